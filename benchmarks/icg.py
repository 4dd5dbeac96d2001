"""ICG speed and grouping quality, side by side with k-means-constrained.

    python benchmarks/icg.py [--repeats 30] [--sizes 364:52,1000:50,10000:100]
        [--generators femnist,shards,dirichlet-0.1,dirichlet-0.5] [--blas-threads 1]

Prints one JSON document with one result per generator and size (K clients, M groups).
Histogram generators (``--generators``, all by default):

- ``femnist``: FEMNIST-like writers, 62 classes with a skewed prior (digits ~5x as
  frequent as letters), per-writer proportions drawn around it and writer sizes
  lognormal (median ~180 examples, 10 to 1500);
- ``shards``: the pathological MNIST split (McMahan et al.): 600 K labels with MNIST's
  class frequencies, sorted, cut into 2 K shards of 300, two random shards per client.
  Most clients hold two classes and many histograms are identical;
- ``dirichlet-0.1`` and ``dirichlet-0.5``: label skew over 10 classes, each client's
  proportions drawn from Dirichlet(alpha), sizes lognormal (median ~240, 20 to 2000).

``k-means-constrained`` (optional, ``pip install -e ".[bench]"``) solves the same
equal-size clustering with an OR-Tools min-cost flow over the full client-cluster
network; it is given the same points, number of clusters, cluster size and iteration
cap. Timings are medians over repeats (K >= 5000: a tenth of them, at least 1) of wall
time (``*_seconds_median``) and of this process's CPU time (``*_cpu_seconds_median``,
less sensitive to other work on a shared machine); the speedups are
k-means-constrained's median over ICG's. Both run in the same process with BLAS
limited to ``--blas-threads`` threads (1: multi-threaded BLAS makes the small matrix
products of both noisy on a shared machine). ``icg_flows``,
``icg_pricing_rounds`` and ``icg_cycles`` are per-run means of ICG's exact assignment
work: min-cost flows solved, flows re-solved after pricing the full network, and
negative cycles cancelled on it. Grouping quality is the median CPD between groups for
ICG (the paper's random one-per-cluster draw), ICG with balanced draws, and random
grouping.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable


def _blas_threads(argv: list[str]) -> str:
    """``--blas-threads`` from the command line (it must be set before numpy loads)."""
    for i, arg in enumerate(argv):
        if arg == "--blas-threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--blas-threads="):
            return arg.split("=", 1)[1]
    return "1"


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _blas_threads(sys.argv)

import numpy as np

from fedgsp_flwr.core.grouping import (
    class_distributions,
    icg,
    pairwise_cpd,
    random_groups,
)
from fedgsp_flwr.core.kmeans import squared_distances

FEMNIST_CLASSES = 62
MNIST_CLASSES = 10
# MNIST's training-set class counts (digits 0-9), for the shards split's class frequencies
MNIST_COUNTS = np.array([5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])


def femnist_like(k: int, seed: int) -> np.ndarray:
    """(k, 62) label counts shaped like FEMNIST writers' (skewed, varying sizes)."""
    rng = np.random.default_rng(seed)
    prior = np.concatenate([np.full(10, 5.0), np.full(FEMNIST_CLASSES - 10, 1.0)])
    prior /= prior.sum()
    sizes = np.clip(rng.lognormal(5.2, 0.7, k).astype(int), 10, 1500)
    return np.stack([rng.multinomial(n, rng.dirichlet(prior * 20)) for n in sizes])


def shards(k: int, seed: int, shard: int = 300) -> np.ndarray:
    """(k, 10) label counts of the pathological MNIST split: 2 k sorted shards of
    ``shard`` labels (MNIST's class frequencies), two random shards per client.
    """
    rng = np.random.default_rng(seed)
    total = 2 * k * shard
    bounds = np.round(np.cumsum(MNIST_COUNTS) / MNIST_COUNTS.sum() * total).astype(int)
    starts = np.arange(2 * k) * shard  # shard j holds sorted labels [starts[j], +shard)
    # labels below each class boundary, at the shard's start and end
    below = np.minimum(np.maximum(bounds[None, :] - starts[:, None], 0), shard)
    per_shard = np.diff(np.concatenate([np.zeros((2 * k, 1), int), below], axis=1), axis=1)
    owners = rng.permutation(2 * k).reshape(k, 2)
    return per_shard[owners].sum(axis=1)


def dirichlet(k: int, seed: int, alpha: float) -> np.ndarray:
    """(k, 10) label counts: Dirichlet(alpha) proportions, lognormal sizes."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(5.5, 0.6, k).astype(int), 20, 2000)
    return np.stack([rng.multinomial(n, rng.dirichlet(np.full(MNIST_CLASSES, alpha)))
                     for n in sizes])


GENERATORS: dict[str, Callable[[int, int], np.ndarray]] = {
    "femnist": femnist_like,
    "shards": shards,
    "dirichlet-0.1": lambda k, seed: dirichlet(k, seed, 0.1),
    "dirichlet-0.5": lambda k, seed: dirichlet(k, seed, 0.5),
}


def objective(points: np.ndarray, labels: np.ndarray) -> float:
    """sum_k 1/2 ||V^k - C_l(k)||^2 with C_l the mean of cluster l."""
    centres = np.stack([points[labels == c].mean(axis=0) for c in np.unique(labels)])
    return 0.5 * float(squared_distances(points, centres)[np.arange(len(points)),
                                                             labels].sum())


def median_cpd(v: np.ndarray, groups: list[list[int]]) -> float:
    """Median CPD over all pairs of groups."""
    return float(np.median(pairwise_cpd(class_distributions(v, groups))))


def bench_size(generator: str, k: int, m: int, repeats: int, tau: int) -> dict:
    """Time ICG and k-means-constrained on one generator and problem size."""
    v = GENERATORS[generator](k, k).astype(np.float64)
    icg_times, icg_obj, kmc_times, kmc_obj, icg_cpd, rnd_cpd = [], [], [], [], [], []
    bal_times, bal_cpd, work, icg_cpu, kmc_cpu = [], [], [], [], []
    for rep in range(repeats):
        started, cpu = time.perf_counter(), time.process_time()
        result = icg(v, m, np.random.default_rng(rep), max_iter=tau)
        icg_times.append(time.perf_counter() - started)
        icg_cpu.append(time.process_time() - cpu)
        stats = result.assignment
        work.append((result.iterations, stats.flows, stats.pricing_rounds, stats.cycles))
        clustered = np.concatenate([np.asarray(c) for c in result.clusters])
        labels = np.concatenate([np.full(len(c), i) for i, c in enumerate(result.clusters)])
        icg_obj.append(objective(v[clustered], labels))
        icg_cpd.append(median_cpd(v, result.groups))
        started = time.perf_counter()
        balanced = icg(v, m, np.random.default_rng(rep), max_iter=tau, balance=True)
        bal_times.append(time.perf_counter() - started)
        bal_cpd.append(median_cpd(v, balanced.groups))
        rnd_cpd.append(median_cpd(v, random_groups(list(range(k)), m,
                                                   np.random.default_rng(rep))))
        try:
            from k_means_constrained import KMeansConstrained
        except ImportError:
            continue
        n_clusters, size = len(result.clusters), len(result.clusters[0])
        model = KMeansConstrained(n_clusters=n_clusters, size_min=size, size_max=size,
                                  n_init=1, max_iter=tau, random_state=rep)
        started, cpu = time.perf_counter(), time.process_time()
        kmc_labels = model.fit_predict(v[clustered])
        kmc_times.append(time.perf_counter() - started)
        kmc_cpu.append(time.process_time() - cpu)
        kmc_obj.append(objective(v[clustered], kmc_labels))
    mean_work = np.mean(work, axis=0)
    out = {
        "generator": generator, "K": k, "M": m, "F": v.shape[1], "tau": tau,
        "repeats": repeats,
        "icg_seconds_median": float(np.median(icg_times)),
        "icg_cpu_seconds_median": float(np.median(icg_cpu)),
        "icg_objective_median": float(np.median(icg_obj)),
        "icg_iterations": float(mean_work[0]),
        "icg_flows": float(mean_work[1]),
        "icg_pricing_rounds": float(mean_work[2]),
        "icg_cycles": float(mean_work[3]),
        "icg_balanced_seconds_median": float(np.median(bal_times)),
        "random_cpd_median": float(np.median(rnd_cpd)),
        "icg_cpd_median": float(np.median(icg_cpd)),
        "icg_balanced_cpd_median": float(np.median(bal_cpd)),
        "cpd_reduction_vs_random": 1 - float(np.median(icg_cpd) / np.median(rnd_cpd)),
        "cpd_reduction_vs_random_balanced": 1 - float(np.median(bal_cpd) / np.median(rnd_cpd)),
    }
    if kmc_times:
        out.update({
            "kmc_seconds_median": float(np.median(kmc_times)),
            "kmc_cpu_seconds_median": float(np.median(kmc_cpu)),
            "kmc_objective_median": float(np.median(kmc_obj)),
            "speedup_vs_kmc": float(np.median(kmc_times)) / float(np.median(icg_times)),
            "speedup_vs_kmc_cpu": float(np.median(kmc_cpu)) / float(np.median(icg_cpu)),
            "objective_ratio_icg_over_kmc": float(np.median(icg_obj)) / float(
                np.median(kmc_obj)),
        })
    return out


def main() -> None:
    """Run the benchmark and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--tau", type=int, default=10)
    parser.add_argument("--sizes", default="364:52,1000:50,10000:100",
                        help="comma-separated K:M pairs")
    parser.add_argument("--generators", default=",".join(GENERATORS),
                        help=f"comma-separated, from {', '.join(GENERATORS)}")
    parser.add_argument("--blas-threads", default="1",
                        help="BLAS threads (set before numpy loads)")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in pair.split(":")) for pair in args.sizes.split(",")]
    generators = args.generators.split(",")
    unknown = set(generators) - set(GENERATORS)
    if unknown:
        parser.error(f"unknown generators {sorted(unknown)}; choose from {list(GENERATORS)}")
    started = time.perf_counter()
    results = [bench_size(g, k, m, args.repeats if k < 5000 else max(1, args.repeats // 10),
                          args.tau) for g in generators for k, m in sizes]
    print(json.dumps({"benchmark": "icg", "machine": platform.processor() or platform.machine(),
                      "blas_threads": int(args.blas_threads),
                      "seconds": round(time.perf_counter() - started, 1),
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
