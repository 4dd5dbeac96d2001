"""Relay hop latency on real SuperNodes vs in Flower's simulation engine.

One chain through every node per round (``naivegsp`` with one group, tiny synthetic
data, so a hop's training takes milliseconds and the latency is the transport's):

- ``deployment``: a SuperLink and SuperNodes on 127.0.0.1 (``LocalFederation``); the
  relay polls for each hop's reply every 0.02 s (``relay-poll``);
- ``deployment-3s-polls``: the same with ``relay-poll = 3.0``, the fixed sleep of
  ``Grid.send_and_receive`` in deployment;
- ``deployment-fast-superexec``: ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1`` on the
  SuperNodes (Flower's default is 1 s);
- ``simulation``: Flower's simulation engine (``LocalSimulation``).

Prints JSON (and writes it with ``--out``): per setting the mean hop latency, seconds
per round, and Flower's ClientApp seconds per message from ``flwr ls``.

    python benchmarks/hop_latency.py --nodes 4 --rounds 2 [--settings deployment simulation]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.app.results import read_metrics
from fedgsp_flwr.tools.federation import CONNECTION, LocalFederation
from fedgsp_flwr.tools.launcher import FlwrCli, LocalSimulation, RunOutcome

BASE = {"strategy": "naivegsp", "fedgsp-num-groups": 1, "fedgsp-growth-beta": 1,
        "fedgsp-kappa": 1.0, "dataset": "synthetic", "partition": "natural", "batch-size": 16,
        "fraction-evaluate": 0.0}


def summarise(cli: FlwrCli, outcome: RunOutcome, folder: Path, nodes: int,
              connection: str = "") -> dict[str, Any]:
    """Hop latency and round figures of a finished run (``nodes`` histogram queries
    and the hops are its messages).
    """
    if not outcome.ok:
        raise RuntimeError(f"run ended {outcome.status}: "
                           f"{outcome.log_path.read_text()[-2000:]}")
    rounds = read_metrics(folder)["rounds"][1:]
    hops = sum(r["hops"] for r in rounds)
    listing = json.loads(cli.cli("ls", *([connection] if connection else []), "--run-id",
                                 str(outcome.run_id), "--format", "json"))["runs"][0]
    return {
        "hops": hops,
        "hop-latency-mean": sum(r["hop-latency-mean"] * r["hops"] for r in rounds) / hops,
        "hop-latency-by-round": [r["hop-latency-mean"] for r in rounds],
        "relay-time-by-round": [r["train-time"] for r in rounds],
        "skipped-nodes": sum(r["skipped-nodes"] for r in rounds),
        "clientapp-seconds-per-message":
            listing["compute-time"]["clientapp-seconds"] / (hops + nodes),
        "wall-time": outcome.wall_time,
    }


def deployment(nodes: int, rounds: int, home: Path, relay_poll: float,
               node_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the chain on a local federation."""
    with LocalFederation(ROOT, home, node_env=node_env) as fed:
        for i in range(nodes):
            fed.add_node({"partition-id": i, "num-partitions": nodes})
        fed.wait_for_nodes(nodes)
        config = {**BASE, "num-server-rounds": rounds, "min-available-nodes": nodes,
                  "relay-poll": relay_poll, "results-dir": str(home / "results"),
                  "run-name": "run"}
        outcome = fed.run(config, log_path=home / "run.log", timeout=1800)
        return summarise(fed, outcome, home / "results" / "run", nodes, CONNECTION)


def simulation(nodes: int, rounds: int, home: Path) -> dict[str, Any]:
    """Run the chain in Flower's simulation engine."""
    with LocalSimulation(ROOT, home / "flwr-home") as sim:
        config = {**BASE, "num-server-rounds": rounds, "min-available-nodes": nodes,
                  "results-dir": str(home / "results"), "run-name": "run"}
        outcome = sim.run(config, num_supernodes=nodes, log_path=home / "run.log",
                          timeout=1800)
        return summarise(sim, outcome, home / "results" / "run", nodes)


SETTINGS: dict[str, Callable[[int, int, Path], dict[str, Any]]] = {
    "deployment": lambda n, r, home: deployment(n, r, home, 0.02),
    "deployment-3s-polls": lambda n, r, home: deployment(n, r, home, 3.0),
    "deployment-fast-superexec": lambda n, r, home: deployment(
        n, r, home, 0.02, {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}),
    "simulation": simulation,
}


def main() -> None:
    """Run the settings and print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                        help="settings to run, in this order (default: all)")
    args = parser.parse_args()
    if args.nodes < 2 or args.rounds < 1:
        parser.error("--nodes must be >= 2 and --rounds >= 1")
    report: dict[str, Any] = {"nodes": args.nodes, "rounds": args.rounds, "config": BASE}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.settings:
            report[name] = SETTINGS[name](args.nodes, args.rounds, work / name)
    emit_json(report, args.out)


if __name__ == "__main__":
    main()
