"""Our strategies with a plain Flower ClientApp (only @app.train / @app.evaluate), and
with the same app after adding our handlers in a few lines.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy

from fakegrid import FakeGrid
from fedgsp_flwr.clients import ClientHooks, register_hooks
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.strategies import FedAvg, FedGSP, FeSEM, HierFL, SemiFL, StoCFL
from helpers import make_context, run_rounds
import plain_clientapp

NODES = 6
COMMON = {"fraction_evaluate": 1.0, "min_available_nodes": NODES}

# Each runs unchanged with the plain app: relay hops go out as plain ``train`` messages,
# and the nodes that cannot answer a histogram or sketch query fall back as documented.
UNCHANGED: dict[str, Callable[[], Strategy]] = {
    "fedavg": lambda: FedAvg(**COMMON),
    "fedgsp": lambda: FedGSP(relay_message_type="train", num_groups=2, kappa=1.0, seed=0,
                             **COMMON),
    "semifl": lambda: SemiFL(relay_message_type="train", cluster_size=3, seed=0, **COMMON),
    "hierfl": lambda: HierFL(num_edges=2, reach_per_user=1, policy="random", seed=0,
                             **COMMON),
    "stocfl": lambda: StoCFL(seed=0, **COMMON),
    "fesem": lambda: FeSEM(k=2, seed=0, **COMMON),
}


def hooks() -> ClientHooks:
    """What our handlers need from the plain app: its data and its model."""
    def load_data(context: Context) -> ClientData:
        x, y = plain_clientapp.load_partition(int(context.node_config["partition-id"]))
        return ClientData(x, y, x, y, plain_clientapp.CLASSES)

    return ClientHooks(load_data=load_data,
                       build_model=lambda _context, _data: plain_clientapp.Net())


def grid_of(app_factory: Callable[[], ClientApp]) -> FakeGrid:
    handlers = {}
    for node in range(NODES):
        app, context = app_factory(), make_context(node, NODES)
        handlers[node] = lambda message, a=app, c=context: a(message, c)
    return FakeGrid(handlers)


def with_our_handlers() -> ClientApp:
    # The few lines an existing project adds to its ClientApp:
    app = plain_clientapp.make_app()
    register_hooks(app, hooks())  # query.histogram, query.sketch, train.relay, train.bilevel
    return app


def run(strategy: Strategy, grid: FakeGrid, rounds: int = 2) -> ArrayRecord:
    initial = ArrayRecord(plain_clientapp.Net().state_dict())
    result = run_rounds(strategy, grid, initial, rounds, lr=0.5)
    assert result.arrays is not None
    moved = [not np.array_equal(result.arrays[k].numpy(), initial[k].numpy())
             for k in initial]
    assert all(moved), "the model did not train"
    return result.arrays


@pytest.mark.parametrize("name", list(UNCHANGED))
def test_strategies_run_unchanged_with_a_plain_clientapp(name: str) -> None:
    strategy = UNCHANGED[name]()
    grid = grid_of(plain_clientapp.make_app)
    run(strategy, grid)
    rounds = strategy.history  # type: ignore[attr-defined]
    assert rounds[2].get("train-rejected", 0) == 0 and rounds[2].get("skipped-nodes", 0) == 0
    assert rounds[2]["eval-replies"] == NODES and rounds[2]["eval-acc"] > 0.25
    types = {t for _, _, t, _ in grid.pushed}
    assert "train.relay" not in types and "train.bilevel" not in types
    if name in ("fedgsp", "semifl"):
        # no histograms: grouped at random / clusters filled in partition order, and
        # asked only once
        assert len(strategy.known.without) == NODES  # type: ignore[attr-defined]
        queries = [t for _, _, t, _ in grid.pushed if t == "query.histogram"]
        assert len(queries) == NODES
        assert rounds[2]["hops"] == NODES
    if name == "stocfl":
        assert len(strategy.plain) == NODES  # type: ignore[attr-defined]


def test_our_handlers_enable_histogram_grouping_and_sketch_clustering() -> None:
    gsp = FedGSP(num_groups=2, kappa=1.0, seed=0, **COMMON)
    grid = grid_of(with_our_handlers)
    run(gsp, grid)
    assert len(gsp.known.histograms) == NODES and not gsp.known.without
    assert gsp.history[2]["hops"] == NODES and "cpd-median" in gsp.history[2]
    assert {t for _, _, t, _ in grid.pushed} >= {"query.histogram", "train.relay"}

    stocfl = StoCFL(seed=0, tau=0.3, **COMMON)
    grid = grid_of(with_our_handlers)
    run(stocfl, grid)
    assert not stocfl.plain and stocfl.history[2]["clustered-clients"] == NODES
    assert {t for _, _, t, _ in grid.pushed} >= {"query.sketch", "train.bilevel"}
