"""Exact equal-size assignment by min-cost flow, and the cycle cancelling that prices it.

The machinery behind :func:`fedgsp_flwr.core.equal_size.equal_size_assignment`:
distances rounded to integer costs, restricted networks (nearest arcs, warm-started
candidates) solved by OR-Tools' ``SimpleMinCostFlow``, Bellman-Ford on the L-node
cluster graph, negative-cycle cancelling and the restricted flow's dual prices.
Pure numpy and OR-Tools (imported lazily).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_MAX_COST_BITS = 40  # distances are rounded to multiples of D / 2^40, D >= max(d)
_FIRST_SHARE = 1 / 32  # warm starts free at least this share of the points
_FREE_FACTOR = 2  # freed share per point that would move; growth per pricing round
_CYCLE_PASSES = 8  # cycle-cancelling passes after a cold flow (2 L more after a warm one)
_CYCLE_CHECK = 2  # Bellman-Ford rounds between looks for negative cycles
_SMALL_CLUSTER_GRAPH = 4096  # up to N points, cycle cancelling recomputes whole rows


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
