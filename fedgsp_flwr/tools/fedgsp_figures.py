"""FedGSP's Fig. 4, 5 and 6 from experiment results folders (``simulation.py``'s).

    python -m fedgsp_flwr.tools.fedgsp_figures --growth results/fedgsp-growth-grid \\
        --kappa results/fedgsp-kappa --cost results/fedgsp-table1-mnist \\
        --out docs/results --figures docs/figures

- ``--growth``: final central loss per growth function x (alpha, beta), one heatmap per
  function (the paper's Fig. 4), with each cell's mean longest chain (sequential hops a
  round), client trainings, wall time and cost-model time, and the final loss over the
  mean longest chain: ``fedgsp-growth-grid.{csv,json,png}``.
- ``--kappa``: final accuracy and loss, rounds to ``--kappa-target`` accuracy (0.95), and
  the cost model's computation and communication time (Eq. 15-16, summed over the run,
  normalised by the largest) beside the measured training bytes, per group sampling
  rate kappa (Fig. 5): ``fedgsp-kappa.{csv,json,png}``.
- ``--cost``: the cost model's time and traffic and the measured training bytes until
  the experiment's target accuracy and until its reference strategy's final accuracy,
  per strategy (Fig. 6, from ``summary.json``; run ``simulation.py --summarize``
  first): ``fedgsp-cost-to-target.{csv,json,png}``.

Values are means over the complete seeds of each label (a run's ``metrics.json`` with
status ``complete``); a label's settings are read from the folder's
``experiment.toml``.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..app.results import (
    mean_if_every,
    read_metrics,
    rounds_to,
    rows_to_csv,
    series,
    write_atomic,
)


def label_settings(folder: Path) -> dict[str, dict[str, Any]]:
    """Each strategy label's run config (the shared one with the label's overrides).

    Raises
    ------
    FileNotFoundError
        If the folder has no ``experiment.toml``.
    """
    spec = tomllib.loads((folder / "experiment.toml").read_text())
    shared = spec.get("run-config", {})
    return {label: {**shared, **overrides} for label, overrides in spec["strategies"].items()}


def complete_runs(folder: Path, label: str) -> list[dict[str, Any]]:
    """The metrics of every complete run of a label (any seed)."""
    runs = sorted((folder / "runs").glob(f"{label}-seed*"))
    found = [read_metrics(run) for run in runs]
    return [m for m in found if m and m.get("status") == "complete"]


def final_value(metrics: Mapping[str, Any], key: str) -> float | None:
    """The last round's value of a per-round metric."""
    values = series(metrics, key)[1]
    return values[-1] if values else None


def mean_of(values: Sequence[float | None]) -> float | None:
    """Mean of the values that exist."""
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def run_total(metrics: Mapping[str, Any], keys: Sequence[str]) -> float:
    """Sum over the run's rounds of the given per-round metrics (missing ones count 0)."""
    return float(sum(r.get(k) or 0.0 for r in metrics["rounds"] for k in keys))


def mean_longest_chain(metrics: Mapping[str, Any]) -> float | None:
    """Mean over the training rounds of the longest group chain (sequential hops)."""
    chains = series(metrics, "longest-chain")[1]
    return float(np.mean(chains)) if chains else None


def growth_rows(folder: Path) -> list[dict[str, Any]]:
    """One row per label: growth function, alpha, beta, final loss and accuracy, and what
    the schedule cost: mean longest chain, client trainings (hops), wall time of the
    rounds and the cost model's time (Eq. 15 + 16), each summed over the run.
    """
    rows = []
    for label, cfg in label_settings(folder).items():
        runs = complete_runs(folder, label)
        if not runs:
            continue
        rows.append({
            "label": label,
            "growth": cfg.get("fedgsp-growth"),
            "alpha": float(cfg["fedgsp-growth-alpha"]),
            "beta": int(cfg["fedgsp-growth-beta"]),
            "seeds": len(runs),
            "final-loss": mean_of([final_value(m, "central-loss") for m in runs]),
            "final-acc": mean_of([final_value(m, "central-acc") for m in runs]),
            "mean-longest-chain": mean_of([mean_longest_chain(m) for m in runs]),
            "hops": mean_of([run_total(m, ("hops",)) for m in runs]),
            "round-time-s": mean_of([run_total(m, ("round-time",)) for m in runs]),
            "cost-time-s": mean_of([run_total(m, ("cost-comp-s", "cost-comm-s"))
                                    for m in runs]),
        })
    return rows


def kappa_rows(folder: Path, target: float = 0.95) -> list[dict[str, Any]]:
    """One row per label: kappa, final accuracy and loss, the first round whose central
    accuracy reaches ``target`` (mean over the seeds, ``None`` unless every seed reaches
    it, as the runner's summary), the cost model's computation and communication seconds
    over the run (absolute and normalised by the largest), the bytes the run moved in
    training (normalised likewise) and its wall time of rounds.
    """
    rows: list[dict[str, Any]] = []
    for label, cfg in label_settings(folder).items():
        runs = complete_runs(folder, label)
        if not runs:
            continue
        comp = [run_total(m, ("cost-comp-s",)) for m in runs]
        comm = [run_total(m, ("cost-comm-s",)) for m in runs]
        reached = [rounds_to(m, "central-acc", target) for m in runs]
        rows.append({"label": label, "kappa": float(cfg["fedgsp-kappa"]),
                     "seeds": len(runs),
                     "final-acc": mean_of([final_value(m, "central-acc") for m in runs]),
                     "final-loss": mean_of([final_value(m, "central-loss") for m in runs]),
                     "target": target,
                     "rounds-to-target": mean_if_every(reached),
                     "seeds-reaching-target": sum(r is not None for r in reached),
                     "comp-s": float(np.mean(comp)), "comm-s": float(np.mean(comm)),
                     "train-bytes": mean_of([run_total(m, ("bytes-sent", "bytes-received"))
                                             for m in runs]),
                     "round-time-s": mean_of([run_total(m, ("round-time",)) for m in runs])})
    for key in ("comp-s", "comm-s", "train-bytes"):
        top = max((row[key] for row in rows), default=0.0)
        for row in rows:
            row[f"{key}-normalised"] = row[key] / top if top > 0 else None
    return sorted(rows, key=lambda row: row["kappa"])


COST_KEYS = ("rounds-to", "cost-time-to", "cost-traffic-to", "train-bytes-to", "seeds-reaching")


def cost_rows(folder: Path) -> list[dict[str, Any]]:
    """The summary's cost to each target per strategy (Fig. 6): the experiment's
    ``target-accuracy`` (``target``) and its ``reference`` strategy's final accuracy
    (``reference``), each with its accuracy, rounds, cost-model time and traffic, measured
    bytes and the seeds that reached it (``None`` where not every seed did)."""
    spec = tomllib.loads((folder / "experiment.toml").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    accuracy = {row["strategy"]: row.get("final-acc-mean") for row in summary}
    targets = {"target": spec.get("target-accuracy"),
               "reference": accuracy.get(spec.get("reference"))}
    if all(value is None for value in targets.values()):
        raise ValueError(f"{folder}: no target to cost: its experiment.toml sets no "
                         "target-accuracy, and no reference strategy with complete runs")
    rows = []
    for row in summary:
        out: dict[str, Any] = {"strategy": row["strategy"], "seeds": row.get("seeds")}
        for name, value in targets.items():
            if value is None:
                continue
            out[f"{name}-accuracy"] = value
            out.update({f"{key}-{name}": row.get(f"{key}-{name}") for key in COST_KEYS})
        rows.append(out)
    return rows


def write_table(rows: list[dict[str, Any]], out: Path, name: str) -> None:
    """``<name>.csv`` and ``<name>.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.json", json.dumps(rows, indent=2))
    write_atomic(out / f"{name}.csv", rows_to_csv(rows))


def plot_growth(rows: list[dict[str, Any]], path: Path) -> None:
    """One heatmap of the final loss per growth function (beta rows, alpha columns), and
    the final loss of every cell over its mean longest chain.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    functions = [f for f in ("linear", "log", "exp") if any(r["growth"] == f for r in rows)]
    alphas = sorted({r["alpha"] for r in rows})
    betas = sorted({r["beta"] for r in rows})
    losses = [r["final-loss"] for r in rows if r["final-loss"] is not None]
    fig, axes = plt.subplots(1, len(functions) + 1, figsize=(4.2 * (len(functions) + 1), 3.6),
                             squeeze=False)
    for ax, function in zip(axes[0][:-1], functions, strict=True):
        grid = np.full((len(betas), len(alphas)), np.nan)
        for r in rows:
            if r["growth"] == function and r["final-loss"] is not None:
                grid[betas.index(r["beta"]), alphas.index(r["alpha"])] = r["final-loss"]
        image = ax.imshow(grid, cmap="viridis_r", vmin=min(losses), vmax=max(losses))
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", color="white")
        ax.set(xticks=range(len(alphas)), xticklabels=[f"{a:g}" for a in alphas],
               yticks=range(len(betas)), yticklabels=[str(b) for b in betas],
               xlabel="alpha", ylabel="beta", title=f"{function} growth: final loss")
        fig.colorbar(image, ax=ax, shrink=0.8)
    chains = axes[0][-1]
    for function in functions:
        cells = [r for r in rows if r["growth"] == function and r["final-loss"] is not None
                 and r["mean-longest-chain"] is not None]
        chains.scatter([r["mean-longest-chain"] for r in cells],
                       [r["final-loss"] for r in cells], label=function)
    chains.set(xscale="log", xlabel="mean longest chain (hops a round)",
               ylabel="final loss", title="final loss over the chain length")
    chains.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    chains.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    chains.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    chains.legend()
    chains.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_kappa(rows: list[dict[str, Any]], path: Path) -> None:
    """Final accuracy, rounds to the target and normalised computation / communication
    time (with the measured bytes beside the latter) over kappa.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kappas = [f"{r['kappa']:g}" for r in rows]
    target = rows[0]["target"] if rows else None
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, key, title in ((axes[0], "final-acc", "final accuracy"),
                           (axes[1], "rounds-to-target", f"rounds to {target:.0%} accuracy"
                            if target is not None else "rounds to target"),
                           (axes[2], "comp-s-normalised", "computation time (normalised)"),
                           (axes[3], "comm-s-normalised", "communication time (normalised)")):
        ax.bar(kappas, [np.nan if r[key] is None else r[key] for r in rows],
               label="cost model" if key.endswith("-normalised") else None)
        ax.set(xlabel="kappa", title=title)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylim(min((r["final-acc"] or 0.0 for r in rows), default=0.0) - 0.02, 1.0)
    axes[3].plot(kappas, [np.nan if r["train-bytes-normalised"] is None
                          else r["train-bytes-normalised"] for r in rows], "o-",
                 color="tab:orange", label="measured bytes")
    axes[3].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_cost(rows: list[dict[str, Any]], path: Path) -> None:
    """Cost-model time, cost-model traffic and measured bytes to each target (a row of
    panels per target; a strategy that did not reach it is marked, not drawn as 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = [name for name in ("target", "reference") if f"{name}-accuracy" in rows[0]]
    names = [r["strategy"] for r in rows]
    fig, axes = plt.subplots(len(targets), 3, figsize=(13, 3.8 * len(targets)),
                             squeeze=False)
    for line, name in zip(axes, targets, strict=True):
        label = f"to {rows[0][f'{name}-accuracy']:.1%}" + (
            "\n(the reference's final)" if name == "reference" else "")
        line[0].set_ylabel(label)
        for ax, key, scale, title in (
                (line[0], "cost-time-to", 1 / 60, "cost model: time (min)"),
                (line[1], "cost-traffic-to", 1e-9, "cost model: traffic (GB)"),
                (line[2], "train-bytes-to", 1e-9, "measured: bytes (GB)")):
            values = [r[f"{key}-{name}"] for r in rows]
            ax.bar(names, [0.0 if v is None else v * scale for v in values])
            for x, v in enumerate(values):
                if v is None:
                    ax.annotate("not reached", (x, 0), ha="center", va="bottom",
                                rotation=90, fontsize=7)  # upright: neighbours overlap
            ax.set(title=title)
            ax.tick_params(axis="x", rotation=45)
            for tick in ax.get_xticklabels():  # long labels end under their bar
                tick.set_horizontalalignment("right")
            ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--growth", type=Path, help="results folder of the growth grid")
    parser.add_argument("--kappa", type=Path, help="results folder of the kappa sweep")
    parser.add_argument("--kappa-target", type=float, default=0.95,
                        help="accuracy whose first round the kappa table reports (0.95)")
    parser.add_argument("--cost", type=Path, help="results folder with a target accuracy")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--figures", type=Path, default=Path("docs/figures"))
    args = parser.parse_args(argv)
    if not 0.0 < args.kappa_target <= 1.0:
        parser.error(f"--kappa-target {args.kappa_target} is not an accuracy in (0, 1]")
    args.figures.mkdir(parents=True, exist_ok=True)
    for folder, rows_of, plot, name in (
            (args.growth, growth_rows, plot_growth, "fedgsp-growth-grid"),
            (args.kappa, lambda f: kappa_rows(f, args.kappa_target), plot_kappa,
             "fedgsp-kappa"),
            (args.cost, cost_rows, plot_cost, "fedgsp-cost-to-target")):
        if folder is None:
            continue
        try:
            rows = rows_of(folder)
        except ValueError as err:
            parser.error(str(err))
        if not rows:
            parser.error(f"{folder}: no complete runs")
        write_table(rows, args.out, name)
        plot(rows, args.figures / f"{name}.png")
        print(f"{name}: {len(rows)} rows -> {args.out / name}.csv, "
              f"{args.figures / name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
