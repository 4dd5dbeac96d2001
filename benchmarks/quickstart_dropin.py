"""Drop-in: Flower's quickstart-pytorch app with each strategy at default arguments.

    python benchmarks/quickstart_dropin.py [--rounds 3] [--train-examples 0] [--lr 0.01]
        [--out docs/results/quickstart-dropin]

Runs the app of ``tests/quickstart`` (Flower's quickstart-pytorch on offline MNIST:
10 nodes of 2 label shards, its own CNN and metric names, ``lr`` in the train config,
central ``evaluate_fn``) through ``flwr run`` in the simulation engine, once as it is and
once with our hooks registered; each run starts every strategy in turn with default
arguments. Writes ``<out>.json`` and ``<out>.csv`` (one row per app and strategy),
``<out>-table.csv`` (the rows of the table of docs/use-in-your-app.md, which its
generated table reads; ``--cells-only`` rewrites it from ``<out>.json``) and prints that
table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import quickstart_app

from fedgsp_flwr.app.results import rows_to_csv, write_atomic
from fedgsp_flwr.tools.launcher import LocalSimulation

STRATEGIES = "fedavg,fedprox,fedgsp,semifl,hierfl,stocfl,fesem"
SUFFIXES = ("-global", "-trained", "-new")  # StoCFL's breakdowns of each metric


def run(hooks: bool, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """One ``flwr run`` of the quickstart app over every strategy; its summary rows."""
    folder = work / ("hooks" if hooks else "plain")
    folder.mkdir()
    app = quickstart_app(folder, hooks)
    with LocalSimulation(app, folder / "flwr-home") as sim:
        outcome = sim.run({"strategies": args.strategies, "num-server-rounds": args.rounds,
                           "train-examples": args.train_examples, "lr": args.lr,
                           "out-dir": str(folder / "out")},
                          num_supernodes=args.nodes, log_path=folder / "run.log",
                          timeout=3 * 3600)
    if not outcome.ok:
        raise RuntimeError(f"the quickstart run failed: {outcome.cause()}")
    rows = json.loads((folder / "out" / "summary.json").read_text())
    log = (folder / "run.log").read_text()
    for row in rows:
        row["app"] = "with hooks" if hooks else "plain"
    rows[0]["failed-messages-in-run"] = log.count(
        "An exception was raised when processing a message")
    return rows


HEADER = ("app", "strategy", "rounds trained", "central accuracy, round 0 -> last",
          "`result.arrays`", "rejected replies", "missing-hook warnings",
          "client metrics reported", "group models", "reported")
COLUMNS = ("app", "strategy", "rounds", "accuracy", "arrays", "rejected", "warnings",
           "metrics", "groups", "reported")  # of <out>-table.csv, in HEADER's order


def cells(r: dict[str, Any]) -> dict[str, str]:
    """One row of the table of docs/use-in-your-app.md, as text by column."""
    accuracy, groups = r["central-accuracy"], r["group-models"]
    return dict(zip(COLUMNS, (
        r["app"], r["strategy"], str(r["trained-rounds"]),
        f"{accuracy[0]:.3f} -> {accuracy[-1]:.3f}",
        f"{r['final-tensors']} tensors, {r['final-bytes'] / 1000:.0f} KB", str(r["rejected"]),
        str(len(r["missing-hook-warnings"])),
        ", ".join(m for m in r["client-metrics"] if not m.endswith(SUFFIXES)),
        f"{len(groups)} ({', '.join(map(str, groups.values()))} nodes)" if groups else "-",
        ", ".join(f"{k} {v:.3g}" for k, v in r["reported"].items()) or "-"), strict=True))


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/use-in-your-app.md."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells(r).values()) + " |" for r in rows]
    return "\n".join(lines)


def write_cells(rows: list[dict[str, Any]], out: Path) -> None:
    """``<out>-table.csv``: the table's text by row and column, which the page's
    generated table reads."""
    write_atomic(out.with_name(f"{out.name}-table.csv"), rows_to_csv([cells(r) for r in rows]))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Central accuracy per round of every strategy, plain app and with hooks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = list(dict.fromkeys(r["app"] for r in rows))
    fig, axes = plt.subplots(1, len(apps), figsize=(5.5 * len(apps), 4), sharey=True,
                             squeeze=False)
    for ax, app in zip(axes[0], apps, strict=True):
        for r in (r for r in rows if r["app"] == app):
            ax.plot(range(len(r["central-accuracy"])), r["central-accuracy"], marker="o",
                    label=r["strategy"])
        ax.set(title=f"quickstart app, {app}", xlabel="round", ylabel="central accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default=STRATEGIES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--train-examples", type=int, default=0, help="0 = all 60,000")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/quickstart-dropin")
    parser.add_argument("--cells-only", action="store_true",
                        help="run nothing: write <out>-table.csv from <out>.json")
    args = parser.parse_args()
    if args.cells_only:
        write_cells(json.loads(args.out.with_suffix(".json").read_text()), args.out)
        return
    with tempfile.TemporaryDirectory(prefix="quickstart-dropin-") as work:
        rows = [row for hooks in (False, True) for row in run(hooks, args, Path(work))]
    for row in rows:
        row["config"] = {k: v for k, v in vars(args).items() if k != "out"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out.with_suffix(".json"), json.dumps(rows, indent=1))
    write_atomic(args.out.with_suffix(".csv"), rows_to_csv(rows))
    write_cells(rows, args.out)
    plot(rows, ROOT / "docs/figures" / f"{args.out.name}.png")
    print(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
