"""User-edge assignment core: objective, exact MILP, heuristics, constraints, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedgsp_flwr.core.edge_assignment import (
    POLICIES,
    AssignmentProblem,
    assign,
    brute_force,
    edge_class_coverage,
    load_topology,
    local_search,
    objective,
    paper_topology,
    similar_groups,
    warm_start,
)


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
        result = assign(problem, policy, np.random.default_rng(trial), original=original,
                        time_limit=5)
        x = result.assignment
        assert problem.reach[x, np.arange(10)].all()
        assert (np.bincount(x, minlength=3) <= problem.capacity).all()
        assert result.objective == pytest.approx(objective(problem.counts, x, 3)[0])


def test_greedy_with_local_search_beats_the_heuristic_and_random() -> None:
    rng = np.random.default_rng(5)
    counts = np.zeros((200, 10), dtype=np.int64)
    counts[np.arange(200), np.arange(200) % 10] = rng.integers(20, 101, 200)
    reach, original = paper_topology(counts, 10, 3, rng)
    problem = AssignmentProblem(counts, reach)
    values = {p: assign(problem, p, np.random.default_rng(0), original=original).objective
              for p in ("original", "random", "heuristic", "greedy")}
    assert values["greedy"] <= values["heuristic"] < values["original"]
    assert values["greedy"] < values["random"]
    # Local search never makes an assignment worse.
    start = assign(problem, "random", np.random.default_rng(1)).assignment
    improved = local_search(problem, start, seconds=0.5)
    assert objective(counts, improved, 10)[0] <= objective(counts, start, 10)[0]


def test_paper_topology_gives_each_edge_two_classes_and_r_reachable_edges() -> None:
    counts = np.zeros((100, 10), dtype=np.int64)
    counts[np.arange(100), np.arange(100) % 10] = 30
    reach, original = paper_topology(counts, 10, 3, np.random.default_rng(0))
    assert (reach.sum(axis=0) == 3).all() and reach[original, np.arange(100)].all()
    for e in range(10):
        assert set(np.argmax(counts[original == e], axis=1).tolist()) == {
            (2 * e) % 10, (2 * e + 1) % 10}
    # The paper: the original assignment scores 1.6 (two classes per edge out of ten).
    assert objective(counts, original, 10)[0] == pytest.approx(1.6)
    one, _ = paper_topology(counts, 1, 1, np.random.default_rng(0))
    assert one.all()
    with pytest.raises(ValueError, match="1 <= r <= edges"):
        paper_topology(counts, 10, 11, np.random.default_rng(0))


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
