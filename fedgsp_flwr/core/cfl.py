"""CFL's cluster splitting over the clients' weight updates (pure numpy/scipy).

Clustered Federated Learning (Sattler, Müller, Samek, IEEE TNNLS 32(8), 2021,
arXiv:1910.01991) trains one model per cluster, starting from one cluster of every
client. Each round every member of a cluster c trains from c's model W_c and returns
W_i; the update is dW_i = W_i - W_c. Cluster c splits in two when it is near a
stationary point of its members' joint objective while some members are still far
from theirs:

    ||sum_i w_i dW_i|| < eps1   and   max_i ||dW_i|| > eps2

(``w_i``: the members' example weights, summing to 1), and, as in the authors' code
(felisat/clustered-federated-learning, ``clustered_federated_learning.ipynb``), only
with at least ``min_size`` members and after ``warmup_rounds`` rounds. The two parts
are a bipartition of the members by the cosine similarity of their updates
(:func:`bipartition`). Each cluster's model then moves by the weighted mean update of
its members (:func:`mean_update`).

Cost. The norms come from one pass over the updates in float64 (:func:`summarize`,
O(n d), which also gives the mean update the cluster's model moves by). Only when the
rule holds is the Gram matrix G_ij = <dW_i, dW_j> formed (:func:`update_gram`, O(n^2 d),
over column blocks of the models: no (n, d) matrix of the updates is ever built), whose
cos(dW_i, dW_j) = G_ij / sqrt(G_ii G_jj) the bipartition reads.

See docs/strategies/cfl.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .arrays import as_dtype

# How a cluster is bipartitioned: "complete" linkage (the authors' code: sklearn's
# AgglomerativeClustering(linkage="complete") on -similarity, 2 clusters), or the
# paper's "optimal" bipartition (its Algorithm 2), which is single linkage.
LINKAGES = ("complete", "optimal")
# Bytes of one float64 block of updates in update_gram (n rows x columns).
BLOCK_BYTES = 1 << 26

Model = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class UpdateNorms:
    """The norms CFL's split test reads.

    Attributes
    ----------
    mean : float
        ||sum_i w_i dW_i||, the norm of the weighted mean update.
    max : float
        max_i ||dW_i||.
    each : np.ndarray
        ||dW_i|| of every update, float64.
    """

    mean: float
    max: float
    each: np.ndarray


@dataclass(frozen=True)
class SplitRule:
    """When a cluster splits (the paper's criterion, plus the authors' code's guards).

    Attributes
    ----------
    eps1 : float
        The weighted mean update's norm must be below it (near a stationary point).
    eps2 : float
        The largest update's norm must exceed it (some member far from its own).
    min_size : int
        Fewest updates a split is tested on (the authors' code: more than 2).
    warmup_rounds : int
        No split in rounds ``1 .. warmup_rounds`` (the authors' code: 20).
    """

    eps1: float = 0.4
    eps2: float = 1.6
    min_size: int = 3
    warmup_rounds: int = 20

    def holds(self, norms: UpdateNorms, server_round: int) -> bool:
        """Whether a cluster whose updates have ``norms`` splits in ``server_round``."""
        return (server_round > self.warmup_rounds and len(norms.each) >= self.min_size
                and norms.mean < self.eps1 and norms.max > self.eps2)


@dataclass(frozen=True)
class ClusterStep:
    """The split test of one cluster in one round.

    Attributes
    ----------
    norms : UpdateNorms
        The norms of its updates.
    update : dict[str, np.ndarray]
        The weighted mean update of all its members, per array, float64 (what the
        cluster's model moves by when it does not split).
    sides : tuple[list[int], list[int]] | None
        The two parts (positions in the update order), ``None`` when it does not split.
    alpha_cross : float | None
        The largest cosine similarity between updates of different parts (the paper's
        alpha_max^cross); ``None`` without a split.
    gamma : float | None
        sqrt((1 - alpha_cross) / 2), the paper's gamma_max; ``None`` without a split.
    """

    norms: UpdateNorms
    update: dict[str, np.ndarray]
    sides: tuple[list[int], list[int]] | None = None
    alpha_cross: float | None = None
    gamma: float | None = None


def _block_width(rows: int) -> int:
    return max(1, BLOCK_BYTES // (8 * max(rows, 1)))


def check_models(models: Sequence[Model], base: Model) -> None:
    """Raise ``ValueError`` unless every model has ``base``'s array names and shapes."""
    for model in models:
        if list(model) != list(base) or any(
                np.shape(model[k]) != np.shape(base[k]) for k in base):
            raise ValueError("every model needs the base model's array names and shapes")


def update_gram(models: Sequence[Model], base: Model) -> np.ndarray:
    """``(n, n)`` Gram matrix of the updates ``models[i] - base``, in float64.

    The updates are formed and multiplied in float64 over column blocks of at most
    :data:`BLOCK_BYTES`, arrays and blocks in a fixed order: the result does not depend
    on the machine's thread count.

    Raises
    ------
    ValueError
        If a model's names or shapes differ from ``base``'s.
    """
    check_models(models, base)
    gram = np.zeros((len(models), len(models)))
    width = _block_width(len(models))
    for key, reference in base.items():
        start = np.asarray(reference, dtype=np.float64).reshape(-1)
        flat = [np.asarray(m[key]).reshape(-1) for m in models]
        for lo in range(0, start.size, width):
            hi = min(lo + width, start.size)
            block = np.stack([f[lo:hi] for f in flat]).astype(np.float64) - start[lo:hi]
            gram += block @ block.T
    return gram


def _normalised_weights(models: Sequence[Model], base: Model, weights: Sequence[float]
                        ) -> np.ndarray:
    """The weights summing to 1, after checking the models against ``base``."""
    w = np.asarray(weights, dtype=np.float64)
    if not models or len(w) != len(models) or not (w > 0).all():
        raise ValueError(f"need models and one positive weight each, got {len(models)} "
                         f"models and weights {w.tolist()}")
    check_models(models, base)
    return w / w.sum()


def mean_update(models: Sequence[Model], base: Model, weights: Sequence[float]
                ) -> dict[str, np.ndarray]:
    """The weighted mean of the updates ``models[i] - base``, per array, in float64.

    Raises
    ------
    ValueError
        Without models, with weights that are not positive, or models unlike ``base``.
    """
    w = _normalised_weights(models, base, weights)
    out = {}
    for key, reference in base.items():
        start = np.asarray(reference, dtype=np.float64)
        total = np.zeros(start.shape)
        for wi, model in zip(w, models, strict=True):
            total += wi * (np.asarray(model[key], dtype=np.float64) - start)
        out[key] = total
    return out


def summarize(models: Sequence[Model], base: Model, weights: Sequence[float]
              ) -> tuple[dict[str, np.ndarray], UpdateNorms]:
    """The weighted mean update (:func:`mean_update`) and the norms of the updates, in
    one float64 pass over them (the arrays in ``base``'s order, the models in order).

    Raises
    ------
    ValueError
        As :func:`mean_update`.
    """
    w = _normalised_weights(models, base, weights)
    squares = np.zeros(len(models))
    mean: dict[str, np.ndarray] = {}
    for key, reference in base.items():
        start = np.asarray(reference, dtype=np.float64)
        total = np.zeros(start.shape)
        for i, (wi, model) in enumerate(zip(w, models, strict=True)):
            update = np.asarray(model[key], dtype=np.float64) - start
            squares[i] += float(np.vdot(update, update))
            total += wi * update
        mean[key] = total
    each = np.sqrt(squares)
    mean_norm = float(np.sqrt(sum(float(np.vdot(v, v)) for v in mean.values())))
    return mean, UpdateNorms(mean_norm, float(each.max()), each)


def moved(base: Model, update: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``base + update`` in ``base``'s dtypes (integer arrays rounded)."""
    out = {}
    for key, reference in base.items():
        value = np.asarray(reference, dtype=np.float64) + update[key]
        out[key] = as_dtype(value, np.asarray(reference).dtype)
    return out


def flat_update(model: Model, base: Model) -> np.ndarray:
    """``model - base`` as one float64 vector (arrays in ``base``'s order)."""
    check_models([model], base)
    return np.concatenate([(np.asarray(model[k], dtype=np.float64)
                            - np.asarray(base[k], dtype=np.float64)).reshape(-1)
                           for k in base]) if base else np.zeros(0)


def update_norms(gram: np.ndarray, weights: Sequence[float]) -> UpdateNorms:
    """The weighted mean update's norm and the largest update norm, from the Gram matrix.

    Raises
    ------
    ValueError
        If the weights do not match the matrix or are not positive.
    """
    w = np.asarray(weights, dtype=np.float64)
    if gram.shape != (len(w), len(w)) or len(w) == 0 or not (w > 0).all():
        raise ValueError(f"need an (n, n) Gram matrix and n positive weights, got "
                         f"{gram.shape} and {w.tolist()}")
    w = w / w.sum()
    each = np.sqrt(np.maximum(np.diag(gram), 0.0))
    return UpdateNorms(float(np.sqrt(max(float(w @ gram @ w), 0.0))), float(each.max()),
                       each)


def cosine_similarities(gram: np.ndarray) -> np.ndarray:
    """``(n, n)`` cosine similarities of the updates, from their Gram matrix.

    A zero update has similarity 0 with every other one (the authors' code divides by
    the norms plus 1e-12) and 1 with itself.
    """
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    scale = np.outer(norms, norms)
    similarities = np.divide(gram, scale, out=np.zeros_like(gram), where=scale > 0)
    similarities = np.clip((similarities + similarities.T) / 2, -1.0, 1.0)
    np.fill_diagonal(similarities, 1.0)
    return similarities


def bipartition(similarities: np.ndarray, method: str = "complete"
                ) -> tuple[list[int], list[int]]:
    """Split ``n >= 2`` updates in two by their cosine similarities.

    ``complete``: the two clusters of complete-linkage agglomerative clustering on the
    distance ``1 - similarity``, which merges in the same order as the authors'
    ``AgglomerativeClustering(affinity="precomputed", linkage="complete").fit(-S)``
    (complete linkage only compares distances; ties aside, the trees agree).

    ``optimal``: the paper's optimal bipartition, argmin over bipartitions (c1, c2) of
    max_{i in c1, j in c2} similarity_ij. Its Algorithm 2 merges the most similar pair
    of clusters until two remain: single linkage, which maximises the smallest distance
    between the two parts (the max-spacing property of single linkage).

    Returns
    -------
    tuple[list[int], list[int]]
        The two parts (sorted positions); the first holds position 0.

    Raises
    ------
    ValueError
        For fewer than two updates or an unknown method.
    """
    if method not in LINKAGES:
        raise ValueError(f"method must be one of {LINKAGES}, got {method!r}")
    n = len(similarities)
    if n < 2 or similarities.shape != (n, n):
        raise ValueError(f"need an (n, n) similarity matrix with n >= 2, got "
                         f"{similarities.shape}")
    # scipy.cluster costs ~0.5 s to import: not at module level, which every ClientApp
    # process loads (through the run config's choices).
    from scipy.cluster.hierarchy import linkage, to_tree
    from scipy.spatial.distance import squareform

    distances = 1.0 - np.clip((similarities + similarities.T) / 2, -1.0, 1.0)
    np.fill_diagonal(distances, 0.0)
    tree = to_tree(linkage(squareform(distances, checks=False),
                           method="complete" if method == "complete" else "single"))
    left, right = sorted(tree.get_left().pre_order()), sorted(tree.get_right().pre_order())
    return (left, right) if left[0] == 0 else (right, left)


def max_cross_similarity(similarities: np.ndarray, first: Sequence[int],
                         second: Sequence[int]) -> float:
    """The largest similarity between a member of ``first`` and one of ``second``
    (the paper's alpha_max^cross)."""
    return float(similarities[np.ix_(list(first), list(second))].max())


def gamma_max(alpha_cross: float) -> float:
    """The paper's gamma_max = sqrt((1 - alpha_max^cross) / 2): how far apart the two
    parts' updates point; the paper's bound on the gradient noise under which the split
    is correct."""
    return float(np.sqrt(max(0.0, (1.0 - alpha_cross) / 2.0)))


def cluster_step(models: Sequence[Model], base: Model, weights: Sequence[float],
                 server_round: int, rule: SplitRule, method: str = "complete",
                 test: bool = True) -> ClusterStep:
    """One cluster's round: the mean update and norms of its members' updates, and,
    if the rule holds, the bipartition of its members.

    Parameters
    ----------
    models : Sequence[Model]
        The members' returned models, in a fixed order (array name -> array).
    base : Model
        The cluster's model they trained from.
    weights : Sequence[float]
        The members' example counts.
    server_round : int
        The round (for ``rule.warmup_rounds``).
    rule : SplitRule
        eps1, eps2, the fewest members and the warm-up rounds.
    method : str (default: "complete")
        One of :data:`LINKAGES` (:func:`bipartition`).
    test : bool (default: True)
        ``False`` skips the split test (norms and mean update only).

    Returns
    -------
    ClusterStep
        The norms and mean update, and the parts with their cross similarity when the
        cluster splits (positions in ``models``).
    """
    update, norms = summarize(models, base, weights)
    if not (test and rule.holds(norms, server_round)):
        return ClusterStep(norms, update)
    similarities = cosine_similarities(update_gram(models, base))
    first, second = bipartition(similarities, method)
    alpha = max_cross_similarity(similarities, first, second)
    return ClusterStep(norms, update, (first, second), alpha, gamma_max(alpha))


def nearest_direction(update: np.ndarray, directions: np.ndarray) -> int:
    """The row of ``directions`` with the largest cosine similarity to ``update`` (the
    first on a tie; a zero row or update counts as similarity 0)."""
    u = np.asarray(update, dtype=np.float64)
    d = np.asarray(directions, dtype=np.float64)
    scale = np.linalg.norm(d, axis=1) * np.linalg.norm(u)
    scores = np.divide(d @ u, scale, out=np.zeros(len(d)), where=scale > 0)
    return int(np.argmax(scores))


@dataclass(frozen=True)
class SplitNode:
    """A cluster that split: an inner node of CFL's parameter tree.

    Attributes
    ----------
    model : dict[str, np.ndarray]
        The cluster's model when it split (what its members trained from that round).
    children : tuple[int, int]
        The tree nodes of its two parts.
    directions : np.ndarray
        ``(2, d)`` float32: each part's weighted mean update in that round, which
        places a client that missed the split
        (:meth:`~fedgsp_flwr.strategies.cfl.CFL.place`, :func:`nearest_direction`).
    server_round : int
        The round of the split.
    alpha_cross : float
        The largest cosine similarity between updates of the two parts.
    gamma : float
        sqrt((1 - alpha_cross) / 2).
    sizes : tuple[int, int]
        The parts' members at the split.
    """

    model: dict[str, np.ndarray]
    children: tuple[int, int]
    directions: np.ndarray
    server_round: int
    alpha_cross: float
    gamma: float
    sizes: tuple[int, int]


def splits_below(splits: Mapping[int, SplitNode], tree_node: int) -> list[int]:
    """The splits of the parameter tree in the subtree of ``tree_node`` (itself first),
    breadth first (``splits``: each inner node's split, by tree node)."""
    out, queue = [], [tree_node]
    while queue:
        t = queue.pop(0)
        if t in splits:
            out.append(t)
            queue.extend(splits[t].children)
    return out
