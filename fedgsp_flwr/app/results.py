"""Run results on disk: per-round metrics (JSON and CSV), the run config, a plot.

One folder per run::

    <results-dir>/<run-name>/
        config.json     the exact run config and the environment
        metrics.json    {"status": "running"|"complete"|"failed", "rounds": [...],
                         "summary": {} (a failed run's: {"error": "<why>"})}
        metrics.csv     one row per round
        accuracy.png    central test accuracy and loss per round
        model.npz       the final global model

Every file is written atomically (temporary file, then rename) after every round, so
an interrupted run keeps all the rounds it finished.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"
STATUS_FAILED = "failed"


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with tempfile.NamedTemporaryFile(mode, dir=path.parent, delete=False,
                                     suffix=path.suffix) as tmp:
        tmp.write(data)
    os.replace(tmp.name, path)


def read_metrics(folder: str | Path) -> dict[str, Any] | None:
    """Return a run folder's ``metrics.json`` content, or ``None`` if absent/corrupt."""
    try:
        return json.loads((Path(folder) / "metrics.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def series(metrics: Mapping[str, Any], key: str) -> tuple[list[int], list[float]]:
    """Rounds and values of one per-round metric of a run's ``metrics.json`` content
    (rounds without it are skipped).
    """
    rows = [r for r in metrics["rounds"] if isinstance(r.get(key), (int, float))]
    return [int(r["round"]) for r in rows], [float(r[key]) for r in rows]


def rounds_to(metrics: Mapping[str, Any], key: str, target: float | None) -> int | None:
    """First round (round 0 = initial model) whose ``key`` reaches ``target`` in a run's
    ``metrics.json`` content (``None``: never, or no target).
    """
    if target is None:
        return None
    rounds, values = series(metrics, key)
    return next((r for r, value in zip(rounds, values, strict=True) if value >= target),
                None)


def mean_if_every(values: Sequence[float | None]) -> float | None:
    """Mean over the seeds, or ``None`` unless every seed has a value: a mean of rounds
    to a target over only the seeds that reached it would flatter a strategy.
    """
    present = [v for v in values if v is not None]
    if not values or len(present) < len(values):
        return None
    return float(np.mean(present))


def is_complete(folder: str | Path) -> bool:
    """Whether a run folder holds a finished run."""
    metrics = read_metrics(folder)
    return metrics is not None and metrics.get("status") == STATUS_COMPLETE


class RunRecorder:
    """Collects per-round metrics of one run and keeps its folder up to date.

    Parameters
    ----------
    folder : str | Path
        The run's results folder (created if missing).
    config : Mapping[str, Any]
        The run configuration, written to ``config.json`` at once.
    rounds : Sequence[Mapping[str, Any]]
        Rounds recorded before (a resumed run's completed rounds).
    """

    def __init__(self, folder: str | Path, config: Mapping[str, Any],
                 rounds: Sequence[Mapping[str, Any]] = ()) -> None:
        self.folder = Path(folder)
        self.rounds: list[dict[str, Any]] = [dict(r) for r in rounds]
        self.summary: dict[str, Any] = {}
        write_atomic(self.folder / "config.json", json.dumps(dict(config), indent=2))

    def add_round(self, metrics: Mapping[str, Any]) -> None:
        """Append one round's metrics (must contain ``round``) and rewrite the files."""
        self.rounds.append({k: _plain(v) for k, v in metrics.items()})
        self._write(STATUS_RUNNING)

    def write_files(self, files: Mapping[str, bytes | str]) -> None:
        """Write extra files (a strategy's state) into the folder, each atomically."""
        for name, data in files.items():
            write_atomic(self.folder / name, data)

    def finish(self, summary: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Mark the run complete, save the final model and the plot."""
        self.summary = {k: _plain(v) for k, v in summary.items()}
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy stub quirk
        write_atomic(self.folder / "model.npz", buffer.getvalue())
        plot_rounds(self.rounds, self.folder / "accuracy.png", title=self.folder.name)
        self._write(STATUS_COMPLETE)

    def fail(self, cause: str) -> None:
        """Mark the run failed, with its cause (its rounds and checkpoint stay)."""
        self.summary = {"error": cause}
        self._write(STATUS_FAILED)

    def _write(self, status: str) -> None:
        payload = {"status": status, "rounds": self.rounds, "summary": self.summary}
        write_atomic(self.folder / "metrics.json", json.dumps(payload, indent=2))
        write_atomic(self.folder / "metrics.csv", rows_to_csv(self.rounds))


def _plain(value: Any) -> Any:
    """Convert numpy scalars and tuples to JSON-friendly Python values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def rows_to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """Render rows as CSV with the union of their keys as columns (first seen first)."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def plot_rounds(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> None:
    """Plot central accuracy and loss per round to a PNG file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r["round"] for r in rows if "central-acc" in r]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    ax_acc.plot(rounds, [r["central-acc"] for r in rows if "central-acc" in r], marker="o")
    ax_acc.set(xlabel="round", ylabel="test accuracy", title="central accuracy")
    ax_loss.plot(rounds, [r["central-loss"] for r in rows if "central-loss" in r],
                 marker="o", color="tab:red")
    ax_loss.set(xlabel="round", ylabel="test loss", title="central loss")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
