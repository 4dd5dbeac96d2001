"""The user-edge assignment problem and its objective.

Users hold class counts V_n (rows of ``counts``); edge e gets D_e = sum of its users'
counts, n_e = |D_e|; T is the total and P = T / n. The objective is

    J(X) = sum_e (n_e / n) ||D_e / n_e - P||_1 = sum_e ||n D_e - n_e T||_1 / n^2.

:class:`AssignmentProblem` (counts, reach, capacities and their checks),
:class:`AssignmentResult`, :func:`objective` and its exact integer form
``_scaled_objective``, :func:`brute_force`, the capacity repair ``_closest_feasible``
and :func:`edge_class_coverage`. Pure numpy (OR-Tools' flows imported lazily).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


def _scaled_objective(counts: np.ndarray, assignment: np.ndarray, num_edges: int) -> int:
    """J n^2 = sum_e ||n D_e - n_e T||_1, exactly in integers."""
    counts = np.asarray(counts, dtype=np.int64)
    edge_counts = np.zeros((num_edges, counts.shape[1]), np.int64)
    np.add.at(edge_counts, assignment, counts)
    total = counts.sum(axis=0)
    return int(np.abs(int(total.sum()) * edge_counts
                      - edge_counts.sum(axis=1, keepdims=True) * total).sum())


def edge_class_coverage(counts: np.ndarray, assignment: np.ndarray,
                        num_edges: int) -> list[float]:
    """Per edge with users holding data, the share of the classes its users cover."""
    with_data = counts.sum(axis=1) > 0
    present = counts[with_data] > 0
    edges = assignment[with_data]
    return [float(present[edges == e].any(axis=0).mean()) for e in range(num_edges)
            if (edges == e).any()]
