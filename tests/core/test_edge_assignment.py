"""User-edge assignment core: objective, exact MILP, heuristics, constraints, errors."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from fedgsp_flwr.core.edge_assignment import (
    POLICIES,
    AssignmentProblem,
    assign,
    brute_force,
    chain_search,
    class_targets,
    edge_class_coverage,
    fill_targets,
    load_topology,
    local_search,
    objective,
    paper_topology,
    similar_groups,
    warm_start,
)
from fedgsp_flwr.core.edge_assignment.heuristics import (
    _equal_split,
    _polish_targets,
    _reachable_sums,
    _row_costs,
    _subset_sum,
    _user_classes,
)
from fedgsp_flwr.core.edge_assignment.search import _extend


def random_problem(rng: np.random.Generator, n: int, e: int, f: int = 3,
                   capacity: bool = False) -> AssignmentProblem:
    counts = rng.integers(0, 6, size=(n, f))
    counts[counts.sum(axis=1) == 0, 0] = 1
    reach = rng.random((e, n)) < 0.6
    reach[rng.integers(e, size=n), np.arange(n)] = True
    cap = None
    if capacity:
        # Loose enough to stay feasible: each edge takes what it would under one
        # reachable choice per user, plus one.
        first = reach.argmax(axis=0)
        cap = np.bincount(first, minlength=e) + 1
    return AssignmentProblem(counts, reach, cap)


def test_objective_matches_a_hand_computed_case() -> None:
    counts = np.array([[5, 0], [0, 5], [3, 3], [1, 0]])
    # Edge 0 holds [5, 5] (10 examples), edge 1 holds [4, 3] (7); P = [9/17, 8/17].
    j, terms = objective(counts, np.array([0, 0, 1, 1]), 2)
    p = np.array([9, 8]) / 17
    edge0 = 10 / 17 * np.abs(np.array([0.5, 0.5]) - p).sum()
    edge1 = 7 / 17 * np.abs(np.array([4, 3]) / 7 - p).sum()
    assert terms == pytest.approx([edge0, edge1])
    assert j == pytest.approx(edge0 + edge1)
    # Every edge holding the global distribution scores 0; an empty edge adds nothing.
    assert objective(np.array([[2, 1], [4, 2]]), np.array([0, 1]), 3)[0] == pytest.approx(0)
    assert objective(counts, np.zeros(4, int), 2)[1][1] == 0


def test_optimal_equals_brute_force_on_random_small_instances() -> None:
    rng = np.random.default_rng(0)
    for trial in range(12):
        problem = random_problem(rng, int(rng.integers(4, 9)), int(rng.integers(2, 4)),
                                 capacity=trial % 3 == 0)
        best, _ = brute_force(problem)
        result = assign(problem, "optimal", np.random.default_rng(trial), time_limit=10)
        assert result.objective == pytest.approx(best, abs=1e-12)
        assert result.status == "optimal" and result.bound == pytest.approx(best, abs=1e-9)


def test_heuristic_is_optimal_when_groups_divide_over_their_edges() -> None:
    # Lemma 3: similar users in groups whose sizes divide by their number of edges.
    # Four classes, 4 users of each, every user in range of all 4 edges.
    counts = np.repeat(np.eye(4, dtype=np.int64) * 10, 4, axis=0)
    problem = AssignmentProblem(counts, np.ones((4, 16), dtype=bool))
    assert all(len(g) % int(problem.reach[:, g[0]].sum()) == 0
               for g in similar_groups(problem))
    result = assign(problem, "heuristic", np.random.default_rng(0))
    assert result.objective == pytest.approx(0.0, abs=1e-12)
    # Groups reaching different edge sets, sizes still divisible: against brute force.
    counts = np.repeat(np.eye(2, dtype=np.int64) * 7, 4, axis=0)  # 8 users, 2 classes
    reach = np.zeros((2, 8), dtype=bool)
    reach[:, :4] = True
    reach[0, 4:6] = True
    reach[1, 6:8] = True
    problem = AssignmentProblem(counts, reach)
    best, _ = brute_force(problem)
    assert assign(problem, "heuristic", np.random.default_rng(0)).objective == pytest.approx(
        best, abs=1e-12)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_respects_reachability_and_capacity(policy: str) -> None:
    rng = np.random.default_rng(3)
    for trial in range(4):
        problem = random_problem(rng, 10, 3, capacity=True)
        original = problem.reach.argmax(axis=0)
        if problem.capacity is not None and (
                np.bincount(original, minlength=3) > problem.capacity).any():
            original = assign(problem, "greedy", rng).assignment
        # Sizes on 10 users rarely fit a narrow equal-size band (its own test below).
        result = assign(problem, policy, np.random.default_rng(trial), original=original,
                        time_limit=5, size_tolerance=10.0)
        x = result.assignment
        assert problem.reach[x, np.arange(10)].all()
        assert (np.bincount(x, minlength=3) <= problem.capacity).all()
        assert result.objective == pytest.approx(objective(problem.counts, x, 3)[0])


def paper_problem(rng: np.random.Generator, n: int, e: int, r: int
                  ) -> tuple[AssignmentProblem, np.ndarray]:
    """The paper's setting: user u holds class u mod 10 (20-100 examples), r edges,
    drawn per user (nearly every user a group of one: the searches' harder instances)."""
    counts = np.zeros((n, 10), dtype=np.int64)
    counts[np.arange(n), np.arange(n) % 10] = rng.integers(20, 101, n)
    reach, original = paper_topology(counts, e, r, rng, reach_by="user")
    return AssignmentProblem(counts, reach), original


def test_greedy_with_local_search_beats_the_heuristic_and_random() -> None:
    problem, original = paper_problem(np.random.default_rng(5), 200, 10, 3)
    values = {p: assign(problem, p, np.random.default_rng(0), original=original).objective
              for p in ("original", "random", "heuristic", "greedy")}
    assert values["greedy"] <= values["heuristic"] < values["original"]
    assert values["greedy"] < values["random"]
    # Local search never makes an assignment worse.
    start = assign(problem, "random", np.random.default_rng(1)).assignment
    improved = local_search(problem, start, seconds=0.5)
    assert objective(problem.counts, improved, 10)[0] <= objective(problem.counts, start, 10)[0]


def test_equal_size_keeps_every_edge_within_its_band_and_names_an_impossible_one() -> None:
    """The paper's constraint (29): every edge's examples within the tolerance of n/E."""
    problem, _ = paper_problem(np.random.default_rng(0), 200, 10, 2)
    mean = problem.counts.sum() / 10

    def sizes(x: np.ndarray) -> np.ndarray:
        return np.bincount(x, weights=problem.counts.sum(axis=1), minlength=10)

    # Without the band the linearised objective is met by unequal edges on this instance.
    free = assign(problem, "equal-size", np.random.default_rng(0), size_tolerance=100,
                  time_limit=2)
    assert sizes(free.assignment).max() > 1.1 * mean
    banded = assign(problem, "equal-size", np.random.default_rng(0), size_tolerance=0.05,
                    time_limit=2)
    assert sizes(banded.assignment).min() >= np.floor(0.95 * mean)
    assert sizes(banded.assignment).max() <= np.ceil(1.05 * mean)
    # r = 1: the original assignment is the only one, and its edges differ in size.
    fixed, original = paper_problem(np.random.default_rng(0), 200, 10, 1)
    assert np.ptp(np.bincount(original, weights=fixed.counts.sum(axis=1))) > 0.02 * mean
    with pytest.raises(ValueError, match=r"equal-size: no assignment gives every edge "
                                         r"between \d+ and \d+ examples.*raise size_tolerance"):
        assign(fixed, "equal-size", np.random.default_rng(0), size_tolerance=0.01,
               time_limit=2)
    with pytest.raises(ValueError, match="size_tolerance must be >= 0"):
        assign(problem, "equal-size", np.random.default_rng(0), size_tolerance=-0.1)


def assert_paper_shape(counts: np.ndarray, reach: np.ndarray, original: np.ndarray,
                       r: int) -> None:
    """Every user reaches r edges, its original one among them; original edge e holds
    users of classes 2e and 2e + 1 (mod 10) only."""
    assert (reach.sum(axis=0) == r).all() and reach[original, np.arange(len(counts))].all()
    for e in range(reach.shape[0]):
        assert set(np.argmax(counts[original == e], axis=1).tolist()) == {
            (2 * e) % 10, (2 * e + 1) % 10}


def test_paper_topology_gives_each_edge_two_classes_and_r_reachable_edges() -> None:
    counts = np.zeros((100, 10), dtype=np.int64)
    counts[np.arange(100), np.arange(100) % 10] = 30
    reach, original = paper_topology(counts, 10, 3, np.random.default_rng(0))
    assert_paper_shape(counts, reach, original, 3)
    # The paper: the original assignment scores 1.6 (two classes per edge out of ten).
    assert objective(counts, original, 10)[0] == pytest.approx(1.6)
    one, _ = paper_topology(counts, 1, 1, np.random.default_rng(0))
    assert one.all()
    with pytest.raises(ValueError, match="1 <= r <= edges"):
        paper_topology(counts, 10, 11, np.random.default_rng(0))


def test_a_group_of_one_class_on_one_edge_shares_its_reach_unless_drawn_per_user() -> None:
    counts = np.zeros((100, 10), dtype=np.int64)
    counts[np.arange(100), np.arange(100) % 10] = 30
    for reach_by in ("group", "user"):
        reach, original = paper_topology(counts, 10, 2, np.random.default_rng(0),
                                         reach_by=reach_by)
        assert_paper_shape(counts, reach, original, 2)
        groups: dict[tuple[int, int], set[bytes]] = {}
        for u in range(100):
            groups.setdefault((int(original[u]), u % 10), set()).add(reach[:, u].tobytes())
        assert len(groups) == 20  # 10 edges x their 2 classes, 5 users each
        shared = all(len(columns) == 1 for columns in groups.values())
        assert shared == (reach_by == "group"), reach_by
    with pytest.raises(ValueError, match="reach_by must be one of"):
        paper_topology(counts, 10, 2, np.random.default_rng(0), reach_by="edge")


def test_infeasible_inputs_are_clear_errors() -> None:
    counts = np.array([[5, 0], [0, 5], [3, 3], [1, 0]])
    with pytest.raises(ValueError, match=r"users \[3\] reach no edge"):
        AssignmentProblem(counts, np.array([[1, 1, 0, 0], [0, 0, 1, 0]], bool))
    reach = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], bool)
    with pytest.raises(ValueError, match=r"users \[0, 1\] reach only edges \[0\], whose "
                                         r"capacities \[1\] hold 1 users, not 2"):
        AssignmentProblem(counts, reach, capacity=np.array([1, 2]))
    with pytest.raises(ValueError, match="capacity must be 2"):
        AssignmentProblem(counts, reach, capacity=np.array([1]))
    with pytest.raises(ValueError, match="non-negative"):
        AssignmentProblem(-counts, reach)
    problem = AssignmentProblem(counts, reach)
    with pytest.raises(ValueError, match=r"users \[2\] are assigned to edges out of range"):
        problem.check(np.array([0, 0, 0, 1]))
    with pytest.raises(ValueError, match="needs the original"):
        assign(problem, "original", np.random.default_rng(0))
    with pytest.raises(ValueError, match="Unknown assignment policy"):
        assign(problem, "best", np.random.default_rng(0))


def test_topology_files_json_and_csv_agree(tmp_path) -> None:
    reach = [[1, 1, 0], [0, 1, 1]]
    (tmp_path / "t.json").write_text(json.dumps(
        {"reach": reach, "original": [0, 1, 1], "capacity": [2, 2]}))
    (tmp_path / "t.csv").write_text("user,edges,original\n0,0,0\n1,0;1,1\n2,1,1\n")
    a = load_topology(tmp_path / "t.json", num_users=3)
    b = load_topology(tmp_path / "t.csv")
    np.testing.assert_array_equal(a.reach, np.array(reach, bool))
    np.testing.assert_array_equal(a.reach, b.reach)
    np.testing.assert_array_equal(a.original, b.original)
    assert a.capacity.tolist() == [2, 2] and b.capacity is None


@pytest.mark.parametrize(("name", "text", "message"), [
    ("t.json", '{"reach": [[1, 2]]}', "matrix of 0/1"),
    ("t.json", '{"reach": [[1, 1]], "original": [0, 1]}', "an edge in \\[0, 1\\)"),
    ("t.json", '{"reach": [[1, 0], [0, 1]], "original": [1, 1]}',
     "puts users \\[0\\] on edges out of range"),
    ("t.json", '{"reach": [[1, 1]], "capacity": [1, 2]}', "one entry per edge"),
    ("t.json", '{"edges": []}', "'reach'"),
    ("t.csv", "id,edges\n0,1\n", "header must be"),
    ("t.csv", "user,edges\n0,0\n2,0\n", "users must be 0..1"),
    ("t.yaml", "reach: []", "expected a .json or .csv"),
])
def test_bad_topology_files_name_the_problem(tmp_path, name: str, text: str,
                                             message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=f"topology file .*{name}: .*{message}"):
        load_topology(tmp_path / name)


def test_topology_must_match_the_number_of_users(tmp_path) -> None:
    (tmp_path / "t.json").write_text('{"reach": [[1, 1, 1]]}')
    with pytest.raises(ValueError, match="describes 3 users, the run has 4"):
        load_topology(tmp_path / "t.json", num_users=4)


def test_users_without_data_are_placed_by_every_policy() -> None:
    # Nodes without a histogram enter with zero counts (HierFL): J is 0, nothing fails.
    problem = AssignmentProblem(np.zeros((4, 3), dtype=np.int64), np.ones((2, 4), bool))
    for policy in POLICIES:
        result = assign(problem, policy, np.random.default_rng(0), time_limit=2,
                        original=np.zeros(4, dtype=np.int64))
        assert result.objective == 0.0 and len(result.assignment) == 4


def test_warm_start_keeps_reachable_previous_edges_and_coverage_counts_classes() -> None:
    counts = np.array([[5, 0], [0, 5], [5, 5], [0, 0]])
    reach = np.array([[1, 1, 1, 1], [1, 1, 0, 1]], dtype=bool)
    problem = AssignmentProblem(counts, reach)
    start = warm_start(problem, [1, 0, 1, None], np.random.default_rng(0))
    assert start is not None and start[:2].tolist() == [1, 0]
    assert start[2] == 0  # edge 1 is out of its reach: the greedy edge instead
    coverage = edge_class_coverage(counts, np.array([0, 1, 1, 0]), 2)
    assert coverage == [0.5, 1.0]  # user 3 holds no data and is not counted


def _cost(edge_counts: np.ndarray, total: np.ndarray) -> np.ndarray:
    n = total.sum()
    return np.abs(n * edge_counts - edge_counts.sum(axis=-1, keepdims=True) * total).sum(
        axis=-1)


def reference_local_search(problem: AssignmentProblem, x: np.ndarray) -> np.ndarray:
    """The straightforward local search: every step rescores every (user, edge) move and
    every swap from scratch (the implementation before vectorisation).
    """
    x = np.array(x, dtype=np.int64)
    v = problem.counts.astype(np.float64)
    total = v.sum(axis=0)
    n_edges, n_users = problem.num_edges, problem.num_users
    edge_counts = np.zeros((n_edges, v.shape[1]))
    np.add.at(edge_counts, x, v)
    tol = 1e-9 * max(total.sum(), 1.0) ** 2
    pairs = [(a, b) for a in range(n_edges) for b in range(a + 1, n_edges)]
    start = 0
    while True:
        cost = _cost(edge_counts, total)
        leave = _cost(edge_counts[x] - v, total) - cost[x]
        join = _cost(edge_counts[None, :, :] + v[:, None, :], total) - cost[None, :]
        delta = leave[:, None] + join
        allowed = problem.reach.T.copy()
        allowed[np.arange(n_users), x] = False
        if problem.capacity is not None:
            allowed &= (np.bincount(x, minlength=n_edges) < problem.capacity)[None, :]
        delta[~allowed] = np.inf
        mover, target = np.unravel_index(int(np.argmin(delta)), delta.shape)
        if delta[mover, target] < -tol:
            edge_counts[x[mover]] -= v[mover]
            edge_counts[target] += v[mover]
            x[mover] = target
            continue
        for k in range(len(pairs)):
            a, b = pairs[(start + k) % len(pairs)]
            us = np.flatnonzero((x == a) & problem.reach[b])
            ws = np.flatnonzero((x == b) & problem.reach[a])
            if not len(us) or not len(ws):
                continue
            diff = v[ws][None, :, :] - v[us][:, None, :]
            change = (_cost(edge_counts[a] + diff, total) + _cost(edge_counts[b] - diff, total)
                      - cost[a] - cost[b])
            i, j = np.unravel_index(int(np.argmin(change)), change.shape)
            if change[i, j] < -tol:
                u, w = us[i], ws[j]
                edge_counts[a] += v[w] - v[u]
                edge_counts[b] += v[u] - v[w]
                x[u], x[w] = b, a
                start = (start + k + 1) % len(pairs)
                break
        else:
            return x


def test_local_search_takes_the_same_steps_as_a_full_recomputation() -> None:
    # Few distinct count rows, so many moves and swaps tie: the tie-breaking must match
    # too (first user, then edge; rotating edge pairs), not only the final J.
    rng = np.random.default_rng(11)
    for trial in range(16):
        n, e = int(rng.integers(20, 60)), int(rng.integers(2, 7))
        rows = rng.integers(0, 9, size=(int(rng.integers(2, 6)), int(rng.integers(1, 5))))
        counts = rows[rng.integers(len(rows), size=n)]
        reach = rng.random((e, n)) < rng.uniform(0.3, 0.9)
        reach[rng.integers(e, size=n), np.arange(n)] = True
        problem = AssignmentProblem(counts, reach)
        start = assign(problem, "random", rng).assignment
        if trial % 3:  # full edges: no move fits, so the swaps' order decides
            problem = AssignmentProblem(counts, reach, np.bincount(start, minlength=e)
                                        + (trial % 3 == 2))
        expected = reference_local_search(problem, start)
        got = local_search(problem, start)
        np.testing.assert_array_equal(got, expected)
        assert objective(counts, got, e)[0] == objective(counts, expected, e)[0]


def test_chain_search_finds_a_cycle_that_moves_and_swaps_cannot() -> None:
    # Three full edges (capacity 2), each with two users of one class; users reach only
    # their edge and the next one, so no move fits and no swap is in range. Rotating
    # one user per edge around the cycle gives every edge two classes.
    counts = np.repeat(np.eye(3, dtype=np.int64) * 10, 2, axis=0)
    reach = np.zeros((3, 6), dtype=bool)
    for u in range(6):
        reach[[u // 2, (u // 2 + 1) % 3], u] = True
    problem = AssignmentProblem(counts, reach, capacity=np.array([2, 2, 2]))
    start = np.repeat(np.arange(3), 2)
    assert local_search(problem, start).tolist() == start.tolist()
    best, _ = brute_force(problem)
    found = chain_search(problem, start)
    problem.check(found)
    assert objective(counts, start, 3)[0] == pytest.approx(4 / 3)
    assert objective(counts, found, 3)[0] == pytest.approx(best) == pytest.approx(2 / 3)
    # Without capacities a path (a move into an edge that pushes another user on) works.
    open_problem = AssignmentProblem(counts, reach)
    assert objective(counts, chain_search(open_problem, start), 3)[0] < 4 / 3


def test_chain_search_keeps_feasibility_and_leaves_no_improving_move() -> None:
    rng = np.random.default_rng(4)
    for trial in range(6):
        problem = random_problem(rng, 60, 6, f=4, capacity=trial % 2 == 1)
        start = assign(problem, "random", rng).assignment
        found = chain_search(problem, start, max_length=6, neighbours=4)
        x = problem.check(found)  # reachable edges, capacities respected
        j = objective(problem.counts, x, 6)[0]
        assert j <= objective(problem.counts, start, 6)[0]
        # Single moves are chains of length 0, scored exhaustively: none improves.
        sizes = np.bincount(x, minlength=6)
        for u in range(60):
            for e in np.flatnonzero(problem.reach[:, u]):
                if e == x[u] or (problem.capacity is not None
                                 and sizes[e] >= problem.capacity[e]):
                    continue
                y = x.copy()
                y[u] = e
                assert objective(problem.counts, y, 6)[0] >= j - 1e-12


def test_chain_extension_matches_a_loop_over_users() -> None:
    # One step of the chain dynamic programme: per user w, the cheapest replacement u
    # whose chain has not visited w's edge (first one on ties).
    rng = np.random.default_rng(2)
    n_users, n_edges, width = 40, 70, 5  # two 64-bit words of visited edges
    x = rng.integers(n_edges, size=n_users)
    value = rng.integers(-5, 5, size=n_users).astype(float)
    value[rng.random(n_users) < 0.1] = np.inf
    replacement = rng.integers(-1, n_users, size=(n_users, width))
    score = rng.integers(-3, 3, size=(n_users, width)).astype(float)
    visited_sets = [set(rng.choice(n_edges, size=int(rng.integers(1, 30)), replace=False))
                    for _ in range(n_users)]
    visited = np.zeros((n_users, 2), np.uint64)
    for u, edges in enumerate(visited_sets):
        for e in edges:
            visited[u, e // 64] |= np.uint64(1) << np.uint64(e % 64)
    word = x // 64
    bit = np.left_shift(np.uint64(1), (x % 64).astype(np.uint64))
    new_value, pred = _extend(value, visited, word, bit, replacement, score)
    for w in range(n_users):
        options = [(value[u] + score[w, j], j, u) for j, u in enumerate(replacement[w])
                   if u >= 0 and np.isfinite(value[u]) and x[w] not in visited_sets[u]]
        if options:
            best = min(options)
            assert (new_value[w], pred[w]) == (best[0], best[2])
        else:
            assert (new_value[w], pred[w]) == (np.inf, -1)


def test_greedy_is_feasible_deterministic_and_no_worse_than_its_local_search() -> None:
    rng = np.random.default_rng(8)
    counts = np.zeros((400, 10), dtype=np.int64)
    counts[np.arange(400), np.arange(400) % 10] = rng.integers(20, 101, 400)
    reach, _ = paper_topology(counts, 12, 3, rng)
    capacity = np.full(12, 36)  # 400 users over 12 edges of at most 36
    problem = AssignmentProblem(counts, reach, capacity)
    first = assign(problem, "greedy", np.random.default_rng(0))
    x = problem.check(first.assignment)
    assert (np.bincount(x, minlength=12) <= capacity).all()
    assert problem.reach[x, np.arange(400)].all()
    again = assign(problem, "greedy", np.random.default_rng(1))
    np.testing.assert_array_equal(again.assignment, x)
    moves_and_swaps = local_search(problem, assign(problem, "heuristic", rng).assignment)
    assert first.objective <= objective(counts, moves_and_swaps, 12)[0]


def test_optimal_reports_a_certified_gap() -> None:
    rng = np.random.default_rng(6)
    for trial in range(6):
        problem = random_problem(rng, int(rng.integers(4, 9)), 3, capacity=trial % 2 == 0)
        best, _ = brute_force(problem)
        result = assign(problem, "optimal", np.random.default_rng(trial), time_limit=10)
        assert result.status == "optimal" and result.gap == 0.0
        assert result.bound_source == "cp-sat"
        assert result.bound == pytest.approx(best, abs=1e-12)
    # Stopped early on a larger instance: the bound is below the optimum, the gap is
    # (J - bound) / J in [0, 1], and the result is never worse than the greedy hint.
    counts = np.zeros((300, 10), dtype=np.int64)
    counts[np.arange(300), np.arange(300) % 10] = rng.integers(20, 101, 300)
    reach, _ = paper_topology(counts, 10, 3, rng)
    problem = AssignmentProblem(counts, reach)
    hint = assign(problem, "greedy", rng)
    result = assign(problem, "optimal", rng, hint=hint.assignment, time_limit=0.3)
    assert result.objective <= hint.objective
    assert 0.0 <= result.bound <= result.objective
    assert result.gap == pytest.approx((result.objective - result.bound) / result.objective)
    assert (result.status == "optimal") == (result.gap == 0.0)
    # Policies without a bound report no gap.
    assert assign(problem, "greedy", rng).gap is None


def test_paper_topology_keeps_its_shape_with_more_edges_than_class_pairs() -> None:
    # Cross-device size: E = 100 edges over F = 10 classes; each class pair (2e, 2e + 1)
    # mod F is held by 10 edges, every edge still by users of exactly 2 classes.
    counts = np.zeros((2000, 10), dtype=np.int64)
    counts[np.arange(2000), np.arange(2000) % 10] = 25
    reach, original = paper_topology(counts, 100, 3, np.random.default_rng(1))
    assert_paper_shape(counts, reach, original, 3)
    assert np.bincount(original, minlength=100).min() == 20


def single_class_problem(rng: np.random.Generator, n: int, e: int, f: int, r: int,
                         low: int = 20, high: int = 101) -> AssignmentProblem:
    """Users of one class each (class u mod f), each in range of r random edges."""
    counts = np.zeros((n, f), dtype=np.int64)
    counts[np.arange(n), np.arange(n) % f] = rng.integers(low, high, n)
    reach = np.zeros((e, n), dtype=bool)
    for u in range(n):
        reach[rng.choice(e, r, replace=False), u] = True
    return AssignmentProblem(counts, reach)


def distance(problem: AssignmentProblem, x: np.ndarray, target: np.ndarray) -> int:
    """sum_e ||D_e - target_e||_1."""
    loads = np.zeros(target.shape, dtype=np.int64)
    np.add.at(loads, x, problem.counts)
    return int(np.abs(loads - target).sum())


def test_subset_sum_is_exact_when_possible_and_nearest_otherwise() -> None:
    rng = np.random.default_rng(12)
    for _ in range(200):
        weights = rng.integers(1, 30, size=int(rng.integers(1, 9)))
        need = int(rng.integers(1, weights.sum() + 15))
        sums = {int(weights[list(c)].sum()) for k in range(len(weights) + 1)
                for c in itertools.combinations(range(len(weights)), k)}
        best = min(sums, key=lambda v: (abs(v - need), v))  # nearest, lower on ties
        take = _subset_sum(weights, need)
        assert int(weights[np.array(take, dtype=bool)].sum()) == best
    # Items are taken in the given order whenever the rest can still complete the sum.
    assert _subset_sum([5, 5, 5], 10) == [True, True, False]
    assert _subset_sum([7, 4, 3], 7) == [True, False, False]
    assert not any(_subset_sum([3, 4], 0))


def test_searches_towards_targets_never_worsen_and_leave_no_improving_move() -> None:
    rng = np.random.default_rng(13)
    for trial in range(8):
        problem = random_problem(rng, 30, 4, f=3, capacity=trial % 2 == 1)
        target = rng.integers(0, 25, size=(4, 3))
        start = assign(problem, "random", rng).assignment
        for search in (local_search, chain_search):
            x = problem.check(search(problem, start, target=target))
            got = distance(problem, x, target)
            assert got <= distance(problem, start, target)
            sizes = np.bincount(x, minlength=4)
            for u in range(30):  # no single move improves (both searches try them all)
                for e in np.flatnonzero(problem.reach[:, u]):
                    if e == x[u] or (problem.capacity is not None
                                     and sizes[e] >= problem.capacity[e]):
                        continue
                    y = x.copy()
                    y[u] = e
                    assert distance(problem, y, target) >= got
        # local_search also leaves no improving swap.
        x = local_search(problem, start, target=target)
        got = distance(problem, x, target)
        for u in range(30):
            for w in range(30):
                if x[u] != x[w] and problem.reach[x[w], u] and problem.reach[x[u], w]:
                    y = x.copy()
                    y[u], y[w] = x[w], x[u]
                    assert distance(problem, y, target) >= got
    # At its own loads an assignment is a fixed point.
    loads = np.zeros((4, 3), dtype=np.int64)
    np.add.at(loads, start, problem.counts)
    np.testing.assert_array_equal(local_search(problem, start, target=loads), start)
    np.testing.assert_array_equal(chain_search(problem, start, target=loads), start)


def test_class_targets_keep_class_totals_and_reachable_counts() -> None:
    rng = np.random.default_rng(14)
    problem = single_class_problem(rng, 300, 8, 4, 3)
    targets = class_targets(problem)
    assert targets.shape == (8, 4) and targets.dtype == np.int64 and (targets >= 0).all()
    np.testing.assert_array_equal(targets.sum(axis=0), problem.counts.sum(axis=0))
    classes = _user_classes(problem)
    sizes = problem.counts.sum(axis=1)
    for e in range(8):
        for c in range(4):
            # Each count is a sum of some subset of the class's users in range of e.
            reachable = 1
            for w in sizes[problem.reach[e] & (classes == c)].tolist():
                reachable |= reachable << w
            assert (reachable >> int(targets[e, c])) & 1
    # Rows are nearly proportional to the global distribution: within one example of
    # it per class and edge, or a few where a count had to move to a reachable one.
    share = problem.counts.sum(axis=0) / problem.counts.sum()
    assert _row_costs(targets, share).sum() <= 8 * 4
    # Several classes per user, or no data at all: no targets.
    assert class_targets(random_problem(rng, 10, 3)) is None
    assert class_targets(AssignmentProblem(np.zeros((3, 2), np.int64),
                                           np.ones((2, 3), bool))) is None


def test_polishing_targets_never_worsens_rows_and_keeps_columns() -> None:
    rng = np.random.default_rng(15)
    problem = single_class_problem(rng, 400, 10, 5, 3)
    classes = _user_classes(problem)
    total = problem.counts.sum(axis=0)
    share = total / total.sum()
    ideal = np.full((10, 1), total.sum() / 10) * share
    start = np.floor(ideal).astype(np.int64)
    start[0] += total - start.sum(axis=0)  # columns right, rows far from proportional
    reachable = _reachable_sums(problem, classes, int(ideal.max()) + 200)
    polished = _polish_targets(start, share, ideal, reachable, bound=200.0)
    np.testing.assert_array_equal(polished.sum(axis=0), total)
    assert _row_costs(polished, share).sum() < _row_costs(start, share).sum()


def test_fill_targets_hits_targets_that_an_assignment_reaches() -> None:
    rng = np.random.default_rng(16)
    for trial in range(4):
        # Every user in range of every edge: targets taken from a random assignment are
        # reachable, and the exact subset sums meet them.
        problem = single_class_problem(rng, 240, 6, 3, 6)
        y = rng.integers(6, size=240)
        target = np.zeros((6, 3), dtype=np.int64)
        np.add.at(target, y, problem.counts)
        x = fill_targets(problem, target, variants=3, seed=trial)
        problem.check(x)
        assert distance(problem, x, target) == 0


def test_fill_targets_when_the_first_edges_take_every_user_of_a_class() -> None:
    # 16 edges: one is filled before the end game of 15, and it takes both users of
    # class 0; the end game has no free user of that class.
    counts = np.zeros((6, 2), dtype=np.int64)
    counts[:2, 0] = [30, 40]
    counts[2:, 1] = [10, 20, 30, 40]
    reach = np.zeros((16, 6), dtype=bool)
    reach[[0, 1], :2] = True
    reach[[1, 2], 2:] = True
    target = np.zeros((16, 2), dtype=np.int64)
    target[0, 0] = 70
    target[1, 1], target[2, 1] = 40, 60
    x = fill_targets(AssignmentProblem(counts, reach), target, variants=4)
    assert x[:2].tolist() == [0, 0]
    assert distance(AssignmentProblem(counts, reach), x, target) == 0


def test_fill_targets_is_feasible_deterministic_and_handles_users_without_data() -> None:
    rng = np.random.default_rng(17)
    problem = single_class_problem(rng, 500, 20, 5, 3)
    counts = problem.counts.copy()
    counts[:7] = 0  # users without data
    problem = AssignmentProblem(counts, problem.reach)
    targets = class_targets(problem)
    x = fill_targets(problem, targets, variants=8)
    assert problem.reach[x, np.arange(500)].all()
    np.testing.assert_array_equal(fill_targets(problem, targets, variants=8), x)
    # A close fit: within 2% of the examples (exact sums almost everywhere).
    assert distance(problem, x, targets) <= 0.02 * counts.sum()
    with pytest.raises(ValueError, match="one class"):
        fill_targets(random_problem(rng, 10, 3), np.zeros((3, 3), np.int64))
    with pytest.raises(ValueError, match=r"\(E, F\)"):
        fill_targets(problem, np.zeros((3, 5), np.int64))


def test_greedy_keeps_the_better_of_its_starts_and_ignores_the_rng() -> None:
    rng = np.random.default_rng(18)
    problem = single_class_problem(rng, 1200, 20, 10, 3)
    counts = problem.counts
    greedy = assign(problem, "greedy", np.random.default_rng(0))
    np.testing.assert_array_equal(
        assign(problem, "greedy", np.random.default_rng(1)).assignment, greedy.assignment)
    # A small instance with nearly proportional class targets: both starts, Algorithm 1
    # (the previous greedy policy) and the filled targets, each followed by the local
    # searches; the lower J is kept.
    old = _equal_split(problem, 0.1, greedy=True)
    old = chain_search(problem, local_search(problem, old))
    filled = fill_targets(problem, class_targets(problem), variants=50)  # 10 per edge > 15
    filled = chain_search(problem, local_search(problem, filled))
    assert greedy.objective == pytest.approx(min(objective(counts, old, 20)[0],
                                                 objective(counts, filled, 20)[0]))
    # The targets pay off: here the filled start beats Algorithm 1 by far.
    assert objective(counts, filled, 20)[0] < 0.5 * objective(counts, old, 20)[0]


def test_greedy_skips_class_targets_that_cannot_be_proportional() -> None:
    # Paper topology, r = 2, 20 users per edge: several edges cannot reach every class
    # in proportion, the targets' own J is far above 1%, and greedy is the previous
    # policy (Algorithm 1 and the local searches) alone.
    rng = np.random.default_rng(19)
    problem, _ = paper_problem(rng, 600, 30, 2)
    total = problem.counts.sum(axis=0)
    assert _row_costs(class_targets(problem), total / total.sum()).sum() > 0.01 * total.sum()
    old = _equal_split(problem, 0.1, greedy=True)
    old = chain_search(problem, local_search(problem, old))
    np.testing.assert_array_equal(assign(problem, "greedy", rng).assignment, old)
