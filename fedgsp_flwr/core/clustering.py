"""StoCFL's stochastic agglomerative clustering of clients by their sketches (pure numpy).

Every client starts as its own cluster, the first time it sends its sketch (a unit
vector that represents its data distribution, see :mod:`fedgsp_flwr.clients.sketches`). A
cluster is represented by the mean of its members' sketches; clusters whose cosine
similarity exceeds ``tau`` are merged greedily, the most similar pair first, the
similarities being recomputed after every merge, until the best pair is at or below
``tau`` (Zeng et al., StoCFL, Algorithm 1).

Cost. The cosine of two cluster means equals the cosine of the clusters' sketch sums,
and the Gram matrix of sums updates by row additions on a merge. So a round costs one
product of the new sketches with the current cluster sums (O(new x clusters x dim)),
then O(clusters) per merge, plus the rows whose best partner was merged: the full
similarity matrix is never recomputed from the sketches.

Only :meth:`SketchClustering.add` changes the clustering; inference for a client outside
it (:meth:`SketchClustering.infer`, :meth:`SketchClustering.infer_all`) is read-only.

See docs/strategies/stocfl.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# How clients sketch their data (fedgsp_flwr.clients.sketches computes them).
SKETCH_MODES = ("gradient", "update")
# The model of a merged cluster when both clusters' models have trained (see
# Merge.model_weights): the larger cluster's (the authors' code), or the size-weighted mean.
MERGE_MODELS = ("larger", "weighted")

Client = int  # a client id (node or partition id)


@dataclass(frozen=True)
class Merge:
    """One merge: cluster ``absorbed`` joined cluster ``kept``.

    Attributes
    ----------
    kept, absorbed : int
        Cluster ids; ``kept`` is the larger cluster (the smaller id on a tie) and
        keeps its id.
    similarity : float
        Cosine similarity of the two clusters' mean sketches.
    kept_size, absorbed_size : int
        Their sizes before the merge.
    """

    kept: int
    absorbed: int
    similarity: float
    kept_size: int
    absorbed_size: int

    def model_weights(self, merge_model: str, kept_trained: bool,
                      absorbed_trained: bool) -> tuple[float, float] | None:
        """Weights of the kept and the absorbed cluster's models in the merged model.

        A model that never trained never wins over one that has: it weighs 0 whatever
        the rule. When both have trained, ``merge_model`` decides:

        - ``larger``: the larger cluster's model, the older (smaller id) one's on a tie,
          i.e. ``kept``'s. This is the authors' ``unite`` (StoCFL-FCC.py,
          StoCFL-FCC+CFL.py and StoCFL-FEMNIST.py in dunzeng/StoCFL): cluster j joins
          the lower id i, which takes j's model if j is strictly larger and has one,
          else keeps its own; j's model is dropped (even when i has none: there the
          trained model is kept here).
        - ``weighted``: the mean of both, weighted by the clusters' sizes.

        Parameters
        ----------
        merge_model : str
            One of :data:`MERGE_MODELS`.
        kept_trained, absorbed_trained : bool
            Whether the kept / the absorbed cluster's model has trained.

        Returns
        -------
        tuple[float, float] | None
            (kept weight, absorbed weight), one of them 0 when only one model counts;
            ``None`` when neither has trained (the merged cluster has no model yet).

        Raises
        ------
        ValueError
            On an unknown ``merge_model``.
        """
        if merge_model not in MERGE_MODELS:
            raise ValueError(f"merge_model must be one of {MERGE_MODELS}, got {merge_model!r}")
        if not (kept_trained or absorbed_trained):
            return None
        if not (kept_trained and absorbed_trained):
            return (1.0, 0.0) if kept_trained else (0.0, 1.0)
        if merge_model == "weighted":
            return float(self.kept_size), float(self.absorbed_size)
        return 1.0, 0.0


@dataclass(frozen=True)
class Placement:
    """Where a sketch belongs (:meth:`SketchClustering.infer`).

    Attributes
    ----------
    cluster : int
        The cluster joined: ``nearest``, or a new id when ``new``.
    nearest : int | None
        The most similar existing cluster (``None`` when there is no cluster yet).
    similarity : float
        Its cosine similarity (-inf when there is no cluster).
    new : bool
        Whether the sketch starts a new cluster (similarity below tau).
    """

    cluster: int
    nearest: int | None
    similarity: float
    new: bool


def unit_rows(sketches: np.ndarray, name: str = "sketches") -> np.ndarray:
    """Check a (n, dim) matrix of sketches and return its rows scaled to unit norm.

    Raises
    ------
    ValueError
        If the matrix is not 2-D, has NaN/inf values or a zero row.
    """
    sketches = np.asarray(sketches)
    if sketches.ndim != 2 or sketches.shape[1] == 0:
        raise ValueError(f"{name} must be a (clients, dim) matrix, got shape {sketches.shape}")
    # Row by row: a raw sketch block (480 x 1.6M) is 3 GB; no float64 copy of it.
    norms = np.array([np.linalg.norm(row.astype(np.float64)) for row in sketches])
    if not np.isfinite(norms).all():
        raise ValueError(f"{name} have NaN or inf values")
    if (norms == 0).any():
        raise ValueError(f"{name} rows {np.flatnonzero(norms == 0)[:5].tolist()} are zero")
    out = sketches.astype(np.float32)  # a copy: the caller's array is left as it is
    out /= norms.astype(np.float32)[:, None]
    return out


class SketchClustering:
    """The partition of the clients seen so far, updated incrementally each round.

    Parameters
    ----------
    tau : float
        Merge threshold on the cosine similarity of cluster means, in [-1, 1]. Pairs
        merge while the best one is above ``tau``; ``tau = 1`` keeps every client
        alone, ``tau = -1`` merges everything into one cluster.
    keep_sketches : bool (default: True)
        Cache every client's sketch (needed to report or check them). Off, only the
        clusters' sketch sums are kept (memory O(clusters x dim) instead of O(clients
        x dim), for raw sketches of large models).

    Attributes
    ----------
    cluster_of : dict[Client, int]
        Cluster id of every client seen.
    sketches : dict[Client, np.ndarray]
        Every client's unit sketch, if ``keep_sketches``.
    """

    def __init__(self, tau: float, keep_sketches: bool = True) -> None:
        if not -1.0 <= tau <= 1.0:
            raise ValueError(f"tau must be in [-1, 1], got {tau}")
        self.tau = float(tau)
        self.keep_sketches = keep_sketches
        self.cluster_of: dict[Client, int] = {}
        self.sketches: dict[Client, np.ndarray] = {}
        self.dim: int | None = None
        self._ids: list[int] = []  # cluster id of each slot
        self._sums: list[np.ndarray] = []  # sketch sum of each slot (float32)
        self._sizes = np.zeros(0, dtype=np.int64)
        self._gram = np.zeros((0, 0))  # Gram matrix of the sums, float64
        self._members: dict[int, list[Client]] = {}
        self._next_id = 0

    # --- views ------------------------------------------------------------------------

    @property
    def num_clusters(self) -> int:
        """Number of clusters."""
        return len(self._ids)

    @property
    def clusters(self) -> dict[int, list[Client]]:
        """Members of every cluster, by cluster id (in order of joining)."""
        return {cid: list(self._members[cid]) for cid in self._ids}

    def sizes(self) -> dict[int, int]:
        """Size of every cluster, by cluster id."""
        return {cid: int(s) for cid, s in zip(self._ids, self._sizes, strict=True)}

    def centroids(self) -> tuple[list[int], np.ndarray]:
        """Cluster ids and the unit mean sketch of each (rows of a matrix)."""
        if not self._ids:
            return [], np.zeros((0, self.dim or 0), dtype=np.float32)
        sums = np.stack(self._sums).astype(np.float64)
        return list(self._ids), sums / _safe_norms(self._gram)[:, None]

    def similarities(self) -> tuple[list[int], np.ndarray]:
        """Cluster ids and the cosine similarity matrix of their means (diagonal 1)."""
        cos = _cosines(self._gram)
        np.fill_diagonal(cos, 1.0)
        return list(self._ids), cos

    # --- saving and restoring ---------------------------------------------------------

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The whole clustering as JSON-able values and arrays (see :meth:`from_state`)."""
        sketch_clients = list(self.sketches)
        meta = {
            "tau": self.tau, "keep-sketches": self.keep_sketches, "dim": self.dim,
            "ids": list(self._ids), "next-id": self._next_id,
            "members": [[cid, list(m)] for cid, m in self._members.items()],
            "sketch-clients": sketch_clients,
        }
        width = self.dim or 0
        arrays = {
            "sums": np.stack(self._sums) if self._sums else np.zeros((0, width), np.float32),
            "sizes": self._sizes.copy(), "gram": self._gram.copy(),
            "sketches": (np.stack([self.sketches[c] for c in sketch_clients]) if sketch_clients
                         else np.zeros((0, width), np.float32)),
        }
        return meta, arrays

    @classmethod
    def from_state(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                   clients: Callable[[Client], Client] = int) -> SketchClustering:
        """The clustering of :meth:`state`, client ids translated by ``clients``.

        Raises
        ------
        ValueError
            If the arrays do not fit the values (a damaged state).
        """
        out = cls(float(meta["tau"]), bool(meta["keep-sketches"]))
        out.dim = meta["dim"]
        out._ids = [int(c) for c in meta["ids"]]
        out._next_id = int(meta["next-id"])
        out._members = {int(cid): [clients(c) for c in members]
                        for cid, members in meta["members"]}
        out.cluster_of = {c: cid for cid, members in out._members.items() for c in members}
        out._sums = list(np.asarray(arrays["sums"], dtype=np.float32))
        out._sizes = np.asarray(arrays["sizes"], dtype=np.int64)
        out._gram = np.asarray(arrays["gram"], dtype=np.float64)
        out.sketches = {clients(c): row for c, row in
                        zip(meta["sketch-clients"], arrays["sketches"], strict=True)}
        n = len(out._ids)
        if len(out._sums) != n or out._sizes.shape != (n,) or out._gram.shape != (n, n) \
                or set(out._members) != set(out._ids):
            raise ValueError(f"clustering state does not fit: {n} clusters, "
                             f"{len(out._sums)} sums, gram {out._gram.shape}")
        return out

    # --- updates ----------------------------------------------------------------------

    def add(self, clients: Sequence[Client], sketches: np.ndarray) -> list[Merge]:
        """Add new clients as singleton clusters, then merge greedily (one round).

        Parameters
        ----------
        clients : Sequence[Client]
            Clients not seen before; their order decides ties.
        sketches : np.ndarray
            Their sketches, shape (len(clients), dim); scaled to unit norm here.

        Returns
        -------
        list[Merge]
            The merges, in order.

        Raises
        ------
        ValueError
            On a client already clustered, a repeated client, or bad sketches.
        """
        if len(clients):
            self._extend(clients, self._check_new(clients, sketches))
        return self.merge()

    def merge(self) -> list[Merge]:
        """Merge the most similar pair of clusters while its similarity exceeds tau."""
        n = len(self._ids)
        if n < 2:
            return []
        gram, sizes = self._gram, self._sizes
        safe = _safe_norms(gram)
        cos = _cosines(gram)
        np.fill_diagonal(cos, -np.inf)
        best_to = cos.argmax(axis=1)
        best = cos[np.arange(n), best_to]
        penalty = np.zeros(n)  # -inf on merged-away slots
        merges: list[Merge] = []
        while True:
            i = int(best.argmax())
            if not self._merges(best[i]):
                break
            j = int(best_to[i])
            a, b = sorted((i, j), key=lambda s: (-sizes[s], self._ids[s]))
            merges.append(Merge(self._ids[a], self._ids[b], float(best[i]),
                                int(sizes[a]), int(sizes[b])))
            row = gram[a] + gram[b]
            row[a] = gram[a, a] + 2 * gram[a, b] + gram[b, b]
            gram[a], gram[:, a] = row, row
            sizes[a] += sizes[b]
            self._sums[a] = self._sums[a] + self._sums[b]
            absorbed = self._members.pop(self._ids[b])
            self._members[self._ids[a]].extend(absorbed)
            for client in absorbed:
                self.cluster_of[client] = self._ids[a]
            penalty[b] = -np.inf
            cos[b], cos[:, b], best[b] = -np.inf, -np.inf, -np.inf
            safe[a] = np.sqrt(row[a]) if row[a] > 0 else np.inf
            cos_a = np.clip(row / safe / safe[a], -1.0, 1.0) + penalty
            cos_a[a] = -np.inf
            cos[a], cos[:, a] = cos_a, cos_a
            best_to[a] = int(cos_a.argmax())
            best[a] = cos_a[best_to[a]]
            # Rows whose best partner was a or b: improved by the new a, or recomputed.
            stale = (best_to == a) | (best_to == b)
            better = cos_a > best
            best[better], best_to[better] = cos_a[better], a
            stale &= ~better & (penalty == 0)
            stale[a] = False
            rows = np.flatnonzero(stale)
            if len(rows):
                best_to[rows] = cos[rows].argmax(axis=1)
                best[rows] = cos[rows, best_to[rows]]
        alive = penalty == 0
        # A singleton's sum is a row of its round's sketch block: copy it, so that the
        # block (3 GB for 480 raw MLP sketches) is freed once the round is merged.
        self._sums = [s.copy() if s.base is not None else s for s in self._sums]
        if merges:
            keep = np.flatnonzero(alive)
            self._ids = [self._ids[k] for k in keep]
            self._sums = [self._sums[k] for k in keep]
            self._sizes = sizes[keep]
            self._gram = gram[np.ix_(keep, keep)]
        return merges

    def infer(self, sketch: np.ndarray) -> Placement:
        """Where a new client with this sketch belongs, without changing the state.

        The most similar cluster (``nearest``) if its similarity is at least tau,
        otherwise a new cluster (which the paper's Sec. 4.4 starts from ``nearest``'s
        model).
        """
        sketch = np.asarray(sketch)
        if sketch.ndim != 1:
            raise ValueError(f"a sketch must be a vector, got shape {sketch.shape}")
        return self.infer_all(sketch[None, :])[0]

    def infer_all(self, sketches: np.ndarray) -> list[Placement]:
        """:meth:`infer` for each row of a (clients, dim) matrix, the centroids computed
        once. A ``new`` placement's ``cluster`` is the id the next cluster would get.

        Raises
        ------
        ValueError
            On bad sketches or a dimension other than the clustered ones'.
        """
        units = unit_rows(self._check_dim(np.asarray(sketches)))
        if not self._ids:
            return [Placement(self._next_id, None, float("-inf"), True) for _ in units]
        ids, centroids = self.centroids()
        sims = np.clip(units.astype(np.float64) @ centroids.T, -1.0, 1.0)
        out = []
        for row in sims:
            k = int(row.argmax())
            nearest, similarity = ids[k], float(row[k])
            joins = similarity >= self.tau
            out.append(Placement(nearest if joins else self._next_id, nearest, similarity,
                                 not joins))
        return out

    # --- helpers ----------------------------------------------------------------------

    def _merges(self, similarity: float) -> bool:
        return similarity > self.tau or (self.tau <= -1.0 and similarity > -np.inf)

    def _new_cluster(self, client: Client) -> int:
        cid, self._next_id = self._next_id, self._next_id + 1
        self._members[cid] = [client]
        self.cluster_of[client] = cid
        return cid

    def _extend(self, clients: Sequence[Client], block: np.ndarray) -> None:
        """Add checked unit sketches as singleton clusters (no merging)."""
        old = len(self._ids)
        # One product of the new sketches with the current sums (and themselves).
        cross = (np.stack(self._sums) @ block.T).astype(np.float64) if old else np.zeros(
            (0, len(clients)))
        gram = np.empty((old + len(clients),) * 2)
        gram[:old, :old] = self._gram
        gram[:old, old:] = cross
        gram[old:, :old] = cross.T
        gram[old:, old:] = (block @ block.T).astype(np.float64)
        self._gram = gram
        self._sizes = np.concatenate([self._sizes, np.ones(len(clients), dtype=np.int64)])
        for client, row in zip(clients, block, strict=True):
            self._ids.append(self._new_cluster(client))
            self._sums.append(row)
            if self.keep_sketches:
                self.sketches[client] = row

    def _check_dim(self, sketches: np.ndarray) -> np.ndarray:
        if self.dim is not None and sketches.ndim == 2 and sketches.shape[1] != self.dim:
            raise ValueError(f"sketches have dimension {sketches.shape[1]}, the clustered "
                             f"ones {self.dim}")
        return sketches

    def _check_new(self, clients: Sequence[Client], sketches: np.ndarray) -> np.ndarray:
        block = unit_rows(self._check_dim(np.asarray(sketches)))
        if len(block) != len(clients):
            raise ValueError(f"{len(clients)} clients but {len(block)} sketches")
        seen = [c for c in clients if c in self.cluster_of]
        if seen or len(set(clients)) != len(clients):
            raise ValueError(f"clients already clustered or repeated: {seen[:5] or clients}")
        self.dim = block.shape[1]
        return block


def _safe_norms(gram: np.ndarray) -> np.ndarray:
    """Norms of the vectors of a Gram matrix, inf for a zero vector (so that it is
    orthogonal to all and scales to zero).
    """
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    return np.where(norms > 0, norms, np.inf)


def _cosines(gram: np.ndarray) -> np.ndarray:
    """Cosine matrix from a Gram matrix (0 for a zero vector), clipped to [-1, 1]."""
    safe = _safe_norms(gram)
    return np.clip(gram / safe[:, None] / safe[None, :], -1.0, 1.0)


# --- clustering quality ----------------------------------------------------------------


def _contingency(labels_true: Sequence[int], labels_pred: Sequence[int]) -> np.ndarray:
    true = np.unique(np.asarray(labels_true), return_inverse=True)[1]
    pred = np.unique(np.asarray(labels_pred), return_inverse=True)[1]
    if len(true) != len(pred):
        raise ValueError(f"{len(true)} true labels but {len(pred)} predicted")
    table = np.zeros((true.max(initial=-1) + 1, pred.max(initial=-1) + 1), dtype=np.int64)
    np.add.at(table, (true, pred), 1)
    return table


def adjusted_rand_index(labels_true: Sequence[int], labels_pred: Sequence[int]) -> float:
    """Adjusted Rand index of two labelings (1 = identical partitions, ~0 = chance).

    Both labelings put everyone in one cluster, or everyone alone: 1.0 (sklearn's
    convention).
    """
    table = _contingency(labels_true, labels_pred)
    n = int(table.sum())

    def pairs(x: np.ndarray) -> float:
        return float((x * (x - 1) // 2).sum())

    index = pairs(table)
    rows, cols = pairs(table.sum(axis=1)), pairs(table.sum(axis=0))
    expected = rows * cols / (n * (n - 1) / 2) if n > 1 else 0.0
    maximum = (rows + cols) / 2
    if maximum == expected:
        return 1.0
    return (index - expected) / (maximum - expected)


def normalized_mutual_info(labels_true: Sequence[int], labels_pred: Sequence[int]) -> float:
    """Mutual information normalised by the arithmetic mean of the two entropies."""
    table = _contingency(labels_true, labels_pred).astype(np.float64)
    n = table.sum()
    p = table / n
    pi, pj = p.sum(axis=1), p.sum(axis=0)
    nz = p > 0
    mi = float((p[nz] * np.log(p[nz] / np.outer(pi, pj)[nz])).sum())

    def entropy(q: np.ndarray) -> float:
        q = q[q > 0]
        return float(-(q * np.log(q)).sum())

    h_true, h_pred = entropy(pi), entropy(pj)
    if h_true == 0 and h_pred == 0:
        return 1.0
    return max(0.0, mi / ((h_true + h_pred) / 2))


def agreement_scores(found: Mapping[int, int], partition_ids: Mapping[int, int],
                     ground_truth: Mapping[int, int] | None) -> dict[str, float]:
    """ARI and NMI of a node -> cluster assignment against the latent groups.

    Parameters
    ----------
    found : Mapping[int, int]
        Cluster of each node.
    partition_ids : Mapping[int, int]
        Partition id each node reported.
    ground_truth : Mapping[int, int] | None
        Latent group of each partition id (``None``: none known).

    Returns
    -------
    dict[str, float]
        ``ari`` and ``nmi`` over the nodes whose group is known; empty when fewer than
        two are.
    """
    ground_truth = ground_truth or {}
    scored = [n for n in found if partition_ids.get(n, -1) in ground_truth]
    if len(scored) < 2:
        return {}
    truth = [ground_truth[partition_ids[n]] for n in scored]
    labels = [found[n] for n in scored]
    return {"ari": adjusted_rand_index(truth, labels),
            "nmi": normalized_mutual_info(truth, labels)}
