"""FedGSP's grouping core: growth functions, ICG, random grouping, CPD.

Pure numpy and OR-Tools; no Flower imports. See docs/algorithms.md#fedgsp and Zeng et al.,
"Heterogeneous Federated Learning via Grouped Sequential-to-Parallel Training".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from ortools.graph.python import min_cost_flow

from .kmeans import kmeans_plus_plus, squared_distances

GROWTH_FUNCTIONS = ("linear", "log", "exp")
LEFTOVER_POLICIES = ("distribute", "drop")
_COST_SCALE = 10**7  # squared distances are scaled to integers in [0, 1e7]
_FREE_FACTOR = 4  # warm-started assignments: initial and growth factor of the freed share


def num_groups(server_round: int, growth: str, alpha: float, beta: int, num_clients: int) -> int:
    """Number of groups f(r) of round r (from 1), clipped to [1, num_clients].

    linear: beta * floor(alpha (r - 1) + 1); log: beta * floor(alpha ln r + 1);
    exp: beta * floor((1 + alpha)^(r - 1)).

    Raises
    ------
    ValueError
        On an unknown growth function, r < 1, alpha <= 0 or beta < 1.
    """
    if growth not in GROWTH_FUNCTIONS:
        raise ValueError(f"Unknown growth '{growth}'. Choose one of {GROWTH_FUNCTIONS}.")
    if server_round < 1 or alpha <= 0 or beta < 1 or num_clients < 1:
        raise ValueError(
            f"need round >= 1, alpha > 0, beta >= 1, clients >= 1; got "
            f"{server_round}, {alpha}, {beta}, {num_clients}"
        )
    if growth == "linear":
        base = math.floor(alpha * (server_round - 1) + 1)
    elif growth == "log":
        base = math.floor(alpha * math.log(server_round) + 1)
    else:
        # (1+alpha)^(r-1) overflows floats for long runs; the clip makes the cap exact.
        exponent = (server_round - 1) * math.log1p(alpha)
        base = (num_clients if exponent > math.log(num_clients + 1)
                else math.floor((1 + alpha) ** (server_round - 1)))
    return int(min(max(beta * base, 1), num_clients))


def random_groups(client_ids: list[int], m: int, rng: np.random.Generator) -> list[list[int]]:
    """Split clients at random into ``min(m, len(client_ids))`` groups of near-equal size.

    Raises
    ------
    ValueError
        If ``m < 1``.
    """
    if m < 1:
        raise ValueError(f"number of groups must be >= 1, got {m}")
    ids = list(client_ids)  # node ids can exceed int64: index, never convert
    order = rng.permutation(len(ids))
    m = min(m, len(ids))
    return [[ids[i] for i in chunk] for chunk in np.array_split(order, m)] if m else []


def spread(rng: np.random.Generator, m: int, count: int) -> np.ndarray:
    """Random group indices for ``count`` extra members, at most one more per group
    than any other group receives.
    """
    return np.concatenate([rng.permutation(m) for _ in range(count // m + 1)])[:count]


@dataclass(frozen=True)
class ICGResult:
    """Outcome of :func:`icg`.

    Attributes
    ----------
    groups : list[list[int]]
        Client ids per group, in random order inside each group.
    clusters : list[list[int]]
        Client ids per equal-size cluster (the clients that were clustered).
    leftover : list[int]
        Clients outside the one-per-cluster structure (distributed or dropped).
    dropped : list[int]
        Clients in no group this round (``leftover="drop"``).
    iterations : int
        Assignment/update iterations run.
    objective : float
        Final clustering objective sum_k 1/2 ||V^k - C_l(k)||^2.
    """

    groups: list[list[int]]
    clusters: list[list[int]]
    leftover: list[int]
    dropped: list[int]
    iterations: int
    objective: float


def icg(
    histograms: np.ndarray,
    m: int,
    rng: np.random.Generator,
    *,
    client_ids: list[int] | None = None,
    max_iter: int = 10,
    normalize: bool = False,
    leftover: str = "distribute",
    neighbours: int = 8,
    balance: bool = False,
) -> ICGResult:
    """Inter-Cluster Grouping (FedGSP, Algorithm 2).

    Clusters the K clients' class histograms into L = floor(K/M) clusters of equal size
    s = floor(K/L) (equal-size k-means, each assignment step a min-cost flow), then
    forms M groups, each taking one client drawn at random from every cluster, so that
    every group's summed histogram is close to the global one.

    Parameters
    ----------
    histograms : np.ndarray
        (K, F) label counts, one row per client.
    m : int
        Number of groups M.
    rng : np.random.Generator
        Randomness (sampling, initialisation, draws).
    client_ids : list[int] | None
        Ids of the rows; ``range(K)`` if ``None``.
    max_iter : int
        Maximum assignment/update iterations (the paper's tau).
    normalize : bool
        Cluster on label proportions instead of raw counts (the paper: counts).
    leftover : str
        ``"distribute"`` (choice): clients outside the one-per-cluster structure (K not
        divisible) join groups, at most one extra per group per cluster, spread over
        the groups; ``"drop"`` (the paper): they sit this round out.
    neighbours : int
        Flow arcs per client: its nearest centroids only (more if the sparse network
        is infeasible). Sparse arcs keep large K fast.
    balance : bool
        After the random one-per-cluster draw, swap same-cluster members between
        groups while that brings the groups' class distributions closer to the global
        one (:func:`balance_groups`; not in the paper, which draws at random). Every
        group still holds one client of every cluster.

    Returns
    -------
    ICGResult
        Groups, clusters and diagnostics.

    Raises
    ------
    ValueError
        On bad shapes or parameters.
    """
    v = np.asarray(histograms, dtype=np.float64)
    if v.ndim != 2 or len(v) == 0:
        raise ValueError(f"histograms must be a non-empty (K, F) array, got shape {v.shape}")
    if not np.isfinite(v).all() or (v < 0).any():
        raise ValueError("histograms must be finite and non-negative")
    if m < 1 or max_iter < 1 or neighbours < 1:
        raise ValueError(f"need m >= 1, max_iter >= 1, neighbours >= 1; got {m}, "
                         f"{max_iter}, {neighbours}")
    if leftover not in LEFTOVER_POLICIES:
        raise ValueError(f"Unknown leftover policy '{leftover}'. Choose {LEFTOVER_POLICIES}.")
    ids = list(range(len(v))) if client_ids is None else list(client_ids)  # may be > int64
    if len(ids) != len(v):
        raise ValueError(f"{len(ids)} client ids for {len(v)} histograms")
    if normalize:
        v = v / np.maximum(v.sum(axis=1, keepdims=True), 1e-12)
    k = len(v)
    if m >= k:  # every client its own group: FedAvg
        return ICGResult([[ids[i]] for i in rng.permutation(k)], [list(ids)], [], [], 0, 0.0)
    n_clusters = k // m
    size = k // n_clusters
    in_clusters = np.zeros(k, dtype=bool)
    in_clusters[rng.choice(k, n_clusters * size, replace=False)] = True
    chosen, outside = np.flatnonzero(in_clusters), np.flatnonzero(~in_clusters)
    points = v[chosen]
    # k-means++ seeds, then one cheap balanced assignment: the exact min-cost-flow
    # steps start from centroids of equal-size clusters (far fewer augmentations).
    seeds = points[kmeans_plus_plus(points, n_clusters, rng)]
    labels = greedy_balanced_assignment(squared_distances(points, seeds), size)
    centroids = _cluster_means(points, labels, n_clusters)
    iterations = 0
    prices: np.ndarray | None = None
    # Warm starts pay off on the full network (L <= neighbours: the paper's sizes); on
    # sparse networks the freed share rarely certifies and cold solves are faster.
    warm = neighbours >= n_clusters
    while iterations < max_iter:
        iterations += 1
        new_labels, prices = equal_size_assignment(
            points, centroids, size, neighbours,
            warm_start=(labels, prices) if warm and prices is not None else None)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        centroids = _cluster_means(points, labels, n_clusters)
    objective = 0.5 * float(((points - centroids[labels]) ** 2).sum())
    clusters = [chosen[labels == c] for c in range(n_clusters)]
    drawn = [rng.permutation(members) for members in clusters]
    table = np.stack([d[:m] for d in drawn], axis=1)  # (M, L): group x cluster
    if balance:
        table = balance_groups(np.asarray(histograms, dtype=np.float64), table)
    groups: list[list[int]] = [[int(c) for c in row] for row in table]
    extra = [int(x) for d in drawn for x in d[m:]] + [int(x) for x in outside]
    dropped: list[int] = []
    if leftover == "distribute":
        for client, g in zip(extra, spread(rng, m, len(extra)), strict=True):
            groups[int(g)].append(client)
    else:
        dropped = extra
    return ICGResult(
        groups=[[int(ids[c]) for c in rng.permutation(g)] for g in groups],
        clusters=[[int(ids[c]) for c in members] for members in clusters],
        leftover=[int(ids[c]) for c in extra],
        dropped=[int(ids[c]) for c in dropped],
        iterations=iterations,
        objective=objective,
    )


def balance_groups(
    histograms: np.ndarray, table: np.ndarray, max_sweeps: int = 5, tol: float = 1e-9
) -> np.ndarray:
    """Rearrange each cluster's members over the groups to equalise group distributions.

    Minimises sum_m ||S_m / |S_m| - P||^2 (S_m the summed histogram of group m, P the
    global class distribution), which is proportional to the mean pairwise CPD between
    groups, by block coordinate descent: for one cluster (column) at a time, with the
    other columns fixed, the best placement of its members is a linear assignment
    (group m receiving member j costs the deviation of group m with j), solved exactly.
    Sweeps over the columns stop when a sweep gains less than ``tol`` (relative).

    Parameters
    ----------
    histograms : np.ndarray
        (K, F) label counts, indexed by the entries of ``table``.
    table : np.ndarray
        (M, L) client indices: row m is group m, column l holds cluster l's members.
    max_sweeps : int
        Upper bound on sweeps over the columns.
    tol : float
        Relative improvement below which the sweeps stop.

    Returns
    -------
    np.ndarray
        The rearranged (M, L) table (a copy); every column keeps its members.
    """
    from scipy.optimize import linear_sum_assignment

    table = np.array(table, copy=True)
    v = np.asarray(histograms, dtype=np.float64)
    total = v[table.reshape(-1)].sum(axis=0)
    target = total / max(total.sum(), 1e-12)
    sums = v[table].sum(axis=1)  # (M, F)

    def objective(s: np.ndarray) -> float:
        return float(((s / np.maximum(s.sum(axis=1, keepdims=True), 1e-12) - target) ** 2
                      ).sum())

    current = objective(sums)
    for _ in range(max_sweeps):
        start = current
        for col in range(table.shape[1]):
            members = v[table[:, col]]  # (M, F), member j currently in group j
            rest = sums - members  # (M, F): each group without its column-l member
            # cost[m, j] = ||(R_m + v_j) / (r_m + w_j) - P||^2 with sizes r, w, expanded
            # so that no (M, M, F) array is formed.
            size = np.maximum(rest.sum(axis=1)[:, None] + members.sum(axis=1)[None, :],
                              1e-12)
            norm2 = ((rest**2).sum(axis=1)[:, None] + 2.0 * rest @ members.T
                     + (members**2).sum(axis=1)[None, :])
            dot = (rest @ target)[:, None] + (members @ target)[None, :]
            cost = norm2 / size**2 - 2.0 * dot / size
            rows, cols = linear_sum_assignment(cost)
            table[rows, col] = table[cols, col].copy()
            sums = rest[rows] + members[cols]
        current = objective(sums)
        if start - current <= tol * max(start, 1e-12):
            break
    return table


def _cluster_means(points: np.ndarray, labels: np.ndarray, n_clusters: int) -> np.ndarray:
    """Mean of each cluster's points (clusters are non-empty: equal sizes)."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=n_clusters)
    sums = np.add.reduceat(points[order], np.concatenate([[0], np.cumsum(counts)[:-1]]))
    return sums / counts[:, None]


def greedy_balanced_assignment(d: np.ndarray, size: int) -> np.ndarray:
    """Fast equal-size assignment by regret-ordered greedy filling (a warm start).

    Clients are taken in decreasing order of regret (their second-best minus best cost)
    and each goes to its nearest cluster that still has room. The result is balanced
    but not cost-optimal; ICG uses it only to place the first centroids before the
    exact min-cost-flow steps.

    Parameters
    ----------
    d : np.ndarray
        (N, L) costs with N = L * size.
    size : int
        Clients per cluster.

    Returns
    -------
    np.ndarray
        (N,) cluster index per client.
    """
    n, n_clusters = d.shape
    preference = np.argsort(d, axis=1, kind="stable")
    if n_clusters > 1:
        ranked = np.take_along_axis(d, preference[:, :2], axis=1)
        order = np.argsort(ranked[:, 0] - ranked[:, 1], kind="stable")  # largest regret first
    else:
        order = np.arange(n)
    room = [size] * n_clusters
    labels = np.empty(n, dtype=np.int64)
    rows = preference.tolist()
    for client in order.tolist():
        for cluster in rows[client]:
            if room[cluster]:
                room[cluster] -= 1
                labels[client] = cluster
                break
    return labels


def equal_size_assignment(
    points: np.ndarray,
    centroids: np.ndarray,
    size: int,
    neighbours: int = 16,
    warm_start: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Assign N = L * size points to L clusters of exactly ``size`` points each,
    minimising the summed squared distance to the centroids (a min-cost flow).

    Network: each point has supply 1 and an arc (capacity 1, cost = its squared
    distance, scaled to an integer) to each of its ``neighbours`` nearest centroids; each
    cluster has demand ``size``. OR-Tools' ``SimpleMinCostFlow`` solves it.

    If that sparse network admits no flow the arcs are doubled until it does (at L arcs
    per point it is the full network, where the result is the exact optimum).

    Warm start (ICG passes its previous iteration's result): the previous optimal
    assignment stays in place except for the points that its cluster prices mark as
    closest to switching; only those get flow arcs (their current cluster among them,
    so the reduced network is always feasible). The freed share grows until the
    assignment is certified optimal by :func:`assignment_prices` over the network's
    arcs, so the result is the same optimum, from a much smaller flow problem.

    Parameters
    ----------
    points : np.ndarray
        (N, F) points.
    centroids : np.ndarray
        (L, F) cluster centres.
    size : int
        Points per cluster.
    neighbours : int
        Initial number of flow arcs per point (its nearest centroids).
    warm_start : tuple[np.ndarray, np.ndarray] | None
        ``(labels, prices)`` as returned by an earlier call over the same points: (N,)
        clusters with exactly ``size`` points each, and (L,) cluster prices.

    Returns
    -------
    tuple[np.ndarray, np.ndarray | None]
        (N,) cluster index per point, and (L,) prices under which every point's
        cluster minimises its distance minus the price over its arcs (``None`` after a
        cold solve on a sparse network, where they are not needed).

    Raises
    ------
    ValueError
        If N is not L * size, or ``warm_start`` is malformed.
    RuntimeError
        If OR-Tools fails on the full network (it should not).
    """
    n, n_clusters = len(points), len(centroids)
    if n != n_clusters * size:
        raise ValueError(f"{n} points cannot fill {n_clusters} clusters of {size}")
    d = squared_distances(points, centroids)
    top = float(d.max())
    unit = top / _COST_SCALE if top > 0 else 1.0
    cost = np.rint(d / unit).astype(np.int64)
    # Rounding moves each arc cost by at most half a unit; a cycle has at most 2L arcs.
    tolerance = n_clusters * unit
    width = min(max(neighbours, 1), n_clusters)
    if warm_start is None:
        while (labels := _solve_assignment_flow(cost, size, np.ones(n, bool), None,
                                                width)) is None:
            if width == n_clusters:
                raise RuntimeError("min-cost flow failed on the full network")
            width = min(2 * width, n_clusters)
        return labels, (assignment_prices(d, labels, np.inf) if width == n_clusters
                        else None)
    labels, prices = (np.asarray(a) for a in warm_start)
    if labels.shape != (n,) or prices.shape != (n_clusters,) or not np.array_equal(
            np.bincount(labels, minlength=n_clusters), np.full(n_clusters, size)):
        raise ValueError(f"warm_start must be (labels, prices) putting exactly {size} "
                         f"of the {n} points in each of the {n_clusters} clusters")
    # Points ranked by how close the old prices bring them to a switch (negative: they
    # would switch); prices move too, so several times that many are freed at first.
    reduced = d - prices[None, :]
    own = reduced[np.arange(n), labels]
    reduced[np.arange(n), labels] = np.inf
    margin = reduced.min(axis=1) - own
    ranked = np.argsort(margin, kind="stable")
    share = max(_FREE_FACTOR * float((margin < 0).mean()), 1 / 32)
    while True:
        certified = _prices(d, labels, width, tolerance)
        if certified is not None:
            return labels, certified
        free = np.zeros(n, dtype=bool)
        free[ranked[:math.ceil(min(share, 1.0) * n)]] = True
        solved = _solve_assignment_flow(cost, size, free, labels, width)
        if solved is None:
            raise RuntimeError("min-cost flow failed on a feasible network")
        labels = solved
        if share >= 1:  # every point free: optimal up to the integer rounding
            return labels, _prices(d, labels, width, np.inf)
        share *= _FREE_FACTOR


def _prices(d: np.ndarray, labels: np.ndarray, width: int,
            tolerance: float) -> np.ndarray | None:
    """:func:`assignment_prices` over the arcs of the flow network: each point to its
    ``width`` nearest clusters and its own.
    """
    n, n_clusters = d.shape
    if width < n_clusters:
        allowed = np.zeros(d.shape, dtype=bool)
        np.put_along_axis(allowed, np.argpartition(d, width - 1, axis=1)[:, :width], True,
                          axis=1)
        allowed[np.arange(n), labels] = True
        d = np.where(allowed, d, np.inf)
    return assignment_prices(d, labels, tolerance)


def assignment_prices(d: np.ndarray, labels: np.ndarray,
                      tolerance: float = 0.0) -> np.ndarray | None:
    """Cluster prices certifying that a balanced assignment is optimal, if it is.

    An assignment has the least total cost among all with the same cluster sizes
    exactly when its residual flow network has no negative cycle. Every such cycle
    alternates clusters and points (cluster a gives up point i, which joins cluster b at
    cost ``d[i, b] - d[i, a]``), so the check runs on the L-node graph whose arc a -> b
    costs the cheapest such move (Floyd-Warshall, O(N L + L^3)). Its shortest-path
    potentials are prices p with every point's cluster minimising ``d[i, l] - p[l]``.

    Parameters
    ----------
    d : np.ndarray
        (N, L) costs.
    labels : np.ndarray
        (N,) cluster index per point; every cluster non-empty.
    tolerance : float
        Cycles cheaper than ``-tolerance`` count as improving.

    Returns
    -------
    np.ndarray | None
        (L,) prices if no cycle of moves lowers the cost by more than ``tolerance``,
        else ``None``.
    """
    n_clusters = d.shape[1]
    moves = d - d[np.arange(len(d)), labels][:, None]
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], np.arange(n_clusters))
    dist = np.minimum.reduceat(moves[order], starts, axis=0)  # (L, L): cheapest a -> b
    np.fill_diagonal(dist, 0.0)
    for via in range(n_clusters):
        np.minimum(dist, dist[:, via, None] + dist[None, via, :], out=dist)
    if np.diag(dist).min() < -tolerance:
        return None
    return dist.min(axis=0)


def _solve_assignment_flow(cost: np.ndarray, size: int, free: np.ndarray,
                           labels: np.ndarray | None, width: int) -> np.ndarray | None:
    """Min-cost flow over the ``free`` points (arcs to their ``width`` cheapest clusters
    and their current one); the other points keep ``labels``. ``None`` if infeasible.
    """
    n, n_clusters = cost.shape
    rows = np.flatnonzero(free)
    sub = cost[rows]
    if width < n_clusters:
        heads = np.argpartition(sub, width - 1, axis=1)[:, :width]
    else:
        heads = np.broadcast_to(np.arange(n_clusters), (len(rows), n_clusters))
    tails = np.repeat(np.arange(len(rows), dtype=np.int64), heads.shape[1])
    heads = heads.reshape(-1).astype(np.int64)
    demand = np.full(n_clusters, size, dtype=np.int64)
    if labels is not None:
        current = labels[rows]
        missing = ~(heads.reshape(len(rows), -1) == current[:, None]).any(axis=1)
        tails = np.concatenate([tails, np.flatnonzero(missing)])
        heads = np.concatenate([heads, current[missing]])
        demand -= np.bincount(labels[~free], minlength=n_clusters)
    flow = min_cost_flow.SimpleMinCostFlow()
    arcs = flow.add_arcs_with_capacity_and_unit_cost(
        tails, heads + len(rows), np.ones(len(tails), np.int64), sub[tails, heads])
    flow.set_nodes_supplies(np.arange(len(rows) + n_clusters),
                            np.concatenate([np.ones(len(rows), np.int64), -demand]))
    if flow.solve() != flow.OPTIMAL:
        return None
    used = flow.flows(arcs) > 0
    out = np.array(labels, dtype=np.int64) if labels is not None else np.empty(n, np.int64)
    out[rows[tails[used]]] = heads[used]
    return out


def class_distributions(histograms: np.ndarray, groups: list[list[int]],
                        client_ids: list[int] | None = None) -> np.ndarray:
    """(G, F) normalised class distribution of each group's summed histogram."""
    v = np.asarray(histograms, dtype=np.float64)
    index = {c: i for i, c in enumerate(client_ids)} if client_ids is not None else None
    rows = []
    for group in groups:
        members = [index[c] for c in group] if index is not None else group
        total = v[members].sum(axis=0)
        rows.append(total / max(total.sum(), 1e-12))
    return np.stack(rows)


def rbf_gram(num_classes: int, sigma: float = 1.0) -> np.ndarray:
    """Gaussian kernel between one-hot class vectors: 1 on the diagonal,
    exp(-1/sigma^2) elsewhere (||e_i - e_j||^2 = 2).
    """
    off = math.exp(-2.0 / (2.0 * sigma**2))
    return np.full((num_classes, num_classes), off) + (1.0 - off) * np.eye(num_classes)


def cpd(p: np.ndarray, q: np.ndarray, sigma: float = 1.0) -> float:
    """Class probability distance: MMD^2 between class distributions p and q,
    (p - q)^T G (p - q) under the RBF kernel over one-hot classes.
    """
    diff = np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64)
    return float(diff @ rbf_gram(len(diff), sigma) @ diff)


def pairwise_cpd(distributions: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """CPD of every pair (i < j) of rows of a (G, F) distribution matrix."""
    p = np.asarray(distributions, dtype=np.float64)
    if len(p) < 2:
        return np.empty(0)
    gram = rbf_gram(p.shape[1], sigma)
    sq = np.einsum("if,fg,ig->i", p, gram, p)
    cross = p @ gram @ p.T
    full = sq[:, None] + sq[None, :] - 2 * cross
    i, j = np.triu_indices(len(p), k=1)
    return np.maximum(full[i, j], 0.0)


@dataclass
class GroupPlan:
    """One round of FedGSP: the groups and the chains that train.

    Attributes
    ----------
    groups : list[list[int]]
        Every non-empty group (client ids).
    chains : list[list[int]]
        The sampled groups, each in its shuffled training order.
    """

    groups: list[list[int]]
    chains: list[list[int]]


def plan_groups(
    nodes: Sequence[int],
    histograms: Mapping[int, np.ndarray],
    m: int,
    kappa: float,
    rng: np.random.Generator,
    *,
    grouping: str = "icg",
    max_iter: int = 10,
    normalize: bool = False,
    leftover: str = "distribute",
    balance: bool = True,
) -> GroupPlan:
    """Group the clients into ``m`` groups, sample ``max(1, round(kappa * M))`` of them
    and shuffle each sampled group's order (FedGSP's STP round, Algorithm 1).

    With ``grouping="icg"`` the clients with a histogram are grouped by :func:`icg`
    and the others are spread over the groups at random; ``"random"`` groups all of
    them at random (:func:`random_groups`).

    Parameters
    ----------
    nodes : Sequence[int]
        Client ids, in a run-independent order.
    histograms : Mapping[int, np.ndarray]
        Class counts of the clients that reported them.
    m : int
        Number of groups (at most ``len(nodes)``).
    kappa : float
        Fraction of groups sampled, in (0, 1].
    rng : np.random.Generator
        Source of every random choice.
    grouping, max_iter, normalize, leftover, balance
        ``icg`` or ``random``, and :func:`icg`'s options.

    Returns
    -------
    GroupPlan
        The groups and the chains.
    """
    with_hist = [n for n in nodes if n in histograms]
    if grouping == "icg" and with_hist:
        result = icg(np.stack([histograms[n] for n in with_hist]), min(m, len(with_hist)),
                     rng, client_ids=with_hist, max_iter=max_iter, normalize=normalize,
                     leftover=leftover, balance=balance)
        groups = result.groups + [[] for _ in range(m - len(result.groups))]
        rest = [n for n in nodes if n not in histograms]
        for i, g in zip(rng.permutation(len(rest)), spread(rng, m, len(rest)), strict=True):
            groups[g].append(rest[i])
        groups = [g for g in groups if g]
    else:
        groups = random_groups(list(nodes), m, rng)
    sampled = rng.choice(len(groups), max(1, round(kappa * len(groups))), replace=False)
    chains = [[groups[i][j] for j in rng.permutation(len(groups[i]))] for i in sorted(sampled)]
    return GroupPlan(groups, chains)


def group_cpd(groups: Sequence[Sequence[int]], histograms: Mapping[int, np.ndarray],
              sigma: float = 1.0) -> dict[str, float]:
    """Median and mean CPD between the groups, over the members with histograms
    (empty when fewer than two groups have one).
    """
    scored = [[n for n in g if n in histograms] for g in groups]
    scored = [g for g in scored if g]
    if len(scored) < 2:
        return {}
    members = sorted({n for g in scored for n in g})
    cpds = pairwise_cpd(class_distributions(np.stack([histograms[n] for n in members]),
                                            scored, members), sigma)
    return {"cpd-median": float(np.median(cpds)), "cpd-mean": float(np.mean(cpds))}
