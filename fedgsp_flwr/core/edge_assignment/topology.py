"""Topologies of user-edge assignment: which users each edge reaches.

:func:`paper_topology` generates the paper's setting; :class:`Topology` and
:func:`load_topology` read one from a JSON or CSV file.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .problem import _first

REACH_BY = ("group", "user")


def paper_topology(counts: np.ndarray, num_edges: int, reach_per_user: int,
                   rng: np.random.Generator, *, reach_by: str = "group"
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The paper's setting: every edge originally holds users of only 2 classes, and
    every user is in range of ``reach_per_user`` edges, its original one among them.

    Edge e holds classes 2e and 2e + 1 (mod F). A user goes, by its most frequent class,
    to the edges holding that class, in turn; a class no edge holds (F > 2E) goes to
    the edges in turn. The other reachable edges are drawn at random: once per group of
    users with the same original edge and most frequent class (``reach_by="group"``,
    the paper's groups of users "with the same classes' distribution" near the same
    edges, which Algorithm 1 splits over them), or for each user on its own
    (``"user"``: nearly every user is then a group of one). Groups form among the users
    of one call: HierFL generates the topology of the users it first sees together, so
    a user that joins later draws its own edges; users without data count as class 0.

    Parameters
    ----------
    counts : np.ndarray
        (N, F) class counts.
    num_edges : int
        E >= 1.
    reach_per_user : int
        r, in [1, E].
    rng : np.random.Generator
        Randomness of the extra reachable edges.
    reach_by : str
        ``group`` or ``user`` (see above).

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The (E, N) reachability and the (N,) original assignment.

    Raises
    ------
    ValueError
        If E < 1, r is outside [1, E] or ``reach_by`` is unknown.
    """
    if num_edges < 1 or not 1 <= reach_per_user <= num_edges:
        raise ValueError(f"need edges >= 1 and 1 <= r <= edges, got {num_edges} edges, "
                         f"r={reach_per_user}")
    if reach_by not in REACH_BY:
        raise ValueError(f"reach_by must be one of {REACH_BY}, got {reach_by!r}")
    counts = np.asarray(counts)
    n_users, n_classes = counts.shape
    holders = [[e for e in range(num_edges) if c in {(2 * e) % n_classes,
                                                     (2 * e + 1) % n_classes}]
               or list(range(num_edges)) for c in range(n_classes)]
    turn = np.zeros(n_classes, dtype=np.int64)
    original = np.empty(n_users, dtype=np.int64)
    dominant = np.argmax(counts, axis=1)
    for u, c in enumerate(dominant):
        original[u] = holders[c][turn[c] % len(holders[c])]
        turn[c] += 1
    reach = np.zeros((num_edges, n_users), dtype=bool)
    reach[original, np.arange(n_users)] = True
    if reach_per_user > 1:
        drawn: dict[tuple[int, int], np.ndarray] = {}
        for u in range(n_users):
            key = (int(original[u]), int(dominant[u]) if reach_by == "group" else -1 - u)
            if key not in drawn:
                others = [e for e in range(num_edges) if e != original[u]]
                drawn[key] = rng.choice(others, reach_per_user - 1, replace=False)
            reach[drawn[key], u] = True
    return reach, original


@dataclass(frozen=True)
class Topology:
    """Which users each edge reaches, and optionally the original assignment and the
    edges' capacities (see :func:`load_topology`).

    Attributes
    ----------
    reach : np.ndarray
        (E, N) booleans.
    original : np.ndarray | None
        (N,) original edge per user.
    capacity : np.ndarray | None
        (E,) maximum users per edge.
    """

    reach: np.ndarray
    original: np.ndarray | None = None
    capacity: np.ndarray | None = None


def load_topology(path: str | Path, num_users: int | None = None) -> Topology:
    """Read a topology file.

    JSON: ``{"reach": [[0 or 1, ... one per user], ... one row per edge],
    "original": [edge per user] (optional), "capacity": [users per edge] (optional)}``.
    CSV, one row per user after the header ``user,edges[,original]``: the user's index,
    its reachable edges separated by ``;`` and optionally its original edge.

    Parameters
    ----------
    path : str | Path
        The file (``.json`` or ``.csv``).
    num_users : int | None
        If given, the number of users the file must describe.

    Returns
    -------
    Topology
        The parsed topology.

    Raises
    ------
    ValueError
        On an unreadable or inconsistent file, naming the problem and the file.
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".json":
            topology = _topology_from_json(json.loads(path.read_text()))
        elif path.suffix.lower() == ".csv":
            topology = _topology_from_csv(path.read_text())
        else:
            raise ValueError("expected a .json or .csv file")
        reach = topology.reach
        if num_users is not None and reach.shape[1] != num_users:
            raise ValueError(f"it describes {reach.shape[1]} users, the run has {num_users}")
        if topology.original is not None:
            original = topology.original
            if original.shape != (reach.shape[1],) or not (
                    (original >= 0) & (original < len(reach))).all():
                raise ValueError(f"'original' must give each of the {reach.shape[1]} users "
                                 f"an edge in [0, {len(reach)})")
            bad = np.flatnonzero(~reach[original, np.arange(reach.shape[1])])
            if len(bad):
                raise ValueError(f"'original' puts users {_first(bad)} on edges out of range")
        if topology.capacity is not None and topology.capacity.shape != (len(reach),):
            raise ValueError(f"'capacity' must have one entry per edge ({len(reach)})")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"topology file {path}: {err}") from err
    return topology


def _topology_from_json(raw: dict) -> Topology:
    reach = np.asarray(raw["reach"])
    if reach.ndim != 2 or not np.isin(reach, (0, 1)).all():
        raise ValueError("'reach' must be a matrix of 0/1, one row per edge")
    original = np.asarray(raw["original"], dtype=np.int64) if "original" in raw else None
    capacity = np.asarray(raw["capacity"], dtype=np.int64) if "capacity" in raw else None
    return Topology(reach.astype(bool), original, capacity)


def _topology_from_csv(text: str) -> Topology:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [c.strip() for c in rows[0][:2]] != ["user", "edges"]:
        raise ValueError("the header must be 'user,edges' or 'user,edges,original'")
    with_original = len(rows[0]) > 2
    body = [r for r in rows[1:] if any(c.strip() for c in r)]
    users = [int(r[0]) for r in body]
    if sorted(users) != list(range(len(body))):
        raise ValueError(f"users must be 0..{len(body) - 1}, each once")
    edges = {int(r[0]): [int(e) for e in r[1].split(";") if e.strip()] for r in body}
    num_edges = 1 + max((e for es in edges.values() for e in es), default=-1)
    if min((e for es in edges.values() for e in es), default=0) < 0:
        raise ValueError("edge indices must be >= 0")
    reach = np.zeros((num_edges, len(body)), dtype=bool)
    for user, es in edges.items():
        reach[es, user] = True
    original = None
    if with_original:
        original = np.empty(len(body), dtype=np.int64)
        for r in body:
            original[int(r[0])] = int(r[2])
    return Topology(reach, original)
