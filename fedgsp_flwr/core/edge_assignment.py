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
        from ortools.graph.python import max_flow  # lazy: see _closest_feasible

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
    # OR-Tools is imported where it is used: every ClientApp process loads this module
    # (through the run config's choices) and never solves anything.
    from ortools.graph.python import min_cost_flow

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
    size_tolerance: float = 0.05,
) -> AssignmentResult:
    """Assign every user to one reachable edge with the given policy.

    Parameters
    ----------
    problem : AssignmentProblem
        Counts, reachability, capacities.
    policy : str
        ``original`` (``original`` as given), ``random`` (a uniformly random reachable
        edge per user), ``heuristic`` (the paper's Algorithm 1), ``greedy`` (when every
        user holds one class and there are no capacities, per-class targets filled by
        exact subset sums: :func:`class_targets`, :func:`fill_targets`; otherwise, and
        also on small instances, Algorithm 1 with each remainder user placed where it
        lowers J most; each start then improved by a local search of moves and swaps
        and of ejection chains, :func:`local_search` and :func:`chain_search`, the best
        kept; deterministic, ``rng`` unused), ``equal-size`` (the paper's
        linearisation, Eq. 27-34, solved with CP-SAT: its objective assumes n_e = n/E,
        and its constraint (29) keeps every edge's examples within ``size_tolerance``
        of n/E) or ``optimal`` (the exact MILP with CP-SAT).
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
        Optional time cap of ``greedy``'s local searches (after its construction) in
        seconds; ``None`` runs them to convergence, which keeps the result a function of
        the inputs alone.
    similar_share : float
        Users are "similar" (one group of Algorithm 1) when they reach the same edges
        and hold the same classes, counting the classes with at least this share of a
        user's examples.
    size_tolerance : float
        ``equal-size`` only: every edge holds between ``(1 - size_tolerance) n/E`` and
        ``(1 + size_tolerance) n/E`` examples (rounded outwards), the paper's
        constraint (29), which integer user sizes rarely allow exactly.

    Returns
    -------
    AssignmentResult
        A capacity- and reachability-respecting assignment with its objective; for
        ``optimal`` also CP-SAT's proven lower bound and the certified gap.

    Raises
    ------
    ValueError
        On an unknown policy, a missing or invalid ``original``, a negative
        ``size_tolerance``, or (``equal-size``) edge sizes that no assignment keeps
        within the tolerance.
    """
    if policy not in POLICIES:
        raise ValueError(f"Unknown assignment policy '{policy}'. Choose one of {POLICIES}.")
    if not size_tolerance >= 0:
        raise ValueError(f"size_tolerance must be >= 0, got {size_tolerance}")
    started = time.perf_counter()
    bound: float | None = None
    gap: float | None = None
    status = "heuristic"
    if policy == "original":
        if original is None:
            raise ValueError("policy 'original' needs the original assignment")
        x = problem.check(original)
    elif policy == "random":
        x = _fit_capacity(problem, np.array(
            [rng.choice(np.flatnonzero(problem.reach[:, n])) for n in range(problem.num_users)],
            dtype=np.int64))
    elif policy == "heuristic":
        x = _fit_capacity(problem, _equal_split(problem, similar_share, greedy=False))
    elif policy == "greedy":
        x = _greedy(problem, similar_share, search_time)
    if policy in ("equal-size", "optimal"):
        if hint is None and policy == "optimal" and greedy_hint:
            hint = assign(problem, "greedy", rng, search_time=search_time,
                          similar_share=similar_share).assignment
        x, bound, status, gap = _cp_sat(
            problem, size_tolerance if policy == "equal-size" else None, hint, time_limit,
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


# --- Class-target construction (every user holds one class) ---------------------------
#
# With single-class users, J only depends on how much of each class every edge gets, so
# the greedy policy first fixes integer targets (nearly proportional rows, one per edge,
# summing to the class totals), then fills them class by class: each class is an exact
# multiple-subset-sum problem over its users' reachable edges.

_END_GAME = 15  # edges of a class filled last, in several variants
_END_GAME_VARIANTS = 800  # most variants per class (fewer with fewer edges)
_END_GAME_KEPT = 12  # variants searched on the whole class
_NOISE = 0.5  # randomisation of the variants' filling order and tie-breaking
_REFILLS = 3  # refills of a class's first edges that put missed edges first
_SMALL_ARCS = 10_000  # also start from Algorithm 1 up to this many user-edge pairs
_TARGET_J = 0.01  # class targets worse than this J are not used


def _greedy(problem: AssignmentProblem, share: float, search_time: float | None
            ) -> np.ndarray:
    """The greedy policy: starts, each improved by :func:`local_search` and
    :func:`chain_search` (within ``search_time`` in all), the lowest J kept (the first
    on ties).

    Users that each hold one class, no capacities, and class targets nearly
    proportional (their own J at most ``_TARGET_J``; above it, some edges cannot reach
    every class in proportion and filling the targets gains nothing): start from
    :func:`fill_targets` of :func:`class_targets`, and on small instances (at most
    ``_SMALL_ARCS`` reachable user-edge pairs) also from Algorithm 1 with each remainder
    user placed where it lowers J most. Otherwise from the latter only, fitted to the
    capacities.
    """
    deadline = None if search_time is None else time.perf_counter() + search_time
    starts = []
    targets = class_targets(problem) if problem.capacity is None else None
    if targets is not None:
        total = problem.counts.sum(axis=0)
        if _row_costs(targets, total / total.sum()).sum() > _TARGET_J * total.sum():
            targets = None
    if targets is not None:
        # Variants pay off when the end game is a small part of many edges.
        variants = int(np.clip(10 * (problem.num_edges - _END_GAME), 4,
                               _END_GAME_VARIANTS))
        starts.append(fill_targets(problem, targets, variants))
    if targets is None or problem.reach.sum() <= _SMALL_ARCS:
        starts.append(_fit_capacity(problem, _equal_split(problem, share, greedy=True)))
    best = None
    for x in starts:
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        x = local_search(problem, x, left)
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        x = chain_search(problem, x, left)
        value = _scaled_objective(problem.counts, x, problem.num_edges)
        if best is None or value < best[0]:
            best = (value, x)
    assert best is not None  # there is always a start (the equal split)
    return best[1]


def _user_classes(problem: AssignmentProblem) -> np.ndarray | None:
    """Each user's one class (-1 without data), or ``None`` if a user holds several."""
    held = problem.counts > 0
    if (held.sum(axis=1) > 1).any():
        return None
    return np.where(held.any(axis=1), held.argmax(axis=1), -1)


def class_targets(problem: AssignmentProblem) -> np.ndarray | None:
    """Integer per-edge class counts to aim at, for users that each hold one class.

    An edge's size is proportional to the largest size at which the users it reaches
    could still give it the global share of every class (so every edge keeps the same
    spare in its scarcest class). Its share of a class is its size times the global
    share, rounded per class to the class total; a count that no subset of the edge's
    reachable users sums to moves to the nearest one that does, and unit transfers
    within a class between edges then make the rows closer to proportional.

    Parameters
    ----------
    problem : AssignmentProblem
        Counts (one class per user) and reachability.

    Returns
    -------
    np.ndarray | None
        (E, F) int64 targets whose column sums are the class totals; ``None`` if some
        user holds several classes or no user holds data.
    """
    classes = _user_classes(problem)
    if classes is None or (classes < 0).all():
        return None
    sizes = _edge_sizes(problem, classes)
    total = problem.counts.sum(axis=0)
    share = total / total.sum()
    ideal = sizes[:, None] * share[None, :]
    targets = np.floor(ideal).astype(np.int64)
    for c in range(len(total)):  # largest remainders, so each column sums to its total
        short = int(total[c] - targets[:, c].sum())
        targets[np.argsort(targets[:, c] - ideal[:, c], kind="stable")[:short], c] += 1
    reachable = _reachable_sums(problem, classes, int(ideal.max()) + 64)
    targets = _achievable_targets(targets, reachable)
    return _polish_targets(targets, share, ideal, reachable)


def _edge_sizes(problem: AssignmentProblem, classes: np.ndarray) -> np.ndarray:
    """Edge sizes (examples) proportional to the largest size at which the edge could
    still hold the global share of every class from the users it reaches, scaled to
    the total (equal sizes if no edge reaches every class).
    """
    n_edges = problem.num_edges
    total = problem.counts.sum(axis=0).astype(np.float64)
    n = total.sum()
    share = total / n
    edge_of, user_of = np.nonzero(problem.reach)
    keep = classes[user_of] >= 0
    edge_of, user_of = edge_of[keep], user_of[keep]
    reachable = np.zeros((n_edges, len(total)))
    np.add.at(reachable, (edge_of, classes[user_of]),
              problem.counts.sum(axis=1)[user_of])
    present = share > 0
    ceiling = (reachable[:, present] / share[present]).min(axis=1)
    if ceiling.sum() <= 0:
        return np.full(n_edges, n / n_edges)
    return ceiling * n / ceiling.sum()


def _reachable_sums(problem: AssignmentProblem, classes: np.ndarray,
                    limit: int) -> list[list[int]]:
    """Per edge and class, the sums up to ``limit`` of subsets of that class's reachable
    users, as bit sets (bit k set: some subset holds k examples).
    """
    weight = problem.counts.sum(axis=1)
    mask = (1 << (limit + 1)) - 1
    sums = []
    for e in range(problem.num_edges):
        row = []
        on = problem.reach[e]
        for c in range(problem.counts.shape[1]):
            bits = 1
            for w in weight[on & (classes == c)].tolist():
                bits = (bits | bits << w) & mask
            row.append(bits)
        sums.append(row)
    return sums


def _achievable_targets(targets: np.ndarray, reachable: list[list[int]]) -> np.ndarray:
    """Move every count no subset of reachable users sums to onto the nearest one that
    some subset does, and the difference onto the edge of the same class with the most
    reachable sums where it stays reachable (column sums are kept).
    """
    targets = targets.copy()
    n_edges, n_classes = targets.shape
    for c in range(n_classes):
        flexible = np.argsort([-reachable[e][c].bit_count() for e in range(n_edges)],
                              kind="stable")
        for e in range(n_edges):
            bits, t = reachable[e][c], int(targets[e, c])
            if (bits >> t) & 1:
                continue
            below = (bits & ((1 << t) - 1)).bit_length() - 1
            higher = bits >> (t + 1)
            above = t + (higher & -higher).bit_length() if higher else -1
            if below < 0 and above < 0:
                continue
            new = below if above < 0 or (below >= 0 and t - below <= above - t) else above
            for f in flexible.tolist():
                moved = int(targets[f, c]) + t - new
                if f != e and moved >= 0 and (reachable[f][c] >> moved) & 1:
                    targets[e, c] = new
                    targets[f, c] = moved
                    break
    return targets


def _row_costs(rows: np.ndarray, share: np.ndarray) -> np.ndarray:
    """||t - |t| P||_1 of each row t (the last axis)."""
    return np.abs(rows - rows.sum(axis=-1, keepdims=True) * share).sum(axis=-1)


def _polish_targets(targets: np.ndarray, share: np.ndarray, ideal: np.ndarray,
                    reachable: list[list[int]], bound: float = 6.0) -> np.ndarray:
    """Unit transfers within a class between two edges, best first, while they lower
    sum_e ||t_e - |t_e| P||_1, keeping counts reachable and within ``bound`` of
    ``ideal``.
    """
    targets = targets.copy()
    n_edges, n_classes = targets.shape
    low, high = np.floor(ideal - bound), np.ceil(ideal + bound)
    unit = np.eye(n_classes, dtype=np.int64)

    def can(e: int, c: int, value: int) -> bool:
        return bool(low[e, c] <= value <= high[e, c] and value >= 0
                    and (reachable[e][c] >> value) & 1)

    can_dec = np.array([[can(e, c, int(targets[e, c]) - 1) for c in range(n_classes)]
                        for e in range(n_edges)])
    can_inc = np.array([[can(e, c, int(targets[e, c]) + 1) for c in range(n_classes)]
                        for e in range(n_edges)])
    for _ in range(targets.size * 4):
        base = _row_costs(targets, share)[:, None]
        dec = _row_costs(targets[:, None, :] - unit, share) - base
        inc = _row_costs(targets[:, None, :] + unit, share) - base
        dec[~can_dec] = np.inf
        inc[~can_inc] = np.inf
        best, move = -1e-9, None
        for c in range(n_classes):
            for a in np.argsort(dec[:, c], kind="stable")[:2].tolist():
                for b in np.argsort(inc[:, c], kind="stable")[:2].tolist():
                    if a != b and dec[a, c] + inc[b, c] < best:
                        best, move = dec[a, c] + inc[b, c], (a, b, c)
        if move is None:
            break
        a, b, c = move
        targets[a, c] -= 1
        targets[b, c] += 1
        for e in (a, b):
            can_dec[e, c] = can(e, c, int(targets[e, c]) - 1)
            can_inc[e, c] = can(e, c, int(targets[e, c]) + 1)
    return targets


def fill_targets(problem: AssignmentProblem, targets: np.ndarray,
                 variants: int = _END_GAME_VARIANTS, seed: int = 0) -> np.ndarray:
    """Assign single-class users so that every edge's class counts approach ``targets``.

    Class by class: edges are filled one at a time, the one with the least spare
    reachable data first, each with the exact subset of its free users that sums to its
    target (or the nearest reachable sum); users whose other reachable edges are all
    filled must join, and among the rest those with the fewest open edges and then the
    largest are preferred, so that the flexible users remain for the edges filled last.
    An edge that misses its target goes first when the class is filled again (up to 3
    times). The last 15 edges of a class, where the choice runs out, are filled in
    ``variants`` ways (the first as above, the others in a randomised order with
    randomised tie-breaking), each improved by :func:`local_search` towards the targets
    among those edges; the closest 12 (a quarter of the variants if fewer) are improved
    by :func:`local_search` and :func:`chain_search` on the whole class and the closest
    is kept.

    Parameters
    ----------
    problem : AssignmentProblem
        Counts with at most one class per user, reachability. Capacities are ignored.
    targets : np.ndarray
        (E, F) counts per edge and class, each class summing to its total
        (:func:`class_targets`).
    variants : int
        End-game variants per class (>= 1).
    seed : int
        Seed of the variants' tie-breaking: the result is a function of the inputs.

    Returns
    -------
    np.ndarray
        (N,) edge per user, reachable; users without data go to their first reachable
        edge.

    Raises
    ------
    ValueError
        If a user holds several classes or ``targets`` has the wrong shape.
    """
    classes = _user_classes(problem)
    targets = np.asarray(targets)
    if classes is None:
        raise ValueError("fill_targets needs users that each hold one class")
    if targets.shape != (problem.num_edges, problem.counts.shape[1]):
        shape = (problem.num_edges, problem.counts.shape[1])
        raise ValueError(f"targets must be (E, F) = {shape}, got {targets.shape}")
    rng = np.random.default_rng(seed)
    weight = problem.counts.sum(axis=1)
    x = problem.reach.argmax(axis=0).astype(np.int64)  # users without data
    for c in range(problem.counts.shape[1]):
        users = np.flatnonzero(classes == c)
        if len(users):
            x[users] = _fill_class(problem.reach[:, users], weight[users],
                                   targets[:, c].astype(np.int64), variants, rng)
    return x


def _fill_class(reach: np.ndarray, weight: np.ndarray, target: np.ndarray, variants: int,
                rng: np.random.Generator) -> np.ndarray:
    """One class of :func:`fill_targets`: (E, U) reachability, (U,) sizes, (E,) targets."""
    n_edges = len(target)
    end_game = min(_END_GAME, n_edges)
    first = np.zeros(n_edges, bool)
    for _ in range(_REFILLS + 1):  # edges that missed their target go first next time
        filled = _Filling(reach, weight, target, first)
        filled.fill(n_edges - end_game, None, rng)
        placed = filled.assignment()
        done = np.array(filled.done)
        missed = done & (np.bincount(placed[placed >= 0], weights=weight[placed >= 0],
                                     minlength=n_edges) != target)
        if not missed.any() or (first | missed).sum() == first.sum():
            break
        first = first | missed
    # The end game on its own: the free users and the edges still open.
    last, free = np.flatnonzero(~done), np.flatnonzero(placed < 0)
    if not len(free):
        return placed
    end = _Filling(reach[last][:, free], weight[free], target[last])
    end_problem = AssignmentProblem(weight[free][:, None], reach[last][:, free])
    goal = target[last]
    tried = []
    for k in range(max(1, variants)):
        attempt = end.copy()
        attempt.fill(len(last), None if k == 0 else _NOISE, rng)
        x = local_search(end_problem, attempt.assignment(), target=goal[:, None])
        tried.append((_distance(x, weight[free], goal), k, x))
    sub_problem = AssignmentProblem(weight[:, None], reach)
    kept = max(1, min(_END_GAME_KEPT, len(tried) // 4))
    best = None
    for _, k, x in sorted(tried, key=lambda item: item[:2])[:kept]:
        full = placed.copy()
        full[free] = last[x]
        full = local_search(sub_problem, full, target=target[:, None])
        full = chain_search(sub_problem, full, target=target[:, None])
        found = (_distance(full, weight, target), k, full)
        if best is None or found[:2] < best[:2]:
            best = found
    assert best is not None  # kept >= 1 and there is always a variant
    return best[2]


def _distance(x: np.ndarray, weight: np.ndarray, target: np.ndarray) -> int:
    """sum_e |load_e - target_e| of one class."""
    return int(np.abs(np.bincount(x, weights=weight, minlength=len(target)) - target).sum())


class _Filling:
    """The state of filling one class's edges one at a time (see :func:`fill_targets`),
    in plain Python lists: the steps are many and small.
    """

    def __init__(self, reach: np.ndarray, weight: np.ndarray, target: np.ndarray,
                 first: np.ndarray | None = None) -> None:
        n_edges, n_users = reach.shape
        self.weight = [int(w) for w in weight]
        self.target = [int(t) for t in target]
        self.users_of = [np.flatnonzero(reach[e]).tolist() for e in range(n_edges)]
        self.edges_of = [np.flatnonzero(reach[:, u]).tolist() for u in range(n_users)]
        # Edges to fill before the others (in their own order of spare data).
        self.first = [False] * n_edges if first is None else [bool(f) for f in first]
        self.edge = [-1] * n_users
        self.done = [False] * n_edges
        self.open = [len(edges) for edges in self.edges_of]  # unfilled reachable edges
        self.spare = [sum(self.weight[u] for u in users) - t  # free reachable data
                      for users, t in zip(self.users_of, self.target, strict=True)]

    def copy(self) -> _Filling:
        other = object.__new__(_Filling)
        other.__dict__.update(self.__dict__)
        for name in ("edge", "done", "open", "spare"):
            setattr(other, name, list(getattr(self, name)))
        return other

    def fill(self, steps: int, noise: float | None, rng: np.random.Generator) -> None:
        """Fill ``steps`` more edges; ``noise`` randomises the order and tie-breaking."""
        weight, edge, open_, spare = self.weight, self.edge, self.open, self.spare
        n_edges = len(self.done)
        if noise is not None:
            order_noise = (1 + noise * rng.random((steps, n_edges))).tolist()
            user_noise = (noise * rng.random((steps, len(edge)))).tolist()
        for step in range(steps):
            pending_first = any(f and not d for f, d in zip(self.first, self.done,
                                                             strict=True))
            e, lowest = -1, np.inf
            for f in range(n_edges):
                if self.done[f] or (pending_first and not self.first[f]):
                    continue
                key = spare[f] if noise is None else spare[f] * order_noise[step][f]
                if key < lowest:
                    e, lowest = f, key
            free = [u for u in self.users_of[e] if edge[u] < 0]
            forced = [u for u in free if open_[u] == 1]
            # Fewest other open edges first, then the largest users.
            preference = {u: 1.0 / (open_[u] - 1) + 1e-3 * weight[u]
                          + (0.0 if noise is None else user_noise[step][u])
                          for u in free if open_[u] > 1}
            optional = sorted(preference, key=lambda u: -preference[u])
            need = self.target[e] - sum(weight[u] for u in forced)
            take = _subset_sum([weight[u] for u in optional], need)
            for u in forced + [u for u, t in zip(optional, take, strict=True) if t]:
                edge[u] = e
                for f in self.edges_of[u]:
                    spare[f] -= weight[u]
            self.done[e] = True
            for u in self.users_of[e]:
                open_[u] -= 1

    def assignment(self) -> np.ndarray:
        """The edge of every user (-1: not placed yet)."""
        return np.array(self.edge, dtype=np.int64)


def _subset_sum(weights: Sequence[int], need: int) -> list[bool]:
    """Which of ``weights`` to take so that they sum to ``need``, or to the nearest
    reachable sum (the lower on ties): each item in the given order whenever the later
    ones can still complete the sum.
    """
    take = [False] * len(weights)
    if need <= 0 or not len(weights):
        return take
    sizes = [int(w) for w in weights]
    limit = (1 << (need + max(sizes) + 1)) - 1
    suffix = [1] * (len(sizes) + 1)  # bit sets of the sums of items i, i + 1, ...
    for i in range(len(sizes) - 1, -1, -1):
        suffix[i] = (suffix[i + 1] | (suffix[i + 1] << sizes[i])) & limit
    bits, goal = suffix[0], need
    if not (bits >> need) & 1:
        below = (bits & ((1 << need) - 1)).bit_length() - 1
        higher = bits >> (need + 1)
        above = need + (higher & -higher).bit_length() if higher else -1
        goal = below if above < 0 or need - below <= above - need else above
    for i, size in enumerate(sizes):
        if goal == 0:
            break
        if goal >= size and (suffix[i + 1] >> (goal - size)) & 1:
            take[i] = True
            goal -= size
    return take


def local_search(problem: AssignmentProblem, x: np.ndarray,
                 seconds: float | None = None, *,
                 target: np.ndarray | None = None) -> np.ndarray:
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
    target : np.ndarray | None
        (E, F) class counts per edge: minimise the distance to them,
        sum_e ||D_e - target_e||_1, instead of J (see :func:`fill_targets`).

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
    state = _SearchState(problem, x, target)
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
    are integers of magnitude at most 2 n^2, exact in float64 while n < 6 * 10^7. With a
    ``target`` (E, F), the residuals are D_e - target_e instead and ``g[u] = V_u``.
    """

    def __init__(self, problem: AssignmentProblem, x: np.ndarray,
                 target: np.ndarray | None = None) -> None:
        self.problem = problem
        self.x = np.array(x, dtype=np.int64)
        v = problem.counts.astype(np.float64)
        total = v.sum(axis=0)
        n = total.sum()
        if target is None:
            self.g = n * v - v.sum(axis=1, keepdims=True) * total
            self.resid = np.zeros((problem.num_edges, v.shape[1]))
            self.tol = 1e-9 * max(n, 1.0) ** 2
        else:
            self.g = v
            self.resid = -np.asarray(target, dtype=np.float64).reshape(problem.num_edges, -1)
            self.tol = 0.5  # integer distances
        self.g_t = np.ascontiguousarray(self.g.T)
        np.add.at(self.resid, self.x, self.g)
        self.cost = np.abs(self.resid).sum(axis=1)
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
                 max_length: int = 16, neighbours: int = 8, *,
                 target: np.ndarray | None = None) -> np.ndarray:
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
    target : np.ndarray | None
        (E, F) class counts per edge: minimise sum_e ||D_e - target_e||_1 instead of J,
        as in :func:`local_search`.

    Returns
    -------
    np.ndarray
        The improved (N,) assignment; reachability and capacities stay respected.
    """
    deadline = None if seconds is None else time.perf_counter() + seconds
    state = _SearchState(problem, x, target)
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


def _cp_sat(problem: AssignmentProblem, size_tolerance: float | None,
            hint: np.ndarray | None, time_limit: float, workers: int, seed: int
            ) -> tuple[np.ndarray, float | None, str, float | None]:
    """Solve the exact MILP (or, given ``size_tolerance``, the paper's equal-size
    linearisation with its edge-size constraint (29) as a band) with CP-SAT.

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
    equal_size = size_tolerance is not None
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
    if size_tolerance is not None:
        low, high = _size_band(n, n_edges, size_tolerance)
        user_sizes = vg.sum(axis=1)
        for e in range(n_edges):
            size = cp_model.LinearExpr.weighted_sum(
                [xs[i] for i in on_edge[e]], user_sizes[group_of[on_edge[e]]].tolist())
            model.add(size >= low)
            model.add(size <= high)
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
    if status == cp_model.INFEASIBLE and size_tolerance is not None:
        low, high = _size_band(n, n_edges, size_tolerance)
        raise ValueError(
            f"equal-size: no assignment gives every edge between {low} and {high} examples "
            f"(n/E = {n / n_edges:.1f} +- {size_tolerance:.0%}, the paper's constraint (29)) "
            "with these users, reach and capacities; raise size_tolerance (run config "
            "hierfl-size-tolerance) or use the 'heuristic' or 'optimal' policy")
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
    else:  # CP-SAT did not complete or beat the hint (so there is one, see above)
        assert hint is not None
        x = problem.check(hint)
    if equal_size:
        return x, None, "optimal" if status == cp_model.OPTIMAL else "feasible", None
    # CP-SAT's bound holds whatever the status (with no solution yet, it is the bound
    # proven so far); on an integer objective it is an integer. J n^2 is exact.
    bound = max(0, int(np.ceil(solver.best_objective_bound - 1e-6)))
    scaled = _scaled_objective(problem.counts, x, n_edges)
    gap = max(0, scaled - bound) / scaled if scaled else 0.0
    return (x, bound / max(n, 1) ** 2, "optimal" if scaled <= bound else "feasible", gap)


def _size_band(total: int, num_edges: int, tolerance: float) -> tuple[int, int]:
    """Least and most examples per edge under the equal-size constraint (29)."""
    mean = total / num_edges
    return int(np.floor(mean * (1 - tolerance))), int(np.ceil(mean * (1 + tolerance)))


def _scaled_objective(counts: np.ndarray, assignment: np.ndarray, num_edges: int) -> int:
    """J n^2 = sum_e ||n D_e - n_e T||_1, exactly in integers."""
    counts = np.asarray(counts, dtype=np.int64)
    edge_counts = np.zeros((num_edges, counts.shape[1]), np.int64)
    np.add.at(edge_counts, assignment, counts)
    total = counts.sum(axis=0)
    return int(np.abs(int(total.sum()) * edge_counts
                      - edge_counts.sum(axis=1, keepdims=True) * total).sum())


REACH_BY = ("group", "user")


def paper_topology(counts: np.ndarray, num_edges: int, reach_per_user: int,
                   rng: np.random.Generator, *, reach_by: str = "group"
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The paper's setting: every edge originally holds users of only 2 classes, and
    every user is in range of ``reach_per_user`` edges, its original one among them.

    Edge e holds classes 2e and 2e + 1 (mod F). A user goes, by its most frequent class,
    to the edges holding that class, in turn; a class no edge holds (F > 2E) goes to
    the edges in turn. The other reachable edges are drawn at random: once per group of
    users with the same original edge and most frequent class (``reach_by="group"``,
    the paper's groups of users "with the same classes' distribution" near the same
    edges, which Algorithm 1 splits over them), or for each user on its own
    (``"user"``: nearly every user is then a group of one). Groups form among the users
    of one call: HierFL generates the topology of the users it first sees together, so
    a user that joins later draws its own edges; users without data count as class 0.

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
    reach_by : str
        ``group`` or ``user`` (see above).

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The (E, N) reachability and the (N,) original assignment.

    Raises
    ------
    ValueError
        If E < 1, r is outside [1, E] or ``reach_by`` is unknown.
    """
    if num_edges < 1 or not 1 <= reach_per_user <= num_edges:
        raise ValueError(f"need edges >= 1 and 1 <= r <= edges, got {num_edges} edges, "
                         f"r={reach_per_user}")
    if reach_by not in REACH_BY:
        raise ValueError(f"reach_by must be one of {REACH_BY}, got {reach_by!r}")
    counts = np.asarray(counts)
    n_users, n_classes = counts.shape
    holders = [[e for e in range(num_edges) if c in {(2 * e) % n_classes,
                                                     (2 * e + 1) % n_classes}]
               or list(range(num_edges)) for c in range(n_classes)]
    turn = np.zeros(n_classes, dtype=np.int64)
    original = np.empty(n_users, dtype=np.int64)
    dominant = np.argmax(counts, axis=1)
    for u, c in enumerate(dominant):
        original[u] = holders[c][turn[c] % len(holders[c])]
        turn[c] += 1
    reach = np.zeros((num_edges, n_users), dtype=bool)
    reach[original, np.arange(n_users)] = True
    if reach_per_user > 1:
        drawn: dict[tuple[int, int], np.ndarray] = {}
        for u in range(n_users):
            key = (int(original[u]), int(dominant[u]) if reach_by == "group" else -1 - u)
            if key not in drawn:
                others = [e for e in range(num_edges) if e != original[u]]
                drawn[key] = rng.choice(others, reach_per_user - 1, replace=False)
            reach[drawn[key], u] = True
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
