"""FedGSP as a Flower strategy, driven through an in-process grid of real handlers."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import ArrayRecord
from flwr.clientapp import ClientApp
from helpers import logistic, make_context, node_app, run_rounds

from fedgsp_flwr.clients import HANDLERS, ClientHooks, register_hooks
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.strategies.fedgsp import FedGSP

CLASSES = 4


def node_data(node: int) -> ClientData:
    """Node i holds mostly class i mod 4 (label-skewed), 40 examples."""
    rng = np.random.default_rng(node)
    y = np.where(rng.random(40) < 0.8, node % CLASSES, rng.integers(0, CLASSES, 40))
    x = (rng.normal(size=(40, 6)) + np.eye(CLASSES, 6)[y] * 2).astype(np.float32)
    return ClientData(x, y, x[:10], y[:10], CLASSES)


model = logistic(6, CLASSES)


def grid_of(nodes: list[int], without_hooks: set[int] = frozenset()) -> FakeGrid:
    # a node in without_hooks is an existing ClientApp with only @app.train()
    return FakeGrid({node: node_app(node_data, node, model, partition=node % 97,
                                    handlers=(["train", "evaluate"] if node in without_hooks
                                              else HANDLERS))
                     for node in nodes})


def start(strategy: FedGSP, grid: FakeGrid, rounds: int) -> object:
    return run_rounds(strategy, grid, ArrayRecord(model().state_dict()), rounds, lr=0.1)


def test_fedgsp_trains_groups_sequentially_and_grows_them() -> None:
    grid = grid_of(list(range(12)))
    strategy = FedGSP(growth="linear", alpha=1.0, beta=2, kappa=1.0, seed=0,
                      fraction_evaluate=0.0)
    result = start(strategy, grid, rounds=3)
    assert [strategy.history[r]["num-groups"] for r in (1, 2, 3)] == [2, 4, 6]
    assert [strategy.history[r]["hops"] for r in (1, 2, 3)] == [12, 12, 12]
    assert strategy.history[1]["groups-trained"] == 2
    hops = [(m.metadata.message_type, m.content["config"]["relay-group"],
             m.content["config"]["relay-hop"]) for _, _, _, m in grid.pushed
            if m.metadata.message_type == "train"]
    assert [h[2] for h in hops[:12] if h[1] == 0] == list(range(6))
    queries = [m for _, _, t, m in grid.pushed if t == "query.histogram"]
    assert len(queries) == 12, "histograms must be asked once per node"
    assert len(result.arrays) == 2 and result.train_metrics_clientapp[3]["train-loss"] > 0
    model_bytes = ArrayRecord(model().state_dict()).count_bytes()
    assert strategy.history[1]["bytes-sent"] == 12 * model_bytes
    assert strategy.history[1]["bytes-estimate"] == 2 * 1.0 * 12 * model_bytes


def test_node_ids_beyond_int64_are_kept_exact() -> None:
    big = [2**64 - 1 - i for i in range(6)]  # Flower's node ids are unsigned 64-bit
    grid = grid_of(big)
    strategy = FedGSP(num_groups=2, kappa=1.0, seed=0, fraction_evaluate=0.0)
    start(strategy, grid, rounds=1)
    assert {n for _, n, t, _ in grid.pushed if t == "train"} == set(big)
    assert strategy.history[1]["skipped-nodes"] == 0


def test_kappa_samples_a_fraction_of_the_groups() -> None:
    strategy = FedGSP(num_groups=6, kappa=0.5, seed=1, fraction_evaluate=0.0)
    start(strategy, grid_of(list(range(12))), rounds=1)
    assert strategy.history[1]["num-groups"] == 6
    assert strategy.history[1]["groups-trained"] == 3 and strategy.history[1]["hops"] == 6


def test_icg_groups_are_more_alike_than_random_ones() -> None:
    def median_cpd(grouping: str, seed: int) -> float:
        strategy = FedGSP(num_groups=4, grouping=grouping, seed=seed, fraction_evaluate=0.0)
        grid = grid_of(list(range(16)))
        strategy.known.refresh(grid, list(range(16)))  # random grouping is scored too
        return strategy.make_chains(1, grid)[1]["cpd-median"]

    icg_cpd = [median_cpd("icg", s) for s in range(4)]
    random_cpd = [median_cpd("random", s) for s in range(4)]
    assert np.mean(icg_cpd) < 0.5 * np.mean(random_cpd)


def test_the_classes_each_trained_group_holds_are_reported() -> None:
    strategy = FedGSP(num_groups=4, kappa=0.5, seed=0, fraction_evaluate=0.0)
    grid = grid_of(list(range(8)))
    strategy.known.refresh(grid, list(range(8)))
    chains, metrics = strategy.make_chains(1, grid)
    held = [len({c for n in chain for c in np.flatnonzero(strategy.known.histograms[n])})
            for chain in chains]
    assert len(chains) == 2 and metrics["group-classes-mean"] == np.mean(held)
    assert metrics["group-classes-min"] == min(held)


def test_a_node_without_the_histogram_handler_is_grouped_at_random() -> None:
    grid = grid_of(list(range(8)), without_hooks={3})
    strategy = FedGSP(num_groups=2, kappa=1.0, seed=0, fraction_evaluate=0.0)
    start(strategy, grid, rounds=2)
    assert 3 in strategy.known.without and "histogram" in strategy.known.without[3]
    queries = [n for _, n, t, _ in grid.pushed if t == "query.histogram"]
    assert queries.count(3) == 1, "a node without the handler must be asked only once"
    trained_nodes = {n for _, n, t, _ in grid.pushed if t == "train"}
    assert trained_nodes == set(range(8)), "node 3 must still be placed in a group"
    assert strategy.history[2]["skipped-nodes"] == 0  # hops are plain train messages


def test_a_silent_node_sits_out_until_it_answers_again() -> None:
    """A node that crashes mid-chain is skipped (its model goes on), is left out while it
    does not answer its histogram query, and is taken in again once it does.
    """
    grid = grid_of(list(range(4)))
    alive = {"node 2": True}
    answer = grid.handlers[2]
    grid.handlers[2] = lambda message: answer(message) if alive["node 2"] else None
    strategy = FedGSP(num_groups=1, kappa=1.0, seed=0, fraction_evaluate=0.0,
                      train_timeout=0.3, query_timeout=0.3)
    start(strategy, grid, rounds=1)
    alive["node 2"] = False  # crashes: no reply to anything until it comes back
    start(strategy, grid, rounds=2)
    dead_rounds = copy.deepcopy(strategy.history)
    alive["node 2"] = True
    start(strategy, grid, rounds=1)
    # fresh start() calls number rounds from 1: round 1 of the second call had node 2
    # time out mid-chain, round 2 left it out; the third call took it in again.
    assert dead_rounds[1]["skipped-nodes"] == 1 and dead_rounds[1]["groups-trained"] == 1
    assert dead_rounds[1]["hops"] == 4
    assert dead_rounds[2]["hops"] == 3 and dead_rounds[2]["skipped-nodes"] == 0
    assert strategy.history[1]["hops"] == 4 and strategy.history[1]["skipped-nodes"] == 0
    queries = [n for _, n, t, _ in grid.pushed if t == "query.histogram"]
    assert queries.count(2) == 3, "asked once, again after its failed hop, and on return"
    assert queries.count(0) == 1


def test_a_node_that_left_is_forgotten_and_asked_anew_on_return() -> None:
    grid = grid_of(list(range(4)))
    strategy = FedGSP(num_groups=1, kappa=1.0, seed=0, fraction_evaluate=0.0)
    start(strategy, grid, rounds=1)
    gone = grid.handlers.pop(3)
    start(strategy, grid, rounds=1)
    assert 3 not in strategy.known.histograms
    grid.handlers[3] = gone
    start(strategy, grid, rounds=1)
    assert [n for _, n, t, _ in grid.pushed if t == "query.histogram"].count(3) == 2
    assert strategy.history[1]["hops"] == 4


def test_plain_train_messages_let_any_clientapp_relay() -> None:
    grid = grid_of(list(range(6)), without_hooks={0, 1, 2, 3, 4, 5})
    strategy = FedGSP(num_groups=2, kappa=1.0, relay_message_type="train", seed=0,
                      fraction_evaluate=0.0)
    start(strategy, grid, rounds=1)
    assert strategy.history[1]["skipped-nodes"] == 0
    assert strategy.history[1]["groups-trained"] == 2


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"alpha": 0.0}, "alpha"), ({"beta": 1.5}, "beta"), ({"kappa": 0.0}, "kappa"),
     ({"kappa": 1.5}, "kappa"), ({"growth": "cubic"}, "growth"),
     ({"grouping": "kmeans"}, "grouping"), ({"num_groups": 0}, "num_groups"),
     ({"train_timeout": 0}, "train_timeout"), ({"relay_message_type": "query"}, "relay")],
)
def test_parameters_are_validated(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        FedGSP(**kwargs)


def test_groups_do_not_depend_on_the_random_node_ids() -> None:
    """Same partitions under other node ids (as in every new run): same chains."""

    def chains_with(ids: list[int]) -> list[list[int]]:
        handlers = {}
        for pid, node in enumerate(ids):
            hooks = ClientHooks(load_data=lambda _c, p=pid: node_data(p), build_model=model)
            app = register_hooks(ClientApp(), hooks, handlers=HANDLERS)
            context = make_context(pid, len(ids))
            handlers[node] = lambda m, a=app, c=context: a(m, c)
        strategy = FedGSP(num_groups=3, kappa=1.0, seed=4, fraction_evaluate=0.0)
        chains, _ = strategy.make_chains(1, FakeGrid(handlers))
        partition_of = {node: pid for pid, node in enumerate(ids)}
        return [[partition_of[n] for n in chain] for chain in chains]

    rng = np.random.default_rng(0)
    first = [int(x) for x in rng.choice(2**62, 12, replace=False)]
    second = [int(x) for x in rng.choice(2**62, 12, replace=False)]
    assert chains_with(first) == chains_with(second)


def test_defaults_are_the_papers_fedgsp_and_the_naive_versions_are_static() -> None:
    fedgsp = FedGSP()
    assert (fedgsp.growth, fedgsp.alpha, fedgsp.beta, fedgsp.kappa) == ("log", 2.0, 10, 0.3)
    assert (fedgsp.grouping, fedgsp.icg_iterations) == ("icg", 10)
    assert (fedgsp.icg_leftover, fedgsp.icg_balance, fedgsp.icg_normalize) == (
        "drop", False, False)
    assert not fedgsp.static_groups
    assert FedGSP(num_groups=10).static_groups
    assert not FedGSP(num_groups=10, static_groups=False).static_groups


def chains_by_round(strategy: FedGSP) -> dict[str, list[list[int]]]:
    return json.loads(strategy.artifacts(final=False)["chains.json"])


@pytest.mark.parametrize("grouping", ["random", "icg"])
def test_naive_groups_and_their_order_are_kept_while_fedgsp_regroups(grouping: str) -> None:
    grid = grid_of(list(range(12)))
    naive = FedGSP(num_groups=3, grouping=grouping, kappa=1.0, seed=0, fraction_evaluate=0.0)
    start(naive, grid, rounds=3)
    chains = chains_by_round(naive)
    assert list(chains) == ["1", "2", "3"] and chains["1"] == chains["2"] == chains["3"]
    assert sorted(p for chain in chains["1"] for p in chain) == list(range(12))
    hops = [[m.content["config"]["relay-group"], n] for _, n, t, m in grid.pushed
            if t == "train" and m.content["config"]["server-round"] == 3]
    assert [[n for g, n in hops if g == i] for i in range(3)] == chains["3"]

    regrouped = FedGSP(num_groups=3, grouping=grouping, kappa=1.0, seed=0,
                       static_groups=False, fraction_evaluate=0.0)
    start(regrouped, grid_of(list(range(12))), rounds=3)
    assert len({json.dumps(c) for c in chains_by_round(regrouped).values()}) > 1


def test_a_static_group_skips_a_node_that_left_and_takes_a_new_one() -> None:
    grid = grid_of(list(range(9)))
    naive = FedGSP(num_groups=3, grouping="random", kappa=1.0, seed=2, fraction_evaluate=0.0)
    start(naive, grid, rounds=1)
    first = chains_by_round(naive)["1"]
    gone = first[1][0]
    grid.handlers.pop(gone)
    start(naive, grid, rounds=1)
    second = chains_by_round(naive)["1"]
    assert second == [first[0], first[1][1:], first[2]]
    grid.handlers.update({20: grid_of([20]).handlers[20], 21: grid_of([21]).handlers[21]})
    start(naive, grid, rounds=1)
    third = chains_by_round(naive)["1"]
    # 20 (partition 20) joins the smallest group (the one that lost a node), 21 the first
    assert third == [first[0] + [21], first[1][1:] + [20], first[2]]


def test_a_round_where_no_node_answers_its_histogram_query_trains_nothing(caplog) -> None:
    """Nodes too slow to answer their first histogram query in time (ClientApps still
    starting) leave FedGSP no node to group in round 1: that round trains nothing and
    says why, instead of failing in the growth function; asked again, they train.
    """
    grid = grid_of(list(range(4)))
    answers, asked = dict(grid.handlers), set()

    def slow_first_query(message, node):
        if message.metadata.message_type == "query.histogram" and node not in asked:
            asked.add(node)
            return None
        return answers[node](message)

    for node in range(4):
        grid.handlers[node] = lambda message, node=node: slow_first_query(message, node)
    strategy = FedGSP(num_groups=1, kappa=1.0, seed=0, fraction_evaluate=0.0,
                      train_timeout=0.3, query_timeout=0.3)
    with caplog.at_level("WARNING", logger="flwr"):
        start(strategy, grid, rounds=2)
    assert strategy.history[1]["hops"] == 0 and strategy.history[1]["num-groups"] == 0
    assert any("none of the 4 connected node(s) answered its histogram query" in r.message
               for r in caplog.records)
    assert strategy.history[2]["hops"] == 4 and strategy.history[2]["groups-trained"] == 1
