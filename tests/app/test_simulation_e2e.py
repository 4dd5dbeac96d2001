"""End to end through Flower's simulation engine: `flwr run` and simulation.py.

The module's runs share one private local SuperLink (own FLWR_HOME and port, runtime
dependency installation off), stopped at the end. Ray's start-up costs ~20 s a run, so
the per-strategy checks share one ``flwr run`` of eight simulated nodes: the test app
``tests/scenarios`` calls the bundled app's ServerApp (``server_app.run``) once per
scenario, with the bundled ClientApp on the nodes; each scenario writes its own results
folder, as a ``flwr run`` of the bundled app does. The 1,000-node run, the failing run
and the experiment runner are runs of the bundled app itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import bundled_app, completed_scenario

import simulation
from fedgsp_flwr.app.results import is_complete, read_metrics
from fedgsp_flwr.tools.launcher import LocalSimulation, RunOutcome

pytestmark = pytest.mark.e2e

SCENARIO_APP = Path(__file__).resolve().parents[1] / "scenarios"
TINY = {"dataset": "synthetic", "partition": "natural", "min-available-nodes": 3,
        "batch-size": 16, "lr": 0.1}
NODES = 8
# Every scenario of the shared run: 8 nodes, 2 rounds, label-shift partitions (StoCFL's
# and FeSEM's checks need the latent groups; the others only need training to work).
SHARED = {"dataset": "synthetic", "partition": "shifted"}
RUN = {"batch-size": 16, "lr": 0.1, "min-available-nodes": NODES, "num-server-rounds": 2}
SCENARIOS: dict[str, dict[str, Any]] = {
    "e2e": {"strategy": "fedprox"},
    # resume-from: one more round, written into the same folder (after "e2e")
    "resumed": {"strategy": "fedprox", "num-server-rounds": 3, "resume-from": "e2e"},
    "gsp": {"strategy": "fedgsp", "fedgsp-kappa": 1.0},
    "hier": {"strategy": "hierfl", "hierfl-policy": "optimal", "hierfl-edges": 2,
             "hierfl-reach": 2, "hierfl-time-limit": 5.0, "hierfl-tau1": 2,
             "hierfl-tau2": 2},
    "sto": {"strategy": "stocfl", "stocfl-sketch-dim": 64, "stocfl-holdout-fraction": 0.25},
    "sem": {"strategy": "fesem", "fesem-k": 2},
    "semi": {"strategy": "semifl", "semifl-cluster-size": 4},
}


class Scenarios:
    """The shared run: its outcome, and each scenario's results folder and log lines."""

    def __init__(self, outcome: RunOutcome, out: Path) -> None:
        self.outcome, self.out = outcome, out

    def row(self, name: str) -> dict[str, Any]:
        """The scenario's row, once the run and the scenario completed."""
        assert self.outcome.ok, self.outcome.cause()
        return completed_scenario(self.out, name)

    def folder(self, name: str) -> Path:
        """The scenario's results folder."""
        return Path(self.row(name)["folder"])

    def metrics(self, name: str) -> dict[str, Any]:
        """The scenario's metrics as it left them (a later scenario may resume it)."""
        return self.row(name)["metrics"]

    def lines(self, name: str) -> str:
        """The ``flwr`` log lines of the scenario, one per line."""
        return "\n".join(self.row(name)["lines"])


@pytest.fixture(scope="module")
def scenarios(local_simulation: LocalSimulation,
              tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    """Run every scenario of SCENARIOS in one ``flwr run`` of eight simulated nodes."""
    folder = tmp_path_factory.mktemp("scenarios")
    app = folder / "app"
    shutil.copytree(SCENARIO_APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    results = folder / "results"
    listed = [{"name": name, "run-config": {
        **RUN, **config, "results-dir": str(results), "run-name": name,
        **({"resume-from": str(results / config["resume-from"])}
           if "resume-from" in config else {})}} for name, config in SCENARIOS.items()]
    (folder / "scenarios.json").write_text(json.dumps(listed))
    outcome = local_simulation.run(
        {**SHARED, "scenarios-file": str(folder / "scenarios.json"),
         "out-dir": str(folder / "out")},
        num_supernodes=NODES, log_path=folder / "run.log", timeout=900, app_dir=app)
    print(f"scenarios: {outcome.status} in {outcome.wall_time:.0f} s")
    return Scenarios(outcome, folder / "out")


def test_flwr_run_trains_and_writes_the_results_folder(scenarios: Scenarios) -> None:
    folder = scenarios.folder("e2e")
    metrics = scenarios.metrics("e2e")  # as the first run left them
    assert metrics["status"] == "complete"
    rounds = metrics["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[2]["train-replies"] == NODES and rounds[2]["train-rejected"] == 0
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]
    config = json.loads((folder / "config.json").read_text())
    assert config["run-config"]["strategy"] == "fedprox" and config["num-nodes"] == NODES
    assert (folder / "accuracy.png").exists() and (folder / "metrics.csv").exists()
    assert "Round 2/2: central accuracy" in scenarios.lines("e2e")
    # resume-from: one more round, written into the same folder
    assert scenarios.folder("resumed") == folder
    assert "Resuming after round 2 of 3" in scenarios.lines("resumed")
    metrics = read_metrics(folder)
    assert [r["round"] for r in metrics["rounds"]] == [0, 1, 2, 3]
    assert metrics["rounds"][:3] == rounds and metrics["status"] == "complete"


def test_fedgsp_relays_through_the_simulation_engine(scenarios: Scenarios) -> None:
    rounds = read_metrics(scenarios.folder("gsp"))["rounds"]
    # log growth with beta=1, alpha=2: one chain of 8, then 2 groups of 4
    assert [(r["num-groups"], r["hops"], r["skipped-nodes"]) for r in rounds[1:]] == [
        (1, NODES, 0), (2, NODES, 0)]
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]
    assert rounds[2]["bytes-sent"] > 0 and "cpd-median" in rounds[2]


def test_hierfl_trains_users_edges_and_cloud_through_the_engine(scenarios: Scenarios) -> None:
    rounds = read_metrics(scenarios.folder("hier"))["rounds"]
    for r in rounds[1:]:
        assert r["user-edge-messages"] == 2 * NODES and r["train-replies"] == 2 * NODES
        assert r["assignment-objective"] <= r["original-objective"] + 1e-12
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]
    assert f"HierFL: optimal assignment of {NODES} users to 2 edges" in scenarios.lines("hier")


def test_stocfl_clusters_and_trains_through_the_engine(scenarios: Scenarios) -> None:
    folder = scenarios.folder("sto")
    rounds = read_metrics(folder)["rounds"]
    # 6 trained nodes in 4 label-shift groups, found exactly; 2 held out, scored by
    # read-only inference (never clustered: only training-sampled nodes are)
    assert rounds[1]["clustered-clients"] == 6 and rounds[1]["ari"] == 1.0
    assert rounds[2]["eval-new-clients"] == 2 and rounds[2]["eval-trained-clients"] == 6
    assert rounds[2]["eval-acc"] > rounds[2]["eval-acc-global"]
    # the held-out nodes on their inferred cluster's model, not on the global model
    # (2026-12-03: 0.83 against 0.0)
    assert rounds[2]["eval-acc-new"] > rounds[2]["eval-acc-global-new"] + 0.2
    state = json.loads((folder / "clusters.json").read_text())
    assert sum(len(m) for m in state["clusters"].values()) == 6
    assert len(state["inferred"]) == 2
    assert (folder / "cluster-models.npz").exists()


def test_fesem_fits_centres_through_the_engine(scenarios: Scenarios) -> None:
    folder = scenarios.folder("sem")
    rounds = read_metrics(folder)["rounds"]
    assert rounds[1]["new-clients"] == NODES and sum(rounds[2]["cluster-sizes"]) == NODES
    assert "ari" in rounds[2] and rounds[2]["multicenter-loss"] >= 0
    assert rounds[2]["eval-replies"] == NODES and 0 <= rounds[2]["eval-acc"] <= 1
    state = json.loads((folder / "centres.json").read_text())
    assert set(state["assignment"]) == {f"partition-{p}" for p in range(NODES)}
    assert (folder / "centres.npz").exists()


def test_semifl_trains_static_clusters_through_the_engine(scenarios: Scenarios) -> None:
    rounds = read_metrics(scenarios.folder("semi"))["rounds"]
    assert [(r["uploads"], r["hops"], r["cluster-sizes"]) for r in rounds[1:]] == [
        (2, NODES, [4, 4]), (2, NODES, [4, 4])]
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]


def test_a_thousand_nodes_train_a_round_of_fedgsp(local_simulation: LocalSimulation,
                                                  tmp_path: Path) -> None:
    """Scale: 1,000 simulated nodes grouped (100 groups of 10), 2% sampled (2 groups),
    2% evaluated.

    One run (FedGSP: 1,000 histogram queries, ICG, 20 relay hops, 20 evaluations);
    FedAvg on 1,000 nodes is measured in benchmarks (README "1,000 simulated nodes").
    """
    outcome = local_simulation.run(
        {"dataset": "synthetic", "model": "logistic", "num-server-rounds": 1,
         "fraction-train": 0.02, "fraction-evaluate": 0.02, "min-available-nodes": 1000,
         "results-dir": str(tmp_path), "strategy": "fedgsp", "fedgsp-growth-beta": 100,
         "fedgsp-kappa": 0.02, "run-name": "fedgsp"},
        num_supernodes=1000, log_path=tmp_path / "fedgsp.log", timeout=900)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    assert json.loads((tmp_path / "fedgsp" / "config.json").read_text())["num-nodes"] == 1000
    fedgsp = read_metrics(tmp_path / "fedgsp")["rounds"][1]
    assert (fedgsp["num-groups"], fedgsp["hops"], fedgsp["skipped-nodes"]) == (100, 20, 0)
    assert fedgsp["eval-replies"] == 20 and fedgsp["eval-rejected"] == 0


def test_a_failing_run_is_reported_not_hidden(local_simulation: LocalSimulation,
                                              tmp_path: Path) -> None:
    # 'hybrid' partitions need the hybrid dataset: the ServerApp raises at start.
    outcome = local_simulation.run(
        {**TINY, "partition": "hybrid", "results-dir": str(tmp_path)}, num_supernodes=3,
        log_path=tmp_path / "fail.log", timeout=600)
    assert not outcome.ok and outcome.status == "finished:failed"
    assert "needs dataset 'hybrid'" in outcome.log_path.read_text()


def test_experiment_runner_compares_and_resumes(tmp_path: Path, monkeypatch) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(
        'name = "tiny"\nnum-supernodes = 3\nseeds = [1]\ntarget-accuracy = 0.3\n'
        "[run-config]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items())
        + "num-server-rounds = 1\n"
        '[strategies.fedavg]\nstrategy = "fedavg"\n'
        '[strategies.central]\nstrategy = "centralized"\n'
    )
    # One flwr run beside the centralized baseline: the runner's handling of several
    # federated strategies is tested with a stand-in launcher (tests/tools/test_runner.py).
    # The bundled app from a copy: its FAB without walking the clone's .venv (helpers).
    monkeypatch.setattr(simulation, "APP_DIR", bundled_app(tmp_path))
    root = simulation.run_experiment(simulation.Experiment.load(spec), tmp_path / "results")
    for label in ("fedavg", "central"):
        assert is_complete(root / "runs" / f"{label}-seed1")
        assert (root / "logs" / f"{label}-seed1.log").exists()
    summary = json.loads((root / "summary.json").read_text())
    assert [row["strategy"] for row in summary] == ["fedavg", "central"]
    central = read_metrics(root / "runs" / "central-seed1")
    assert central["rounds"][1]["central-acc"] > central["rounds"][0]["central-acc"]
    divergence = json.loads((root / "divergence.json").read_text())
    assert {(r["strategy"], r["reference"]) for r in divergence} == {("fedavg", "central")}
    assert all(r["red"] > 0 and -1 <= r["acs"] <= 1 for r in divergence)
    assert (root / "divergence.png").read_bytes()[:4] == b"\x89PNG"
    assert all(row["seeds"] == 1 and 0 < row["final-acc-mean"] <= 1 for row in summary)
    assert (root / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    assert (root / "experiment.toml").read_text() == spec.read_text()

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a complete run was started again")

    monkeypatch.setattr(LocalSimulation, "run", must_not_run)
    simulation.run_experiment(simulation.Experiment.load(spec), tmp_path / "results")


def test_bad_experiment_files_fail_before_any_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[strategies.a]\nstrategy = "fedsgd"\n')
    with pytest.raises(simulation.ConfigError, match="'strategy' must be one of"):
        simulation.Experiment.load(bad)
    bad.write_text('name = "x"\n[run-config]\nlr = -1\n[strategies.a]\nstrategy = "fedavg"\n')
    with pytest.raises(simulation.ConfigError, match="'lr' must be > 0"):
        simulation.Experiment.load(bad)
    bad.write_text('name = "x"\n[strategies.a]\nstrategy = "centralized"\nlr = -1\n')
    with pytest.raises(simulation.ConfigError, match="'lr' must be > 0"):
        simulation.Experiment.load(bad)  # the baseline's settings are checked too
    bad.write_text('name = "x"\nround = 3\n[strategies.a]\nstrategy = "fedavg"\n')
    with pytest.raises(simulation.ConfigError, match="unknown experiment field"):
        simulation.Experiment.load(bad)
