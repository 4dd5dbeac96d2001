"""Results folders: JSON, CSV, config and plot written atomically each round."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from fedgsp_flwr.app.results import RunRecorder, is_complete, read_metrics


def test_recorder_keeps_the_folder_current(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    recorder = RunRecorder(folder, {"run-config": {"lr": 0.1}})
    assert json.loads((folder / "config.json").read_text()) == {"run-config": {"lr": 0.1}}
    recorder.add_round({"round": 0, "central-acc": np.float32(0.1), "central-loss": 2.3})
    assert read_metrics(folder)["status"] == "running" and not is_complete(folder)
    recorder.add_round({"round": 1, "central-acc": 0.5, "central-loss": 1.2, "x": 3})
    recorder.finish({"final-central-acc": 0.5}, {"w": np.ones(3)})
    metrics = read_metrics(folder)
    assert is_complete(folder) and metrics["summary"]["final-central-acc"] == 0.5
    rows = list(csv.DictReader((folder / "metrics.csv").open()))
    assert [r["round"] for r in rows] == ["0", "1"] and rows[1]["x"] == "3"
    assert (folder / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    np.testing.assert_array_equal(np.load(folder / "model.npz")["w"], np.ones(3))


def test_a_failed_run_says_why_and_keeps_its_rounds(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path / "run", {})
    recorder.add_round({"round": 0, "central-acc": 0.1})
    recorder.fail("TrainingStalled: FedGSP: no round trained in the last 3")
    metrics = read_metrics(tmp_path / "run")
    assert metrics["status"] == "failed" and not is_complete(tmp_path / "run")
    assert metrics["summary"]["error"].startswith("TrainingStalled: FedGSP")
    assert metrics["rounds"] == [{"round": 0, "central-acc": 0.1}]


def test_a_corrupt_or_missing_metrics_file_is_not_complete(tmp_path: Path) -> None:
    assert read_metrics(tmp_path) is None and not is_complete(tmp_path)
    (tmp_path / "metrics.json").write_text("{not json")
    assert not is_complete(tmp_path)
