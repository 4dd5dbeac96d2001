"""FedGSP's Fig. 4-6 tables from hand-written results folders (no simulation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedgsp_flwr.tools import fedgsp_figures as figures


def write_folder(root: Path, spec: str, runs: dict[str, list[dict]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "experiment.toml").write_text(spec)
    for name, rounds in runs.items():
        folder = root / "runs" / name
        folder.mkdir(parents=True)
        folder.joinpath("metrics.json").write_text(json.dumps(
            {"status": "complete", "rounds": rounds, "summary": {"wall-time": 1.0}}))
    return root


def test_the_growth_grid_reports_each_cells_final_loss_and_plots(tmp_path: Path) -> None:
    spec = ('name = "g"\n[run-config]\nstrategy = "fedgsp"\n'
            '[strategies.log-a2-b3]\nfedgsp-growth = "log"\nfedgsp-growth-alpha = 2.0\n'
            'fedgsp-growth-beta = 3\n'
            '[strategies.exp-a1-b1]\nfedgsp-growth = "exp"\nfedgsp-growth-alpha = 1.0\n'
            'fedgsp-growth-beta = 1\n'
            '[strategies.missing]\nfedgsp-growth = "linear"\nfedgsp-growth-alpha = 1.0\n'
            'fedgsp-growth-beta = 1\n')
    folder = write_folder(tmp_path / "g", spec, {
        "log-a2-b3-seed0": [
            {"round": 0, "central-loss": 2.3, "round-time": 1.0},
            {"round": 1, "central-loss": 0.9, "longest-chain": 10, "hops": 30,
             "round-time": 4.0, "cost-comp-s": 1.0, "cost-comm-s": 2.0},
            {"round": 2, "central-loss": 0.4, "central-acc": 0.9, "longest-chain": 4,
             "hops": 20, "round-time": 3.0, "cost-comp-s": 1.0, "cost-comm-s": 2.0}],
        "log-a2-b3-seed1": [{"round": 1, "central-loss": 0.6, "central-acc": 0.8,
                             "longest-chain": 2, "hops": 10, "round-time": 2.0,
                             "cost-comp-s": 0.5, "cost-comm-s": 1.5}],
        "exp-a1-b1-seed0": [{"round": 1, "central-loss": 1.0, "central-acc": 0.5}],
    })
    rows = {r["label"]: r for r in figures.growth_rows(folder)}
    assert set(rows) == {"log-a2-b3", "exp-a1-b1"}  # no complete run: no row
    # chain: seed 0 averages its rounds (7), seed 1 has 2; totals sum over rounds
    assert rows["log-a2-b3"] == {"label": "log-a2-b3", "growth": "log", "alpha": 2.0,
                                 "beta": 3, "seeds": 2, "final-loss": pytest.approx(0.5),
                                 "final-acc": pytest.approx(0.85),
                                 "mean-longest-chain": pytest.approx(4.5),
                                 "hops": pytest.approx(30.0),
                                 "round-time-s": pytest.approx(5.0),
                                 "cost-time-s": pytest.approx(4.0)}
    assert rows["exp-a1-b1"]["mean-longest-chain"] is None  # not recorded: no value
    assert figures.main(["--growth", str(folder), "--out", str(tmp_path / "out"),
                         "--figures", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "fedgsp-growth-grid.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "out" / "fedgsp-growth-grid.json").read_text())
    assert len(saved) == 2


def test_kappa_rows_sum_the_cost_model_and_normalise_by_the_largest(tmp_path: Path) -> None:
    spec = ('name = "k"\n[run-config]\nstrategy = "fedgsp"\n'
            '[strategies.kappa-1]\nfedgsp-kappa = 1.0\n'
            '[strategies.kappa-0p1]\nfedgsp-kappa = 0.1\n')
    rounds = lambda comp, comm, sent: [
        {"round": r, "central-acc": 0.5 + r / 10, "central-loss": 1.0 / r,
         "cost-comp-s": comp, "cost-comm-s": comm, "bytes-sent": sent,
         "bytes-received": sent, "round-time": 2.0}
        for r in (1, 2, 3)]
    folder = write_folder(tmp_path / "k", spec, {"kappa-1-seed0": rounds(3.0, 10.0, 50),
                                                 "kappa-0p1-seed0": rounds(2.0, 1.0, 5)})
    rows = figures.kappa_rows(folder, target=0.7)
    assert [r["kappa"] for r in rows] == [0.1, 1.0]
    assert rows[0]["comm-s"] == 3.0 and rows[1]["comm-s"] == 30.0
    assert rows[0]["comm-s-normalised"] == pytest.approx(0.1)
    assert rows[0]["comp-s-normalised"] == pytest.approx(6 / 9)
    assert rows[0]["train-bytes"] == 30 and rows[0]["train-bytes-normalised"] == 0.1
    assert rows[1]["final-acc"] == pytest.approx(0.8)
    assert rows[1]["final-loss"] == pytest.approx(1 / 3)
    assert rows[1]["round-time-s"] == pytest.approx(6.0)
    # 0.6, 0.7, 0.8 over rounds 1-3: 0.7 first reached in round 2
    assert rows[1]["rounds-to-target"] == 2 and rows[1]["seeds-reaching-target"] == 1
    unreached = figures.kappa_rows(folder, target=0.9)
    assert unreached[0]["rounds-to-target"] is None
    assert unreached[0]["seeds-reaching-target"] == 0
    figures.plot_kappa(unreached, tmp_path / "kappa.png")  # no bar for the unreached
    assert (tmp_path / "kappa.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        figures.main(["--kappa", str(folder), "--kappa-target", "80"])


def test_kappa_rounds_to_target_need_every_seed_as_the_runners_summary(tmp_path: Path) -> None:
    spec = 'name = "k"\n[strategies.kappa-0p3]\nfedgsp-kappa = 0.3\n'
    curve = lambda accs: [{"round": r, "central-acc": a}
                          for r, a in enumerate(accs, start=1)]
    folder = write_folder(tmp_path / "k", spec, {"kappa-0p3-seed0": curve([0.5, 0.96]),
                                                 "kappa-0p3-seed1": curve([0.5, 0.9])})
    row, = figures.kappa_rows(folder, target=0.95)
    assert row["rounds-to-target"] is None  # not the mean of the one seed that reached
    assert row["seeds-reaching-target"] == 1
    row, = figures.kappa_rows(folder, target=0.5)
    assert row["rounds-to-target"] == 1.0 and row["seeds-reaching-target"] == 2


def test_cost_rows_give_both_targets_from_the_summary(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "experiment.toml").write_text(
        'name = "t"\nreference = "fedavg"\ntarget-accuracy = 0.8\n'
        '[strategies.fedavg]\n[strategies.fedprox]\n')
    (folder / "summary.json").write_text(json.dumps([
        {"strategy": "fedavg", "seeds": 1, "final-acc-mean": 0.88, "rounds-to-target": 40.0,
         "cost-time-to-target": 7200.0, "cost-traffic-to-target": 2e9,
         "train-bytes-to-target": 3e9, "seeds-reaching-target": 1,
         "rounds-to-reference": 60.0, "cost-time-to-reference": 9000.0,
         "cost-traffic-to-reference": 3e9, "train-bytes-to-reference": 4e9,
         "seeds-reaching-reference": 1},
        {"strategy": "fedprox", "seeds": 1, "final-acc-mean": 0.79,
         "rounds-to-target": None, "cost-time-to-target": None,
         "cost-traffic-to-target": None, "train-bytes-to-target": None,
         "seeds-reaching-target": 0}]))
    rows = figures.cost_rows(folder)
    assert [r["strategy"] for r in rows] == ["fedavg", "fedprox"]
    assert rows[0]["target-accuracy"] == 0.8 and rows[1]["reference-accuracy"] == 0.88
    assert rows[0]["train-bytes-to-reference"] == 4e9
    assert rows[0]["seeds-reaching-target"] == 1 and rows[1]["seeds-reaching-target"] == 0
    assert rows[1]["cost-time-to-target"] is None and rows[1]["rounds-to-reference"] is None
    figures.plot_cost(rows, tmp_path / "cost.png")  # unreached: marked, not drawn
    assert (tmp_path / "cost.png").stat().st_size > 1000


def test_cost_needs_a_target(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "experiment.toml").write_text('name = "t"\n[strategies.fedavg]\n')
    (folder / "summary.json").write_text(json.dumps([{"strategy": "fedavg", "seeds": 1}]))
    with pytest.raises(SystemExit):
        figures.main(["--cost", str(folder), "--out", str(tmp_path), "--figures",
                      str(tmp_path)])
    with pytest.raises(ValueError, match="no target to cost"):
        figures.cost_rows(folder)
