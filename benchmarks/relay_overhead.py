"""Relay overhead in Flower's simulation engine: time per hop vs a FedAvg round trip.

    python benchmarks/relay_overhead.py [--nodes 10] [--rounds 3]

Runs, back to back against one private local SuperLink, FedAvg and a single relay
chain through every node (``naivegsp`` with one group), both on tiny synthetic data
with the logistic model so that training time is negligible. Prints one JSON
document: FedAvg's mean round time (all nodes in parallel, one message each) and the
relay's mean hop latency and time per round (one message per node, in sequence).
Round 1 includes Ray's actor start-up (about 10 s) and is left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from fedgsp_flwr.launcher import LocalSimulation
from fedgsp_flwr.results import read_metrics

APP_DIR = Path(__file__).resolve().parents[1]


def main() -> None:
    """Run both simulations and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4, help="at least 2")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is warm-up)")
    work = Path(tempfile.mkdtemp(prefix="relay-overhead-"))
    common: dict[str, Any] = {
        "dataset": "synthetic", "partition": "natural", "model": "logistic",
        "num-server-rounds": args.rounds, "fraction-evaluate": 0.0,
        "min-available-nodes": args.nodes, "results-dir": str(work / "results"),
    }
    runs = {
        "fedavg": {"strategy": "fedavg"},
        "relay": {"strategy": "naivegsp", "num-groups": 1, "kappa": 1.0},
    }
    rows: dict[str, list[dict[str, Any]]] = {}
    with LocalSimulation(APP_DIR, work / "flwr-home") as sim:
        for name, overrides in runs.items():
            outcome = sim.run({**common, **overrides, "run-name": name},
                              num_supernodes=args.nodes, log_path=work / f"{name}.log")
            if not outcome.ok:
                raise SystemExit(f"{name} run {outcome.status}; log: {outcome.log_path}")
            rows[name] = (read_metrics(work / "results" / name) or {})["rounds"][2:]
    fedavg_round = statistics.mean(r["round-time"] for r in rows["fedavg"])
    hop = statistics.mean(r["hop-latency-mean"] for r in rows["relay"])
    relay_round = statistics.mean(r["relay-time"] for r in rows["relay"])
    print(json.dumps({
        "benchmark": "relay_overhead", "engine": "simulation", "nodes": args.nodes,
        "rounds_measured": args.rounds - 1,
        "fedavg_round_seconds": fedavg_round,
        "relay_hop_seconds": hop,
        "relay_round_seconds": relay_round,
        "hops_per_relay_round": statistics.mean(r["hops"] for r in rows["relay"]),
        "hop_over_fedavg_round": hop / fedavg_round,
        "work_dir": str(work),
    }, indent=2))


if __name__ == "__main__":
    main()
