"""FedGSP's grouping core: growth functions, ICG, random grouping, CPD.

Pure numpy and OR-Tools; no Flower imports. See docs/strategies/fedgsp.md and Zeng et al.,
"Heterogeneous Federated Learning via Grouped Sequential-to-Parallel Training".

The equal-size clustering behind ICG lives in :mod:`fedgsp_flwr.core.equal_size`
(entry points) and :mod:`fedgsp_flwr.core.min_cost_flow` (the exact solver); the
public solver names are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from .equal_size import (
    _cluster_means,
    _distances,
    _kmeans_plus_plus,
    assignment_prices,
    equal_size_assignment,
    greedy_balanced_assignment,
)
from .min_cost_flow import (
    AssignmentStats,
    _duplicate_groups,
    _exact_assignment,
    _integer_distances,
)

__all__ = [
    "GROWTH_FUNCTIONS",
    "LEFTOVER_POLICIES",
    "AssignmentStats",
    "GroupPlan",
    "ICGResult",
    "assignment_prices",
    "balance_groups",
    "class_distributions",
    "cpd",
    "equal_size_assignment",
    "form_groups",
    "greedy_balanced_assignment",
    "group_classes",
    "group_cpd",
    "icg",
    "join_smallest",
    "num_groups",
    "pairwise_cpd",
    "plan_groups",
    "random_groups",
    "rbf_gram",
    "sample_groups",
    "sampled_group_count",
    "shuffled",
    "spread",
]

GROWTH_FUNCTIONS = ("linear", "log", "exp")
LEFTOVER_POLICIES = ("distribute", "drop")
_GREEDY_ROUNDS = 3  # greedy balanced assignment + update rounds before the exact steps


def num_groups(server_round: int, growth: str, alpha: float, beta: int, num_clients: int) -> int:
    """Number of groups f(r) of round r (from 1), clipped to [1, num_clients].

    linear: beta * floor(alpha (r - 1) + 1); log: beta * floor(alpha ln r + 1);
    exp: beta * floor((1 + alpha)^(r - 1)).

    Raises
    ------
    ValueError
        On an unknown growth function, r < 1, alpha <= 0 or beta < 1.
    """
    if growth not in GROWTH_FUNCTIONS:
        raise ValueError(f"Unknown growth '{growth}'. Choose one of {GROWTH_FUNCTIONS}.")
    if server_round < 1 or alpha <= 0 or beta < 1 or num_clients < 1:
        raise ValueError(
            f"need round >= 1, alpha > 0, beta >= 1, clients >= 1; got "
            f"{server_round}, {alpha}, {beta}, {num_clients}"
        )
    if growth == "linear":
        base = math.floor(alpha * (server_round - 1) + 1)
    elif growth == "log":
        base = math.floor(alpha * math.log(server_round) + 1)
    else:
        # (1+alpha)^(r-1) overflows floats for long runs; the clip makes the cap exact.
        exponent = (server_round - 1) * math.log1p(alpha)
        base = (num_clients if exponent > math.log(num_clients + 1)
                else math.floor((1 + alpha) ** (server_round - 1)))
    return int(min(max(beta * base, 1), num_clients))


def random_groups(client_ids: list[int], m: int, rng: np.random.Generator) -> list[list[int]]:
    """Split clients at random into ``min(m, len(client_ids))`` groups of near-equal size.

    Raises
    ------
    ValueError
        If ``m < 1``.
    """
    if m < 1:
        raise ValueError(f"number of groups must be >= 1, got {m}")
    ids = list(client_ids)  # node ids can exceed int64: index, never convert
    order = rng.permutation(len(ids))
    m = min(m, len(ids))
    return [[ids[i] for i in chunk] for chunk in np.array_split(order, m)] if m else []


def spread(rng: np.random.Generator, m: int, count: int) -> np.ndarray:
    """Random group indices for ``count`` extra members, at most one more per group
    than any other group receives.
    """
    return np.concatenate([rng.permutation(m) for _ in range(count // m + 1)])[:count]


@dataclass(frozen=True)
class ICGResult:
    """Outcome of :func:`icg`.

    Attributes
    ----------
    groups : list[list[int]]
        Client ids per group, in random order inside each group.
    clusters : list[list[int]]
        Client ids per equal-size cluster (the clients that were clustered).
    leftover : list[int]
        Clients outside the one-per-cluster structure (distributed or dropped).
    dropped : list[int]
        Clients in no group this round (``leftover="drop"``).
    iterations : int
        Exact assignment/update iterations run.
    objective : float
        Final clustering objective sum_k 1/2 ||V^k - C_l(k)||^2.
    assignment : AssignmentStats
        Work of the exact assignment steps (flows solved, pricing rounds, cycles).
    """

    groups: list[list[int]]
    clusters: list[list[int]]
    leftover: list[int]
    dropped: list[int]
    iterations: int
    objective: float
    assignment: AssignmentStats = field(default_factory=AssignmentStats)


def icg(
    histograms: np.ndarray,
    m: int,
    rng: np.random.Generator,
    *,
    client_ids: list[int] | None = None,
    max_iter: int = 10,
    normalize: bool = False,
    leftover: str = "drop",
    neighbours: int = 8,
    balance: bool = False,
) -> ICGResult:
    """Inter-Cluster Grouping (FedGSP, Algorithm 2).

    Clusters the K clients' class histograms into L = floor(K/M) clusters of equal size
    s = floor(K/L) (equal-size k-means), then forms M groups, each taking one client
    drawn at random from every cluster, so that every group's summed histogram is close
    to the global one.

    The clustering starts from k-means++ seeds and ``_GREEDY_ROUNDS`` (3) cheap rounds
    of greedy balanced assignment (:func:`greedy_balanced_assignment`) and centroid
    update; then up to ``max_iter`` iterations alternate an exact assignment step, the
    optimum over the full client-cluster network (:func:`equal_size_assignment`,
    warm-started from the previous step), and the centroid update, until the
    assignment no longer changes.

    Parameters
    ----------
    histograms : np.ndarray
        (K, F) label counts, one row per client.
    m : int
        Number of groups M.
    rng : np.random.Generator
        Randomness (sampling, initialisation, draws).
    client_ids : list[int] | None
        Ids of the rows; ``range(K)`` if ``None``.
    max_iter : int
        Maximum exact assignment/update iterations (the paper's tau).
    normalize : bool
        Cluster on label proportions instead of raw counts (the paper: counts).
    leftover : str
        ``"drop"`` (the paper): clients outside the one-per-cluster structure (K not
        divisible) sit this round out; ``"distribute"`` (ours): they join groups, at
        most one extra per group per cluster, spread over the groups.
    neighbours : int
        Initial flow arcs per client (its nearest centroids) of the first assignment
        step, and the most a client gets when later steps free it. Only a speed
        setting: every assignment step is optimal over all client-cluster arcs.
    balance : bool
        After the random one-per-cluster draw, swap same-cluster members between
        groups while that brings the groups' class distributions closer to the global
        one (:func:`balance_groups`; not in the paper, which draws at random). Every
        group still holds one client of every cluster.

    Returns
    -------
    ICGResult
        Groups, clusters and diagnostics.

    Raises
    ------
    ValueError
        On bad shapes or parameters.
    """
    v = np.asarray(histograms, dtype=np.float64)
    if v.ndim != 2 or len(v) == 0:
        raise ValueError(f"histograms must be a non-empty (K, F) array, got shape {v.shape}")
    if not np.isfinite(v).all() or (v < 0).any():
        raise ValueError("histograms must be finite and non-negative")
    if m < 1 or max_iter < 1 or neighbours < 1:
        raise ValueError(f"need m >= 1, max_iter >= 1, neighbours >= 1; got {m}, "
                         f"{max_iter}, {neighbours}")
    if leftover not in LEFTOVER_POLICIES:
        raise ValueError(f"Unknown leftover policy '{leftover}'. Choose {LEFTOVER_POLICIES}.")
    ids = list(range(len(v))) if client_ids is None else list(client_ids)  # may be > int64
    if len(ids) != len(v):
        raise ValueError(f"{len(ids)} client ids for {len(v)} histograms")
    if normalize:
        v = v / np.maximum(v.sum(axis=1, keepdims=True), 1e-12)
    k = len(v)
    if m >= k:  # every client its own group: FedAvg
        return ICGResult([[ids[i]] for i in rng.permutation(k)], [list(ids)], [], [], 0, 0.0)
    n_clusters = k // m
    size = k // n_clusters
    in_clusters = np.zeros(k, dtype=bool)
    in_clusters[rng.choice(k, n_clusters * size, replace=False)] = True
    chosen, outside = np.flatnonzero(in_clusters), np.flatnonzero(~in_clusters)
    points = v[chosen]
    norms = np.einsum("ij,ij->i", points, points)
    duplicates = _duplicate_groups(points)
    # k-means++ seeds, then cheap greedy balanced rounds: the exact steps start from
    # centroids of equal-size clusters, much nearer their fixed point (smaller flows).
    seeds = _kmeans_plus_plus(points, norms, n_clusters, rng)
    labels = greedy_balanced_assignment(_distances(points, norms, seeds), size)
    centroids = _cluster_means(points, labels, n_clusters)
    for _ in range(_GREEDY_ROUNDS - 1):
        labels = greedy_balanced_assignment(_distances(points, norms, centroids), size)
        centroids = _cluster_means(points, labels, n_clusters)
    iterations = 0
    prices: np.ndarray | None = None
    stats = AssignmentStats()
    while iterations < max_iter:
        iterations += 1
        # After the first step, the previous step's labels and prices warm-start the next.
        new_labels, prices = _exact_assignment(*_integer_distances(points, norms, centroids),
                                               size, neighbours, labels, prices,
                                               duplicates, stats)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        centroids = _cluster_means(points, labels, n_clusters)
    objective = 0.5 * float(((points - centroids[labels]) ** 2).sum())
    clusters = chosen[np.argsort(labels, kind="stable").reshape(n_clusters, size)]
    drawn = rng.permuted(clusters, axis=1)  # each cluster's members in random order
    table = drawn[:, :m].T  # (M, L): group x cluster
    if balance:
        table = balance_groups(np.asarray(histograms, dtype=np.float64), table)
    extra = np.concatenate([drawn[:, m:].reshape(-1), outside])
    members, owner = table.reshape(-1), np.repeat(np.arange(m), n_clusters)
    dropped = extra[:0]
    if leftover == "distribute":
        members = np.concatenate([members, extra])
        owner = np.concatenate([owner, spread(rng, m, len(extra))])
    else:
        dropped = extra
    # every group in random order: sort by group, then by a random key
    order = np.lexsort((rng.random(len(members)), owner))
    shuffled = [int(ids[c]) for c in members[order].tolist()]
    ends = np.cumsum(np.bincount(owner, minlength=m)).tolist()
    return ICGResult(
        groups=[shuffled[a:b] for a, b in zip([0] + ends[:-1], ends, strict=True)],
        clusters=[[int(ids[c]) for c in row] for row in clusters.tolist()],
        leftover=[int(ids[c]) for c in extra.tolist()],
        dropped=[int(ids[c]) for c in dropped.tolist()],
        iterations=iterations,
        objective=objective,
        assignment=stats,
    )


def balance_groups(
    histograms: np.ndarray, table: np.ndarray, max_sweeps: int = 5, tol: float = 1e-9
) -> np.ndarray:
    """Rearrange each cluster's members over the groups to equalise group distributions.

    Minimises sum_m ||S_m / |S_m| - P||^2 (S_m the summed histogram of group m, P the
    global class distribution), which is proportional to the mean pairwise CPD between
    groups, by block coordinate descent: for one cluster (column) at a time, with the
    other columns fixed, the best placement of its members is a linear assignment
    (group m receiving member j costs the deviation of group m with j), solved exactly.
    Sweeps over the columns stop when a sweep gains less than ``tol`` (relative).

    Parameters
    ----------
    histograms : np.ndarray
        (K, F) label counts, indexed by the entries of ``table``.
    table : np.ndarray
        (M, L) client indices: row m is group m, column l holds cluster l's members.
    max_sweeps : int
        Upper bound on sweeps over the columns.
    tol : float
        Relative improvement below which the sweeps stop.

    Returns
    -------
    np.ndarray
        The rearranged (M, L) table (a copy); every column keeps its members.
    """
    from scipy.optimize import linear_sum_assignment

    table = np.array(table, copy=True)
    v = np.asarray(histograms, dtype=np.float64)
    total = v[table.reshape(-1)].sum(axis=0)
    target = total / max(total.sum(), 1e-12)
    sums = v[table].sum(axis=1)  # (M, F)

    def objective(s: np.ndarray) -> float:
        return float(((s / np.maximum(s.sum(axis=1, keepdims=True), 1e-12) - target) ** 2
                      ).sum())

    current = objective(sums)
    for _ in range(max_sweeps):
        start = current
        for col in range(table.shape[1]):
            members = v[table[:, col]]  # (M, F), member j currently in group j
            rest = sums - members  # (M, F): each group without its column-l member
            # cost[m, j] = ||(R_m + v_j) / (r_m + w_j) - P||^2 with sizes r, w, expanded
            # so that no (M, M, F) array is formed.
            size = np.maximum(rest.sum(axis=1)[:, None] + members.sum(axis=1)[None, :],
                              1e-12)
            norm2 = ((rest**2).sum(axis=1)[:, None] + 2.0 * rest @ members.T
                     + (members**2).sum(axis=1)[None, :])
            dot = (rest @ target)[:, None] + (members @ target)[None, :]
            cost = norm2 / size**2 - 2.0 * dot / size
            rows, cols = linear_sum_assignment(cost)
            table[rows, col] = table[cols, col].copy()
            sums = rest[rows] + members[cols]
        current = objective(sums)
        if start - current <= tol * max(start, 1e-12):
            break
    return table
def class_distributions(histograms: np.ndarray, groups: list[list[int]],
                        client_ids: list[int] | None = None) -> np.ndarray:
    """(G, F) normalised class distribution of each group's summed histogram."""
    v = np.asarray(histograms, dtype=np.float64)
    index = {c: i for i, c in enumerate(client_ids)} if client_ids is not None else None
    rows = []
    for group in groups:
        members = [index[c] for c in group] if index is not None else group
        total = v[members].sum(axis=0)
        rows.append(total / max(total.sum(), 1e-12))
    return np.stack(rows)


def rbf_gram(num_classes: int, sigma: float = 1.0) -> np.ndarray:
    """Gaussian kernel between one-hot class vectors: 1 on the diagonal,
    exp(-1/sigma^2) elsewhere (||e_i - e_j||^2 = 2).
    """
    off = math.exp(-2.0 / (2.0 * sigma**2))
    return np.full((num_classes, num_classes), off) + (1.0 - off) * np.eye(num_classes)


def cpd(p: np.ndarray, q: np.ndarray, sigma: float = 1.0) -> float:
    """Class probability distance: MMD^2 between class distributions p and q,
    (p - q)^T G (p - q) under the RBF kernel over one-hot classes.
    """
    diff = np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64)
    return float(diff @ rbf_gram(len(diff), sigma) @ diff)


def pairwise_cpd(distributions: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """CPD of every pair (i < j) of rows of a (G, F) distribution matrix."""
    p = np.asarray(distributions, dtype=np.float64)
    if len(p) < 2:
        return np.empty(0)
    gram = rbf_gram(p.shape[1], sigma)
    sq = np.einsum("if,fg,ig->i", p, gram, p)
    cross = p @ gram @ p.T
    full = sq[:, None] + sq[None, :] - 2 * cross
    i, j = np.triu_indices(len(p), k=1)
    return np.maximum(full[i, j], 0.0)


@dataclass
class GroupPlan:
    """One round of FedGSP: the groups and the chains that train.

    Attributes
    ----------
    groups : list[list[int]]
        Every non-empty group (client ids).
    chains : list[list[int]]
        The sampled groups, each in its shuffled training order.
    """

    groups: list[list[int]]
    chains: list[list[int]]


def form_groups(
    nodes: Sequence[int],
    histograms: Mapping[int, np.ndarray],
    m: int,
    rng: np.random.Generator,
    *,
    grouping: str = "icg",
    max_iter: int = 10,
    normalize: bool = False,
    leftover: str = "drop",
    balance: bool = False,
) -> list[list[int]]:
    """Group the clients into at most ``m`` non-empty groups.

    With ``grouping="icg"`` the clients with a histogram are grouped by :func:`icg`
    and the others are spread over the groups at random; ``"random"`` groups all of
    them at random (:func:`random_groups`).

    Parameters
    ----------
    nodes : Sequence[int]
        Client ids, in a run-independent order.
    histograms : Mapping[int, np.ndarray]
        Class counts of the clients that reported them.
    m : int
        Number of groups (at most ``len(nodes)``).
    rng : np.random.Generator
        Source of every random choice.
    grouping, max_iter, normalize, leftover, balance
        ``icg`` or ``random``, and :func:`icg`'s options (defaults: the paper's).
    """
    with_hist = [n for n in nodes if n in histograms]
    if grouping != "icg" or not with_hist:
        return random_groups(list(nodes), m, rng)
    result = icg(np.stack([histograms[n] for n in with_hist]), min(m, len(with_hist)),
                 rng, client_ids=with_hist, max_iter=max_iter, normalize=normalize,
                 leftover=leftover, balance=balance)
    groups = result.groups + [[] for _ in range(m - len(result.groups))]
    rest = [n for n in nodes if n not in histograms]
    for i, g in zip(rng.permutation(len(rest)), spread(rng, m, len(rest)), strict=True):
        groups[g].append(rest[i])
    return [g for g in groups if g]


def sampled_group_count(num_groups: int, kappa: float) -> int:
    """``max(1, floor(kappa * num_groups + 0.5))``: kappa M rounded half up, at least one
    (Python's ``round`` rounds half to even: 0.3 x 15 = 4.5 would give 4). Computed on
    kappa as written (``Fraction(repr(kappa))``): in floats 0.7 x 45 is 31.4999...
    """
    return max(1, math.floor(Fraction(repr(kappa)) * num_groups + Fraction(1, 2)))


def sample_groups(num_groups: int, kappa: float, rng: np.random.Generator) -> list[int]:
    """The indices of :func:`sampled_group_count` groups drawn at random, in increasing
    order."""
    return sorted(int(i) for i in rng.choice(num_groups, sampled_group_count(num_groups, kappa),
                                             replace=False))


def shuffled(group: Sequence[int], rng: np.random.Generator) -> list[int]:
    """``group`` in a random training order."""
    return [group[j] for j in rng.permutation(len(group))]


def join_smallest(groups: list[list[int]], present: set[int], new: Sequence[int]) -> None:
    """Append each of ``new`` (in order) to the group with the fewest ``present``
    members (ties: the first such group); ``groups`` must not be empty."""
    sizes = [sum(n in present for n in g) for g in groups]
    for node in new:
        smallest = int(np.argmin(sizes))
        groups[smallest].append(node)
        sizes[smallest] += 1


def plan_groups(
    nodes: Sequence[int],
    histograms: Mapping[int, np.ndarray],
    m: int,
    kappa: float,
    rng: np.random.Generator,
    **grouping: Any,
) -> GroupPlan:
    """Group the clients into ``m`` groups (:func:`form_groups`, with ``grouping``'s
    options), sample ``max(1, floor(kappa * M + 0.5))`` of them and shuffle each sampled
    group's order (FedGSP's STP round, Algorithm 1).

    Returns
    -------
    GroupPlan
        The groups and the chains.
    """
    groups = form_groups(nodes, histograms, m, rng, **grouping)
    return GroupPlan(groups, [shuffled(groups[i], rng)
                              for i in sample_groups(len(groups), kappa, rng)])


def group_cpd(groups: Sequence[Sequence[int]], histograms: Mapping[int, np.ndarray],
              sigma: float = 1.0) -> dict[str, float]:
    """Median and mean CPD between the groups, over the members with histograms
    (empty when fewer than two groups have one).
    """
    scored = [[n for n in g if n in histograms] for g in groups]
    scored = [g for g in scored if g]
    if len(scored) < 2:
        return {}
    members = sorted({n for g in scored for n in g})
    cpds = pairwise_cpd(class_distributions(np.stack([histograms[n] for n in members]),
                                            scored, members), sigma)
    return {"cpd-median": float(np.median(cpds)), "cpd-mean": float(np.mean(cpds))}


def group_classes(groups: Sequence[Sequence[int]], histograms: Mapping[int, np.ndarray]
                  ) -> dict[str, float]:
    """Mean and minimum number of classes a group's members hold between them, over the
    groups with at least one histogram (empty when none has one): how many classes a
    chain trained on, the quantity ICG's grouping raises.
    """
    counts = [int(np.count_nonzero(np.sum([histograms[n] for n in known], axis=0)))
              for known in ([n for n in g if n in histograms] for g in groups) if known]
    if not counts:
        return {}
    return {"group-classes-mean": float(np.mean(counts)),
            "group-classes-min": float(min(counts))}
