"""Local search on user-edge assignments: moves and swaps, and ejection chains.

:func:`local_search` and :func:`chain_search` improve a feasible assignment, towards a
lower J or towards per-edge class targets; they share ``_SearchState``, the residuals
and per-edge costs that make every score an exact integer in float64.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from .problem import AssignmentProblem

# Work-array sizes (float64 elements) of the vectorised searches, to bound memory.
_SWAP_CHUNK = 1 << 18
_BLOCK_CHUNK = 1 << 21


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
