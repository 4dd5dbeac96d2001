"""Node order and sampling independent of node ids."""

from __future__ import annotations

import numpy as np

from fedgsp_flwr.core.sampling import partition_order, sample_share


def test_nodes_are_ordered_by_partition_then_id_with_unreported_ones_last() -> None:
    assert partition_order([90, 10, 55, 7], {90: 0, 55: 1}) == [90, 55, 7, 10]


def test_a_share_keeps_the_order_and_respects_the_minimum_and_the_size() -> None:
    nodes = [2**70 + i for i in range(10)]  # beyond int64: positions are sampled
    picked = sample_share(nodes, 0.3, 1, np.random.default_rng(0))
    assert len(picked) == 3 and picked == [n for n in nodes if n in picked]
    assert len(sample_share(nodes, 0.01, 2, np.random.default_rng(0))) == 2
    assert sample_share(nodes, 1.0, 20, np.random.default_rng(0)) == nodes
    assert sample_share(nodes, 0.5, 1, np.random.default_rng(4)) == sample_share(
        nodes, 0.5, 1, np.random.default_rng(4))
