"""FedGSP's cost model (Eq. 15-17) and the model FLOPs it prices with."""

from __future__ import annotations

import math

import pytest

from fedgsp_flwr.core.cost import CostModel, RoundCost, cumulative, round_cost

PAPER = CostModel()


def eq15_round(k: int, groups: int, kappa: float, n: float, e: float) -> float:
    """Eq. 15 for one round, as printed in the paper."""
    return (PAPER.flops_per_example / PAPER.device_flops * n * e * k / min(k, groups)
            + PAPER.aggregation_flops / PAPER.device_flops * (kappa * groups - 1))


@pytest.mark.parametrize("groups", [4, 8, 92, 368])
def test_a_fedgsp_round_is_priced_as_eq_15_to_17(groups: int) -> None:
    k, kappa, n, e, size = 368, 0.25, 226.0, 1.0, 25.2e6
    cost = round_cost(PAPER, participants=int(kappa * k), longest_chain=k // groups,
                      uploads=int(kappa * groups), examples_per_client=n, epochs=e,
                      model_bytes=size)
    assert cost.comp_seconds == pytest.approx(eq15_round(k, groups, kappa, n, e))
    # Eq. 16-17 with M = 25.2 MB and 567 Mbit/s each way: 8 kappa K M (2 / 567) s
    assert cost.comm_seconds == pytest.approx(8 * kappa * k * 25.2 * 2 / 567)
    assert cost.traffic_bytes == pytest.approx(2 * kappa * k * size)


def test_a_longer_chain_costs_proportionally_more_training() -> None:
    one = round_cost(PAPER, participants=10, longest_chain=1, uploads=1,
                     examples_per_client=100, epochs=2, model_bytes=1e6)
    five = round_cost(PAPER, participants=10, longest_chain=5, uploads=1,
                      examples_per_client=100, epochs=2, model_bytes=1e6)
    assert five.comp_seconds == pytest.approx(5 * one.comp_seconds)
    assert five.comm_seconds == one.comm_seconds  # traffic depends on participants only


def test_cumulative_sums_rounds() -> None:
    total = cumulative([RoundCost(1.0, 2.0, 3.0), RoundCost(0.5, 0.25, 1.0)])
    assert (total.comp_seconds, total.comm_seconds, total.traffic_bytes) == (1.5, 2.25, 4.0)
    assert total.seconds == 3.75


def test_bad_constants_and_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="device_flops must be > 0"):
        CostModel(device_flops=0)
    with pytest.raises(ValueError, match="participants"):
        round_cost(PAPER, participants=-1, longest_chain=1, uploads=1,
                   examples_per_client=1, epochs=1, model_bytes=1)


def test_model_flops_and_size_match_the_papers_model() -> None:
    from fedgsp_flwr.models import build_model, parameter_count, training_flops

    leaf = build_model("cnn-leaf", (1, 28, 28), 62)
    # The paper's FedGSP model: 25.2 MB, N_calc 96M FLOPs per example (we count 103M).
    assert parameter_count(leaf) * 4 / 2**20 == pytest.approx(25.2, abs=0.05)
    assert training_flops(leaf, (1, 28, 28)) == pytest.approx(103.27e6, rel=1e-3)
    mlp = build_model("mlp", (1, 28, 28), 10)
    assert training_flops(mlp, (1, 28, 28)) == 3 * 2 * (784 * 2048 + 2048 * 10)
    assert parameter_count(mlp) == 784 * 2048 + 2048 + 2048 * 10 + 10
    assert math.isclose(training_flops(build_model("cnn", (1, 28, 28), 10), (1, 28, 28)),
                        3 * 2 * (25 * 32 * 784 + 25 * 32 * 64 * 196 + 3136 * 512 + 5120))
