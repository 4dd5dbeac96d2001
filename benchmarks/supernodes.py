"""30 real SuperNodes on 127.0.0.1: memory per node, round time and relay hop latency.

    python benchmarks/supernodes.py [--nodes 30] [--rounds 2] [--out FILE]

Starts a SuperLink and ``--nodes`` SuperNodes (``LocalFederation``, each node with
``num-threads=1`` in its node config: the machine's cores are shared by all of them),
runs ``--rounds`` rounds of FedAvg (every node trains and evaluates) and of FedGSP
(relay chains) on Synthetic(1, 1) data with the logistic model, and reports:

- memory: resident set size of each SuperNode with every process under it (its
  SuperExec and ClientApp processes), idle before the runs and the peak while they run,
  sampled every 0.5 s from /proc;
- per run: round times and, for FedGSP, the mean relay hop latency (``results``);
- cleanup: the processes left over afterwards (none expected), checked by PID.

Prints one JSON document (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.app.results import read_metrics
from fedgsp_flwr.tools.federation import LocalFederation
from fedgsp_flwr.tools.launcher import descendants, is_running

BASE = {"dataset": "synthetic", "model": "logistic", "lr": 0.05}
RUNS = {"fedavg": {"strategy": "fedavg", "fraction-train": 1.0, "fraction-evaluate": 1.0},
        "fedgsp": {"strategy": "fedgsp", "fraction-evaluate": 0.0}}


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and every process under it, in MB (0 if gone)."""
    total = 0
    for p in (pid, *descendants(pid)):
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in text.splitlines()
                       if line.startswith("VmRSS:")), 0)
    return total / 1024


class MemorySampler:
    """Peak RSS per process tree, sampled in a background thread."""

    def __init__(self, pids: list[int], interval: float = 0.5) -> None:
        self.pids, self.interval = pids, interval
        self.peak = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], rss_mb(pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "max": max(values), "min": min(values)}


def run_one(fed: LocalFederation, home: Path, name: str, nodes: int, rounds: int) -> dict:
    """One run on the federation; its round times and hop latency."""
    config = {**BASE, **RUNS[name], "num-server-rounds": rounds, "min-available-nodes": nodes,
              "results-dir": str(home / "results"), "run-name": name}
    outcome = fed.run(config, log_path=home / f"{name}.log", timeout=3600)
    if not outcome.ok:
        raise RuntimeError(f"{name} ended {outcome.status}: {outcome.cause()}")
    done = read_metrics(home / "results" / name)["rounds"][1:]
    out: dict[str, Any] = {"wall_seconds": outcome.wall_time,
                           "round_seconds": [r["round-time"] for r in done],
                           "train_seconds": [r["train-time"] for r in done]}
    if "hop-latency-mean" in done[0]:
        hops = sum(r["hops"] for r in done)
        out["hops"] = hops
        out["hop_latency_mean"] = sum(r["hop-latency-mean"] * r["hops"] for r in done) / hops
    return out


def main() -> None:
    """Start the federation, run FedAvg and FedGSP, print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    # Terminated, it unwinds like Ctrl-C: the processes it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    report: dict[str, Any] = {"nodes": args.nodes, "rounds": args.rounds, "config": BASE,
                              "runs": RUNS, "command": " ".join(["python", *sys.argv])}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        with LocalFederation(ROOT, home / "federation") as fed:
            for i in range(args.nodes):
                fed.add_node({"partition-id": i, "num-partitions": args.nodes,
                              "num-threads": 1})
            fed.wait_for_nodes(args.nodes, timeout=600)
            report["start_seconds"] = time.perf_counter() - started
            node_pids = [n.process.pid for n in fed.nodes if n.process is not None]
            report["idle_rss_mb_per_node"] = summary([rss_mb(p) for p in node_pids])
            report["superlink_rss_mb"] = rss_mb(fed.superlink.pid) if fed.superlink else 0.0
            for name in RUNS:
                with MemorySampler(node_pids) as sampler:
                    report[name] = run_one(fed, home, name, args.nodes, args.rounds)
                report[name]["peak_rss_mb_per_node"] = summary(list(sampler.peak.values()))
            started_pids = fed.pids() + [d for p in fed.pids() for d in descendants(p)]
        time.sleep(1)
        report["left_running_after_close"] = [p for p in started_pids if is_running(p)]
    report["wall_seconds"] = time.perf_counter() - started
    emit_json(report, args.out)


if __name__ == "__main__":
    main()
