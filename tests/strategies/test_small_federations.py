"""A federation too small for a strategy's settings says so, once, with the fix."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from fakegrid import FakeGrid
from flwr.app import ArrayRecord
from helpers import logistic, node_app, run_rounds, vector_data

from fedgsp_flwr import strategies

# What a strategy at the given settings warns on `nodes` nodes: the node count, what the
# settings imply, and the setting to change.
CASES: dict[str, tuple[Callable[[], strategies.FedAvg], int, list[str]]] = {
    # Flower's quickstart-pytorch: 10 nodes, every strategy at default arguments
    "FedGSP-defaults": (lambda: strategies.FedGSP(), 10, [
        "10 groups for 10 nodes are groups of one node", "FedAvg", "fedgsp-growth-beta",
        "at most 5"]),
    "NaiveGSP": (lambda: strategies.FedGSP(grouping="random", num_groups=3,
                                           min_available_nodes=4), 4, [
        "3 groups for 4 nodes", "fedgsp-num-groups", "at most 2"]),
    "SemiFL-defaults": (lambda: strategies.SemiFL(), 10, [
        "all 10 nodes are in one cluster (cluster_size=10)", "one sequential chain",
        "semifl-cluster-size", "below 10"]),
    "HierFL": (lambda: strategies.HierFL(num_edges=6, min_available_nodes=4), 4, [
        "6 edges for 4 users", "at least 2 edges get no user", "hierfl-edges",
        "at most 4"]),
    "FeSEM": (lambda: strategies.FeSEM(k=5, min_available_nodes=3), 3, [
        "k=5 centres for 3 nodes", "at least 2 centres", "fesem-k", "at most 3"]),
    "IFCA": (lambda: strategies.IFCA(k=5, min_available_nodes=3), 3, [
        "k=5 models for 3 nodes", "at least 2 models", "ifca-k", "at most 3"]),
}
# The same strategies where the settings fit: no such warning.
FITTING: dict[str, tuple[Callable[[], strategies.FedAvg], int]] = {
    "FedGSP": (lambda: strategies.FedGSP(beta=2, min_available_nodes=6), 6),
    "SemiFL": (lambda: strategies.SemiFL(cluster_size=2, min_available_nodes=4), 4),
    "HierFL": (lambda: strategies.HierFL(num_edges=2, min_available_nodes=4), 4),
    "FeSEM": (lambda: strategies.FeSEM(k=2, min_available_nodes=3), 3),
    "IFCA": (lambda: strategies.IFCA(k=2, min_available_nodes=3), 3),
}
WORDS = ("groups of one node", "in one cluster", "get no user", "get no node")


def federation(nodes: int) -> FakeGrid:
    return FakeGrid({n: node_app(lambda p: vector_data(n=24, seed=p), n, logistic(5, 3))
                     for n in range(1, nodes + 1)})


def size_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and any(w in r.getMessage() for w in WORDS)]


@pytest.mark.parametrize("case", list(CASES))
def test_a_federation_too_small_for_the_settings_warns_once(
        case: str, caplog: pytest.LogCaptureFixture) -> None:
    build, nodes, expected = CASES[case]
    with caplog.at_level(logging.WARNING):
        run_rounds(build(), federation(nodes), ArrayRecord(logistic(5, 3)().state_dict()), 2,
                   lr=0.1, **{"batch-size": 8})
    (warning,) = size_warnings(caplog)  # once in two rounds
    assert all(part in warning for part in expected), warning


@pytest.mark.parametrize("case", list(FITTING))
def test_settings_that_fit_the_federation_do_not_warn(
        case: str, caplog: pytest.LogCaptureFixture) -> None:
    build, nodes = FITTING[case]
    with caplog.at_level(logging.WARNING):
        run_rounds(build(), federation(nodes), ArrayRecord(logistic(5, 3)().state_dict()), 1,
                   lr=0.1, **{"batch-size": 8})
    assert size_warnings(caplog) == []
