"""What the simulation engine costs our code, side by side with a plain process.

    python benchmarks/engine_overhead.py [--parts a,b,c] [--nodes 10,100,1000]

(a) Server-side cores (ICG at K=364 and 10,000, a StoCFL clustering round, FeSEM's
    E-step on 100 MLPs, a weighted average of 100 MLPs), timed in the ServerApp of a
    running simulation (benchmarks/engine_app) on 10 and on 1,000 simulated nodes as our
    strategies run there (one BLAS thread, the objects alive before the run frozen for
    Python's cyclic GC: fedgsp_flwr.threads) and with the GC as it is, and in this
    process with its default threads and with one.
(b) A round of our FedAvg, every node training, on 10/100/1,000 simulated nodes with a
    no-op ClientApp and with a logistic model (60 -> 10, 200 examples, 1 epoch); and
    the floor: Flower's own FedAvg with the no-op ClientApp, in the same engine.
    Medians over the rounds after the first (round 1 starts the actors).
(c) A relay chain's hops (CNN, 1 epoch over 4,800 MNIST images) with and without the
    per-message thread hint, against the same training in this process on all cores;
    with the hint once per relay poll interval of ``--polls``.
(d) The stall's root cause, in a plain process: one thread runs multi-threaded BLAS
    calls (a 10000x62 @ 62 product) while another calls ``os.fork()``; with the
    process's BLAS threads and with one thread (``thread_limit(1)``).

Prints one JSON document (and writes it to --out if given). Each simulation is one
``flwr run`` against a private local SuperLink (fedgsp_flwr.tools.launcher), with
``client-resources-num-cpus=1`` as in the README.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

APP = Path(__file__).resolve().parent / "engine_app"
sys.path.insert(0, str(APP))

from benchmark_io import emit_json
from engine_probe.workloads import hop_training, time_workloads

from fedgsp_flwr.threads import machine_cores, thread_limit
from fedgsp_flwr.tools.launcher import LocalSimulation


def simulate(sim: LocalSimulation, folder: Path, nodes: int, **config: Any) -> dict:
    """One probe run on ``nodes`` simulated nodes; its JSON."""
    out = folder / f"{config['mode']}-{nodes}-{len(list(folder.glob('*.json')))}.json"
    outcome = sim.run({**config, "out": str(out)}, num_supernodes=nodes,
                      log_path=out.with_suffix(".log"), timeout=3600)
    if not outcome.ok:
        raise RuntimeError(f"probe run failed ({outcome.status}): {outcome.cause()}; log "
                           f"{outcome.log_path}")
    return json.loads(out.read_text())


def ratios(engine: dict[str, float], plain: dict[str, float]) -> dict[str, float]:
    return {k: engine[k] / plain[k] for k in plain}


def part_a(sim: LocalSimulation, folder: Path, repeats: int) -> dict:
    plain = {"threads-default": time_workloads(repeats)}
    with thread_limit(1):
        plain["threads-1"] = time_workloads(repeats)
    out: dict[str, Any] = {"plain": plain}
    for nodes in (10, 1000):
        engine = simulate(sim, folder, nodes, mode="cores", repeats=repeats)
        out[f"engine-{nodes}-nodes"] = engine
        out[f"ratio-{nodes}-nodes"] = {
            "ours-vs-plain-default": ratios(engine["ours"], plain["threads-default"]),
            "ours-vs-plain-1-thread": ratios(engine["ours"], plain["threads-1"]),
            "gc-as-is-vs-plain-1-thread": ratios(engine["threads-1-gc-as-is"],
                                                 plain["threads-1"]),
        }
    return out


def part_b(sim: LocalSimulation, folder: Path, sizes: list[int], rounds: int) -> dict:
    out: dict[str, Any] = {}
    for nodes in sizes:
        for label, work, strategy in (("noop", "noop", "ours"),
                                      ("logistic", "logistic", "ours"),
                                      ("flower-noop", "noop", "flower")):
            run = simulate(sim, folder, nodes, mode="round", work=work, rounds=rounds,
                           strategy=strategy)
            # Round 1 includes the actors' start-up.
            run["median_round_seconds"] = statistics.median(run["round_seconds"][1:])
            out[f"{label}-{nodes}"] = run
    return out


def part_c(sim: LocalSimulation, folder: Path, hops: int, polls: list[float]) -> dict:
    import torch

    from fedgsp_flwr.models import build_model

    in_process = [hop_training(build_model("cnn", (1, 28, 28), 10, 0), p, seed=0)
                  for p in range(hops)]
    out: dict[str, Any] = {"in_process_seconds": in_process,
                           "in_process_threads": torch.get_num_threads()}
    reference = statistics.median(in_process)
    runs = [(False, polls[0])] + [(True, poll) for poll in polls]
    for hint, poll in runs:
        run = simulate(sim, folder, hops, mode="relay", hops=hops, hint=hint, poll=poll)
        latency = statistics.median(h["latency"] for h in run["hops"])
        run["median_hop_seconds"] = latency
        run["hop_over_in_process"] = latency / reference
        # The first hop also starts the actor: the medians above include it, as before.
        later = run["hops"][1:]
        run["median_later_hop_seconds"] = statistics.median(h["latency"] for h in later)
        run["median_later_train_over_in_process"] = statistics.median(
            h["train_seconds"] for h in later) / reference
        key = "with-hint" if hint else "without-hint"
        out[key if key not in out else f"{key}-{len(out)}"] = run  # poll_interval inside
    return out


FORK_RACE = """
import json, os, sys, threading, time
from fedgsp_flwr.threads import thread_limit
import numpy as np
threads = int(sys.argv[1]) or None
a, b, calls, forks = np.random.rand(10000, 62), np.random.rand(62), [0], [0]
def blas():
    with thread_limit(threads):
        while True:
            a @ b
            calls[0] += 1
def fork():
    while True:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        forks[0] += 1
threading.Thread(target=blas, daemon=True).start()
time.sleep(0.5)
threading.Thread(target=fork, daemon=True).start()
seen, stalled = -1, False
for _ in range(int(sys.argv[2])):
    time.sleep(1)
    stalled = calls[0] == seen
    if stalled:
        break
    seen = calls[0]
print(json.dumps({"blas_calls": calls[0], "forks": forks[0], "stalled": stalled}))
os._exit(0)
"""


def part_d(seconds: int) -> dict:
    """Run the fork race in fresh processes (a stalled one cannot be recovered)."""
    import subprocess

    out = {}
    for threads in (0, 1):
        run = subprocess.run([sys.executable, "-c", FORK_RACE, str(threads), str(seconds)],
                             capture_output=True, text=True, timeout=seconds + 60, check=True)
        out["threads-1" if threads else "threads-default"] = json.loads(run.stdout)
    return out


def main() -> None:
    """Run the chosen parts and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="a,b,c,d")
    parser.add_argument("--fork-seconds", type=int, default=10, help="(d) seconds per race")
    parser.add_argument("--nodes", default="10,100,1000", help="(b) simulated nodes")
    parser.add_argument("--rounds", type=int, default=3,
                        help="(b) rounds per run, at least 2")
    parser.add_argument("--repeats", type=int, default=3, help="(a) repeats per workload")
    parser.add_argument("--hops", type=int, default=4, help="(c) hops in the chain")
    parser.add_argument("--polls", default="0.02",
                        help="(c) the relay's poll intervals in seconds, one run with the "
                             "hint each (the first also without)")
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "b" in parts and args.rounds < 2:
        parser.error("--rounds must be at least 2 for (b): its medians leave out round 1")
    # Terminated, it unwinds like Ctrl-C: the processes it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.perf_counter()
    result: dict[str, Any] = {"benchmark": "engine_overhead", "cores": machine_cores(),
                              "machine": platform.processor() or platform.machine(),
                              "command": " ".join(["python", *sys.argv])}
    with tempfile.TemporaryDirectory() as tmp, LocalSimulation(APP, Path(tmp) / "home") as sim:
        folder = Path(tmp)
        if "a" in parts:
            result["a_server_cores"] = part_a(sim, folder, args.repeats)
        if "b" in parts:
            result["b_fedavg_round"] = part_b(
                sim, folder, [int(n) for n in args.nodes.split(",")], args.rounds)
        if "c" in parts:
            result["c_relay_hop"] = part_c(sim, folder, args.hops,
                                           [float(p) for p in args.polls.split(",")])
        if "d" in parts:
            result["d_fork_race"] = part_d(args.fork_seconds)
    result["wall_seconds"] = time.perf_counter() - started
    emit_json(result, args.out, indent=2)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
