"""The assignment policies: :func:`assign` dispatches on :data:`POLICIES` to the
heuristics and the CP-SAT models; :func:`warm_start` starts them after nodes changed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .exact import _cp_sat
from .heuristics import _equal_split, _fit_capacity, _greedy
from .problem import AssignmentProblem, AssignmentResult, objective

POLICIES = ("original", "random", "heuristic", "greedy", "equal-size", "optimal")


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
