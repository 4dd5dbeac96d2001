"""Drop-in, end to end: Flower's quickstart-pytorch app (tests/quickstart: its own CNN,
``train_loss`` / ``eval_loss`` / ``eval_acc``, ``lr`` only in the train config, a central
``evaluate_fn``, ``result.arrays`` saved) with ``FedAvg(...)`` replaced by each of our
strategies at default arguments, through ``flwr run`` in the simulation engine.

Ten nodes share 6,000 MNIST training images, two label shards each; 3 rounds (FedAvg's
central accuracy 0.10 -> 0.30, the check asks +0.05). One ``flwr run`` runs every
strategy in turn (one Ray start-up), on the session's local SuperLink.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import quickstart_app

from fedgsp_flwr.tools.launcher import LocalSimulation

pytestmark = pytest.mark.e2e

STRATEGIES = ("fedavg", "fedprox", "fedgsp", "semifl", "hierfl", "stocfl", "fesem")
ASKS = {"fedgsp": ("query.histogram",), "semifl": ("query.histogram",),
        "hierfl": ("query.histogram",), "fesem": ("query.partition",),
        "stocfl": ("query.partition", "query.sketch")}
# The FedAvg family asks each node its partition id (its sampling order): two probes,
# an INFO line and Flower's node-id order in a plain app.
PROBES = {"fedavg": ("query.partition",), "fedprox": ("query.partition",)}
RUN = {"train-examples": 6000, "lr": 0.02, "num-server-rounds": 3}


def run_quickstart(sim: LocalSimulation, folder: Path, strategies: tuple[str, ...],
                   hooks: bool, rounds: int = RUN["num-server-rounds"]) -> dict[str, dict]:
    outcome = sim.run({**RUN, "num-server-rounds": rounds, "strategies": ",".join(strategies),
                       "out-dir": str(folder / "out")},
                      num_supernodes=10, log_path=folder / "run.log", timeout=900,
                      app_dir=quickstart_app(folder, hooks))
    print(f"flwr run: {outcome.status} in {outcome.wall_time:.0f} s")
    assert outcome.ok, outcome.cause()
    rows = json.loads((folder / "out" / "summary.json").read_text())
    return {row["strategy"]: row for row in rows}


def test_every_strategy_with_defaults_drops_into_the_quickstart_app(
        local_simulation: LocalSimulation, tmp_path: Path) -> None:
    rows = run_quickstart(local_simulation, tmp_path, STRATEGIES, hooks=False)
    for name in STRATEGIES:
        row = rows[name]
        assert not row["error"] and row["trained-rounds"] == 3, (name, row)
        assert row["final-tensors"] == 10 and row["final-shapes-match"], (name, row)
        assert (tmp_path / "out" / f"{name}-final_model.pt").stat().st_size > 100_000
        assert row["rejected"] == 0, (name, row)
        assert {"train_loss", "eval_acc", "eval_loss"} <= set(row["client-metrics"]), name
        assert row["moved"], name
        accuracy = row["central-accuracy"]
        # Every node trains every round: the central accuracy rises. FedGSP's defaults
        # train 3 one-node groups per round here (kappa 0.3 of 10 groups), Semi-FL's one
        # chain through all ten nodes (its default cluster holds 10): on nodes of one or
        # two classes, 3 rounds of either move the central accuracy by luck only.
        # FeSEM in a plain app has no partition ids: its nodes (and so its centres'
        # first members) come in the engine's random node-id order, and 3 rounds moved
        # the central accuracy by 0.03 in one launch, 0.34 in another.
        if name not in ("fedgsp", "semifl", "fesem"):
            assert accuracy[-1] > accuracy[0] + 0.05, (name, accuracy)
        # One warning per run for a missing hook (and two failed queries), none per node.
        expected = [f"{row['strategy']}: the nodes' ClientApp has no '{query}' handler"
                    for query in ASKS.get(name, ())]
        assert [w.split(": ", 1)[1] for w in row["missing-hook-warnings"]] == [
            e.split(": ", 1)[1] for e in expected], (name, row)
    # The engine logs one traceback per failed message: two per hook a strategy asks for
    # (the probe and a second node's, which confirms it).
    log = (tmp_path / "run.log").read_text()
    failed = log.count("An exception was raised when processing a message")
    assert failed == 2 * (sum(map(len, ASKS.values())) + sum(map(len, PROBES.values())))


def test_the_same_app_with_our_hooks_groups_by_icg_and_clusters_by_sketches(
        local_simulation: LocalSimulation, tmp_path: Path) -> None:
    # One round: the histograms and sketches are asked, and used, in round 1.
    rows = run_quickstart(local_simulation, tmp_path, ("fedgsp", "stocfl"), hooks=True,
                          rounds=1)
    for row in rows.values():
        assert not row["error"] and row["rejected"] == 0 and not row["missing-hook-warnings"]
        assert row["final-tensors"] == 10 and row["trained-rounds"] == 1
    assert "cpd-median" in rows["fedgsp"]["reported"], "ICG groups need the histograms"
    assert rows["stocfl"]["reported"]["num-clusters"] >= 2
    assert len(rows["stocfl"]["group-models"]) == rows["stocfl"]["reported"]["num-clusters"]
    assert "eval_acc-global" in rows["stocfl"]["client-metrics"]
