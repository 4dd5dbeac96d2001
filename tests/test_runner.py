"""The experiment runner's summary, on hand-written results folders (no simulation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simulation


def write_run(root: Path, label: str, seed: int, accs: list[float],
              traffic: int | None) -> None:
    folder = root / "runs" / simulation.run_name(label, seed)
    folder.mkdir(parents=True)
    rounds = [{"round": r, "central-acc": a} for r, a in enumerate(accs)]
    if traffic is not None:
        for entry in rounds[1:]:
            entry.update({"bytes-sent": traffic, "bytes-received": 2 * traffic})
    folder.joinpath("metrics.json").write_text(json.dumps({
        "status": "complete", "rounds": rounds,
        "summary": {"final-central-acc": accs[-1], "wall-time": 10.0}}))


def experiment(tmp_path: Path, extra: str) -> simulation.Experiment:
    spec = tmp_path / "e.toml"
    spec.write_text(f'name = "e"\nseeds = [0, 1]\n{extra}\n'
                    '[strategies.base]\nstrategy = "fedavg"\n'
                    '[strategies.fast]\nstrategy = "fedgsp"\n')
    return simulation.Experiment.load(spec)


def test_summary_reports_rounds_to_the_reference_accuracy_and_bytes(tmp_path: Path) -> None:
    exp = experiment(tmp_path, 'reference = "base"\ntarget-accuracy = 0.5')
    write_run(tmp_path, "base", 0, [0.1, 0.4, 0.6, 0.7], traffic=None)
    write_run(tmp_path, "base", 1, [0.1, 0.5, 0.6, 0.5], traffic=None)
    write_run(tmp_path, "fast", 0, [0.1, 0.7, 0.8, 0.9], traffic=100)
    write_run(tmp_path, "fast", 1, [0.1, 0.5, 0.65, 0.8], traffic=100)
    rows = {row["strategy"]: row for row in simulation.summarize(exp, tmp_path)}
    # The reference is base's mean final accuracy, 0.6.
    assert rows["base"]["rounds-to-reference"] == pytest.approx(2.0)
    assert rows["fast"]["rounds-to-reference"] == pytest.approx(1.5)
    assert rows["fast"]["rounds-to-target"] == pytest.approx(1.0)
    assert rows["fast"]["train-bytes-mean"] == 3 * 300
    assert rows["base"]["train-bytes-mean"] is None
    assert rows["fast"]["final-acc-mean"] == pytest.approx(0.85)


def test_a_seed_that_never_reaches_the_reference_is_counted(tmp_path: Path) -> None:
    exp = experiment(tmp_path, 'reference = "base"')
    write_run(tmp_path, "base", 0, [0.1, 0.9], traffic=None)
    write_run(tmp_path, "base", 1, [0.1, 0.9], traffic=None)
    write_run(tmp_path, "fast", 0, [0.1, 0.95], traffic=None)
    write_run(tmp_path, "fast", 1, [0.1, 0.3], traffic=None)
    fast = simulation.summarize(exp, tmp_path)[1]
    assert fast["rounds-to-reference"] is None and fast["seeds-reaching-reference"] == 1


def test_the_reference_must_be_a_compared_strategy(tmp_path: Path) -> None:
    with pytest.raises(simulation.ConfigError, match="reference 'fedprox'"):
        experiment(tmp_path, 'reference = "fedprox"')
