"""A real federation on 127.0.0.1: flower-superlink, flower-supernode, ``flwr run``.

Every test starts its own SuperLink and SuperNodes as separate processes (runtime
dependency installation off, each node with its own port and node config) and stops
exactly those processes, also when it fails. In deployment every message starts a new
ClientApp process and an idle SuperNode polls every 3 s, so a message takes ~5-9 s here:
the runs are one round over three nodes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import quickstart_app

from fedgsp_flwr.app.results import read_metrics
from fedgsp_flwr.tools.federation import LocalFederation
from fedgsp_flwr.tools.launcher import RunOutcome, is_running

pytestmark = pytest.mark.deployment

APP_DIR = Path(__file__).resolve().parents[2]
TINY = {"dataset": "synthetic", "partition": "natural", "batch-size": 16, "lr": 0.1,
        "min-available-nodes": 3, "num-server-rounds": 1, "fraction-evaluate": 0.0}
# HierFL reads the edges a node reaches, Semi-FL its cluster, from the node config.
NODE_CONFIGS = [
    {"partition-id": 0, "num-partitions": 3, "edges": "0", "cluster-id": 0},
    {"partition-id": 1, "num-partitions": 3, "edges": "0,1", "cluster-id": 0},
    {"partition-id": 2, "num-partitions": 3, "edges": "1", "cluster-id": 1},
]


@pytest.fixture(scope="module")
def secure_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFederation]:
    """TLS and SuperNode authentication: three registered nodes."""
    fed = LocalFederation(APP_DIR, tmp_path_factory.mktemp("secure"), tls=True, auth=True)
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


STRATEGY_RUNS: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = {
    "fedavg": ({"fraction-evaluate": 1.0}, expect(**{"train-replies": 3,
                                                     "eval-replies": 3})),
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
    "cfl": ({}, expect(**{"train-replies": 3, "clusters": lambda k: k >= 1,
                          "placed-clients": 3})),
    # every node trains its personal model in its node state and is scored on it
    "ditto": ({"fraction-evaluate": 1.0}, expect(**{"train-replies": 3, "eval-replies": 3,
                                                    "eval-personal-clients": 3})),
}


@pytest.mark.parametrize("strategy", list(STRATEGY_RUNS))
def test_each_strategy_runs_a_round_on_real_supernodes(
        secure_federation: LocalFederation, strategy: str) -> None:
    overrides, check = STRATEGY_RUNS[strategy]
    folder = secure_federation.folder / "results"
    outcome = secure_federation.run(
        {**TINY, **overrides, "strategy": strategy, "results-dir": str(folder),
         "run-name": strategy},
        log_path=folder / f"{strategy}.log", timeout=300)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    metrics = read_metrics(folder / strategy)
    assert metrics["status"] == "complete"
    assert check(metrics["rounds"][1]), metrics["rounds"][1]


def run_in_background(fed: LocalFederation, run_config: dict[str, Any],
                      log_path: Path, timeout: float) -> Callable[[], RunOutcome]:
    """Start ``fed.run`` in a thread; return a function that waits for its outcome."""
    outcome: list[RunOutcome] = []
    thread = threading.Thread(target=lambda: outcome.append(
        fed.run(run_config, log_path=log_path, timeout=timeout)), daemon=True)
    thread.start()

    def wait() -> RunOutcome:
        thread.join(timeout + 60)
        assert outcome, "flwr run did not return"
        return outcome[0]

    return wait


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` every 0.2 s until it is truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}")


class ReceiptWatcher:
    """Names of the nodes whose log shows a message type, in the order they first did."""

    def __init__(self, fed: LocalFederation, message_type: str) -> None:
        self.fed, self.line = fed, f"Receiving: {message_type} message"
        self.order: list[str] = []

    def poll(self) -> list[str]:
        """Look at the logs once; return the order so far."""
        for node in self.fed.nodes:
            if node.name not in self.order and self.line in node.log_path.read_text():
                self.order.append(node.name)
        return self.order


# A live node's reply can take over 20 s here when three ClientApp processes start at
# once (round 3 of the killed-node runs): their train-timeout.
LIVE_REPLY_TIMEOUT = 45.0


def crash_and_return(fed: LocalFederation, run_config: dict[str, Any], folder: Path,
                     message_type: str, nth: int) -> tuple[list[dict[str, Any]], str, str]:
    """Run three rounds (``train-timeout`` LIVE_REPLY_TIMEOUT); SIGKILL the ``nth`` node
    to receive ``message_type`` (while it works on it), restart it once round 1 is over
    (a new process and node id).

    Returns
    -------
    tuple[list[dict[str, Any]], str, str]
        The rounds' metrics, the streamed log, the restarted node's log.
    """
    for config in NODE_CONFIGS:
        fed.add_node(config)
    fed.wait_for_nodes(3)
    wait = run_in_background(
        fed, {**TINY, "train-timeout": LIVE_REPLY_TIMEOUT, **run_config,
              "num-server-rounds": 3, "min-available-nodes": 2,
              "results-dir": str(folder), "run-name": "fault"},
        folder / "fault.log", timeout=480)
    watcher = ReceiptWatcher(fed, message_type)
    order = wait_until(lambda: len(watcher.poll()) > nth and watcher.order, 180,
                       f"{message_type} number {nth + 1}")
    victim = next(n for n in fed.nodes if n.name == order[nth])
    fed.kill_node(victim)
    wait_until(lambda: (folder / "fault" / "metrics.json").exists() and len(
        read_metrics(folder / "fault")["rounds"]) >= 2, 240, "the end of round 1")
    fed.restart_node(victim)
    outcome = wait()
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    rounds = read_metrics(folder / "fault")["rounds"]
    assert len(rounds) == 4
    return rounds, outcome.log_path.read_text(), victim.log_path.read_text()


def test_a_node_killed_mid_chain_is_skipped_and_a_returning_node_rejoins(
        tmp_path: Path) -> None:
    with LocalFederation(APP_DIR, tmp_path / "fed") as fed:
        # Round 1 is one chain over the three nodes: the second hop's node dies.
        rounds, log, victim_log = crash_and_return(
            fed, {"strategy": "fedgsp", "fedgsp-kappa": 1.0, "query-timeout": 20.0},
            tmp_path / "results", "train", nth=1)
    # Round 1: the lost hop is skipped and the first hop's model goes on to the third.
    assert rounds[1]["hops"] == 3 and rounds[1]["skipped-nodes"] == 1
    assert rounds[1]["groups-trained"] == 1
    assert "skipped node" in log and "its model goes on" in log
    assert rounds[1]["central-acc"] > rounds[0]["central-acc"]
    # The dead node is never chained again; the returning one answers a histogram
    # query and trains by the last round.
    assert [r["skipped-nodes"] for r in rounds[2:]] == [0, 0]
    assert rounds[3]["hops"] == 3
    assert "Receiving: query.histogram" in victim_log
    assert "Receiving: train message" in victim_log


def test_a_node_killed_mid_stocfl_round_is_skipped_and_a_returning_node_rejoins(
        tmp_path: Path) -> None:
    with LocalFederation(APP_DIR, tmp_path / "fed") as fed:
        rounds, _log, victim_log = crash_and_return(
            fed, {"strategy": "stocfl", "query-timeout": 30.0},
            tmp_path / "results", "train.bilevel", nth=0)
    # Round 1 completes with the two other replies within the round's timeout.
    assert rounds[1]["train-replies"] == 2 and rounds[1]["train-rejected"] == 1
    assert rounds[1]["central-acc"] > rounds[0]["central-acc"]
    # The dead node is not sampled again; the returning one is sketched anew,
    # clustered and trains by the last round.
    assert [r["train-rejected"] for r in rounds[2:]] == [0, 0]
    assert rounds[3]["train-replies"] == 3
    assert "Receiving: query.sketch" in victim_log
    assert "Receiving: train.bilevel" in victim_log


def test_the_quickstart_app_takes_fedgsp_and_stocfl_defaults_on_real_supernodes(
        tmp_path: Path) -> None:
    """Flower's quickstart app (tests/quickstart), our strategies at default arguments,
    on three real SuperNodes: both train, and a missing hook costs one message each.
    """
    with LocalFederation(quickstart_app(tmp_path), tmp_path / "fed") as fed:
        for partition in range(3):
            fed.add_node({"partition-id": partition, "num-partitions": 3})
        fed.wait_for_nodes(3)
        # One round: the hooks are probed in round 1 only (the simulation test runs 3).
        outcome = fed.run({"strategies": "fedgsp,stocfl", "num-server-rounds": 1,
                           "train-examples": 3000, "lr": 0.02,
                           "out-dir": str(tmp_path / "out")},
                          log_path=tmp_path / "run.log", timeout=900)
        node_logs = "".join(n.log_path.read_text() for n in fed.nodes)
        pids = fed.pids()
        with pytest.raises(RuntimeError, match="already running"):
            fed.start()
    assert not any(map(is_running, pids)), f"processes left running: {pids}"
    assert outcome.ok, outcome.cause()
    rows = {r["strategy"]: r for r in json.loads((tmp_path / "out" / "summary.json")
                                                 .read_text())}
    for name, queries in (("fedgsp", ("query.histogram",)),
                          ("stocfl", ("query.partition", "query.sketch"))):
        row = rows[name]
        assert not row["error"] and row["trained-rounds"] == 1 and row["moved"], row
        assert row["final-tensors"] == 10 and row["rejected"] == 0, row
        assert len(row["missing-hook-warnings"]) == len(queries), row
        for query, warning in zip(queries, row["missing-hook-warnings"], strict=True):
            assert query in warning, row
            assert node_logs.count(f"Receiving: {query} message") == 1, query
