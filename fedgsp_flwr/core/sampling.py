"""Node order and sampling that do not depend on node ids (which change every run)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np


def partition_order(nodes: Iterable[int], partition_ids: Mapping[int, int]) -> list[int]:
    """Nodes by reported partition id, then node id: the same order in every run of a
    seed wherever nodes report their partition (node ids are random).
    """
    return sorted(nodes, key=lambda n: (n not in partition_ids, partition_ids.get(n, 0), n))


def sample_share(nodes: Sequence[int], fraction: float, minimum: int,
                 rng: np.random.Generator) -> list[int]:
    """A ``fraction`` of ``nodes`` (at least ``minimum``, at most all), in their order.

    Node ids may exceed int64: positions are sampled, never the ids.
    """
    count = min(len(nodes), max(int(len(nodes) * fraction), minimum))
    return [nodes[i] for i in sorted(rng.choice(len(nodes), count, replace=False).tolist())]
