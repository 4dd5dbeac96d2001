"""ICG grouping quality when clients report Laplace-noised class histograms.

    python benchmarks/histogram_noise.py [--clients 100] [--groups 10] [--repeats 5]
        [--out results/bench/histogram-noise.json]

Clients hold MNIST-sized pathological shards (``--classes-per-client`` classes of 300
examples each, 10 classes) or a Dirichlet(0.5) mix of 600 examples. Each reports its
histogram through :func:`fedgsp_flwr.clients.privacy.laplace_histogram` at budget epsilon; ICG
(balanced draw, the app's default) groups the noisy histograms; the groups are scored
on the **true** histograms by the median CPD between groups (lower: groups more alike,
the FedGSP goal). Random grouping and ICG on exact histograms are the two ends. Prints
JSON and, with ``--out``, writes it and a PNG beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.clients.privacy import laplace_histogram
from fedgsp_flwr.core.grouping import (
    class_distributions,
    icg,
    pairwise_cpd,
    random_groups,
)

CLASSES = 10
EPSILONS = [10.0, 1.0, 0.1, 0.03, 0.01]


def pathological(k: int, per_client: int, rng: np.random.Generator) -> np.ndarray:
    """(k, 10) counts: ``per_client`` random classes of 300 examples each."""
    counts = np.zeros((k, CLASSES), dtype=np.int64)
    for row in counts:
        row[rng.choice(CLASSES, per_client, replace=False)] = 300
    return counts


def dirichlet(k: int, rng: np.random.Generator, alpha: float = 0.5) -> np.ndarray:
    """(k, 10) counts of 600 examples drawn from Dirichlet(alpha) class proportions."""
    return np.stack([rng.multinomial(600, rng.dirichlet(np.full(CLASSES, alpha)))
                     for _ in range(k)])


def median_cpd(true: np.ndarray, groups: list[list[int]]) -> float:
    """Median CPD between the groups' true class distributions."""
    return float(np.median(pairwise_cpd(class_distributions(true, groups))))


def score(true: np.ndarray, m: int, epsilon: float | None, seed: int) -> float:
    """Group (noisy) histograms with ICG; score on the true ones."""
    rng = np.random.default_rng(seed)
    reported = true if epsilon is None else np.stack(
        [laplace_histogram(row, epsilon, rng) for row in true])
    result = icg(reported.astype(np.float64), m, rng, client_ids=list(range(len(true))))
    return median_cpd(true, result.groups)


def setting(name: str, make: Any, k: int, m: int, repeats: int) -> dict[str, Any]:
    """Median CPD by epsilon (mean and std over repeats) for one kind of partition."""
    rows: dict[str, list[float]] = {"exact": [], "random": []}
    rows.update({f"{e:g}": [] for e in EPSILONS})
    for rep in range(repeats):
        true = make(np.random.default_rng(1000 + rep))
        rows["exact"].append(score(true, m, None, rep))
        rows["random"].append(median_cpd(true, random_groups(
            list(range(k)), m, np.random.default_rng(rep))))
        for e in EPSILONS:
            rows[f"{e:g}"].append(score(true, m, e, rep))
    return {"partition": name, "median-cpd": {
        key: {"mean": float(np.mean(v)), "std": float(np.std(v))} for key, v in rows.items()}}


def plot(report: dict[str, Any], path: Path) -> None:
    """Median CPD against epsilon, with the exact and random levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(report["settings"]), figsize=(5 * len(report["settings"]), 4))
    for ax, entry in zip(np.atleast_1d(axes), report["settings"], strict=True):
        cpd = entry["median-cpd"]
        means = [cpd[f"{e:g}"]["mean"] for e in EPSILONS]
        stds = [cpd[f"{e:g}"]["std"] for e in EPSILONS]
        ax.errorbar(EPSILONS, means, yerr=stds, marker="o", label="ICG on noisy histograms")
        ax.axhline(cpd["exact"]["mean"], color="tab:green", ls="--", label="ICG, exact")
        ax.axhline(cpd["random"]["mean"], color="tab:red", ls=":", label="random groups")
        ax.set(xscale="log", xlabel="epsilon (Laplace noise 1/epsilon per count)",
               ylabel="median CPD between groups (true labels)", title=entry["partition"])
        ax.invert_xaxis()
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{report['clients']} clients, {report['groups']} groups")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    """Run the settings; print (and write) the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--classes-per-client", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.groups <= args.clients or args.repeats < 1:
        parser.error("need 1 <= --groups <= --clients and --repeats >= 1")
    k, m = args.clients, args.groups
    report: dict[str, Any] = {"clients": k, "groups": m, "repeats": args.repeats,
                              "epsilons": EPSILONS, "settings": [
        setting(f"pathological, {args.classes_per_client} classes of 300",
                lambda rng: pathological(k, args.classes_per_client, rng), k, m,
                args.repeats),
        setting("Dirichlet(0.5), 600 examples", lambda rng: dirichlet(k, rng), k, m,
                args.repeats),
    ]}
    emit_json(report, args.out)
    if args.out is not None:
        plot(report, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
