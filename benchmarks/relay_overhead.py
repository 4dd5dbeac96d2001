"""Relay overhead in Flower's simulation engine: time per hop vs a FedAvg round trip,
measured in the same run.

    python benchmarks/relay_overhead.py [--nodes 10] [--rounds 4] [--out FILE.json]

One run on a private local SuperLink: every round trains one relay chain through every
node (``naivegsp`` with one group), then evaluates on every node the way Flower's
FedAvg does (all nodes in parallel, one message each, through ``send_and_receive``).
Tiny synthetic data and the logistic model make training time negligible. Prints one
JSON document (and writes it to ``--out``): the relay's mean hop latency and time per round, and the mean round
trip of the parallel evaluation. Round 1 includes Ray's actor start-up (about 10 s)
and is left out.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmark_io import emit_json

from fedgsp_flwr.app.results import read_metrics
from fedgsp_flwr.tools.launcher import LocalSimulation

APP_DIR = Path(__file__).resolve().parents[1]


def main() -> None:
    """Run the simulation and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4, help="at least 2")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is warm-up)")
    work = Path(tempfile.mkdtemp(prefix="relay-overhead-"))
    config: dict[str, Any] = {
        "dataset": "synthetic", "partition": "natural", "model": "logistic",
        "num-server-rounds": args.rounds, "fraction-evaluate": 1.0,
        "min-available-nodes": args.nodes, "results-dir": str(work / "results"),
        "strategy": "naivegsp", "fedgsp-num-groups": 1, "fedgsp-kappa": 1.0, "run-name": "relay",
    }
    with LocalSimulation(APP_DIR, work / "flwr-home") as sim:
        outcome = sim.run(config, num_supernodes=args.nodes, log_path=work / "relay.log")
    if not outcome.ok:
        raise SystemExit(f"run {outcome.status}; log: {outcome.log_path}")
    rows = (read_metrics(work / "results" / "relay") or {})["rounds"][2:]
    hop = statistics.mean(r["hop-latency-mean"] for r in rows)
    fedavg_round = statistics.mean(r["eval-time"] for r in rows)
    emit_json({
        "benchmark": "relay_overhead", "engine": "simulation", "nodes": args.nodes,
        "rounds_measured": len(rows),
        "fedavg_round_trip_seconds": fedavg_round,
        "relay_hop_seconds": hop,
        "relay_round_seconds": statistics.mean(r["train-time"] for r in rows),
        "hops_per_relay_round": statistics.mean(r["hops"] for r in rows),
        "hop_over_fedavg_round_trip": hop / fedavg_round,
        "work_dir": str(work),
    }, args.out, indent=2)


if __name__ == "__main__":
    main()
