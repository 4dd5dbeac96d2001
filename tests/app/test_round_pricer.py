"""The ServerApp prices every round with the cost model from what the round did."""

from __future__ import annotations

import pytest

from fedgsp_flwr.app.config import RunConfig
from fedgsp_flwr.app.server_app import RoundPricer
from fedgsp_flwr.models import build_model

SHAPE = (1, 28, 28)


def pricer(**overrides: object) -> RoundPricer:
    cfg = RunConfig.from_mapping({"local-epochs": 2, **overrides})
    return RoundPricer.for_run(cfg, build_model("mlp", SHAPE, 10), SHAPE, 50.0)


def test_a_relay_round_trains_along_its_longest_chain() -> None:
    p = pricer()
    flops, params = 3 * 2 * (784 * 2048 + 2048 * 10), 784 * 2048 + 2048 + 2048 * 10 + 10
    cost = p({"hops": 6, "longest-chain": 3, "uploads": 2})
    assert cost["cost-comp-s"] == pytest.approx((flops * 50 * 2 * 3 + params * 1) / 567e9)
    # the model's bytes as Flower counts them: float32 weights plus a little metadata
    assert cost["cost-traffic"] == pytest.approx(2 * 6 * params * 4, rel=1e-3)
    assert cost["cost-comm-s"] == pytest.approx(8 * 6 * params * 4 / 1e6 * 2 / 567, rel=1e-3)


def test_a_parallel_round_trains_one_client_deep() -> None:
    p = pricer()
    relay = p({"hops": 10, "longest-chain": 10, "uploads": 1})
    parallel = p({"train-replies": 10, "uploads": 10})
    assert parallel["cost-traffic"] == relay["cost-traffic"]
    assert parallel["cost-comp-s"] < relay["cost-comp-s"] / 5


def test_config_overrides_and_unpriced_rounds() -> None:
    p = pricer(**{"cost-flops-per-example": 1e6, "cost-device-flops": 1e9,
                  "cost-aggregation-flops": 1.0})
    assert p({"train-replies": 4, "uploads": 4})["cost-comp-s"] == pytest.approx(
        (1e6 * 50 * 2 + 3) / 1e9)
    assert p({"train-replies": 4, "uploads": 4, "edge-rounds": 2}) == {}  # HierFL
    assert p({"train-replies": 0, "uploads": 0}) == {}  # nothing trained
