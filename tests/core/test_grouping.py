"""FedGSP's grouping core: growth functions, ICG, random grouping, CPD."""

from __future__ import annotations

import math
from itertools import permutations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from fedgsp_flwr.core import equal_size, grouping, min_cost_flow
from fedgsp_flwr.core.equal_size import (
    assignment_prices,
    equal_size_assignment,
    greedy_balanced_assignment,
)
from fedgsp_flwr.core.grouping import (
    balance_groups,
    class_distributions,
    cpd,
    group_classes,
    group_cpd,
    icg,
    num_groups,
    pairwise_cpd,
    plan_groups,
    random_groups,
)
from fedgsp_flwr.core.kmeans import squared_distances
from fedgsp_flwr.core.min_cost_flow import AssignmentStats


@pytest.mark.parametrize(
    ("growth", "r", "alpha", "beta", "expected"),
    [
        ("linear", 1, 2.0, 10, 10), ("linear", 3, 0.5, 10, 20), ("linear", 4, 1.5, 2, 10),
        ("log", 1, 2.0, 10, 10), ("log", 3, 2.0, 10, 30), ("log", 10, 2.0, 10, 50),
        ("exp", 1, 1.0, 3, 3), ("exp", 4, 1.0, 3, 24), ("exp", 3, 0.5, 4, 8),
    ],
)
def test_growth_functions_follow_the_paper(growth: str, r: int, alpha: float, beta: int,
                                           expected: int) -> None:
    assert num_groups(r, growth, alpha, beta, num_clients=10_000) == expected


def test_growth_matches_the_formulas_over_many_rounds() -> None:
    for r in range(1, 60):
        assert num_groups(r, "linear", 0.7, 3, 10**6) == 3 * math.floor(0.7 * (r - 1) + 1)
        assert num_groups(r, "log", 2.0, 10, 10**6) == 10 * math.floor(2 * math.log(r) + 1)
        assert num_groups(r, "exp", 0.3, 2, 10**6) == min(2 * math.floor(1.3 ** (r - 1)),
                                                          10**6)


def test_growth_is_clipped_to_the_number_of_clients() -> None:
    assert num_groups(500, "exp", 1.0, 10, num_clients=100) == 100
    assert num_groups(10**6, "exp", 5.0, 10, num_clients=7) == 7  # no float overflow
    assert num_groups(1, "log", 2.0, 50, num_clients=20) == 20


@pytest.mark.parametrize("bad", [("cubic", 1, 1.0, 1), ("log", 0, 1.0, 1),
                                 ("log", 1, 0.0, 1), ("log", 1, 1.0, 0)])
def test_growth_rejects_bad_parameters(bad: tuple) -> None:
    growth, r, alpha, beta = bad
    with pytest.raises(ValueError):
        num_groups(r, growth, alpha, beta, 10)


def skewed_histograms(k: int, f: int = 10, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(20, 300, k)
    return np.stack([rng.multinomial(n, rng.dirichlet(np.full(f, 0.2))) for n in sizes])


def test_icg_groups_hold_one_client_of_every_cluster() -> None:
    v = skewed_histograms(60)
    result = icg(v, 12, np.random.default_rng(0))
    assert len(result.clusters) == 5 and {len(c) for c in result.clusters} == {12}
    cluster_of = {c: i for i, members in enumerate(result.clusters) for c in members}
    assert len(result.groups) == 12
    for group in result.groups:
        assert sorted(cluster_of[c] for c in group) == list(range(5))
    assert sorted(c for g in result.groups for c in g) == list(range(60))


def test_icg_with_k_not_divisible_drops_or_distributes_the_leftovers() -> None:
    v = skewed_histograms(103)
    result = icg(v, 10, np.random.default_rng(1), leftover="distribute")
    assert len(result.clusters) == 10 and {len(c) for c in result.clusters} == {10}
    assert sorted(c for g in result.groups for c in g) == list(range(103))
    sizes = sorted(len(g) for g in result.groups)
    assert sizes[0] >= 10 and sizes[-1] - sizes[0] <= 1
    dropped = icg(v, 10, np.random.default_rng(1))  # the paper's default
    assert {len(g) for g in dropped.groups} == {10}
    assert len(dropped.dropped) == 3 and not set(dropped.dropped) & {
        c for g in dropped.groups for c in g}


def test_icg_edge_cases_m1_and_m_at_least_k() -> None:
    v = skewed_histograms(9)
    one = icg(v, 1, np.random.default_rng(0))
    assert len(one.groups) == 1 and sorted(one.groups[0]) == list(range(9))
    for m in (9, 20):
        each = icg(v, m, np.random.default_rng(0))
        assert sorted(len(g) for g in each.groups) == [1] * 9


def test_icg_is_deterministic_by_seed_and_uses_client_ids() -> None:
    v = skewed_histograms(40)
    ids = list(range(100, 140))
    a = icg(v, 8, np.random.default_rng(5), client_ids=ids)
    b = icg(v, 8, np.random.default_rng(5), client_ids=ids)
    c = icg(v, 8, np.random.default_rng(6), client_ids=ids)
    assert a.groups == b.groups and a.groups != c.groups
    assert {x for g in a.groups for x in g} == set(ids)


def test_equal_size_assignment_is_optimal_on_a_small_case() -> None:
    rng = np.random.default_rng(0)
    points, centroids = rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    labels, _ = equal_size_assignment(points, centroids, size=2, neighbours=1)
    assert sorted(np.bincount(labels)) == [2, 2, 2]
    cost = lambda lab: sum(((points[i] - centroids[lab[i]]) ** 2).sum() for i in range(6))
    best = min(cost([perm[i] // 2 for i in range(6)]) for perm in permutations(range(6)))
    assert cost(labels) == pytest.approx(best, rel=1e-5)


def test_warm_started_assignment_reaches_the_cold_optimum() -> None:
    rng = np.random.default_rng(1)
    points = rng.normal(size=(120, 5))
    for step in range(6):
        old = rng.normal(size=(6, 5))
        warm = equal_size_assignment(points, old, size=20, neighbours=6)
        assert warm[1] is not None
        new = old + rng.normal(scale=0.1 * (step + 1), size=old.shape)
        cold, _ = equal_size_assignment(points, new, size=20, neighbours=6)
        labels, prices = equal_size_assignment(points, new, size=20, neighbours=6,
                                               warm_start=warm)
        d = squared_distances(points, new)
        total = lambda lab, d=d: d[np.arange(120), lab].sum()
        assert np.bincount(labels).tolist() == [20] * 6
        assert total(labels) == pytest.approx(total(cold), rel=1e-6)
        assert prices is not None
        reduced = d - prices[None, :]
        assert (reduced[np.arange(120), labels] <= reduced.min(axis=1) + 1e-6).all()


def dense_optimum(d: np.ndarray, size: int) -> float:
    """Least total cost of an equal-size assignment over the full network: an exact
    linear assignment against ``size`` copies of every cluster column.
    """
    rows, cols = linear_sum_assignment(np.repeat(d, size, axis=1))
    return float(d[rows, cols // size].sum())


def sparse_optimum(d: np.ndarray, size: int, width: int) -> float | None:
    """The same over each point's ``width`` nearest clusters only (``None``: infeasible)."""
    restricted = np.full(d.shape, np.inf)
    nearest = np.argpartition(d, width - 1, axis=1)[:, :width]
    np.put_along_axis(restricted, nearest, np.take_along_axis(d, nearest, axis=1), axis=1)
    try:
        rows, cols = linear_sum_assignment(np.repeat(restricted, size, axis=1))
    except ValueError:
        return None
    return float(restricted[rows, cols // size].sum())


def crowded_instance(seed: int, n_clusters: int = 12,
                     size: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """70% of the points crowd around 3 of the centroids: their near clusters fill up,
    and the optimum sends many of them to far ones.
    """
    rng = np.random.default_rng(seed)
    centroids = rng.uniform(-10, 10, size=(n_clusters, 2))
    hot = rng.choice(n_clusters, 3, replace=False)
    n = n_clusters * size
    home = np.where(rng.random(n) < 0.7, rng.choice(hot, n), rng.integers(0, n_clusters, n))
    return centroids[home] + rng.normal(size=(n, 2)), centroids


def assert_optimal(points: np.ndarray, centroids: np.ndarray, size: int,
                   labels: np.ndarray, prices: np.ndarray) -> None:
    """Balanced, as cheap as the dense optimum, and certified by the prices."""
    d = squared_distances(points, centroids)
    assert np.bincount(labels, minlength=len(centroids)).tolist() == [size] * len(centroids)
    best = dense_optimum(d, size)
    assert d[np.arange(len(d)), labels].sum() == pytest.approx(best, rel=1e-9, abs=1e-9)
    # every point's cluster minimises distance minus price over ALL clusters (up to the
    # integer rounding of the distances, a unit of max(d) / 2^40)
    reduced = d - prices[None, :]
    slack = reduced[np.arange(len(d)), labels] - reduced.min(axis=1)
    assert slack.max() <= 1e-9 * d.max()


@pytest.mark.parametrize("seed", range(8))
def test_assignment_is_optimal_over_the_full_network_with_many_clusters(seed: int) -> None:
    # L = 12 > 8 clusters, 2 initial arcs per point: sparse arcs alone are not enough
    points, centroids = crowded_instance(seed)
    labels, prices = equal_size_assignment(points, centroids, size=10, neighbours=2)
    assert_optimal(points, centroids, 10, labels, prices)


def test_crowded_instances_need_far_arcs() -> None:
    # The instances above are adversarial: on some, the first feasible sparse network
    # (arcs to the 2, 4, 8 nearest centroids, doubled until feasible) misses the optimum.
    worse = 0
    for seed in range(8):
        points, centroids = crowded_instance(seed)
        d = squared_distances(points, centroids)
        for width in (2, 4, 8, 12):
            sparse = sparse_optimum(d, 10, width)
            if sparse is not None:
                break
        worse += sparse > dense_optimum(d, 10) * (1 + 1e-9)
    assert worse >= 2


@pytest.mark.parametrize("seed", [0, 5, 6])
def test_growing_restricted_networks_reach_the_optimum(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # With a single Bellman-Ford pass per flow, non-optimal flows are not repaired by
    # cycle cancelling: the restricted network must grow (pricing rounds) instead.
    monkeypatch.setattr(min_cost_flow, "_CYCLE_PASSES", -10**6)
    points, centroids = crowded_instance(seed)
    stats = AssignmentStats()
    labels, prices = equal_size_assignment(points, centroids, size=10, neighbours=2,
                                           stats=stats)
    assert_optimal(points, centroids, 10, labels, prices)
    assert stats.pricing_rounds >= 1
    moved = centroids + np.random.default_rng(seed).normal(scale=4.0, size=centroids.shape)
    labels, prices = equal_size_assignment(points, moved, size=10, neighbours=2,
                                           warm_start=(labels, prices), stats=stats)
    assert_optimal(points, moved, 10, labels, prices)


@pytest.mark.parametrize("seed", range(4))
def test_random_instances_with_many_clusters_are_solved_exactly(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n_clusters, size = int(rng.integers(9, 25)), int(rng.integers(3, 12))
    points = rng.gamma(0.3, size=(n_clusters * size, 10)) * 50
    centroids = points[rng.choice(len(points), n_clusters, replace=False)]
    stats = AssignmentStats()
    labels, prices = equal_size_assignment(points, centroids, size, neighbours=1, stats=stats)
    assert_optimal(points, centroids, size, labels, prices)
    assert stats.flows >= 1 and stats.flow_arcs >= len(points)


@pytest.mark.parametrize("incremental", [False, True])
def test_warm_started_steps_with_many_clusters_stay_exact(
        incremental: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # k-means-like sequence: centroids move, each step warm-started from the last
    if incremental:
        monkeypatch.setattr(min_cost_flow, "_SMALL_CLUSTER_GRAPH", 0)
    points, centroids = crowded_instance(3, n_clusters=16, size=8)
    rng = np.random.default_rng(7)
    labels, prices = equal_size_assignment(points, centroids, size=8, neighbours=2)
    for step in range(8):
        if step % 2:
            centroids = np.stack([points[labels == c].mean(axis=0) for c in range(16)])
        else:
            centroids = centroids + rng.normal(scale=3.0, size=centroids.shape)
        labels, prices = equal_size_assignment(points, centroids, size=8, neighbours=2,
                                               warm_start=(labels, prices))
        assert_optimal(points, centroids, 8, labels, prices)


def test_identical_points_are_assigned_exactly() -> None:
    # duplicates share one flow node; the shares still fill every cluster exactly
    rng = np.random.default_rng(4)
    kinds = rng.integers(0, 4, size=(7, 10)) * 100.0
    points = kinds[rng.integers(0, 7, size=132)]
    centroids = kinds[rng.integers(0, 7, size=12)] + rng.normal(scale=20, size=(12, 10))
    labels, prices = equal_size_assignment(points, centroids, size=11, neighbours=2)
    assert_optimal(points, centroids, 11, labels, prices)
    moved = centroids + rng.normal(scale=30, size=centroids.shape)
    labels, prices = equal_size_assignment(points, moved, size=11, neighbours=2,
                                           warm_start=(labels, prices))
    assert_optimal(points, moved, 11, labels, prices)


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("shape", ["spread", "crowded", "duplicates"])
def test_every_icg_assignment_step_is_optimal_over_the_full_network(
        shape: str, incremental: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spy on ICG's assignment steps (L = 15 clusters, 2 arcs per client at first): each
    # result must match the dense optimum of the same integer costs exactly. Cycle
    # cancelling updates the cluster graph incrementally on large problems only; force
    # that path here too.
    if incremental:
        monkeypatch.setattr(min_cost_flow, "_SMALL_CLUSTER_GRAPH", 0)
    steps = []
    exact = min_cost_flow._exact_assignment

    def spy(cost: np.ndarray, *args: object) -> tuple[np.ndarray, np.ndarray]:
        before = cost.copy()
        labels, prices = exact(cost, *args)
        steps.append((before, args[1], labels))
        return labels, prices

    monkeypatch.setattr(grouping, "_exact_assignment", spy)  # where icg looks it up
    rng = np.random.default_rng(11)
    if shape == "spread":
        v = skewed_histograms(300, f=10, seed=5)
    elif shape == "crowded":
        v = np.abs(crowded_instance(5, n_clusters=15, size=20)[0]) * 10
    else:
        v = rng.integers(0, 3, size=(12, 6))[rng.integers(0, 12, 300)] * 50
    result = icg(v, 20, np.random.default_rng(0), neighbours=2, max_iter=6)
    assert len(result.clusters) == 15 and steps
    for cost, size, labels in steps:
        integer_cost = cost[np.arange(len(cost)), labels].sum()
        assert integer_cost == dense_optimum(cost, size)
    assert result.assignment.flows >= len(steps)


def test_assignment_prices_rejects_an_assignment_with_an_improving_swap() -> None:
    rng = np.random.default_rng(2)
    points, centroids = rng.normal(size=(30, 3)), rng.normal(size=(3, 3))
    labels, _ = equal_size_assignment(points, centroids, size=10, neighbours=3)
    d = squared_distances(points, centroids)
    assert assignment_prices(d, labels) is not None
    # Swap the pair whose exchange costs the most: the result is balanced but worse.
    a, b = np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)
    gain = (d[a, 1][:, None] + d[b, 0][None, :]) - (d[a, 0][:, None] + d[b, 1][None, :])
    i, j = np.unravel_index(np.argmax(gain), gain.shape)
    assert gain[i, j] > 0
    worse = labels.copy()
    worse[a[i]], worse[b[j]] = 1, 0
    assert assignment_prices(d, worse) is None
    with pytest.raises(ValueError, match="warm_start"):
        equal_size_assignment(points, centroids, size=10,
                              warm_start=(worse[:-1], np.zeros(3)))


def test_grouping_still_exports_the_solver_names() -> None:
    # they moved to equal_size / min_cost_flow; users may still import them from grouping
    for name in ("equal_size_assignment", "greedy_balanced_assignment", "assignment_prices"):
        assert getattr(grouping, name) is getattr(equal_size, name)
        assert name in grouping.__all__
    assert grouping.AssignmentStats is AssignmentStats
    assert "AssignmentStats" in grouping.__all__


def test_icg_beats_random_grouping_on_cpd() -> None:
    v = skewed_histograms(200, f=10, seed=3)
    icg_cpd, random_cpd = [], []
    for seed in range(5):
        groups = icg(v, 20, np.random.default_rng(seed)).groups
        icg_cpd.append(np.median(pairwise_cpd(class_distributions(v, groups))))
        rand = random_groups(list(range(200)), 20, np.random.default_rng(seed))
        random_cpd.append(np.median(pairwise_cpd(class_distributions(v, rand))))
    assert np.mean(icg_cpd) < np.mean(random_cpd)


def test_random_groups_are_a_near_equal_partition() -> None:
    groups = random_groups(list(range(23)), 5, np.random.default_rng(0))
    assert sorted(len(g) for g in groups) == [4, 4, 5, 5, 5]
    assert sorted(c for g in groups for c in g) == list(range(23))


def test_cpd_is_mmd_under_the_rbf_kernel() -> None:
    p, q = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])
    off = math.exp(-1.0)
    assert cpd(p, q) == pytest.approx(2 - 2 * off)
    assert cpd(p, p) == 0.0
    dists = np.array([p, q, [0.5, 0.5, 0.0]])
    pairs = pairwise_cpd(dists)
    assert pairs == pytest.approx([cpd(p, q), cpd(p, dists[2]), cpd(q, dists[2])])


def test_icg_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        icg(np.array([[1, -1], [2, 2]]), 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="\\(K, F\\)"):
        icg(np.zeros(4), 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="leftover"):
        icg(np.ones((4, 2)), 2, np.random.default_rng(0), leftover="keep")


def test_balancing_keeps_one_client_per_cluster_and_lowers_cpd() -> None:
    v = skewed_histograms(120, f=10, seed=4)
    plain = icg(v, 20, np.random.default_rng(2))
    balanced = icg(v, 20, np.random.default_rng(2), balance=True)
    cluster_of = {c: i for i, members in enumerate(balanced.clusters) for c in members}
    for group in balanced.groups:
        assert sorted(cluster_of[c] for c in group) == list(range(len(balanced.clusters)))
    assert balanced.clusters == plain.clusters
    cpd_plain = np.mean(pairwise_cpd(class_distributions(v, plain.groups)))
    cpd_balanced = np.mean(pairwise_cpd(class_distributions(v, balanced.groups)))
    assert cpd_balanced < 0.6 * cpd_plain


def test_balance_groups_reaches_the_best_arrangement_of_a_tiny_case() -> None:
    # two groups, two clusters: the best table pairs the opposite-skew clients
    v = np.array([[9, 1], [1, 9], [8, 2], [2, 8]], dtype=float)
    table = np.array([[0, 2], [1, 3]])  # group 0 = {0, 2} (both class-0 heavy)
    best = balance_groups(v, table)
    assert sorted(map(sorted, best.tolist())) == [[0, 3], [1, 2]]


def test_greedy_balanced_assignment_is_balanced_and_near_greedy() -> None:
    rng = np.random.default_rng(3)
    d = rng.random((60, 6))
    labels = greedy_balanced_assignment(d, 10)
    assert np.bincount(labels, minlength=6).tolist() == [10] * 6
    # with room everywhere it is the plain nearest-cluster assignment
    near = np.repeat(np.eye(3), 4, axis=0)  # 12 clients, 4 nearest to each cluster
    np.testing.assert_array_equal(greedy_balanced_assignment(1 - near, 4),
                                  np.repeat(np.arange(3), 4))
    # the client with most to lose gets its first choice
    d = np.array([[0.0, 10.0], [0.0, 0.5], [1.0, 1.0], [2.0, 2.0]])
    assert greedy_balanced_assignment(d, 2)[0] == 0


def test_a_plan_samples_kappa_of_the_groups_and_shuffles_only_their_order() -> None:
    rng = np.random.default_rng(0)
    nodes = list(range(100, 120))
    histograms = {n: np.eye(4, dtype=np.int64)[n % 4] * 10 for n in nodes[:16]}
    plan = plan_groups(nodes, histograms, 4, 0.5, rng)
    assert sorted(n for g in plan.groups for n in g) == nodes  # leftovers distributed
    for group in plan.groups:  # ICG: one client of each of the 4 one-class clusters
        assert sorted(n % 4 for n in group if n in histograms) == [0, 1, 2, 3]
    assert len(plan.chains) == 2  # 0.5 x 4
    assert all(sorted(c) in [sorted(g) for g in plan.groups] for c in plan.chains)
    again = plan_groups(nodes, histograms, 4, 0.5, np.random.default_rng(0))
    assert again == plan
    at_random = plan_groups(nodes, {}, 5, 1.0, np.random.default_rng(0))
    assert len(at_random.chains) == 5 and sorted(map(len, at_random.groups)) == [4] * 5


@pytest.mark.parametrize(("num_groups", "kappa", "count"), [
    (15, 0.3, 5), (5, 0.3, 2), (10, 0.3, 3), (5, 0.1, 1), (1, 0.3, 1), (4, 0.5, 2),
    (45, 0.7, 32), (50, 0.29, 15), (90, 0.35, 32)])
def test_kappa_m_groups_are_sampled_rounded_half_up_and_at_least_one(
        num_groups: int, kappa: float, count: int) -> None:
    assert grouping.sampled_group_count(num_groups, kappa) == count
    assert len(grouping.sample_groups(num_groups, kappa, np.random.default_rng(0))) == count


def test_group_cpd_is_zero_for_identical_groups_and_needs_two_groups() -> None:
    hist = {1: np.array([5, 0]), 2: np.array([0, 5]), 3: np.array([5, 0]),
            4: np.array([0, 5]), 5: np.array([9, 9])}
    same = group_cpd([[1, 2], [3, 4]], hist)
    assert same == {"cpd-median": pytest.approx(0.0), "cpd-mean": pytest.approx(0.0)}
    assert group_cpd([[1, 3], [2, 4]], hist)["cpd-mean"] > 0.1
    assert group_cpd([[1, 2, 6], [7]], hist) == {}  # 6 and 7 have no histogram


def test_group_classes_counts_the_classes_a_group_holds_between_its_members() -> None:
    hist = {1: np.array([5, 0, 0]), 2: np.array([0, 5, 0]), 3: np.array([2, 0, 0]),
            4: np.array([0, 0, 1])}
    assert group_classes([[1, 2, 4], [3, 9]], hist) == {"group-classes-mean": 2.0,
                                                        "group-classes-min": 1.0}
    assert group_classes([[8, 9]], hist) == {}  # no histogram
