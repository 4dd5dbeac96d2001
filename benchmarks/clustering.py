"""StoCFL's clustering core on real sketches: wall time per round, rounds, ARI.

    python benchmarks/clustering.py [--rounds 100] [--sizes 400,1200,4800] [--out f.json]

Sketches are the real ones: the normalised full-batch gradient of the StoCFL MLP
(784-2048-10, 1.6M parameters, randomly initialised with seed 0: the anchor) on each
client's MNIST data, exactly as ``query.sketch`` computes them, raw (6.4 MB) and
projected to 1,024 numbers (4 KB) with :func:`fedgsp_flwr.clients.sketches.project`. Each round
samples 10% of the clients; a client's sketch is computed the first time it is sampled
(outside the timed section) and the clustering core is timed on that round's new
clients (:meth:`SketchClustering.add`: the products with the cluster sums and the
greedy merging). Prints one JSON document:

``speed``
    Rotated MNIST with N in ``--sizes`` clients (60,000 / N examples each): per-round
    clustering time (median, max, round 1) for raw and projected sketches, and the round
    after which the partition no longer changes (every client seen, no merge).
``settings``
    The paper's section 4.1 settings (label groups, rotated and shifted with 400
    clients, hybrid MNIST + Fashion-MNIST with 200), projected sketches, tau 0.5:
    ARI against the latent groups per round and the first round from which it stays 1.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import time
from typing import Any

import numpy as np

from fedgsp_flwr.app.config import RunConfig
from fedgsp_flwr.app.datasets import load_client_data, load_partitions
from fedgsp_flwr.clients.sketches import project
from fedgsp_flwr.core.clustering import SketchClustering, adjusted_rand_index
from fedgsp_flwr.models import build_model
from fedgsp_flwr.training import normalized_gradient

DIM = 1024
SETTINGS = {  # name: (dataset, partition, clients)
    "label-groups": ("mnist", "label-groups", 400),
    "rotated": ("mnist", "rotated", 400),
    "shifted": ("mnist", "shifted", 400),
    "hybrid": ("hybrid", "hybrid", 200),
}


class Sketcher:
    """Computes (and caches the projected) sketches of one dataset's clients."""

    def __init__(self, dataset: str, partition: str, clients: int, seed: int) -> None:
        self.cfg = RunConfig(dataset=dataset, partition=partition, seed=seed)
        self.clients = clients
        self.truth = np.array([p.latent_group for p in load_partitions(self.cfg, clients)])
        self.anchor = build_model("mlp", (1, 28, 28), 10, seed=0)
        self.size = sum(p.numel() for p in self.anchor.parameters())
        self.projected: dict[int, np.ndarray] = {}

    def raw(self, client: int) -> np.ndarray:
        """The client's unit gradient sketch (also caches its projection)."""
        data = load_client_data(self.cfg, client, self.clients)
        sketch = normalized_gradient(self.anchor, data.x_train, data.y_train)
        self.projected[client] = project(sketch, DIM, seed=0)
        return sketch

    def small(self, clients: list[int]) -> np.ndarray:
        """Projected sketches of ``clients``."""
        for c in clients:
            if c not in self.projected:
                self.raw(c)
        return np.stack([self.projected[c] for c in clients])


def ari_of(state: SketchClustering, truth: np.ndarray) -> float:
    """ARI over the clients clustered so far."""
    clients = sorted(state.cluster_of)
    return adjusted_rand_index(truth[clients], [state.cluster_of[c] for c in clients])


def run_rounds(sketcher: Sketcher, rounds: int, tau: float, raw: bool, seed: int
               ) -> dict[str, Any]:
    """Cluster with 10% sampling for ``rounds`` rounds (or until all are final)."""
    rng = np.random.default_rng(seed)
    n = sketcher.clients
    states = {"projected": SketchClustering(tau, keep_sketches=False)}
    if raw:
        states["raw"] = SketchClustering(tau, keep_sketches=False)
    times: dict[str, list[float]] = {k: [] for k in states}
    ari: list[float] = []
    clusters: list[int] = []
    final = None
    for r in range(1, rounds + 1):
        sampled = sorted(rng.choice(n, max(1, n // 10), replace=False).tolist())
        new = [c for c in sampled if c not in states["projected"].cluster_of]
        blocks = {"projected": sketcher.small(new) if new else np.zeros((0, DIM))}
        if raw:  # filled in place: the raw block of round 1 at N = 4,800 is 3 GB
            blocks["raw"] = np.empty((len(new), sketcher.size), dtype=np.float32)
            for i, c in enumerate(new):
                blocks["raw"][i] = sketcher.raw(c)
        changed = bool(new)
        for name, state in states.items():
            start = time.perf_counter()
            merges = state.add(new, blocks[name]) if new else state.merge()
            times[name].append(time.perf_counter() - start)
            changed |= bool(merges)
        del blocks
        ari.append(ari_of(states["projected"], sketcher.truth))
        clusters.append(states["projected"].num_clusters)
        if changed:
            final = None
        elif final is None and len(states["projected"].cluster_of) == n:
            final = r - 1
        if final is not None:
            break
    out: dict[str, Any] = {
        "clients": n, "rounds-run": len(ari), "partition-final-round": final,
        "clients-clustered": len(states["projected"].cluster_of),
        "clusters": clusters[-1], "ari-final": ari[-1],
        "ari-1-from-round": next((i + 1 for i in range(len(ari))
                                  if all(a == 1.0 for a in ari[i:])), None),
        "ari-per-round": [round(a, 4) for a in ari], "clusters-per-round": clusters,
    }
    if raw:
        out["ari-final-raw"] = ari_of(states["raw"], sketcher.truth)
        out["same-partition-raw-projected"] = (
            {frozenset(m) for m in states["raw"].clusters.values()}
            == {frozenset(m) for m in states["projected"].clusters.values()})
    for name, values in times.items():
        ms = 1000 * np.array(values)
        out[f"{name}-ms-median"] = round(float(np.median(ms)), 3)
        out[f"{name}-ms-max"] = round(float(ms.max()), 3)
        out[f"{name}-ms-round1"] = round(float(ms[0]), 3)
    return out


def main() -> None:
    """Run the benchmark and print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--sizes", default="400,1200,4800")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--tau", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    started = time.perf_counter()
    report: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "numpy": np.__version__},
        "sketch": {"model": "mlp 784-2048-10", "raw-bytes": 1_628_170 * 4,
                   "projected-dim": DIM, "projected-bytes": DIM * 4},
        "tau": args.tau, "sampling": 0.1, "speed": {}, "settings": {},
    }
    for size in (int(s) for s in args.sizes.split(",") if s):
        sketcher = Sketcher("mnist", "rotated", size, args.seed)
        report["speed"][str(size)] = run_rounds(sketcher, args.rounds, args.tau, True,
                                                args.seed)
        print(json.dumps({"done": f"speed N={size}",
                          "seconds": round(time.perf_counter() - started)}), flush=True)
    for name in (s for s in args.settings.split(",") if s):
        dataset, partition, clients = SETTINGS[name]
        sketcher = Sketcher(dataset, partition, clients, args.seed)
        result = run_rounds(sketcher, min(args.rounds, 50), args.tau, False, args.seed)
        report["settings"][name] = result
    report["seconds"] = round(time.perf_counter() - started, 1)
    # One line per list of numbers keeps the per-round curves readable.
    text = re.sub(r"\[[^\[\]{}]*\]", lambda m: " ".join(m.group(0).split()),
                  json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
