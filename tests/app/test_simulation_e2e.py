"""End to end through Flower's simulation engine: `flwr run` and simulation.py.

The module's runs share one private local SuperLink (own FLWR_HOME and port, runtime
dependency installation off), stopped at the end; each run takes ~20-30 s, mostly Ray
start-up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simulation
from fedgsp_flwr.app.results import is_complete, read_metrics
from fedgsp_flwr.tools.launcher import LocalSimulation

pytestmark = pytest.mark.e2e

APP_DIR = Path(__file__).resolve().parents[2]
TINY = {"dataset": "synthetic", "partition": "natural", "min-available-nodes": 3,
        "batch-size": 16, "lr": 0.1}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    """One private SuperLink for the module's runs (each run is its own ``flwr run``)."""
    with LocalSimulation(APP_DIR, tmp_path_factory.mktemp("flwr-home")) as local:
        yield local
    assert local.superlink_pids() == [], "the private SuperLink was not stopped"


def test_flwr_run_trains_and_writes_the_results_folder(sim: LocalSimulation,
                                                       tmp_path: Path) -> None:
    outcome = sim.run({**TINY, "num-server-rounds": 2, "strategy": "fedprox",
                       "results-dir": str(tmp_path / "results"), "run-name": "e2e"},
                      num_supernodes=3, log_path=tmp_path / "e2e.log", timeout=600)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    folder = tmp_path / "results" / "e2e"
    metrics = read_metrics(folder)
    assert metrics["status"] == "complete"
    rounds = metrics["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert rounds[2]["train-replies"] == 3 and rounds[2]["train-rejected"] == 0
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]
    config = json.loads((folder / "config.json").read_text())
    assert config["run-config"]["strategy"] == "fedprox" and config["num-nodes"] == 3
    assert (folder / "accuracy.png").exists() and (folder / "metrics.csv").exists()
    log = outcome.log_path.read_text()
    assert "Round 2/2: central accuracy" in log
    # resume-from through flwr run: one more round, written into the same folder
    outcome = sim.run({**TINY, "num-server-rounds": 3, "strategy": "fedprox",
                       "results-dir": str(tmp_path / "results"), "resume-from": str(folder)},
                      num_supernodes=3, log_path=tmp_path / "resumed.log", timeout=600)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    assert "Resuming after round 2 of 3" in outcome.log_path.read_text()
    metrics = read_metrics(folder)
    assert [r["round"] for r in metrics["rounds"]] == [0, 1, 2, 3]
    assert metrics["rounds"][:3] == rounds and metrics["status"] == "complete"


def test_fedgsp_relays_through_the_simulation_engine(sim: LocalSimulation,
                                                    tmp_path: Path) -> None:
    outcome = sim.run({**TINY, "num-server-rounds": 2, "strategy": "fedgsp", "fedgsp-kappa": 1.0,
                       "min-available-nodes": 4, "results-dir": str(tmp_path), "run-name": "gsp"},
                      num_supernodes=4, log_path=tmp_path / "gsp.log", timeout=600)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    rounds = read_metrics(tmp_path / "gsp")["rounds"]
    # log growth with beta=1, alpha=2: one chain of 4, then 2 groups of 2
    assert [(r["num-groups"], r["hops"], r["skipped-nodes"]) for r in rounds[1:]] == [
        (1, 4, 0), (2, 4, 0)]
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]
    assert rounds[2]["bytes-sent"] > 0 and "cpd-median" in rounds[2]


def test_hierfl_trains_users_edges_and_cloud_through_the_engine(sim: LocalSimulation,
                                                               tmp_path: Path) -> None:
    outcome = sim.run({**TINY, "num-server-rounds": 2, "strategy": "hierfl",
                       "hierfl-policy": "optimal", "hierfl-edges": 2, "hierfl-reach": 2,
                       "hierfl-time-limit": 5.0, "hierfl-tau1": 2, "hierfl-tau2": 2,
                       "min-available-nodes": 6,
                       "results-dir": str(tmp_path), "run-name": "hier"},
                      num_supernodes=6, log_path=tmp_path / "hier.log", timeout=600)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    rounds = read_metrics(tmp_path / "hier")["rounds"]
    for r in rounds[1:]:
        assert r["user-edge-messages"] == 12 and r["train-replies"] == 12
        assert r["assignment-objective"] <= r["original-objective"] + 1e-12
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]
    assert "HierFL: optimal assignment of 6 users to 2 edges" in outcome.log_path.read_text()


def test_stocfl_clusters_and_trains_through_the_engine(sim: LocalSimulation,
                                                       tmp_path: Path) -> None:
    outcome = sim.run({**TINY, "num-server-rounds": 2, "strategy": "stocfl",
                       "partition": "shifted", "min-available-nodes": 8, "stocfl-sketch-dim": 64,
                       "stocfl-holdout-fraction": 0.25, "results-dir": str(tmp_path),
                       "run-name": "sto"},
                      num_supernodes=8, log_path=tmp_path / "sto.log", timeout=600)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    rounds = read_metrics(tmp_path / "sto")["rounds"]
    # 6 trained nodes in 4 label-shift groups, found exactly; 2 held out, scored by
    # read-only inference (never clustered: only training-sampled nodes are)
    assert rounds[1]["clustered-clients"] == 6 and rounds[1]["ari"] == 1.0
    assert rounds[2]["eval-new-clients"] == 2 and rounds[2]["eval-trained-clients"] == 6
    assert rounds[2]["eval-acc"] > rounds[2]["eval-acc-global"]
    state = json.loads((tmp_path / "sto" / "clusters.json").read_text())
    assert sum(len(m) for m in state["clusters"].values()) == 6
    assert len(state["inferred"]) == 2
    assert (tmp_path / "sto" / "cluster-models.npz").exists()


def test_fesem_fits_centres_through_the_engine(sim: LocalSimulation, tmp_path: Path) -> None:
    outcome = sim.run({**TINY, "num-server-rounds": 2, "strategy": "fesem", "fesem-k": 2,
                       "partition": "shifted", "min-available-nodes": 6,
                       "results-dir": str(tmp_path), "run-name": "sem"},
                      num_supernodes=6, log_path=tmp_path / "sem.log", timeout=600)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    rounds = read_metrics(tmp_path / "sem")["rounds"]
    assert rounds[1]["new-clients"] == 6 and sum(rounds[2]["cluster-sizes"]) == 6
    assert "ari" in rounds[2] and rounds[2]["multicenter-loss"] >= 0
    assert rounds[2]["eval-replies"] == 6 and 0 <= rounds[2]["eval-acc"] <= 1
    state = json.loads((tmp_path / "sem" / "centres.json").read_text())
    assert set(state["assignment"]) == {f"partition-{p}" for p in range(6)}
    assert (tmp_path / "sem" / "centres.npz").exists()


def test_semifl_trains_static_clusters_through_the_engine(sim: LocalSimulation,
                                                          tmp_path: Path) -> None:
    outcome = sim.run({**TINY, "num-server-rounds": 2, "strategy": "semifl",
                       "semifl-cluster-size": 3, "min-available-nodes": 6,
                       "results-dir": str(tmp_path), "run-name": "semi"},
                      num_supernodes=6, log_path=tmp_path / "semi.log", timeout=600)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    rounds = read_metrics(tmp_path / "semi")["rounds"]
    assert [(r["uploads"], r["hops"], r["cluster-sizes"]) for r in rounds[1:]] == [
        (2, 6, [3, 3]), (2, 6, [3, 3])]
    assert rounds[2]["central-acc"] > rounds[0]["central-acc"]


def test_a_thousand_nodes_train_a_round_of_fedgsp(sim: LocalSimulation,
                                                  tmp_path: Path) -> None:
    """Scale: 1,000 simulated nodes, 10% sampled (10 of 100 groups of 10), 10% evaluated.

    One run (FedGSP: 1,000 histogram queries, ICG, 100 relay hops, 100 evaluations);
    FedAvg on 1,000 nodes is measured in benchmarks (README "1,000 simulated nodes").
    """
    outcome = sim.run({"dataset": "synthetic", "model": "logistic", "num-server-rounds": 1,
                       "fraction-train": 0.1, "fraction-evaluate": 0.1,
                       "min-available-nodes": 1000, "results-dir": str(tmp_path),
                       "strategy": "fedgsp", "fedgsp-growth-beta": 100, "fedgsp-kappa": 0.1,
                       "run-name": "fedgsp"},
                      num_supernodes=1000, log_path=tmp_path / "fedgsp.log", timeout=900)
    assert outcome.ok, outcome.log_path.read_text()[-3000:]
    assert json.loads((tmp_path / "fedgsp" / "config.json").read_text())["num-nodes"] == 1000
    fedgsp = read_metrics(tmp_path / "fedgsp")["rounds"][1]
    assert (fedgsp["num-groups"], fedgsp["hops"], fedgsp["skipped-nodes"]) == (100, 100, 0)
    assert fedgsp["eval-replies"] == 100 and fedgsp["eval-rejected"] == 0


def test_a_failing_run_is_reported_not_hidden(sim: LocalSimulation, tmp_path: Path) -> None:
    # 'hybrid' partitions need the hybrid dataset: the ServerApp raises at start.
    outcome = sim.run({**TINY, "partition": "hybrid", "results-dir": str(tmp_path)},
                      num_supernodes=3, log_path=tmp_path / "fail.log", timeout=600)
    assert not outcome.ok and outcome.status == "finished:failed"
    assert "needs dataset 'hybrid'" in outcome.log_path.read_text()


def test_experiment_runner_compares_and_resumes(tmp_path: Path, monkeypatch) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(
        'name = "tiny"\nnum-supernodes = 3\nseeds = [1]\ntarget-accuracy = 0.3\n'
        "[run-config]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items())
        + "num-server-rounds = 1\n"
        '[strategies.fedavg]\nstrategy = "fedavg"\n'
        '[strategies.fedprox]\nstrategy = "fedprox"\nfedprox-mu = 0.1\n'
        '[strategies.central]\nstrategy = "centralized"\n'
    )
    root = simulation.run_experiment(simulation.Experiment.load(spec), tmp_path / "results")
    for label in ("fedavg", "fedprox", "central"):
        assert is_complete(root / "runs" / f"{label}-seed1")
        assert (root / "logs" / f"{label}-seed1.log").exists()
    summary = json.loads((root / "summary.json").read_text())
    assert [row["strategy"] for row in summary] == ["fedavg", "fedprox", "central"]
    central = read_metrics(root / "runs" / "central-seed1")
    assert central["rounds"][1]["central-acc"] > central["rounds"][0]["central-acc"]
    divergence = json.loads((root / "divergence.json").read_text())
    assert {(r["strategy"], r["reference"]) for r in divergence} == {
        ("fedavg", "central"), ("fedprox", "central")}
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
