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
        A proven lower bound on J (``optimal`` and ``equal-size``), else ``None``.
    status : str
        ``optimal`` (proven), ``feasible`` (solver stopped by its time limit) or
        ``heuristic``.
    seconds : float
        Wall time.
    """

    assignment: np.ndarray
    objective: float
    bound: float | None
    status: str
    seconds: float


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
        moves and swaps), ``equal-size`` (the paper's linearisation, which assumes equal
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
        A capacity- and reachability-respecting assignment with its objective.

    Raises
    ------
    ValueError
        On an unknown policy, or a missing or invalid ``original``.
    """
    if policy not in POLICIES:
        raise ValueError(f"Unknown assignment policy '{policy}'. Choose one of {POLICIES}.")
    started = time.perf_counter()
    bound: float | None = None
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
        x = local_search(problem, x, search_time)
    if policy in ("equal-size", "optimal"):
        if hint is None and policy == "optimal" and greedy_hint:
            hint = assign(problem, "greedy", rng, search_time=search_time,
                          similar_share=similar_share).assignment
        x, bound, status = _cp_sat(problem, policy == "equal-size", hint, time_limit,
                                   workers, int(rng.integers(2**31)))
    x = problem.check(x)
    value, _ = objective(problem.counts, x, problem.num_edges)
    return AssignmentResult(x, value, bound, status, time.perf_counter() - started)


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
    """
    deadline = None if seconds is None else time.perf_counter() + seconds
    x = np.array(x, dtype=np.int64)
    v = problem.counts.astype(np.float64)
    total = v.sum(axis=0)
    n_edges, n_users = problem.num_edges, problem.num_users
    edge_counts = np.zeros((n_edges, v.shape[1]))
    np.add.at(edge_counts, x, v)
    cap = problem.capacity
    tol = 1e-9 * max(total.sum(), 1.0) ** 2
    pairs = [(a, b) for a in range(n_edges) for b in range(a + 1, n_edges)]
    start = 0
    while deadline is None or time.perf_counter() < deadline:
        cost = _edge_cost(edge_counts, total)
        leave = _edge_cost(edge_counts[x] - v, total) - cost[x]  # (N,)
        join = _edge_cost(edge_counts[None, :, :] + v[:, None, :], total) - cost[None, :]
        delta = leave[:, None] + join  # (N, E): user u from its edge to edge b
        allowed = problem.reach.T.copy()
        allowed[np.arange(n_users), x] = False
        if cap is not None:
            allowed &= (np.bincount(x, minlength=n_edges) < cap)[None, :]
        delta[~allowed] = np.inf
        mover, target = (int(i) for i in np.unravel_index(int(np.argmin(delta)),
                                                         delta.shape))
        if delta[mover, target] < -tol:
            edge_counts[x[mover]] -= v[mover]
            edge_counts[target] += v[mover]
            x[mover] = target
            continue
        for k in range(len(pairs)):
            a, b = pairs[(start + k) % len(pairs)]
            swap = _best_swap(problem, x, v, edge_counts, total, cost, a, b)
            if swap is not None and swap[2] < -tol:
                u, w, _ = swap
                edge_counts[a] += v[w] - v[u]
                edge_counts[b] += v[u] - v[w]
                x[u], x[w] = b, a
                start = (start + k + 1) % len(pairs)
                break
        else:
            break
    return x


def _best_swap(problem: AssignmentProblem, x: np.ndarray, v: np.ndarray,
               edge_counts: np.ndarray, total: np.ndarray, cost: np.ndarray,
               a: int, b: int) -> tuple[int, int, float] | None:
    """The swap of a user on edge a (in range of b) with one on edge b (in range of a)
    that lowers J most: (u, w, change of J * n^2), or ``None`` if there is no pair.
    """
    us = np.flatnonzero((x == a) & problem.reach[b])
    ws = np.flatnonzero((x == b) & problem.reach[a])
    if not len(us) or not len(ws):
        return None
    diff = v[ws][None, :, :] - v[us][:, None, :]  # (U, W, F): a gains w, loses u
    change = (_edge_cost(edge_counts[a] + diff, total)
              + _edge_cost(edge_counts[b] - diff, total) - cost[a] - cost[b])
    i, j = np.unravel_index(int(np.argmin(change)), change.shape)
    return int(us[i]), int(ws[j]), float(change[i, j])


def _cp_sat(problem: AssignmentProblem, equal_size: bool, hint: np.ndarray | None,
            time_limit: float, workers: int, seed: int) -> tuple[np.ndarray, float | None, str]:
    """Solve the exact MILP (or the paper's equal-size linearisation) with CP-SAT.

    Identical users (same counts, same reachable edges) are merged into one integer
    variable per (group, edge). Returns the assignment, a proven lower bound on J (exact
    model only) and ``optimal`` or ``feasible``.
    """
    from ortools.sat.python import cp_model

    v = problem.counts
    keys = np.concatenate([problem.reach.T.astype(np.int64), v], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    sizes = np.bincount(inverse)
    vg = v[first]  # (G, F)
    wg = vg.sum(axis=1)
    t = v.sum(axis=0)
    n = int(t.sum())
    n_edges = problem.num_edges
    model = cp_model.CpModel()
    xs: dict[tuple[int, int], cp_model.IntVar] = {}
    for g in range(len(first)):
        reachable = np.flatnonzero(problem.reach[:, first[g]]).tolist()
        for e in reachable:
            xs[g, e] = model.new_int_var(0, int(sizes[g]), f"x{g}_{e}")
        model.add(sum(xs[g, e] for e in reachable) == int(sizes[g]))
    if problem.capacity is not None:
        for e in range(n_edges):
            model.add(sum(var for (_, f), var in xs.items() if f == e)
                      <= int(problem.capacity[e]))
    terms = []
    for e in range(n_edges):
        members = [(g, var) for (g, f), var in xs.items() if f == e]
        for c in range(v.shape[1]):
            if equal_size:  # the paper: n_e = n / E, so ||E D_e - T||_1
                coef = [n_edges * int(vg[g, c]) for g, _ in members]
                offset = -int(t[c])
            else:  # exact: ||n D_e - n_e T||_1
                coef = [n * int(vg[g, c]) - int(wg[g]) * int(t[c]) for g, _ in members]
                offset = 0
            reach_max = sum(abs(a) * int(sizes[g]) for a, (g, _) in zip(coef, members,
                                                                       strict=True))
            reach_max += abs(offset)
            term = model.new_int_var(0, reach_max, f"t{e}_{c}")
            expr = sum(a * var for a, (_, var) in zip(coef, members, strict=True)) + offset
            model.add(term >= expr)
            model.add(term >= -expr)
            terms.append(term)
    model.minimize(sum(terms))
    if hint is not None:
        placed = np.zeros((len(first), n_edges), np.int64)
        np.add.at(placed, (inverse, problem.check(hint)), 1)
        for (g, e), var in xs.items():
            model.add_hint(var, int(placed[g, e]))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = seed
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT found no assignment ({solver.status_name(status)}) "
                           f"within {time_limit} s")
    x = np.empty(problem.num_users, np.int64)
    for g in range(len(first)):
        users = np.flatnonzero(inverse == g)
        filled = 0
        for e in np.flatnonzero(problem.reach[:, first[g]]).tolist():
            k = int(solver.value(xs[g, e]))
            x[users[filled:filled + k]] = e
            filled += k
    bound = None if equal_size else float(solver.best_objective_bound) / max(n, 1) ** 2
    return x, bound, "optimal" if status == cp_model.OPTIMAL else "feasible"


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
