"""Equal-size (balanced) k-means steps: seeding, assignment, centroid update.

The entry points of ICG's equal-size clustering: k-means++ seeds, the greedy balanced
assignment (a warm start), the exact :func:`equal_size_assignment` (solved by
:mod:`fedgsp_flwr.core.min_cost_flow`), cluster means and the optimality check
:func:`assignment_prices`. Pure numpy (OR-Tools through the flow solver).
"""

from __future__ import annotations

import numpy as np

from .kmeans import squared_distances
from .min_cost_flow import AssignmentStats, _duplicate_groups, _exact_assignment, _integer_costs

_ONE_HOT_MEANS = 2**15  # below N * L, cluster means by a one-hot matrix product
_GREEDY_CHUNK = 256  # clients the greedy assignment ranks clusters for at once


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
