"""A real federation on 127.0.0.1: flower-superlink, flower-supernode, ``flwr run``.

The tests start their SuperLink and SuperNodes as separate processes (runtime dependency
installation off, each node with its own port and node config) and stop exactly those
processes, also when they fail. In deployment every message starts a new ClientApp
process and an idle SuperNode polls every 3 s, so a message takes ~5-15 s here: the
runs are one round over three nodes, of the strategies in STRATEGY_RUNS. The module's
secure federation (TLS, SuperNode authentication) serves every test: three ``flwr
run``s at once, two of the test app ``tests/scenarios`` (each calls the bundled
ServerApp once per strategy of its batch: a ServerApp process and FAB install a run,
~35 s, paid once) and one of the quickstart app; the killed-node tests start
federations of their own.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import DEPLOYMENT_NODE_ENV, bundled_app, completed_scenario, quickstart_app
from helpers import DEPLOYMENT_RUN as TINY

from fedgsp_flwr.app.results import read_metrics
from fedgsp_flwr.tools.federation import LocalFederation
from fedgsp_flwr.tools.launcher import RunOutcome, is_running

pytestmark = pytest.mark.deployment

SCENARIO_APP = Path(__file__).resolve().parents[1] / "scenarios"
# HierFL reads the edges a node reaches, Semi-FL its cluster, from the node config.
NODE_CONFIGS = [
    {"partition-id": 0, "num-partitions": 3, "edges": "0", "cluster-id": 0},
    {"partition-id": 1, "num-partitions": 3, "edges": "0,1", "cluster-id": 0},
    {"partition-id": 2, "num-partitions": 3, "edges": "1", "cluster-id": 1},
]


@pytest.fixture(scope="module")
def secure_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFederation]:
    """TLS and SuperNode authentication: three registered nodes."""
    fed = LocalFederation(bundled_app(tmp_path_factory.mktemp("app")),
                          tmp_path_factory.mktemp("secure"), tls=True, auth=True,
                          node_env=DEPLOYMENT_NODE_ENV)
    try:
        fed.start()
        for config in NODE_CONFIGS:
            fed.add_node(config)
        fed.wait_for_nodes(3)
        yield fed
    finally:
        pids = fed.pids()
        fed.close()
        assert not any(map(is_running, pids)), f"processes left running: {pids}"


def test_an_unregistered_node_is_refused(secure_federation: LocalFederation) -> None:
    fed = secure_federation
    intruder = fed.add_node({"partition-id": 0, "num-partitions": 3}, register=False,
                            max_retries=1)
    assert intruder.process is not None
    assert intruder.process.wait(timeout=120) != 0
    assert "Failed to activate SuperNode" in intruder.log_path.read_text()
    assert "No SuperNode found with the given public key" in (
        fed.folder / "superlink.log").read_text()
    assert len(fed.online_nodes()) == 3


def expect(**values: Any) -> Callable[[dict[str, Any]], bool]:
    """A check that a round's metrics hold ``values`` (a callable value is a predicate)."""
    def check(row: dict[str, Any]) -> bool:
        return all(v(row.get(k)) if callable(v) else row.get(k) == v
                   for k, v in values.items())
    return check


# Each message type the strategies send, and each use of the node config and the node
# state, once: FedAvg's exchanges (query.partition, train, evaluate) and CFL's
# (query.partition, train) are FeSEM's and Ditto's too, so they run in simulation only
# (tests/app/test_simulation_e2e.py, test_lying_partition_e2e.py, test_quickstart_e2e.py):
# the 18 messages they would add cost ~70 CPU-s of ClientApp processes.
STRATEGY_RUNS: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = {
    "fedgsp": ({"fedgsp-kappa": 1.0}, expect(**{"hops": 3, "skipped-nodes": 0, "num-groups": 1})),
    # nodes 0 and 1 reach edge 0, nodes 1 and 2 edge 1 (node config)
    "hierfl": ({"hierfl-edges": 2, "hierfl-tau1": 1, "hierfl-tau2": 1},
               expect(**{"train-replies": 3, "edges-trained": 2})),
    "stocfl": ({}, expect(**{"train-replies": 3, "num-clusters": lambda k: k >= 1})),
    "fesem": ({"fesem-k": 2}, expect(**{"train-replies": 3,
                                        "cluster-sizes": lambda s: sum(s) == 3})),
    # clusters from the node config: nodes 0 and 1 in cluster 0, node 2 in cluster 1
    "semifl": ({"semifl-clusters": "node-config"},
               expect(**{"cluster-sizes": [2, 1], "hops": 3, "uploads": 2})),
    # each node scores both models on its data (train.ifca) and trains its argmin
    "ifca": ({"ifca-k": 2}, expect(**{"train-replies": 3, "chosen-clients": 3,
                                      "cluster-sizes": lambda s: sum(s) == 3})),
    # every node trains its personal model in its node state and is scored on it, and
    # the global model on the plain evaluate message
    "ditto": ({"fraction-evaluate": 1.0}, expect(**{"train-replies": 3, "eval-replies": 3,
                                                    "eval-personal-clients": 3})),
}


# Balanced by their messages: 21 (two relays of three hops) and 27.
BATCHES = (("fedgsp", "semifl", "stocfl"), ("hierfl", "ifca", "fesem", "ditto"))
# Default arguments but evaluation off: what is checked is training and the missing
# hooks, and the 9 evaluate messages it saves cost ~35 CPU-s of ClientApp processes.
QUICKSTART_RUN = {"strategies": "fedgsp:fraction_evaluate=0.0,stocfl:fraction_evaluate=0.0",
                  "num-server-rounds": 1, "train-examples": 3000, "lr": 0.02}


@dataclass(frozen=True)
class Runs:
    """The module's ``flwr run``s on the secure federation, with where each wrote."""

    outcomes: dict[str, RunOutcome]  # by batch name ("batch-0", ...) and "quickstart"
    folder: Path
    batch_of: dict[str, str]  # strategy -> its batch


@pytest.fixture(scope="module")
def runs(secure_federation: LocalFederation) -> Runs:
    """Every strategy of STRATEGY_RUNS for one round, and Flower's quickstart app with
    FedGSP and StoCFL, as three ``flwr run``s at once on the secure federation.

    Each batch of BATCHES is one run of the scenario app (the bundled ServerApp once per
    strategy, the bundled ClientApp on the nodes). A SuperNode handles one message at a
    time and pulls the next as soon as it has replied, so the runs keep each other's
    nodes busy where one run alone leaves them idle (a hook probed on one node first, a
    relay hop, a ServerApp starting).
    """
    fed = secure_federation
    folder = fed.folder / "runs"
    jobs: dict[str, Callable[[], RunOutcome]] = {}
    batch_of = {}
    for i, batch in enumerate(BATCHES):
        name = f"batch-{i}"
        app = folder / name / "app"
        shutil.copytree(SCENARIO_APP, app, ignore=shutil.ignore_patterns("__pycache__"))
        scenarios = [{"name": s, "run-config": {
            **TINY, **STRATEGY_RUNS[s][0], "strategy": s,
            "results-dir": str(folder / "results"), "run-name": s}} for s in batch]
        (folder / name / "scenarios.json").write_text(json.dumps(scenarios))
        batch_of.update(dict.fromkeys(batch, name))
        jobs[name] = functools.partial(fed.run, {
            "dataset": "synthetic", "partition": "natural",
            "scenarios-file": str(folder / name / "scenarios.json"),
            "out-dir": str(folder / name / "out")},
            log_path=folder / name / "run.log", timeout=1500, app_dir=app)
    jobs["quickstart"] = functools.partial(
        fed.run, {**QUICKSTART_RUN, "out-dir": str(folder / "quickstart" / "out")},
        log_path=folder / "quickstart" / "run.log", timeout=1500,
        app_dir=quickstart_app(folder / "quickstart"))
    pool = ThreadPoolExecutor(len(jobs))
    try:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        outcomes = {name: future.result() for name, future in futures.items()}
    finally:
        # Interrupted (Ctrl-C, a test timeout): do not wait for the other runs; closing
        # the federation stops them.
        pool.shutdown(wait=False, cancel_futures=True)
    return Runs(outcomes, folder, batch_of)


# The first test waits for the module's runs (its fixture).
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("strategy", list(STRATEGY_RUNS))
def test_each_strategy_runs_a_round_on_real_supernodes(runs: Runs, strategy: str) -> None:
    batch = runs.batch_of[strategy]
    outcome = runs.outcomes[batch]
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    completed_scenario(runs.folder / batch / "out", strategy)
    metrics = read_metrics(runs.folder / "results" / strategy)
    assert metrics["status"] == "complete"
    _overrides, check = STRATEGY_RUNS[strategy]
    assert check(metrics["rounds"][1]), metrics["rounds"][1]


def received_in_run(log: str, run_id: str, message_type: str) -> int:
    """How many ``message_type`` messages of run ``run_id`` a SuperNode's log received.

    A SuperNode logs ``[RUN <id>]`` (or ``[RUN <id>, ROUND <r>]``) just before each
    ``Receiving: <type> message``; it is the only process that logs those headers.
    """
    count, run = 0, None
    for line in log.splitlines():
        if (header := re.search(r"\[RUN (\d+)", line)) is not None:
            run = header.group(1)
        elif f"Receiving: {message_type} message" in line and run == run_id:
            count += 1
    return count


@pytest.mark.timeout(1800)
def test_the_quickstart_app_takes_fedgsp_and_stocfl_defaults_on_real_supernodes(
        secure_federation: LocalFederation, runs: Runs) -> None:
    """Flower's quickstart app (tests/quickstart), our strategies at default arguments
    (but evaluation), on the three secure SuperNodes: both train, and a missing hook costs
    two messages each (the probe, and another node's that confirms it).
    """
    with pytest.raises(RuntimeError, match="already running"):
        secure_federation.start()
    outcome = runs.outcomes["quickstart"]
    assert outcome.ok, outcome.cause()
    assert outcome.run_id is not None
    node_logs = [n.log_path.read_text() for n in secure_federation.nodes]
    rows = {r["strategy"].split(":")[0]: r for r in json.loads(
        (runs.folder / "quickstart" / "out" / "summary.json").read_text())}
    # One round: the hooks are probed in round 1 only (the simulation test runs 3).
    for name, queries in (("fedgsp", ("query.histogram",)),
                          ("stocfl", ("query.partition", "query.sketch"))):
        row = rows[name]
        assert not row["error"] and row["trained-rounds"] == 1 and row["moved"], row
        assert row["final-tensors"] == 10 and row["rejected"] == 0, row
        assert len(row["missing-hook-warnings"]) == len(queries), row
        for query, warning in zip(queries, row["missing-hook-warnings"], strict=True):
            assert query in warning, row
            assert sum(received_in_run(log, outcome.run_id, query)
                       for log in node_logs) == 2, query
