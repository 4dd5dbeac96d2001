"""Laplace noise on reported class histograms."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import RecordDict
from flwr.clientapp import ClientApp
from helpers import instruction, make_context, vector_data

from fedgsp_flwr.clients import HANDLERS, ClientHooks, register_hooks
from fedgsp_flwr.clients.privacy import laplace_histogram
from fedgsp_flwr.models import build_model

DATA = vector_data(n=300, classes=3, seed=0)


def test_the_noise_has_the_laplace_scale_and_counts_stay_integers() -> None:
    counts = np.full(20_000, 50)
    rng = np.random.default_rng(0)
    for epsilon in (0.5, 2.0):
        noisy = laplace_histogram(counts, epsilon, rng)
        assert noisy.dtype == np.int64 and (noisy >= 0).all()
        # E|Laplace(b)| = b = 1/epsilon (rounding adds at most 1/4 on average)
        assert abs(np.abs(noisy - counts).mean() - 1 / epsilon) < 0.3
    near_zero = laplace_histogram(np.zeros(1000, np.int64), 0.1, rng)
    assert near_zero.min() == 0 and near_zero.max() > 0  # clipped, not negative


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_epsilon_is_refused(epsilon: float) -> None:
    with pytest.raises(ValueError, match="epsilon"):
        laplace_histogram(np.ones(3), epsilon, np.random.default_rng(0))


def histogram_of(**node_config: object) -> tuple[np.ndarray, int]:
    hooks = ClientHooks(load_data=lambda _c: DATA, build_model=lambda _c, d: build_model(
        "logistic", d.x_train.shape[1:], d.num_classes, seed=0))
    app = register_hooks(ClientApp(), hooks, handlers=HANDLERS)
    context = make_context(0, 2, seed=3)
    context.node_config.update(node_config)
    reply = app(instruction(RecordDict(), "query.histogram"), context)
    return (reply.content["histogram"]["histogram"].numpy(),
            int(reply.content["metrics"]["num-examples"]))


def test_a_node_with_a_budget_reports_a_noisy_histogram_and_total() -> None:
    exact, total = histogram_of()
    assert total == 300 and exact.sum() == 300
    noisy, noisy_total = histogram_of(**{"histogram-epsilon": 0.05})
    assert not np.array_equal(noisy, exact) and noisy_total == noisy.sum()
    again, _ = histogram_of(**{"histogram-epsilon": 0.05})
    np.testing.assert_array_equal(noisy, again)  # deterministic given the run's seed


def test_a_bad_node_budget_is_refused() -> None:
    # (Flower turns the handler's exception into an error reply.)
    with pytest.raises(ValueError, match="histogram-epsilon"):
        histogram_of(**{"histogram-epsilon": -2.0})
