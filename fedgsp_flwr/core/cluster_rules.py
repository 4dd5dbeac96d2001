"""Static cluster rules of Semi-FL over the clients' class histograms (pure numpy).

Semi-FL (Chen et al., 2021) trains fixed clusters of clients. Its Table II builds them
by hand from one-class clients: ``c1`` puts the ten clients of one class together,
``c2`` five clients of class i with five of class i + 1, ``c3`` one client of every
class in each cluster. The rules below produce those patterns from any histograms:

``label-homogeneous``
    Clients sorted by their dominant class, then cut into consecutive clusters. With
    ``offset = 0`` this is c1; an offset of half a cluster moves every cut into the
    middle of a class, which is c2.
``label-diverse``
    Greedy: clients (by dominant class) join the cluster with room that holds the
    least of their labels so far, so every cluster covers as many classes as it can
    (c3).
``random``
    A seeded random split.

The paper's own patterns are rules too: ``c1`` (``label-homogeneous``), ``c2``
(``label-homogeneous`` cut half a cluster off), ``c3`` (``label-diverse``) and ``c4``:
clients that each hold every class (the paper's IID setting, "(0, 1, ..., 9) 10
repeats"), split at random; ``c4`` refuses clients that miss a class.

Clusters hold ``ceil(n / cluster_size)`` clients at most and differ in size by at
most one.

See docs/strategies/semifl.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

PAPER_PATTERNS = ("c1", "c2", "c3", "c4")
CLUSTER_RULES = ("label-diverse", "label-homogeneous", "random", *PAPER_PATTERNS)


def cluster_sizes(num_clients: int, cluster_size: int) -> list[int]:
    """Sizes of ``ceil(num_clients / cluster_size)`` clusters that differ by at most one.

    Raises
    ------
    ValueError
        If ``num_clients < 1`` or ``cluster_size < 1``.
    """
    if num_clients < 1 or cluster_size < 1:
        raise ValueError(f"need num_clients >= 1 and cluster_size >= 1, got {num_clients} "
                         f"and {cluster_size}")
    count = -(-num_clients // cluster_size)
    base, extra = divmod(num_clients, count)
    return [base + (i < extra) for i in range(count)]


def _by_dominant_class(histograms: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Client indices sorted by dominant class, larger share first, ties at random."""
    shares = histograms / histograms.sum(axis=1, keepdims=True)
    dominant = shares.argmax(axis=1)
    return np.lexsort((rng.permutation(len(shares)), -shares.max(axis=1), dominant))


def static_clusters(
    histograms: np.ndarray,
    cluster_size: int,
    rule: str,
    rng: np.random.Generator,
    offset: int = 0,
) -> list[list[int]]:
    """Split clients into static clusters by one of :data:`CLUSTER_RULES`.

    Parameters
    ----------
    histograms : np.ndarray
        (n, F) label counts, one row per client (every row with a positive total).
    cluster_size : int
        Clients per cluster (the last clusters may hold one fewer).
    rule : str
        ``label-diverse``, ``label-homogeneous``, ``random``, or one of the paper's
        patterns ``c1`` to ``c4`` (see the module docstring).
    rng : np.random.Generator
        Breaks ties (and draws the ``random`` split).
    offset : int (default: 0)
        ``label-homogeneous`` only: rotate the sorted order by this many clients before
        cutting it (half a cluster gives the paper's c2; the patterns ignore it).

    Returns
    -------
    list[list[int]]
        Client indices (rows of ``histograms``) of each cluster, each sorted.

    Raises
    ------
    ValueError
        On an unknown rule, a bad ``cluster_size`` or ``offset``, histograms that are
        not an (n, F) array of non-negative counts with positive row totals, or ``c4``
        with a client that misses a class the others hold.
    """
    counts = np.asarray(histograms, dtype=np.float64)
    if rule not in CLUSTER_RULES:
        raise ValueError(f"rule must be one of {CLUSTER_RULES}, got {rule!r}")
    if counts.ndim != 2 or len(counts) == 0 or (counts < 0).any() or not (
            counts.sum(axis=1) > 0).all():
        raise ValueError("histograms must be an (n, F) array of non-negative counts with "
                         f"a positive total per row, got shape {counts.shape}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if rule == "c4":
        _check_every_class(counts)
    rule, offset = {"c1": ("label-homogeneous", 0),
                    "c2": ("label-homogeneous", cluster_size // 2),
                    "c3": ("label-diverse", 0), "c4": ("random", 0)}.get(rule, (rule, offset))
    sizes = cluster_sizes(len(counts), cluster_size)
    if rule == "random":
        order = rng.permutation(len(counts))
    elif rule == "label-homogeneous":
        order = np.roll(_by_dominant_class(counts, rng), -offset)
    else:
        return _diverse(counts, sizes, rng)
    bounds = np.cumsum([0, *sizes])
    return [sorted(order[a:b].tolist()) for a, b in itertools.pairwise(bounds)]


def _check_every_class(counts: np.ndarray) -> None:
    """Raise unless every client holds every class present in ``counts``."""
    present = counts.sum(axis=0) > 0
    missing = np.flatnonzero(((counts == 0) & present).any(axis=1))
    if len(missing):
        raise ValueError(
            f"pattern 'c4' needs clients that each hold every class (the paper's IID "
            f"setting), but {len(missing)} clients miss one (rows {missing[:5].tolist()}"
            f"{', ...' if len(missing) > 5 else ''}): use partition 'iid', or 'c3' for "
            "label-skewed clients")


def _diverse(counts: np.ndarray, sizes: Sequence[int], rng: np.random.Generator
             ) -> list[list[int]]:
    """Greedy label-diverse clusters (see :func:`static_clusters`)."""
    shares = counts / counts.sum(axis=1, keepdims=True)
    held = np.zeros((len(sizes), counts.shape[1]))
    members: list[list[int]] = [[] for _ in sizes]
    room = np.array(sizes)
    for client in _by_dominant_class(counts, rng):
        overlap = held @ shares[client]
        filled = np.array([len(m) for m in members])
        # Least overlap first, then the emptiest cluster, then the lowest index.
        candidates = np.flatnonzero(room > 0)
        best = candidates[np.lexsort((candidates, filled[candidates], overlap[candidates]))[0]]
        members[best].append(int(client))
        held[best] += shares[client]
        room[best] -= 1
    return [sorted(m) for m in members]


def label_coverage(histograms: np.ndarray, clusters: Sequence[Sequence[int]]) -> list[int]:
    """Number of classes present in each cluster's pooled data."""
    counts = np.asarray(histograms)
    return [int((counts[list(c)].sum(axis=0) > 0).sum()) for c in clusters]


def cluster_with_room(clusters: Mapping[int, Sequence[int]], cluster_size: int) -> int:
    """Where a late or unplaceable client goes: the smallest cluster with fewer than
    ``cluster_size`` members (the lowest id on a tie), or a new cluster's id when
    every cluster is full.
    """
    open_clusters = [c for c, m in clusters.items() if len(m) < cluster_size]
    if open_clusters:
        return min(open_clusters, key=lambda c: (len(clusters[c]), c))
    return max(clusters, default=-1) + 1
