"""FedGSP's grouping core: growth functions, ICG, random grouping, CPD.

Pure numpy and OR-Tools; no Flower imports. See docs/algorithms.md#fedgsp and Zeng et al.,
"Heterogeneous Federated Learning via Grouped Sequential-to-Parallel Training".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from .kmeans import squared_distances

GROWTH_FUNCTIONS = ("linear", "log", "exp")
LEFTOVER_POLICIES = ("distribute", "drop")
_MAX_COST_BITS = 40  # distances are rounded to multiples of D / 2^40, D >= max(d)
_FIRST_SHARE = 1 / 32  # warm starts free at least this share of the points
_FREE_FACTOR = 2  # freed share per point that would move; growth per pricing round
_CYCLE_PASSES = 8  # cycle-cancelling passes after a cold flow (2 L more after a warm one)
_CYCLE_CHECK = 2  # Bellman-Ford rounds between looks for negative cycles
_GREEDY_ROUNDS = 3  # greedy balanced assignment + update rounds before the exact steps
_ONE_HOT_MEANS = 2**15  # below N * L, cluster means by a one-hot matrix product
_SMALL_CLUSTER_GRAPH = 4096  # up to N points, cycle cancelling recomputes whole rows
_GREEDY_CHUNK = 256  # clients the greedy assignment ranks clusters for at once


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


@dataclass
class AssignmentStats:
    """Work done by exact equal-size assignments (summed over calls).

    Attributes
    ----------
    flows : int
        Restricted min-cost flows solved by OR-Tools.
    flow_points : int
        Flow nodes for points in those flows (summed; one per duplicate group).
    flow_arcs : int
        Point-to-cluster arcs in those flows (summed).
    pricing_rounds : int
        Flows re-solved on a larger network because the full network still held a
        cheaper assignment after cycle cancelling.
    cycles : int
        Negative cycles cancelled on the full network.
    """

    flows: int = 0
    flow_points: int = 0
    flow_arcs: int = 0
    pricing_rounds: int = 0
    cycles: int = 0


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
        Exact assignment/update iterations run.
    objective : float
        Final clustering objective sum_k 1/2 ||V^k - C_l(k)||^2.
    assignment : AssignmentStats
        Work of the exact assignment steps (flows solved, pricing rounds, cycles).
    """

    groups: list[list[int]]
    clusters: list[list[int]]
    leftover: list[int]
    dropped: list[int]
    iterations: int
    objective: float
    assignment: AssignmentStats = field(default_factory=AssignmentStats)


def icg(
    histograms: np.ndarray,
    m: int,
    rng: np.random.Generator,
    *,
    client_ids: list[int] | None = None,
    max_iter: int = 10,
    normalize: bool = False,
    leftover: str = "drop",
    neighbours: int = 8,
    balance: bool = False,
) -> ICGResult:
    """Inter-Cluster Grouping (FedGSP, Algorithm 2).

    Clusters the K clients' class histograms into L = floor(K/M) clusters of equal size
    s = floor(K/L) (equal-size k-means), then forms M groups, each taking one client
    drawn at random from every cluster, so that every group's summed histogram is close
    to the global one.

    The clustering starts from k-means++ seeds and ``_GREEDY_ROUNDS`` (3) cheap rounds
    of greedy balanced assignment (:func:`greedy_balanced_assignment`) and centroid
    update; then up to ``max_iter`` iterations alternate an exact assignment step, the
    optimum over the full client-cluster network (:func:`equal_size_assignment`,
    warm-started from the previous step), and the centroid update, until the
    assignment no longer changes.

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
        Maximum exact assignment/update iterations (the paper's tau).
    normalize : bool
        Cluster on label proportions instead of raw counts (the paper: counts).
    leftover : str
        ``"drop"`` (the paper): clients outside the one-per-cluster structure (K not
        divisible) sit this round out; ``"distribute"`` (ours): they join groups, at
        most one extra per group per cluster, spread over the groups.
    neighbours : int
        Initial flow arcs per client (its nearest centroids) of the first assignment
        step, and the most a client gets when later steps free it. Only a speed
        setting: every assignment step is optimal over all client-cluster arcs.
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
    norms = np.einsum("ij,ij->i", points, points)
    duplicates = _duplicate_groups(points)
    # k-means++ seeds, then cheap greedy balanced rounds: the exact steps start from
    # centroids of equal-size clusters, much nearer their fixed point (smaller flows).
    seeds = _kmeans_plus_plus(points, norms, n_clusters, rng)
    labels = greedy_balanced_assignment(_distances(points, norms, seeds), size)
    centroids = _cluster_means(points, labels, n_clusters)
    for _ in range(_GREEDY_ROUNDS - 1):
        labels = greedy_balanced_assignment(_distances(points, norms, centroids), size)
        centroids = _cluster_means(points, labels, n_clusters)
    iterations = 0
    prices: np.ndarray | None = None
    stats = AssignmentStats()
    while iterations < max_iter:
        iterations += 1
        # After the first step, the previous step's labels and prices warm-start the next.
        new_labels, prices = _exact_assignment(*_integer_distances(points, norms, centroids),
                                               size, neighbours, labels, prices,
                                               duplicates, stats)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        centroids = _cluster_means(points, labels, n_clusters)
    objective = 0.5 * float(((points - centroids[labels]) ** 2).sum())
    clusters = chosen[np.argsort(labels, kind="stable").reshape(n_clusters, size)]
    drawn = rng.permuted(clusters, axis=1)  # each cluster's members in random order
    table = drawn[:, :m].T  # (M, L): group x cluster
    if balance:
        table = balance_groups(np.asarray(histograms, dtype=np.float64), table)
    extra = np.concatenate([drawn[:, m:].reshape(-1), outside])
    members, owner = table.reshape(-1), np.repeat(np.arange(m), n_clusters)
    dropped = extra[:0]
    if leftover == "distribute":
        members = np.concatenate([members, extra])
        owner = np.concatenate([owner, spread(rng, m, len(extra))])
    else:
        dropped = extra
    # every group in random order: sort by group, then by a random key
    order = np.lexsort((rng.random(len(members)), owner))
    shuffled = [int(ids[c]) for c in members[order].tolist()]
    ends = np.cumsum(np.bincount(owner, minlength=m)).tolist()
    return ICGResult(
        groups=[shuffled[a:b] for a, b in zip([0] + ends[:-1], ends, strict=True)],
        clusters=[[int(ids[c]) for c in row] for row in clusters.tolist()],
        leftover=[int(ids[c]) for c in extra.tolist()],
        dropped=[int(ids[c]) for c in dropped.tolist()],
        iterations=iterations,
        objective=objective,
        assignment=stats,
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


def _distances(points: np.ndarray, norms: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """(N, L) squared distances via the Gram trick, with the points' squared norms given."""
    out = points @ (-2.0 * centres).T
    out += norms[:, None]
    out += np.einsum("ij,ij->i", centres, centres)[None, :]
    return np.maximum(out, 0.0, out=out)


def _kmeans_plus_plus(points: np.ndarray, norms: np.ndarray, k: int,
                      rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeds (D^2 sampling) as :func:`fedgsp_flwr.core.kmeans.kmeans_plus_plus`
    draws them, with the points' norms computed once.
    """
    n = len(points)
    chosen = [int(rng.integers(n))]
    nearest = _distances(points, norms, points[chosen])[:, 0]
    while len(chosen) < k:
        cumulative = np.cumsum(nearest)
        total = cumulative[-1]
        if total > 0:  # what rng.choice(n, p=nearest / total) draws, without its checks
            pick = min(int(np.searchsorted(cumulative, rng.random() * total, side="right")),
                       n - 1)
        else:  # every point equals a chosen one: draw among the others uniformly
            pick = int(rng.choice(np.setdiff1d(np.arange(n), chosen)))
        chosen.append(pick)
        np.minimum(nearest, _distances(points, norms, points[[pick]])[:, 0], out=nearest)
    return points[chosen]


def _cluster_means(points: np.ndarray, labels: np.ndarray, n_clusters: int) -> np.ndarray:
    """Mean of each cluster's points (clusters of equal size)."""
    n = len(points)
    if n * n_clusters <= _ONE_HOT_MEANS:  # one small matrix product
        weights = np.zeros((n_clusters, n))
        weights[labels, np.arange(n)] = n_clusters / n
        return weights @ points
    order = np.argsort(labels, kind="stable")
    return points[order].reshape(n_clusters, -1, points.shape[1]).sum(axis=1) * (n_clusters / n)


def greedy_balanced_assignment(d: np.ndarray, size: int) -> np.ndarray:
    """Fast equal-size assignment by regret-ordered greedy filling (a warm start).

    Clients are taken in decreasing order of regret (their second-best minus best cost)
    and each goes to its nearest cluster that still has room (ties: the lowest index).
    The result is balanced but not cost-optimal; ICG uses it only to place the first
    centroids before the exact steps.

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
    if n_clusters > 1:
        two = np.partition(d, 1, axis=1)[:, :2]
        order = np.argsort(two.min(axis=1) - two.max(axis=1), kind="stable")  # regret
    else:
        order = np.arange(n)
    room = [size] * n_clusters
    labels = np.empty(n, dtype=np.int64)
    start = 0
    while start < n:
        # Cheapest cluster with room (ties: lowest index) for a chunk of clients at once,
        # valid until a cluster fills up; then the rest of the chunk is re-ranked.
        chunk = order[start:start + _GREEDY_CHUNK]
        costs = d[chunk]
        costs[:, np.asarray(room) == 0] = np.inf
        choice = costs.argmin(axis=1)
        taken = 0
        for cluster in choice.tolist():
            if not room[cluster]:
                break
            room[cluster] -= 1
            taken += 1
        labels[chunk[:taken]] = choice[:taken]
        start += taken
    return labels


def equal_size_assignment(
    points: np.ndarray,
    centroids: np.ndarray,
    size: int,
    neighbours: int = 16,
    warm_start: tuple[np.ndarray, np.ndarray | None] | None = None,
    *,
    stats: AssignmentStats | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Assign N = L * size points to L clusters of exactly ``size`` points each,
    minimising the summed squared distance to the centroids (a min-cost flow).

    What "optimal" means: the distances d (float64) are rounded to integer multiples
    of a unit u = D / 2^b, with D >= max(d) and b = 40 unless L or N is huge
    (:func:`_cost_bits`). The result is an exact optimum of that rounded problem over
    the full bipartite network (every point may join every cluster), so its real cost
    exceeds the real optimum by at most N * u. The returned prices p certify it: every
    point's cluster minimises its rounded distance minus p, over all L clusters.

    How: OR-Tools' ``SimpleMinCostFlow`` solves a restricted network (below); then the
    full network is priced through the L-node graph whose arc a -> b costs the cheapest
    move of any point from cluster a to b (all N x L arcs enter it). A balanced
    assignment is optimal exactly when that graph has no negative cycle. Bellman-Ford
    on it either converges, and its distances are the prices, or exposes negative
    cycles, which are cancelled (each lowers the integer cost, so this ends). If they
    persist, a larger restricted network is solved: the points the restricted flow's
    dual potentials price closest to moving are freed, then more points, then more arcs
    per point, up to the full network, whose flow is optimal.

    Restricted networks:

    - cold start (no prices): every point, with arcs to its ``neighbours`` nearest
      centroids and to its ``warm_start`` cluster if given (otherwise the arcs double
      while the network is infeasible);
    - warm start (``(labels, prices)`` of an earlier call over the same points, as in
      ICG's iterations): free are the points with the smallest margins under the old
      prices (twice the share whose margin is negative, at least 1/32), with arcs to
      their cluster and to the clusters within that margin (at most ``neighbours``);
      the other points keep their cluster.

    Identical points share one flow node (supply: their number).

    Parameters
    ----------
    points : np.ndarray
        (N, F) points.
    centroids : np.ndarray
        (L, F) cluster centres.
    size : int
        Points per cluster.
    neighbours : int
        Flow arcs per point in a cold start (its nearest centroids), and the most a
        freed point gets in a warm start. Only a speed setting: the result is optimal
        over all arcs whatever its value.
    warm_start : tuple[np.ndarray, np.ndarray | None] | None
        ``(labels, prices)``: (N,) clusters with exactly ``size`` points each, and (L,)
        prices as returned by an earlier call, or ``None`` (then only the labels are
        used, as one extra arc per point).
    stats : AssignmentStats | None
        Counters to add this call's work to.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        (N,) cluster index per point, and (L,) cluster prices (in distance units).

    Raises
    ------
    ValueError
        If N is not L * size, or ``warm_start`` is malformed.
    RuntimeError
        If OR-Tools fails on a feasible network (it should not).
    """
    n, n_clusters = len(points), len(centroids)
    if n != n_clusters * size or size < 1:
        raise ValueError(f"{n} points cannot fill {n_clusters} clusters of {size}")
    labels = prices = None
    if warm_start is not None:
        labels, prices = warm_start
        labels = np.asarray(labels)
        if labels.shape != (n,) or (prices is not None and np.shape(prices) != (n_clusters,)) \
                or not np.array_equal(np.bincount(labels, minlength=n_clusters),
                                      np.full(n_clusters, size)):
            raise ValueError(f"warm_start must be (labels, prices) putting exactly {size} "
                             f"of the {n} points in each of the {n_clusters} clusters")
    return _exact_assignment(*_integer_costs(squared_distances(points, centroids)), size,
                             neighbours, labels,
                             None if prices is None else np.asarray(prices, float),
                             _duplicate_groups(np.asarray(points)),
                             stats if stats is not None else AssignmentStats())


def _exact_assignment(cost: np.ndarray, unit: float, size: int, neighbours: int,
                      labels: np.ndarray | None, prices: np.ndarray | None,
                      groups: np.ndarray | None,
                      stats: AssignmentStats) -> tuple[np.ndarray, np.ndarray]:
    """:func:`equal_size_assignment` on (N, L) distances rounded to integer multiples of
    ``unit`` (:func:`_integer_costs`), with ``groups`` as :func:`_duplicate_groups`
    returns.
    """
    n, n_clusters = cost.shape
    if n_clusters == 1:
        return np.zeros(n, dtype=np.int64), np.zeros(1)
    width = min(max(neighbours, 1), n_clusters)
    share: float | None = None  # None: the nearest-arcs network of a cold start; inf: all
    if prices is None:
        guess = np.zeros(n_clusters)
        network = _nearest(cost, width, labels)
    else:
        assert labels is not None  # prices come with the labels they priced
        guess = np.rint(prices / unit)
        network, share = _candidates(cost, guess, labels, None, width)
    while True:
        solved = _solve_flow(cost, size, *network, labels, groups, stats)
        if solved is None:  # only a cold start without labels can be infeasible
            if width == n_clusters:
                raise RuntimeError("min-cost flow found no assignment on the full network")
            width = min(2 * width, n_clusters)
            network = _nearest(cost, width, None)
            continue
        labels = solved
        members = np.argsort(labels, kind="stable").reshape(n_clusters, size)
        graph, slot = _cluster_graph(cost, members)
        flow_labels = labels.copy()
        dist = guess
        # A cold network's duals price better than cancelling its many cycles does.
        passes = _CYCLE_PASSES if share is None else 2 * n_clusters + _CYCLE_PASSES
        for _ in range(max(passes, 1)):
            dist, cycles = _bellman_ford(graph, dist)
            if cycles is None:
                return labels, dist * unit
            if not cycles:
                break
            stats.cycles += len(cycles)
            _cancel_cycles(cost, labels, members, graph, slot, cycles)
        # Still improvable: price the full network with the restricted flow's dual
        # potentials (those nearest the old prices) and solve a larger network: more
        # points, then more arcs, then all of them.
        if share == math.inf:
            raise RuntimeError("no certificate for the optimum of the full network")
        stats.pricing_rounds += 1
        guess = _restricted_duals(cost, flow_labels, *network, guess)
        if share is not None and share >= 1:
            if width == n_clusters:
                network, share = (np.arange(n), np.ones((n, n_clusters), dtype=bool)), math.inf
                continue
            width = min(2 * width, n_clusters)
        network, share = _candidates(cost, guess, labels,
                                     None if share is None else _FREE_FACTOR * share, width)


def _cost_bits(n: int, n_clusters: int) -> int:
    """Bits b of the integer costs: 2^b units span the largest distance. Shortest paths
    over the L-node cluster graph (at most 2L + 2 costs summed) stay exact in float64,
    and OR-Tools' cost scaling (costs times the node count) stays within int64.
    """
    return min(_MAX_COST_BITS, 52 - (2 * n_clusters + 2).bit_length(),
               61 - (n + n_clusters + 2).bit_length())


def _integer_costs(d: np.ndarray) -> tuple[np.ndarray, float]:
    """Distances rounded to integer multiples of a unit (float64 holding integers),
    in place: ``d`` is overwritten and returned, with the unit.
    """
    top = float(d.max())
    unit = top / 2.0 ** _cost_bits(*d.shape) if top > 0 else 1.0
    d *= 1.0 / unit
    return np.rint(d, out=d), unit


def _integer_distances(points: np.ndarray, norms: np.ndarray,
                       centres: np.ndarray) -> tuple[np.ndarray, float]:
    """:func:`_integer_costs` of the squared distances (Gram trick), in one pass: the unit
    comes from an upper bound of the largest distance, (max |x| + max |c|)^2.
    """
    centre_norms = np.einsum("ij,ij->i", centres, centres)
    top = (math.sqrt(float(norms.max())) + math.sqrt(float(centre_norms.max()))) ** 2
    unit = top / 2.0 ** _cost_bits(len(points), len(centres)) if top > 0 else 1.0
    cost = points @ (centres * (-2.0 / unit)).T
    cost += norms[:, None] / unit
    cost += centre_norms[None, :] / unit
    return np.rint(cost, out=cost), unit


def _nearest(cost: np.ndarray, width: int,
             labels: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Cold-start network: every point, with arcs to its ``width`` cheapest clusters
    and to its cluster in ``labels``. Returns (points, (N, L) arc mask).
    """
    n, n_clusters = cost.shape
    if width >= n_clusters:
        return np.arange(n), np.ones(cost.shape, dtype=bool)
    arcs = np.zeros(cost.shape, dtype=bool)
    np.put_along_axis(arcs, np.argpartition(cost, width - 1, axis=1)[:, :width], True,
                      axis=1)
    if labels is not None:
        arcs[np.arange(n), labels] = True
    return np.arange(n), arcs


def _candidates(cost: np.ndarray, prices: np.ndarray, labels: np.ndarray,
                share: float | None,
                width: int) -> tuple[tuple[np.ndarray, np.ndarray], float]:
    """Warm-started network: free points and their arcs, the others keep their cluster.

    A point's margin is how much its best other cluster undercuts its own under
    ``prices`` (distance minus price; negative: it would rather move). The ``share``
    of points with the smallest margins is free, with arcs to their own cluster and to
    the clusters within that margin of it (at most ``width``, the cheapest). Without a
    share, it is ``_FREE_FACTOR`` times the share of points that would move (at least
    ``_FIRST_SHARE``). Returns ((free points, their (F, L) arc mask), share).
    """
    n, n_clusters = cost.shape
    rows = np.arange(n)
    reduced = cost - prices
    own = reduced[rows, labels]
    reduced[rows, labels] = np.inf
    margin = reduced.min(axis=1) - own
    if share is None:
        share = max(_FIRST_SHARE, _FREE_FACTOR * float(np.count_nonzero(margin < 0)) / n)
    share = min(share, 1.0)
    k = math.ceil(share * n) - 1
    threshold = max(float(np.partition(margin, k)[k]), 0.0)
    free = np.flatnonzero(margin <= threshold)
    gap = reduced[free]
    gap -= own[free, None]
    arcs = gap <= threshold
    crowded = np.flatnonzero(np.count_nonzero(arcs, axis=1) > width) if width < n_clusters \
        else free[:0]
    if len(crowded):  # keep their `width` cheapest
        cheapest = np.zeros((len(crowded), n_clusters), dtype=bool)
        np.put_along_axis(cheapest, np.argpartition(gap[crowded], width - 1, axis=1)[:, :width],
                          True, axis=1)
        arcs[crowded] &= cheapest
    arcs[np.arange(len(free)), labels[free]] = True
    return (free, arcs), share


def _solve_flow(cost: np.ndarray, size: int, rows: np.ndarray, arcs: np.ndarray,
                labels: np.ndarray | None, groups: np.ndarray | None,
                stats: AssignmentStats) -> np.ndarray | None:
    """Min-cost flow of the points ``rows`` over their ``arcs`` ((len(rows), L) mask);
    the other points keep their cluster in ``labels``. ``None`` if no flow is feasible.

    ``labels`` (balanced) or ``None`` (then ``rows`` are all points). Free points of one
    duplicate group (``groups``: equal ids for identical points, hence identical costs)
    form one node with their number as supply and the union of their arcs; its flow is
    then shared out, members keeping their cluster where the flow allows.
    """
    n, n_clusters = cost.shape
    if labels is None:
        demand = np.full(n_clusters, size, dtype=np.int64)
        out = np.empty(n, np.int64)
    else:  # every cluster holds `size` points: the free ones leave exactly this room
        demand = np.bincount(labels[rows], minlength=n_clusters).astype(np.int64, copy=False)
        out = np.array(labels, dtype=np.int64)
    if not len(rows):
        return out
    node_of = None
    if groups is not None:
        ids, first, node_of, supply = np.unique(groups[rows], return_index=True,
                                                return_inverse=True, return_counts=True)
        supply = supply.astype(np.int64, copy=False)
        if len(ids) == len(rows):
            node_of = None
    if node_of is None:
        tails, heads = np.nonzero(arcs)
        supply = np.ones(len(rows), np.int64)
        arc_cost = cost[rows[tails], heads]
    else:
        order = np.argsort(node_of, kind="stable")
        starts = np.concatenate([[0], np.cumsum(supply)[:-1]])
        tails, heads = np.nonzero(np.logical_or.reduceat(arcs[order], starts, axis=0))
        arc_cost = cost[rows[first[tails]], heads]
    stats.flows += 1
    stats.flow_points += len(supply)
    stats.flow_arcs += len(tails)
    # Imported here, not at module level: every ClientApp process loads this module
    # (through the run config's choices) and OR-Tools costs it ~0.3 s.
    from ortools.graph.python import min_cost_flow

    flow = min_cost_flow.SimpleMinCostFlow()
    handles = flow.add_arcs_with_capacity_and_unit_cost(
        tails, heads + len(supply), supply[tails], arc_cost.astype(np.int64))
    flow.set_nodes_supplies(np.arange(len(supply) + n_clusters),
                            np.concatenate([supply, -demand]))
    status = flow.solve()
    if status == flow.INFEASIBLE:
        return None
    if status != flow.OPTIMAL:
        raise RuntimeError(f"min-cost flow failed: {status}")
    amounts = flow.flows(handles)
    if node_of is None:
        used = amounts > 0
        out[rows[tails[used]]] = heads[used]
        return out
    # share each group's flow out: first its members keep their clusters, then the
    # rest fill the remaining amounts
    target = np.zeros((len(supply), n_clusters), dtype=np.int64)
    target[tails, heads] = amounts
    key = node_of * n_clusters + (out[rows] if labels is not None else 0)
    keep = np.zeros(len(rows), dtype=bool)
    if labels is not None:
        order = np.argsort(key, kind="stable")
        ranked = key[order]
        rank = np.arange(len(order)) - np.searchsorted(ranked, ranked)
        keep[order] = rank < target.reshape(-1)[ranked]
    kept = np.bincount(key[keep], minlength=target.size).reshape(target.shape)
    movers = np.flatnonzero(~keep)
    movers = movers[np.argsort(node_of[movers], kind="stable")]
    out[rows[movers]] = np.repeat(np.tile(np.arange(n_clusters), len(supply)),
                                  (target - kept).reshape(-1))
    return out


def _duplicate_groups(points: np.ndarray) -> np.ndarray | None:
    """(N,) equal ids for identical rows of ``points`` (``None`` if all differ).

    Rows are sorted by a fixed projection; neighbours in that order with equal rows
    share an id (identical rows the projection cannot tell apart from others may get
    separate ids, which only costs speed).
    """
    n = len(points)
    if n < 2:
        return None
    key = points @ np.sqrt(np.arange(2.0, points.shape[1] + 2.0))
    order = np.argsort(key, kind="stable")
    ranked = points[order]
    same = (ranked[1:] == ranked[:-1]).all(axis=1)
    if not same.any():
        return None
    groups = np.empty(n, dtype=np.int64)
    groups[order] = np.concatenate([[0], np.cumsum(~same)])
    return groups


def _cluster_graph(cost: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest moves between clusters: ``graph[b, a]`` costs moving a point from
    cluster a to b (heads in rows, for Bellman-Ford), ``slot[a, b]`` is that point's
    position in ``members[a]``. ``members`` is (L, size): the points of each cluster.
    """
    n_clusters, size = members.shape
    block = cost[members.reshape(-1)]
    block -= block[np.arange(block.shape[0]), np.repeat(np.arange(n_clusters), size)][:, None]
    block = block.reshape(n_clusters, size, n_clusters)
    slot = block.argmin(axis=1)
    clusters = np.arange(n_clusters)
    return block[clusters[:, None], slot, clusters[None, :]].T.copy(), slot


def _bellman_ford(graph: np.ndarray,
                  dist: np.ndarray) -> tuple[np.ndarray, list[list[int]] | None]:
    """Shortest paths on a dense graph (``graph[b, a]``: arc a -> b) from a virtual
    source with arcs of cost ``dist``.

    Returns the distances and ``None`` if they converge (then ``dist[b] <= dist[a] +
    graph[b, a]`` for every arc: they are potentials). Otherwise some negative cycles
    (node lists in arc order; vertex-disjoint), or none if none showed within L + 1
    rounds (there is one, but the predecessor graph had not closed it yet).
    """
    n_nodes = len(graph)
    nodes = np.arange(n_nodes)
    pred = np.full(n_nodes, -1)
    for rnd in range(1, n_nodes + 2):
        through = graph + dist
        best = through.argmin(axis=1)
        length = through[nodes, best]
        shorter = length < dist
        if not shorter.any():
            return dist, None
        dist = np.where(shorter, length, dist)
        pred = np.where(shorter, best, pred)
        if rnd % _CYCLE_CHECK == 0 or rnd == n_nodes + 1:
            cycles = _predecessor_cycles(pred, graph)
            if cycles:
                return dist, cycles
    return dist, []


def _predecessor_cycles(pred: np.ndarray, graph: np.ndarray) -> list[list[int]]:
    """The cycles of a predecessor graph (``-1``: none), each in arc order.

    Every cycle that Bellman-Ford's predecessor graph closes is negative (a node's
    distance is at least its predecessor's plus the arc, strictly for the node that
    was lowered last); the weight is checked anyway.
    """
    parent = pred.tolist()
    walk = [0] * len(parent)  # the walk that first reached each node, from 1
    cycles: list[list[int]] = []
    for start in range(len(parent)):
        path = []
        node = start
        while node >= 0 and not walk[node]:
            walk[node] = start + 1
            path.append(node)
            node = parent[node]
        if node >= 0 and walk[node] == start + 1:  # this walk closed a cycle
            cycle = path[path.index(node):][::-1]  # reversed: pred[v] -> v is an arc
            if graph[cycle[1:] + cycle[:1], cycle].sum() < 0:
                cycles.append(cycle)
    return cycles


def _cancel_cycles(cost: np.ndarray, labels: np.ndarray, members: np.ndarray,
                   graph: np.ndarray, slot: np.ndarray, cycles: list[list[int]]) -> None:
    """Move one point along every arc of each (vertex-disjoint) negative cycle: the
    cheapest mover from a to b joins b, and so on around; sizes are unchanged. Updates
    ``labels``, ``members``, ``graph`` and ``slot`` (see :func:`_cluster_graph`) in place.
    """
    tails: list[int] = []
    heads: list[int] = []
    previous: list[int] = []  # the arc whose mover takes the freed slot
    for cycle in cycles:
        start = len(tails)
        tails += cycle
        heads += cycle[1:] + cycle[:1]
        previous += [start + len(cycle) - 1] + list(range(start, start + len(cycle) - 1))
    tail, head = np.array(tails), np.array(heads)
    edges = np.arange(len(tails))
    slots = slot[tail, head]
    movers = members[tail, slots]
    incoming = movers[previous]
    members[tail, slots] = incoming
    labels[movers] = head
    if members.size <= _SMALL_CLUSTER_GRAPH:  # fewer operations: recompute the rows
        block = cost[members[tail]]  # (E, size, L)
        block -= block[edges, :, tail][:, :, None]
        slot[tail] = block.argmin(axis=1)
        graph[:, tail] = block.min(axis=1).T
        return
    # A tail cluster's cheapest moves change where the mover was the cheapest (those
    # are recomputed over its members) or where the incoming point is cheaper.
    stale = slot[tail] == slots[:, None]
    fresh = cost[incoming] - cost[incoming, tail][:, None]
    moves = graph[:, tail].T
    better = fresh < moves
    moves = np.where(better, fresh, moves)
    positions = np.where(better, slots[:, None], slot[tail])
    arc, col = np.nonzero(stale)
    block = members[tail[arc]]
    recomputed = cost[block, col[:, None]] - cost[block, tail[arc][:, None]]
    cheapest = recomputed.argmin(axis=1)
    moves[arc, col] = recomputed[np.arange(len(arc)), cheapest]
    positions[arc, col] = cheapest
    moves[edges, tail] = 0.0
    graph[:, tail] = moves.T
    slot[tail] = positions


def _restricted_duals(cost: np.ndarray, labels: np.ndarray, rows: np.ndarray,
                      arcs: np.ndarray, guess: np.ndarray) -> np.ndarray:
    """Dual potentials of the restricted flow's optimum ``labels`` over its network
    (points ``rows``, ``arcs`` mask): shortest paths on its cluster graph, from
    ``guess`` (so clusters that the restricted network leaves loose keep their old
    price).
    """
    n_clusters = cost.shape[1]
    tails, heads = np.nonzero(arcs)
    points = rows[tails]
    own = labels[points]
    moves = heads != own
    points, heads, own = points[moves], heads[moves], own[moves]
    graph = np.full((n_clusters, n_clusters), np.inf)
    np.fill_diagonal(graph, 0.0)
    np.minimum.at(graph, (heads, own), cost[points, heads] - cost[points, own])
    dist, cycles = _bellman_ford(graph, guess)
    if cycles is not None:
        raise RuntimeError("the restricted min-cost flow is not optimal")
    return dist


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


def form_groups(
    nodes: Sequence[int],
    histograms: Mapping[int, np.ndarray],
    m: int,
    rng: np.random.Generator,
    *,
    grouping: str = "icg",
    max_iter: int = 10,
    normalize: bool = False,
    leftover: str = "drop",
    balance: bool = False,
) -> list[list[int]]:
    """Group the clients into at most ``m`` non-empty groups.

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
    rng : np.random.Generator
        Source of every random choice.
    grouping, max_iter, normalize, leftover, balance
        ``icg`` or ``random``, and :func:`icg`'s options (defaults: the paper's).
    """
    with_hist = [n for n in nodes if n in histograms]
    if grouping != "icg" or not with_hist:
        return random_groups(list(nodes), m, rng)
    result = icg(np.stack([histograms[n] for n in with_hist]), min(m, len(with_hist)),
                 rng, client_ids=with_hist, max_iter=max_iter, normalize=normalize,
                 leftover=leftover, balance=balance)
    groups = result.groups + [[] for _ in range(m - len(result.groups))]
    rest = [n for n in nodes if n not in histograms]
    for i, g in zip(rng.permutation(len(rest)), spread(rng, m, len(rest)), strict=True):
        groups[g].append(rest[i])
    return [g for g in groups if g]


def sampled_group_count(num_groups: int, kappa: float) -> int:
    """``max(1, floor(kappa * num_groups + 0.5))``: kappa M rounded half up, at least one
    (Python's ``round`` rounds half to even: 0.3 x 15 = 4.5 would give 4). Computed on
    kappa as written (``Fraction(repr(kappa))``): in floats 0.7 x 45 is 31.4999...
    """
    return max(1, math.floor(Fraction(repr(kappa)) * num_groups + Fraction(1, 2)))


def sample_groups(num_groups: int, kappa: float, rng: np.random.Generator) -> list[int]:
    """The indices of :func:`sampled_group_count` groups drawn at random, in increasing
    order."""
    return sorted(int(i) for i in rng.choice(num_groups, sampled_group_count(num_groups, kappa),
                                             replace=False))


def shuffled(group: Sequence[int], rng: np.random.Generator) -> list[int]:
    """``group`` in a random training order."""
    return [group[j] for j in rng.permutation(len(group))]


def join_smallest(groups: list[list[int]], present: set[int], new: Sequence[int]) -> None:
    """Append each of ``new`` (in order) to the group with the fewest ``present``
    members (ties: the first such group); ``groups`` must not be empty."""
    sizes = [sum(n in present for n in g) for g in groups]
    for node in new:
        smallest = int(np.argmin(sizes))
        groups[smallest].append(node)
        sizes[smallest] += 1


def plan_groups(
    nodes: Sequence[int],
    histograms: Mapping[int, np.ndarray],
    m: int,
    kappa: float,
    rng: np.random.Generator,
    **grouping: Any,
) -> GroupPlan:
    """Group the clients into ``m`` groups (:func:`form_groups`, with ``grouping``'s
    options), sample ``max(1, floor(kappa * M + 0.5))`` of them and shuffle each sampled
    group's order (FedGSP's STP round, Algorithm 1).

    Returns
    -------
    GroupPlan
        The groups and the chains.
    """
    groups = form_groups(nodes, histograms, m, rng, **grouping)
    return GroupPlan(groups, [shuffled(groups[i], rng)
                              for i in sample_groups(len(groups), kappa, rng)])


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
