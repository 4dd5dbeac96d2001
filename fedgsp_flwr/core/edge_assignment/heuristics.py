"""The constructive heuristics of user-edge assignment.

Algorithm 1 of the paper (:func:`similar_groups`, ``_equal_split``), the capacity fit
``_fit_capacity``, and the greedy policy ``_greedy``: starts from per-class targets
(:func:`class_targets`, :func:`fill_targets`) or from Algorithm 1, each improved by
:func:`~.search.local_search` and :func:`~.search.chain_search`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .problem import AssignmentProblem, _closest_feasible, _scaled_objective
from .search import chain_search, local_search


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
