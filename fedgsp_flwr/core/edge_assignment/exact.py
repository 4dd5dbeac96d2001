"""The CP-SAT models of user-edge assignment.

``_cp_sat`` solves the exact MILP (J linear after an epigraph step) or the paper's
equal-size linearisation (Eq. 27-34) with OR-Tools' CP-SAT, imported where it is used.
"""

from __future__ import annotations

import numpy as np

from .problem import AssignmentProblem, _scaled_objective


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
