"""User-edge assignment for hierarchical FL: minimise the edges' distribution distance.

Pure numpy and OR-Tools; no Flower imports. See docs/algorithms.md#hierfl and Mhaisen et
al., "Optimal User-Edge Assignment in Hierarchical Federated Learning".

Users hold class counts V_n (rows of ``counts``); edge e gets D_e = sum of its users'
counts, n_e = |D_e|; T is the total and P = T / n. The objective is the weighted
distance of every edge's class distribution to the global one,

    J(X) = sum_e (n_e / n) ||D_e / n_e - P||_1 = sum_e ||n D_e - n_e T||_1 / n^2,

which is linear in the assignment after an epigraph step: an exact MILP.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ortools.graph.python import max_flow, min_cost_flow

POLICIES = ("original", "random", "heuristic", "greedy", "equal-size", "optimal")
# Work-array sizes (float64 elements) of the vectorised searches, to bound memory.
_SWAP_CHUNK = 1 << 18
_BLOCK_CHUNK = 1 << 21


@dataclass(frozen=True)
class AssignmentProblem:
    """Inputs of the user-edge assignment.

    Attributes
    ----------
    counts : np.ndarray
        (N, F) non-negative integer class counts, one row per user.
    reach : np.ndarray
        (E, N) booleans: ``reach[e, n]`` if user n is in range of edge e.
    capacity : np.ndarray | None
        (E,) maximum number of users per edge, or ``None`` for no limit.
    """

    counts: np.ndarray
    reach: np.ndarray
    capacity: np.ndarray | None = None

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts)
        reach = np.asarray(self.reach, dtype=bool)
        if counts.ndim != 2 or len(counts) == 0:
            raise ValueError(f"counts must be a non-empty (N, F) array, got {counts.shape}")
        if not np.issubdtype(counts.dtype, np.integer) and not np.array_equal(
                counts, np.round(counts)):
            raise ValueError("counts must be integer class counts")
        if (counts < 0).any():
            raise ValueError("counts must be non-negative")
        if reach.ndim != 2 or reach.shape[1] != len(counts) or reach.shape[0] == 0:
            raise ValueError(f"reach must be an (E, N={len(counts)}) array, got {reach.shape}")
        object.__setattr__(self, "counts", counts.astype(np.int64))
        object.__setattr__(self, "reach", reach)
        if self.capacity is not None:
            cap = np.asarray(self.capacity)
            if cap.shape != (reach.shape[0],) or (cap < 0).any():
                raise ValueError(f"capacity must be {reach.shape[0]} non-negative user "
                                 f"counts, got {cap.tolist()}")
            object.__setattr__(self, "capacity", cap.astype(np.int64))
        stranded = np.flatnonzero(~reach.any(axis=0))
        if len(stranded):
            raise ValueError(f"users {_first(stranded)} reach no edge")
        self._check_capacity()

    @property
    def num_users(self) -> int:
        """N."""
        return len(self.counts)

    @property
    def num_edges(self) -> int:
        """E."""
        return len(self.reach)

    def check(self, assignment: np.ndarray) -> np.ndarray:
        """Validate an assignment: one reachable edge per user, capacities respected.

        Returns
        -------
        np.ndarray
            The assignment as an (N,) int64 array.

        Raises
        ------
        ValueError
            Naming the offending users or edges.
        """
        x = np.asarray(assignment)
        if x.shape != (self.num_users,) or not np.issubdtype(x.dtype, np.integer):
            raise ValueError(f"an assignment is {self.num_users} edge indices, got "
                             f"{x.dtype}{list(x.shape)}")
        x = x.astype(np.int64)
        if ((x < 0) | (x >= self.num_edges)).any():
            raise ValueError(f"users {_first(np.flatnonzero((x < 0) | (x >= self.num_edges)))}"
                             f" have no edge in [0, {self.num_edges})")
        unreachable = np.flatnonzero(~self.reach[x, np.arange(self.num_users)])
        if len(unreachable):
            raise ValueError(f"users {_first(unreachable)} are assigned to edges out of range")
        if self.capacity is not None:
            over = np.flatnonzero(np.bincount(x, minlength=self.num_edges) > self.capacity)
            if len(over):
                raise ValueError(f"edges {over.tolist()} exceed their capacity")
        return x

    def _check_capacity(self) -> None:
        """Raise unless the capacities admit an assignment, naming a set of users whose
        reachable edges cannot hold them all (a violation of Hall's condition).
        """
        if self.capacity is None:
            return
        n_users, n_edges = self.num_users, self.num_edges
        edges_idx, users_idx = np.nonzero(self.reach)
        source, sink = n_users + n_edges, n_users + n_edges + 1
        flow = max_flow.SimpleMaxFlow()
        arcs = flow.add_arcs_with_capacity(
            users_idx.astype(np.int64), edges_idx.astype(np.int64) + n_users,
            np.ones(len(users_idx), np.int64))
        flow.add_arcs_with_capacity(np.full(n_users, source, np.int64),
                                    np.arange(n_users, dtype=np.int64),
                                    np.ones(n_users, np.int64))
        flow.add_arcs_with_capacity(np.arange(n_edges, dtype=np.int64) + n_users,
                                    np.full(n_edges, sink, np.int64), self.capacity)
        flow.solve(source, sink)
        if flow.optimal_flow() == n_users:
            return
        used = flow.flows(arcs) > 0
        matched = np.full(n_users, -1)
        matched[users_idx[used]] = edges_idx[used]
        # From an unplaced user, follow "could go to edge" and "edge holds user": every
        # edge reached is full (no augmenting path), so the users reached outnumber the
        # capacity of the edges they reach.
        users = {int(np.flatnonzero(matched < 0)[0])}
        edges: set[int] = set()
        frontier = list(users)
        while frontier:
            u = frontier.pop()
            for e in np.flatnonzero(self.reach[:, u]).tolist():
                if e not in edges:
                    edges.add(e)
                    for w in np.flatnonzero(matched == e).tolist():
                        if w not in users:
                            users.add(w)
                            frontier.append(w)
        edge_list = sorted(edges)
        raise ValueError(
            f"edge capacities too small: users {_first(np.array(sorted(users)))} reach only "
            f"edges {edge_list}, whose capacities {self.capacity[edge_list].tolist()} hold "
            f"{int(self.capacity[edge_list].sum())} users, not {len(users)}")


@dataclass(frozen=True)
class AssignmentResult:
    """An assignment and how it was found.

    Attributes
    ----------
    assignment : np.ndarray
        (N,) edge index per user.
    objective : float
        J of the assignment.
    bound : float | None
        A proven lower bound on J (``optimal``), else ``None``.
    status : str
        ``optimal`` (proven), ``feasible`` (solver stopped by its time limit) or
        ``heuristic``.
    seconds : float
        Wall time.
    gap : float | None
        The certified optimality gap (J - bound) / J, in [0, 1] (0 when J = 0), with
        ``bound``; else ``None``.
    bound_source : str | None
        Where ``bound`` comes from: ``"cp-sat"`` is CP-SAT's proven objective bound on
        the exact MILP (its LP relaxation, tightened by presolve, cuts and search).
    """

    assignment: np.ndarray
    objective: float
    bound: float | None
    status: str
    seconds: float
    gap: float | None = None
    bound_source: str | None = None


def objective(counts: np.ndarray, assignment: np.ndarray,
              num_edges: int) -> tuple[float, np.ndarray]:
    """The distribution distance J of an assignment and its per-edge terms.

    Parameters
    ----------
    counts : np.ndarray
        (N, F) class counts.
    assignment : np.ndarray
        (N,) edge per user.
    num_edges : int
        E.

    Returns
    -------
    tuple[float, np.ndarray]
        J and the (E,) terms (n_e / n) ||D_e / n_e - P||_1 (0 for an empty edge).
    """
    v = np.asarray(counts, dtype=np.float64)
    edge_counts = np.zeros((num_edges, v.shape[1]))
    np.add.at(edge_counts, np.asarray(assignment), v)
    total = v.sum(axis=0)
    n = total.sum()
    if n == 0:
        return 0.0, np.zeros(num_edges)
    sizes = edge_counts.sum(axis=1, keepdims=True)
    terms = np.abs(n * edge_counts - sizes * total).sum(axis=1) / n**2
    return float(terms.sum()), terms


def brute_force(problem: AssignmentProblem) -> tuple[float, np.ndarray]:
    """The exact optimum by enumeration (small instances only: tests and checks).

    Raises
    ------
    ValueError
        If there are more than 2 million assignments.
    """
    options = [np.flatnonzero(problem.reach[:, n]) for n in range(problem.num_users)]
    total = int(np.prod([len(o) for o in options], dtype=np.float64))
    if total > 2_000_000:
        raise ValueError(f"{total} assignments is too many to enumerate")
    grids = np.stack([g.reshape(-1) for g in np.meshgrid(*options, indexing="ij")], axis=1)
    v = problem.counts.astype(np.float64)
    t = v.sum(axis=0)
    n = t.sum()
    best, best_x = np.inf, grids[0]
    for chunk in np.array_split(grids, max(1, len(grids) // 20_000)):
        onehot = np.zeros((len(chunk), problem.num_edges, problem.num_users))
        rows = np.repeat(np.arange(len(chunk)), problem.num_users)
        onehot[rows, chunk.reshape(-1), np.tile(np.arange(problem.num_users), len(chunk))] = 1
        if problem.capacity is not None:
            ok = (onehot.sum(axis=2) <= problem.capacity).all(axis=1)
        else:
            ok = np.ones(len(chunk), dtype=bool)
        d = onehot @ v  # (B, E, F)
        j = np.abs(n * d - d.sum(axis=2, keepdims=True) * t).sum(axis=(1, 2)) / n**2
        j[~ok] = np.inf
        if j.min() < best:
            best, best_x = float(j.min()), chunk[int(j.argmin())]
    return best, best_x.astype(np.int64)


def _first(ids: np.ndarray, limit: int = 10) -> str:
    """A short list of ids for error messages."""
    shown = [int(i) for i in ids[:limit]]
    return str(shown)[:-1] + (", ...]" if len(ids) > limit else "]")


def _closest_feasible(problem: AssignmentProblem,
                      preferred: np.ndarray | None) -> np.ndarray | None:
    """A capacity-feasible assignment moving as few users as possible from ``preferred``
    (a min-cost flow; ``None`` if the capacities admit no assignment at all).
    """
    n_users, n_edges = problem.num_users, problem.num_edges
    edges_idx, users_idx = np.nonzero(problem.reach)
    costs = (np.ones(len(users_idx), np.int64) if preferred is None
             else (preferred[users_idx] != edges_idx).astype(np.int64))
    sink = n_users + n_edges
    cap = (problem.capacity if problem.capacity is not None
           else np.full(n_edges, n_users, np.int64))
    flow = min_cost_flow.SimpleMinCostFlow()
    arcs = flow.add_arcs_with_capacity_and_unit_cost(
        users_idx.astype(np.int64), edges_idx.astype(np.int64) + n_users,
        np.ones(len(users_idx), np.int64), costs)
    flow.add_arcs_with_capacity_and_unit_cost(
        np.arange(n_edges, dtype=np.int64) + n_users, np.full(n_edges, sink, np.int64),
        np.asarray(cap, np.int64), np.zeros(n_edges, np.int64))
    supplies = np.concatenate([np.ones(n_users, np.int64), np.zeros(n_edges, np.int64),
                               [-n_users]])
    flow.set_nodes_supplies(np.arange(sink + 1), supplies)
    if flow.solve() != flow.OPTIMAL:
        return None
    used = flow.flows(arcs) > 0
    out = np.empty(n_users, np.int64)
    out[users_idx[used]] = edges_idx[used]
    return out


def assign(
    problem: AssignmentProblem,
    policy: str,
    rng: np.random.Generator,
    *,
    original: np.ndarray | None = None,
    hint: np.ndarray | None = None,
    greedy_hint: bool = True,
    time_limit: float = 10.0,
    workers: int = 2,
    search_time: float | None = None,
    similar_share: float = 0.1,
) -> AssignmentResult:
    """Assign every user to one reachable edge with the given policy.

    Parameters
    ----------
    problem : AssignmentProblem
        Counts, reachability, capacities.
    policy : str
        ``original`` (``original`` as given), ``random`` (a uniformly random reachable
        edge per user), ``heuristic`` (the paper's Algorithm 1), ``greedy`` (Algorithm
        1 with each remainder user placed where it lowers J most, then a local search of
        moves and swaps, then of ejection chains: :func:`local_search` and
        :func:`chain_search`), ``equal-size`` (the paper's linearisation, which assumes equal
        edge sizes, solved with CP-SAT) or ``optimal`` (the exact MILP with CP-SAT).
    rng : np.random.Generator
        Randomness of ``random`` and the solvers' seeds.
    original : np.ndarray | None
        The given assignment of ``original``.
    hint : np.ndarray | None
        A starting assignment for the CP-SAT policies.
    greedy_hint : bool
        Without ``hint``, start ``optimal`` from ``greedy``'s assignment.
    time_limit : float
        CP-SAT's time limit in seconds.
    workers : int
        CP-SAT's workers.
    search_time : float | None
        Optional time cap of ``greedy``'s local search in seconds; ``None`` runs it to
        convergence, which keeps the result a function of the seed alone.
    similar_share : float
        Users are "similar" (one group of Algorithm 1) when they reach the same edges
        and hold the same classes, counting the classes with at least this share of a
        user's examples.

    Returns
    -------
    AssignmentResult
        A capacity- and reachability-respecting assignment with its objective; for
        ``optimal`` also CP-SAT's proven lower bound and the certified gap.

    Raises
    ------
    ValueError
        On an unknown policy, or a missing or invalid ``original``.
    """
    if policy not in POLICIES:
        raise ValueError(f"Unknown assignment policy '{policy}'. Choose one of {POLICIES}.")
    started = time.perf_counter()
    bound: float | None = None
    gap: float | None = None
    status = "heuristic"
    if policy == "original":
        if original is None:
            raise ValueError("policy 'original' needs the original assignment")
        x = problem.check(original)
    elif policy == "random":
        x = np.array([rng.choice(np.flatnonzero(problem.reach[:, n]))
                      for n in range(problem.num_users)], dtype=np.int64)
    elif policy in ("heuristic", "greedy"):
        x = _equal_split(problem, similar_share, greedy=policy == "greedy")
    if policy in ("random", "heuristic", "greedy"):
        x = _fit_capacity(problem, x)
    if policy == "greedy":
        searched = time.perf_counter()
        x = local_search(problem, x, search_time)
        x = chain_search(problem, x, None if search_time is None else max(
            0.0, search_time - (time.perf_counter() - searched)))
    if policy in ("equal-size", "optimal"):
        if hint is None and policy == "optimal" and greedy_hint:
            hint = assign(problem, "greedy", rng, search_time=search_time,
                          similar_share=similar_share).assignment
        x, bound, status, gap = _cp_sat(problem, policy == "equal-size", hint, time_limit,
                                        workers, int(rng.integers(2**31)))
    x = problem.check(x)
    value, _ = objective(problem.counts, x, problem.num_edges)
    return AssignmentResult(x, value, bound, status, time.perf_counter() - started, gap,
                            None if bound is None else "cp-sat")


def similar_groups(problem: AssignmentProblem, share: float = 0.1) -> list[np.ndarray]:
    """Groups of similar users: the same reachable edges and the same classes holding at
    least ``share`` of their examples. Sorted users; groups in a deterministic order.
    """
    counts = problem.counts.astype(np.float64)
    totals = np.maximum(counts.sum(axis=1, keepdims=True), 1)
    classes = counts >= share * totals
    keys = np.concatenate([problem.reach.T, classes], axis=1)
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    return [np.flatnonzero(inverse.reshape(-1) == g) for g in range(inverse.max() + 1)]


def _equal_split(problem: AssignmentProblem, share: float, greedy: bool) -> np.ndarray:
    """Algorithm 1: each group of similar users split equally over its reachable edges.

    A group's remainder (size not divisible by its number of edges) goes one user per
    edge to the edges holding the fewest examples so far (the paper: "to a remaining
    edge"), or with ``greedy`` each to the reachable edge where it lowers J most.
    """
    x = np.full(problem.num_users, -1, dtype=np.int64)
    v = problem.counts.astype(np.float64)
    edge_counts = np.zeros((problem.num_edges, v.shape[1]))
    remainders = []
    for users in similar_groups(problem, share):
        edges = np.flatnonzero(problem.reach[:, users[0]])
        base = len(users) // len(edges)
        for i, e in enumerate(edges.tolist()):
            members = users[i * base:(i + 1) * base]
            x[members] = e
            edge_counts[e] += v[members].sum(axis=0)
        remainders.append((users[base * len(edges):], edges))
    total = v.sum(axis=0)
    for rest, edges in remainders:
        for u in rest[np.argsort(-v[rest].sum(axis=1), kind="stable")] if greedy else rest:
            if greedy:
                after = edge_counts[edges] + v[u]
                before = edge_counts[edges]
                gain = (_edge_cost(after, total) - _edge_cost(before, total))
                e = int(edges[np.argmin(gain)])
            else:
                taken = set(x[rest][x[rest] >= 0].tolist())
                free = [f for f in edges if f not in taken] or list(edges)
                e = int(min(free, key=lambda f: (edge_counts[f].sum(), f)))
            x[u] = e
            edge_counts[e] += v[u]
    return x


def _edge_cost(edge_counts: np.ndarray, total: np.ndarray) -> np.ndarray:
    """||n D_e - n_e T||_1 per row of ``edge_counts`` (J times n^2, per edge)."""
    n = total.sum()
    return np.abs(n * edge_counts - edge_counts.sum(axis=-1, keepdims=True) * total).sum(
        axis=-1)


def _fit_capacity(problem: AssignmentProblem, x: np.ndarray) -> np.ndarray:
    """``x`` if it respects the capacities, else the feasible assignment closest to it."""
    if problem.capacity is None or (
            np.bincount(x, minlength=problem.num_edges) <= problem.capacity).all():
        return x
    fitted = _closest_feasible(problem, x)
    if fitted is None:  # AssignmentProblem checked the capacities: should not happen
        raise RuntimeError("no capacity-feasible assignment found")
    return fitted


def local_search(problem: AssignmentProblem, x: np.ndarray,
                 seconds: float | None = None) -> np.ndarray:
    """Improve an assignment by single moves and pairwise swaps until neither lowers J.

    Each step takes the best single move (a user to another reachable edge with room)
    if one improves J; otherwise the best swap between the first pair of edges, in a
    rotating order, that has an improving one. Deterministic; ``seconds`` optionally
    caps the time (then the result depends on the machine's speed). Reachability and
    capacities stay respected.

    Parameters
    ----------
    problem : AssignmentProblem
        Counts, reachability, capacities.
    x : np.ndarray
        (N,) starting assignment (feasible).
    seconds : float | None
        Optional time cap.

    Returns
    -------
    np.ndarray
        The improved (N,) assignment.

    Notes
    -----
    Only the candidate moves to reachable edges are scored, and after a move only the
    scores involving the two edges it changed are recomputed. Every score is an integer
    (J times n^2) held exactly in float64, so ties break as in a full recomputation
    (``tests/core/test_edge_assignment.py`` checks step-for-step equality with one).
    """
    deadline = None if seconds is None else time.perf_counter() + seconds
    state = _SearchState(problem, x)
    x, g, resid, cost = state.x, state.g, state.resid, state.cost
    n_edges = problem.num_edges
    cu, ce = state.cand_user, state.cand_edge
    gc = g[cu]
    cap = problem.capacity
    sizes = np.bincount(x, minlength=n_edges)
    leave = np.abs(resid[x] - g).sum(axis=1) - cost[x]
    join = np.abs(resid[ce] + gc).sum(axis=1) - cost[ce]
    n_pairs = n_edges * (n_edges - 1) // 2
    start = 0
    while deadline is None or time.perf_counter() < deadline:
        delta = leave[cu] + join
        blocked = ce == x[cu]
        if cap is not None:
            blocked |= (sizes >= cap)[ce]
        delta[blocked] = np.inf
        best = int(np.argmin(delta))  # the first (user, edge) on ties, as row-major
        if delta[best] < -state.tol:
            changed = state.apply([(int(cu[best]), int(ce[best]))])
        else:
            swap = _first_swap(state, start)
            if swap is None:
                break
            u, w, pair = swap
            start = (pair + 1) % n_pairs
            changed = state.apply([(u, int(x[w])), (w, int(x[u]))])
        sizes[changed] = np.bincount(x, minlength=n_edges)[changed]
        on = np.flatnonzero(np.logical_or.reduce([x == e for e in changed]))
        leave[on] = np.abs(resid[x[on]] - g[on]).sum(axis=1) - cost[x[on]]
        idx = np.concatenate([state.reachers(e) for e in changed])
        join[idx] = np.abs(resid[ce[idx]] + gc[idx]).sum(axis=1) - cost[ce[idx]]
    return x


class _SearchState:
    """An assignment with its per-edge residuals n D_e - n_e T and costs (J n^2 per edge).

    ``g[u] = n V_u - |V_u| T`` is user u's share of its edge's residual, so moving u from
    a to b subtracts ``g[u]`` from ``resid[a]`` and adds it to ``resid[b]``. All values
    are integers of magnitude at most 2 n^2, exact in float64 while n < 6 * 10^7.
    """

    def __init__(self, problem: AssignmentProblem, x: np.ndarray) -> None:
        self.problem = problem
        self.x = np.array(x, dtype=np.int64)
        v = problem.counts.astype(np.float64)
        total = v.sum(axis=0)
        n = total.sum()
        self.g = n * v - v.sum(axis=1, keepdims=True) * total
        self.g_t = np.ascontiguousarray(self.g.T)
        self.resid = np.zeros((problem.num_edges, v.shape[1]))
        np.add.at(self.resid, self.x, self.g)
        self.cost = np.abs(self.resid).sum(axis=1)
        self.tol = 1e-9 * max(n, 1.0) ** 2
        # Candidate moves (user, reachable edge), ordered by user, then edge.
        self.cand_user, self.cand_edge = np.nonzero(problem.reach.T)
        self._by_edge = np.argsort(self.cand_edge, kind="stable")
        self._edge_ptr = np.concatenate(
            [[0], np.cumsum(np.bincount(self.cand_edge, minlength=problem.num_edges))])

    def reachers(self, edge: int) -> np.ndarray:
        """Indices of the candidate moves to ``edge`` (ordered by user)."""
        return self._by_edge[self._edge_ptr[edge]:self._edge_ptr[edge + 1]]

    def change(self, moves: Sequence[tuple[int, int]]) -> float:
        """The change of J n^2 if users moved to edges at once (each user once)."""
        touched = sorted({int(self.x[u]) for u, _ in moves} | {e for _, e in moves})
        at = {e: i for i, e in enumerate(touched)}
        resid = self.resid[touched]
        for u, e in moves:
            resid[at[int(self.x[u])]] -= self.g[u]
            resid[at[e]] += self.g[u]
        return float(np.abs(resid).sum() - self.cost[touched].sum())

    def apply(self, moves: Sequence[tuple[int, int]]) -> list[int]:
        """Move users to edges at once; returns the sorted edges whose content changed."""
        touched = sorted({int(self.x[u]) for u, _ in moves} | {e for _, e in moves})
        for u, e in moves:
            self.resid[self.x[u]] -= self.g[u]
            self.resid[e] += self.g[u]
        for u, e in moves:
            self.x[u] = e
        self.cost[touched] = np.abs(self.resid[touched]).sum(axis=1)
        return touched


def _pair_index(a: np.ndarray, b: np.ndarray, n_edges: int) -> np.ndarray:
    """Position of the edge pair (a, b), a < b, in the lexicographic list of pairs."""
    return a * n_edges - a * (a + 1) // 2 + b - a - 1


def _first_swap(state: _SearchState, start: int) -> tuple[int, int, int] | None:
    """The best swap of the first edge pair, from pair ``start`` on in rotating order,
    that has an improving one: (user on the lower edge, user on the higher edge, pair
    position), or ``None``. Within a pair, ties go to the lowest users.

    All the candidate swaps are scored at once, in chunks of at most ``_SWAP_CHUNK``.
    """
    x, cu, ce = state.x, state.cand_user, state.cand_edge
    n_edges = state.problem.num_edges
    n_pairs = n_edges * (n_edges - 1) // 2
    src = x[cu]
    valid = ce != src
    users, src, dst = cu[valid], src[valid], ce[valid]
    up = src < dst
    # "up" users would go from a lower edge a to b, "down" users from b down to a.
    n_users = state.problem.num_users
    up_pair = _pair_index(src[up], dst[up], n_edges)
    order = np.argsort((up_pair - start) % n_pairs * n_users + users[up])  # unique keys
    up_user, up_pair = users[up][order], up_pair[order]
    down_pair = _pair_index(dst[~up], src[~up], n_edges)
    order = np.argsort(down_pair * n_users + users[~up])
    down_user, down_pair = users[~up][order], down_pair[order]
    down_count = np.bincount(down_pair, minlength=n_pairs)
    down_start = np.cumsum(down_count) - down_count
    row_size = down_count[up_pair]  # partners of each up user
    ends = np.cumsum(row_size)
    rows = (up_user, up_pair, down_user, down_start, row_size)

    def chunk_end(r0: int, limit: int, size: int) -> int:
        before = int(ends[r0 - 1]) if r0 else 0
        return min(limit, max(r0 + 1, int(np.searchsorted(ends, before + size,
                                                          side="right"))))

    # Growing chunks: an improving swap is often among the first pairs in the order.
    r0, size = 0, 1024
    while r0 < len(up_user):
        r1 = chunk_end(r0, len(up_user), size)
        size = min(2 * size, _SWAP_CHUNK)
        change, row, _ = _swap_changes(state, rows, r0, r1)
        hit = np.flatnonzero(change < -state.tol)
        if len(hit):
            pair = int(up_pair[row[hit[0]]])
            members = np.flatnonzero(up_pair == pair)  # contiguous rows
            lo, hi = int(members[0]), int(members[-1]) + 1
            best_change, best = np.inf, (-1, -1)
            k0 = lo
            while k0 < hi:
                k1 = chunk_end(k0, hi, _SWAP_CHUNK)
                change, row, partner = _swap_changes(state, rows, k0, k1)
                i = int(np.argmin(change))
                if change[i] < best_change:
                    best_change = float(change[i])
                    best = (int(up_user[row[i]]), int(down_user[partner[i]]))
                k0 = k1
            return best[0], best[1], pair
        r0 = r1
    return None


def _swap_changes(state: _SearchState, rows: tuple[np.ndarray, ...], r0: int,
                  r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Change of J n^2 of swapping up users ``r0:r1`` with each of their partners, with
    the up row and down partner index of every swap (rows major, partners by user).
    """
    up_user, up_pair, down_user, down_start, row_size = rows
    sizes = row_size[r0:r1]
    row = np.repeat(np.arange(r0, r1), sizes)
    partner = down_start[up_pair[row]] + np.arange(len(row)) - np.repeat(
        np.cumsum(sizes) - sizes, sizes)
    u, w = up_user[row], down_user[partner]
    a, b = state.x[u], state.x[w]
    diff = state.g[w] - state.g[u]
    change = (np.abs(state.resid[a] + diff).sum(axis=1) + np.abs(state.resid[b] - diff).sum(
        axis=1) - state.cost[a] - state.cost[b])
    return change, row, partner


def chain_search(problem: AssignmentProblem, x: np.ndarray, seconds: float | None = None,
                 max_length: int = 16, neighbours: int = 8) -> np.ndarray:
    """Improve an assignment by ejection chains until no improving one is found.

    A chain takes users c_0, ..., c_k on k + 1 distinct edges: c_0 leaves its edge, each
    c_i moves to the edge of c_(i+1), and c_k moves to another edge (a path, which
    with k = 0 is a single move) or to c_0's edge (a cycle, which with k = 1 is a swap).
    Edges that a chain does not visit are unchanged, so its change of J is the sum of
    one term per visited edge. A round scores, for every user w, its ``neighbours``
    best replacements (users that could take w's place on its edge), finds for every
    user and length the cheapest chain ending with it by dynamic programming over
    lengths up to ``max_length`` (a user's chain is the cheapest that does not revisit
    an edge), then applies the improving chains, best first, that share no edge with a
    chain already applied. Rounds repeat until one applies nothing.

    Parameters
    ----------
    problem : AssignmentProblem
        Counts, reachability, capacities.
    x : np.ndarray
        (N,) starting assignment (feasible).
    seconds : float | None
        Optional time cap (then the result depends on the machine's speed).
    max_length : int
        Most users displaced in one chain (k).
    neighbours : int
        Replacements kept per user.

    Returns
    -------
    np.ndarray
        The improved (N,) assignment; reachability and capacities stay respected.
    """
    deadline = None if seconds is None else time.perf_counter() + seconds
    state = _SearchState(problem, x)
    n_users, n_edges = problem.num_users, problem.num_edges
    replacement = np.full((n_users, neighbours), -1, np.int64)
    score = np.full((n_users, neighbours), np.inf)
    dirty = list(range(n_edges))
    while deadline is None or time.perf_counter() < deadline:
        on_edge = np.argsort(state.x, kind="stable")
        starts = np.concatenate([[0], np.cumsum(np.bincount(state.x, minlength=n_edges))])
        for e in dirty:
            _score_replacements(state, e, on_edge[starts[e]:starts[e + 1]], replacement,
                                score)
        dirty = _apply_chains(state, replacement, score, max_length)
        if not dirty:
            break
    return state.x


def _score_replacements(state: _SearchState, edge: int, on: np.ndarray,
                        replacement: np.ndarray, score: np.ndarray) -> None:
    """For each user w on ``edge``, the users u that could take its place there, with the
    change of the edge's cost (u in, w out), cheapest first; ``-1``/inf pad the rows.
    """
    replacement[on] = -1
    score[on] = np.inf
    movers = state.cand_user[state.reachers(edge)]
    movers = movers[state.x[movers] != edge]
    if not len(on) or not len(movers):
        return
    keep = min(replacement.shape[1], len(movers))
    # Classes first: the sum over classes then adds contiguous (w, u) slabs.
    g_movers = state.g_t[:, movers][:, None, :] + state.resid[edge][:, None, None]
    rows = max(1, _BLOCK_CHUNK // (len(movers) * state.g.shape[1]))
    for r0 in range(0, len(on), rows):
        w = on[r0:r0 + rows]
        block = g_movers - state.g_t[:, w][:, :, None]
        change = np.abs(block, out=block).sum(axis=0)
        change -= state.cost[edge]
        if keep < len(movers):
            best = np.argpartition(change, keep - 1, axis=1)[:, :keep]
            best.sort(axis=1)  # by mover: the stable sort below breaks ties by mover
        else:
            best = np.broadcast_to(np.arange(keep), change.shape)
        picked = np.take_along_axis(change, best, axis=1)
        order = np.argsort(picked, axis=1, kind="stable")
        replacement[w, :keep] = movers[np.take_along_axis(best, order, axis=1)]
        score[w, :keep] = np.take_along_axis(picked, order, axis=1)


def _apply_chains(state: _SearchState, replacement: np.ndarray, score: np.ndarray,
                  max_length: int) -> list[int]:
    """One round of :func:`chain_search`: find chains, apply the disjoint improving ones
    best first, and return the sorted edges they changed (empty: none improves).
    """
    x, g, resid, cost, tol = state.x, state.g, state.resid, state.cost, state.tol
    problem = state.problem
    n_users = len(x)
    users = np.arange(n_users)
    cu, ce = state.cand_user, state.cand_edge
    leave = np.abs(resid[x] - g).sum(axis=1) - cost[x]
    room = (np.ones(problem.num_edges, bool) if problem.capacity is None
            else np.bincount(x, minlength=problem.num_edges) < problem.capacity)
    join = np.abs(resid[ce] + g[cu]).sum(axis=1) - cost[ce]
    join[(ce == x[cu]) | ~room[ce]] = np.inf
    # Labels: value, first user and visited edges of the cheapest chain of the current
    # length ending with each user (who has left its edge and is still to be placed).
    # Visited edges are bit sets: one uint64 word per 64 edges.
    word = np.arange(problem.num_edges) // 64
    bit = np.left_shift(np.uint64(1), (np.arange(problem.num_edges) % 64).astype(np.uint64))
    value, first = leave, users.copy()
    visited = np.zeros((n_users, word[-1] + 1), np.uint64)
    visited[users, word[x]] = bit[x]
    preds: list[np.ndarray] = []
    # The cheapest improving chain ending with each user, over lengths and both ends.
    best = np.full(n_users, -tol)
    best_length = np.full(n_users, -1, np.int64)
    best_target = np.full(n_users, -1, np.int64)
    best_first = np.full(n_users, -1, np.int64)
    for length in range(max_length + 1):
        if length:
            value, pred = _extend(value, visited, word[x], bit[x], replacement, score)
            alive = np.flatnonzero(pred >= 0)
            if not len(alive):
                break
            preds.append(pred)
            was = visited
            visited = np.zeros_like(was)
            visited[alive] = was[pred[alive]]
            visited[alive, word[x[alive]]] |= bit[x[alive]]
            first = np.where(pred >= 0, first[np.maximum(pred, 0)], -1)
        # Paths: the last user goes to a reachable edge with room, not yet visited.
        total = value[cu] + join
        hit = np.flatnonzero(total < best[cu])
        hit = hit[(visited[cu[hit], word[ce[hit]]] & bit[ce[hit]]) == 0]
        # Cycles: the last user goes back to the first user's edge.
        ends = np.flatnonzero(first >= 0) if length else np.empty(0, np.int64)
        home = x[first[ends]]
        # The home edge's term is at least -cost[home]: skip what cannot improve.
        keep = problem.reach[home, ends] & (
            value[ends] - leave[first[ends]] - cost[home] < best[ends])
        ends, home = ends[keep], home[keep]
        cycle = (value[ends] - leave[first[ends]] - cost[home]
                 + np.abs(resid[home] - g[first[ends]] + g[ends]).sum(axis=1))
        # The cheapest path per user (``hit`` is ordered by user, then edge).
        order = np.lexsort((total[hit], cu[hit]))
        hit = hit[order]
        hit = hit[np.concatenate([[True], cu[hit][1:] != cu[hit][:-1]])] if len(hit) else hit
        # Strict improvements only, so ties keep the shorter chain, then paths.
        for who, total_, target in ((cu[hit], total[hit], ce[hit]), (ends, cycle, home)):
            better = total_ < best[who]
            best[who[better]] = total_[better]
            best_length[who[better]] = length
            best_target[who[better]] = target[better]
            best_first[who[better]] = first[who[better]]
    used: set[int] = set()
    ends = np.flatnonzero(best_length >= 0)
    for end in ends[np.lexsort((ends, best_length[ends], best[ends]))].tolist():
        target, length = int(best_target[end]), int(best_length[end])
        if target in used or int(x[end]) in used or int(x[best_first[end]]) in used:
            continue
        chain = [end]
        for pred in reversed(preds[:length]):
            chain.append(int(pred[chain[-1]]))
        chain.reverse()
        touched = {int(x[u]) for u in chain} | {target}
        if touched & used:
            continue
        moves = [(chain[j], int(x[chain[j + 1]])) for j in range(length)]
        moves.append((chain[-1], target))
        # Exact by construction (edge-disjoint from the chains applied before); the
        # check only guards against applying a chain that would not improve J.
        if state.change(moves) < -tol:
            state.apply(moves)
            used |= touched
            if len(used) == problem.num_edges:
                break
    return sorted(used)


def _extend(value: np.ndarray, visited: np.ndarray, word: np.ndarray, bit: np.ndarray,
            replacement: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lengthen the chains by one: for each user w, the cheapest chain ending with a
    user u that can take w's place and has not visited w's edge (``word``/``bit`` per
    user locate that edge in the bit sets ``visited``). Returns the new values and u
    per w (-1: none); ties go to the earlier replacement.
    """
    candidate = value[np.maximum(replacement, 0)] + score
    candidate[replacement < 0] = np.inf
    new_value = np.full(len(value), np.inf)
    pred = np.full(len(value), -1, np.int64)
    rows = np.arange(len(value))
    while len(rows):  # most rows settle at their cheapest replacement
        col = np.argmin(candidate[rows], axis=1)
        val = candidate[rows, col]
        live = np.isfinite(val)
        rows, col, val = rows[live], col[live], val[live]
        u = replacement[rows, col]
        ok = (visited[u, word[rows]] & bit[rows]) == 0
        new_value[rows[ok]] = val[ok]
        pred[rows[ok]] = u[ok]
        rows, col = rows[~ok], col[~ok]
        candidate[rows, col] = np.inf
    return new_value, pred


def _cp_sat(problem: AssignmentProblem, equal_size: bool, hint: np.ndarray | None,
            time_limit: float, workers: int, seed: int
            ) -> tuple[np.ndarray, float | None, str, float | None]:
    """Solve the exact MILP (or the paper's equal-size linearisation) with CP-SAT.

    Identical users (same counts, same reachable edges) are merged into one integer
    variable per (group, edge). For the exact model a hint is given in full (the
    epigraph terms too), so CP-SAT starts from it as a solution, and it is returned if
    CP-SAT finds nothing better; the paper's model gets the assignment part only, as
    before. Returns the assignment, a proven lower bound on J and the certified gap
    (J - bound) / J (exact model only, else ``None``), and ``optimal`` or ``feasible``.
    """
    from ortools.sat.python import cp_model

    v = problem.counts
    keys = np.concatenate([problem.reach.T.astype(np.int64), v], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    sizes = np.bincount(inverse)
    vg = v[first]  # (G, F)
    t = v.sum(axis=0)
    n = int(t.sum())
    n_edges, n_classes = problem.num_edges, v.shape[1]
    if equal_size:  # the paper: n_e = n / E, so ||E D_e - T||_1
        coef = n_edges * vg
        offset = -t
    else:  # exact: ||n D_e - n_e T||_1
        coef = n * vg - vg.sum(axis=1, keepdims=True) * t
        offset = np.zeros_like(t)
    model = cp_model.CpModel()
    group_of, edge_of = np.nonzero(problem.reach[:, first].T)  # variables, by group
    xs = [model.new_int_var(0, int(sizes[g]), f"x{g}_{e}")
          for g, e in zip(group_of.tolist(), edge_of.tolist(), strict=True)]
    group_start = np.concatenate([[0], np.cumsum(np.bincount(group_of, minlength=len(first)))])
    for g in range(len(first)):
        model.add(sum(xs[group_start[g]:group_start[g + 1]]) == int(sizes[g]))
    on_edge = [np.flatnonzero(edge_of == e) for e in range(n_edges)]
    if problem.capacity is not None:
        for e in range(n_edges):
            model.add(sum(xs[i] for i in on_edge[e]) <= int(problem.capacity[e]))
    placed = None
    if hint is not None:
        placed = np.zeros((len(first), n_edges), np.int64)
        np.add.at(placed, (inverse, problem.check(hint)), 1)
        for i, var in enumerate(xs):
            model.add_hint(var, int(placed[group_of[i], edge_of[i]]))
    terms = []
    hint_objective = 0
    for e in range(n_edges):
        members = on_edge[e]
        for c in range(n_classes):
            a = coef[group_of[members], c]
            reach_max = int((np.abs(a) * sizes[group_of[members]]).sum()) + abs(int(offset[c]))
            term = model.new_int_var(0, reach_max, f"t{e}_{c}")
            expr = cp_model.LinearExpr.weighted_sum([xs[i] for i in members],
                                                    a.tolist()) + int(offset[c])
            model.add(term >= expr)
            model.add(term >= -expr)
            terms.append(term)
            if placed is not None and not equal_size:
                value = abs(int((a * placed[group_of[members], e]).sum()) + int(offset[c]))
                model.add_hint(term, value)
                hint_objective += value
    model.minimize(sum(terms))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = seed
    status = solver.solve(model)
    solved = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if not solved and (hint is None or equal_size):
        raise RuntimeError(f"CP-SAT found no assignment ({solver.status_name(status)}) "
                           f"within {time_limit} s")
    if solved and (hint is None or equal_size or solver.objective_value <= hint_objective):
        x = np.empty(problem.num_users, np.int64)
        for g in range(len(first)):
            users = np.flatnonzero(inverse == g)
            filled = 0
            for i in range(group_start[g], group_start[g + 1]):
                k = int(solver.value(xs[i]))
                x[users[filled:filled + k]] = edge_of[i]
                filled += k
    else:  # CP-SAT did not complete or beat the hint
        x = problem.check(hint)
    if equal_size:
        return x, None, "optimal" if status == cp_model.OPTIMAL else "feasible", None
    # CP-SAT's bound holds whatever the status (with no solution yet, it is the bound
    # proven so far); on an integer objective it is an integer. J n^2 is exact.
    bound = max(0, int(np.ceil(solver.best_objective_bound - 1e-6)))
    scaled = _scaled_objective(problem.counts, x, n_edges)
    gap = max(0, scaled - bound) / scaled if scaled else 0.0
    return (x, bound / max(n, 1) ** 2, "optimal" if scaled <= bound else "feasible", gap)


def _scaled_objective(counts: np.ndarray, assignment: np.ndarray, num_edges: int) -> int:
    """J n^2 = sum_e ||n D_e - n_e T||_1, exactly in integers."""
    counts = np.asarray(counts, dtype=np.int64)
    edge_counts = np.zeros((num_edges, counts.shape[1]), np.int64)
    np.add.at(edge_counts, assignment, counts)
    total = counts.sum(axis=0)
    return int(np.abs(int(total.sum()) * edge_counts
                      - edge_counts.sum(axis=1, keepdims=True) * total).sum())


def paper_topology(counts: np.ndarray, num_edges: int, reach_per_user: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The paper's setting: every edge originally holds users of only 2 classes, and
    every user is in range of ``reach_per_user`` edges, its original one among them.

    Edge e holds classes 2e and 2e + 1 (mod F). A user goes, by its most frequent class,
    to the edges holding that class, in turn; a class no edge holds (F > 2E) goes to
    the edges in turn. The other reachable edges are drawn at random.

    Parameters
    ----------
    counts : np.ndarray
        (N, F) class counts.
    num_edges : int
        E >= 1.
    reach_per_user : int
        r, in [1, E].
    rng : np.random.Generator
        Randomness of the extra reachable edges.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The (E, N) reachability and the (N,) original assignment.

    Raises
    ------
    ValueError
        If E < 1 or r is outside [1, E].
    """
    if num_edges < 1 or not 1 <= reach_per_user <= num_edges:
        raise ValueError(f"need edges >= 1 and 1 <= r <= edges, got {num_edges} edges, "
                         f"r={reach_per_user}")
    counts = np.asarray(counts)
    n_users, n_classes = counts.shape
    holders = [[e for e in range(num_edges) if c in {(2 * e) % n_classes,
                                                     (2 * e + 1) % n_classes}]
               or list(range(num_edges)) for c in range(n_classes)]
    turn = np.zeros(n_classes, dtype=np.int64)
    original = np.empty(n_users, dtype=np.int64)
    for u, c in enumerate(np.argmax(counts, axis=1)):
        original[u] = holders[c][turn[c] % len(holders[c])]
        turn[c] += 1
    reach = np.zeros((num_edges, n_users), dtype=bool)
    reach[original, np.arange(n_users)] = True
    if reach_per_user > 1:
        for u in range(n_users):
            others = [e for e in range(num_edges) if e != original[u]]
            reach[rng.choice(others, reach_per_user - 1, replace=False), u] = True
    return reach, original


@dataclass(frozen=True)
class Topology:
    """Which users each edge reaches, and optionally the original assignment and the
    edges' capacities (see :func:`load_topology`).

    Attributes
    ----------
    reach : np.ndarray
        (E, N) booleans.
    original : np.ndarray | None
        (N,) original edge per user.
    capacity : np.ndarray | None
        (E,) maximum users per edge.
    """

    reach: np.ndarray
    original: np.ndarray | None = None
    capacity: np.ndarray | None = None


def load_topology(path: str | Path, num_users: int | None = None) -> Topology:
    """Read a topology file.

    JSON: ``{"reach": [[0 or 1, ... one per user], ... one row per edge],
    "original": [edge per user] (optional), "capacity": [users per edge] (optional)}``.
    CSV, one row per user after the header ``user,edges[,original]``: the user's index,
    its reachable edges separated by ``;`` and optionally its original edge.

    Parameters
    ----------
    path : str | Path
        The file (``.json`` or ``.csv``).
    num_users : int | None
        If given, the number of users the file must describe.

    Returns
    -------
    Topology
        The parsed topology.

    Raises
    ------
    ValueError
        On an unreadable or inconsistent file, naming the problem and the file.
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".json":
            topology = _topology_from_json(json.loads(path.read_text()))
        elif path.suffix.lower() == ".csv":
            topology = _topology_from_csv(path.read_text())
        else:
            raise ValueError("expected a .json or .csv file")
        reach = topology.reach
        if num_users is not None and reach.shape[1] != num_users:
            raise ValueError(f"it describes {reach.shape[1]} users, the run has {num_users}")
        if topology.original is not None:
            original = topology.original
            if original.shape != (reach.shape[1],) or not (
                    (original >= 0) & (original < len(reach))).all():
                raise ValueError(f"'original' must give each of the {reach.shape[1]} users "
                                 f"an edge in [0, {len(reach)})")
            bad = np.flatnonzero(~reach[original, np.arange(reach.shape[1])])
            if len(bad):
                raise ValueError(f"'original' puts users {_first(bad)} on edges out of range")
        if topology.capacity is not None and topology.capacity.shape != (len(reach),):
            raise ValueError(f"'capacity' must have one entry per edge ({len(reach)})")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"topology file {path}: {err}") from err
    return topology


def _topology_from_json(raw: dict) -> Topology:
    reach = np.asarray(raw["reach"])
    if reach.ndim != 2 or not np.isin(reach, (0, 1)).all():
        raise ValueError("'reach' must be a matrix of 0/1, one row per edge")
    original = np.asarray(raw["original"], dtype=np.int64) if "original" in raw else None
    capacity = np.asarray(raw["capacity"], dtype=np.int64) if "capacity" in raw else None
    return Topology(reach.astype(bool), original, capacity)


def _topology_from_csv(text: str) -> Topology:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [c.strip() for c in rows[0][:2]] != ["user", "edges"]:
        raise ValueError("the header must be 'user,edges' or 'user,edges,original'")
    with_original = len(rows[0]) > 2
    body = [r for r in rows[1:] if any(c.strip() for c in r)]
    users = [int(r[0]) for r in body]
    if sorted(users) != list(range(len(body))):
        raise ValueError(f"users must be 0..{len(body) - 1}, each once")
    edges = {int(r[0]): [int(e) for e in r[1].split(";") if e.strip()] for r in body}
    num_edges = 1 + max((e for es in edges.values() for e in es), default=-1)
    if min((e for es in edges.values() for e in es), default=0) < 0:
        raise ValueError("edge indices must be >= 0")
    reach = np.zeros((num_edges, len(body)), dtype=bool)
    for user, es in edges.items():
        reach[es, user] = True
    original = None
    if with_original:
        original = np.empty(len(body), dtype=np.int64)
        for r in body:
            original[int(r[0])] = int(r[2])
    return Topology(reach, original)


def warm_start(problem: AssignmentProblem, previous: Sequence[int | None],
               rng: np.random.Generator) -> np.ndarray | None:
    """A feasible start for the CP-SAT policies after nodes joined or left: every user
    keeps its ``previous`` edge where it still reaches it, the others take the greedy
    policy's edge; ``None`` when that is infeasible (capacities).
    """
    start = assign(problem, "greedy", rng).assignment
    for i, edge in enumerate(previous):
        if edge is not None and problem.reach[edge, i]:
            start[i] = edge
    try:
        return problem.check(start)
    except ValueError:
        return None


def edge_class_coverage(counts: np.ndarray, assignment: np.ndarray,
                        num_edges: int) -> list[float]:
    """Per edge with users holding data, the share of the classes its users cover."""
    with_data = counts.sum(axis=1) > 0
    present = counts[with_data] > 0
    edges = assignment[with_data]
    return [float(present[edges == e].any(axis=0).mean()) for e in range(num_edges)
            if (edges == e).any()]
