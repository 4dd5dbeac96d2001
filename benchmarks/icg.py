"""ICG speed and grouping quality, side by side with k-means-constrained.

    python benchmarks/icg.py [--repeats 5] [--sizes 364:52,10000:100]

Prints one JSON document. Histograms are shaped like FEMNIST's: 62 classes with a
skewed prior (digits ~5x as frequent as letters), per-writer proportions drawn around it
and writer sizes lognormal (median ~180 examples, 10 to 1500). ``k-means-constrained``
(optional, ``pip install -e ".[bench]"``) solves the same equal-size clustering with an
OR-Tools min-cost flow; it is given the same points, number of clusters, cluster size
and iteration cap. Grouping quality is the median CPD between groups for ICG (the
paper's random one-per-cluster draw), ICG with balanced draws, and random grouping.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from fedgsp_flwr.core.grouping import (
    class_distributions,
    icg,
    pairwise_cpd,
    random_groups,
)
from fedgsp_flwr.core.kmeans import squared_distances

NUM_CLASSES = 62


def femnist_like(k: int, seed: int) -> np.ndarray:
    """(k, 62) label counts shaped like FEMNIST writers' (skewed, varying sizes)."""
    rng = np.random.default_rng(seed)
    prior = np.concatenate([np.full(10, 5.0), np.full(NUM_CLASSES - 10, 1.0)])
    prior /= prior.sum()
    sizes = np.clip(rng.lognormal(5.2, 0.7, k).astype(int), 10, 1500)
    return np.stack([rng.multinomial(n, rng.dirichlet(prior * 20)) for n in sizes])


def objective(points: np.ndarray, labels: np.ndarray) -> float:
    """sum_k 1/2 ||V^k - C_l(k)||^2 with C_l the mean of cluster l."""
    centres = np.stack([points[labels == c].mean(axis=0) for c in np.unique(labels)])
    return 0.5 * float(squared_distances(points, centres)[np.arange(len(points)),
                                                             labels].sum())


def median_cpd(v: np.ndarray, groups: list[list[int]]) -> float:
    """Median CPD over all pairs of groups."""
    return float(np.median(pairwise_cpd(class_distributions(v, groups))))


def bench_size(k: int, m: int, repeats: int, tau: int) -> dict:
    """Time ICG and k-means-constrained on one problem size."""
    v = femnist_like(k, seed=k).astype(np.float64)
    icg_times, icg_obj, kmc_times, kmc_obj, icg_cpd, rnd_cpd = [], [], [], [], [], []
    bal_times, bal_cpd = [], []
    for rep in range(repeats):
        started = time.perf_counter()
        result = icg(v, m, np.random.default_rng(rep), max_iter=tau)
        icg_times.append(time.perf_counter() - started)
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
        started = time.perf_counter()
        kmc_labels = model.fit_predict(v[clustered])
        kmc_times.append(time.perf_counter() - started)
        kmc_obj.append(objective(v[clustered], kmc_labels))
    out = {
        "K": k, "M": m, "F": NUM_CLASSES, "tau": tau, "repeats": repeats,
        "icg_seconds_median": float(np.median(icg_times)),
        "icg_objective_median": float(np.median(icg_obj)),
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
            "kmc_objective_median": float(np.median(kmc_obj)),
            "speedup_vs_kmc": float(np.median(kmc_times)) / float(np.median(icg_times)),
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
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in pair.split(":")) for pair in args.sizes.split(",")]
    results = [bench_size(k, m, args.repeats if k < 5000 else max(1, args.repeats // 10),
                          args.tau) for k, m in sizes]
    print(json.dumps({"benchmark": "icg", "machine": platform.processor() or platform.machine(),
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
