"""Per-round checkpoints and ``resume-from``: a resumed run ends where an uninterrupted
run of the same seed ends, for every strategy. The ServerApp and the app's ClientApp
run in-process over a FakeGrid; the resumed run's nodes have other node ids (as after a
restart), found again by their partition ids.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Context, Message, RecordDict

from fedgsp_flwr.app import client_app, server_app
from fedgsp_flwr.app.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedgsp_flwr.app.config import ConfigError, RunConfig
from fedgsp_flwr.app.results import read_metrics

NODES = 4
BASE = {"dataset": "synthetic", "partition": "natural", "batch-size": 16, "lr": 0.1,
        "min-available-nodes": NODES, "train-timeout": 60.0, "query-timeout": 60.0,
        "seed": 7}
STRATEGIES = {
    "fedavg": {"fraction-train": 0.5},  # Flower samples with Python's random
    "fedgsp": {"fedgsp-kappa": 0.5, "fedgsp-growth": "linear", "fedgsp-growth-alpha": 1.0},
    "hierfl": {"hierfl-edges": 2, "hierfl-tau2": 1, "fraction-train": 0.5},
    "stocfl": {"fraction-train": 0.75, "stocfl-tau": 0.3},
    "fesem": {"fesem-k": 2, "fraction-train": 0.75},
    "semifl": {"semifl-cluster-size": 2, "semifl-shuffle": True},
    "fedadam": {"fraction-train": 0.75},  # the optimizer's moments in the checkpoint
    # the fusion module travels in the model's arrays (an MLP: a logistic regression
    # has no features to fuse)
    "fedfusion": {"model": "mlp", "fedfusion-operator": "multi"},
    # the personal models stay on the nodes, in files of client-state-dir
    "ditto": {"fraction-train": 0.75, "fraction-evaluate": 1.0},
    "ifca": {"ifca-k": 2, "fraction-train": 0.75},  # the clients' choices by partition
    # splits from round 1 on (no warm-up, every norm test passes): the tree is resumed
    "cfl": {"cfl-warmup-rounds": 0, "cfl-eps1": 100.0, "cfl-eps2": 0.0,
            "cfl-min-split-size": 2},
}


RUN_IDS = itertools.count(1000)


def grid_of(cfg: RunConfig, node_ids: list[int], received: list[str] | None = None
            ) -> FakeGrid:
    """Nodes running the app's ClientApp for the run of ``cfg`` (a new Flower run id: the
    ClientApp parses a run's config once); node i holds partition i. The message types
    they receive are appended to ``received``.
    """
    handlers, run_id = {}, next(RUN_IDS)
    for partition, node in enumerate(node_ids):
        context = Context(run_id=run_id, node_id=node, state=RecordDict(),
                          node_config={"partition-id": partition, "num-partitions": NODES},
                          run_config=cfg.to_mapping())

        def handle(message: Message, c: Context = context) -> Message:
            if received is not None:
                received.append(message.metadata.message_type)
            return client_app.app(message, c)
        handlers[node] = handle
    return FakeGrid(dict(sorted(handlers.items())))  # listed by node id, as a SuperLink


def config(tmp_path: Path, strategy: str, rounds: int, name: str, **extra: object) -> RunConfig:
    return RunConfig.from_mapping({**BASE, **STRATEGIES[strategy], "strategy": strategy,
                                   "num-server-rounds": rounds, "run-name": name,
                                   "results-dir": str(tmp_path), "data-dir": str(tmp_path / "data"),
                                   "client-state-dir": str(tmp_path / "state" / name), **extra})


def arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


CLOCK_WORDS = ("time", "seconds", "elapsed", "round-trip", "latency")


def untimed(row: dict) -> dict:
    """A round's metrics without the wall-clock ones."""
    return {k: v for k, v in row.items() if not any(w in k for w in CLOCK_WORDS)}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_resumed_run_ends_where_the_uninterrupted_run_ends(tmp_path: Path,
                                                              strategy: str) -> None:
    first_ids = [11, 12, 13, 14]
    full_cfg, part_cfg = config(tmp_path, strategy, 3, "full"), config(tmp_path, strategy,
                                                                      2, "part")
    full = server_app.run(grid_of(full_cfg, first_ids), full_cfg)
    part = server_app.run(grid_of(part_cfg, first_ids), part_cfg)
    assert load_checkpoint(part).round == 2
    restarted_ids = [901, 902, 903, 904]  # other node ids: found again by partition id
    resumed_cfg = config(tmp_path, strategy, 3, "ignored", **{
        "resume-from": str(part), "client-state-dir": str(tmp_path / "state" / "part")})
    received: list[str] = []
    resumed = server_app.run(grid_of(resumed_cfg, restarted_ids, received), resumed_cfg)
    assert resumed == part, "a resumed run writes into the folder it resumes"
    # the nodes are found again by partition id alone: a strategy that never needed a
    # class histogram (StoCFL, FeSEM) asks for none on resume either
    if load_checkpoint(part).partitions:
        assert received[:NODES] == ["query.partition"] * NODES
    if strategy in ("fedavg", "stocfl", "fesem", "fedadam", "fedfusion"):
        assert "query.histogram" not in received
    # the global model, and the cluster/centre models of the strategies that have them
    for name in ("model.npz", "cluster-models.npz", "centres.npz"):
        if (full / name).exists():
            expected, got = arrays(full / name), arrays(part / name)
            assert list(expected) == list(got), name
            for key in expected:
                np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{name} {key}")
    if strategy == "fedfusion":
        assert any(k.startswith("fusion.") for k in arrays(part / "model.npz"))
    full_rounds, part_rounds = read_metrics(full)["rounds"], read_metrics(part)["rounds"]
    assert [r["round"] for r in part_rounds] == [0, 1, 2, 3]
    # every metric of every round: assignments, cluster sizes, losses, bytes, ...
    assert [untimed(r) for r in part_rounds] == [untimed(r) for r in full_rounds]
    assert load_checkpoint(part).round == 3 and read_metrics(part)["status"] == "complete"


def test_a_resumed_run_counts_the_interrupted_runs_time(tmp_path: Path) -> None:
    part_cfg = config(tmp_path, "fedavg", 2, "part")
    part = server_app.run(grid_of(part_cfg, [1, 2, 3, 4]), part_cfg)
    # as if the interrupted run had taken an hour to its checkpoint's round
    metrics = read_metrics(part)
    metrics["rounds"][2]["elapsed"] = 3600.0
    (part / "metrics.json").write_text(json.dumps(metrics))
    resumed_cfg = config(tmp_path, "fedavg", 3, "ignored", **{"resume-from": str(part)})
    server_app.run(grid_of(resumed_cfg, [5, 6, 7, 8]), resumed_cfg)
    resumed = read_metrics(part)
    assert resumed["rounds"][3]["elapsed"] > 3600.0
    assert resumed["summary"]["wall-time"] >= resumed["rounds"][3]["elapsed"]
    assert resumed["rounds"][3]["round-time"] < 3600.0  # the resumed round's own time


def test_each_round_leaves_a_checkpoint_with_the_strategy_state(tmp_path: Path) -> None:
    cfg = config(tmp_path, "stocfl", 2, "ckpt")
    folder = server_app.run(grid_of(cfg, [5, 6, 7, 8]), cfg)
    checkpoint = load_checkpoint(folder)
    assert checkpoint.round == 2 and checkpoint.run_config == cfg.to_mapping()
    assert set(checkpoint.partitions.values()) <= set(range(NODES))
    assert checkpoint.strategy.arrays["clustering/gram"].ndim == 2
    assert {"python", "numpy", "torch"} <= set(checkpoint.rng)
    assert not list(folder.glob("*.tmp")) and (folder / CHECKPOINT_FILE).is_file()


def test_resuming_with_a_changed_run_config_is_refused(tmp_path: Path) -> None:
    cfg = config(tmp_path, "fedavg", 1, "base")
    folder = server_app.run(grid_of(cfg, [1, 2, 3, 4]), cfg)
    changed = config(tmp_path, "fedavg", 3, "x", **{"resume-from": str(folder), "lr": 0.5})
    with pytest.raises(ConfigError, match="'lr' \\(0.1 there, 0.5 here\\)"):
        server_app.run(grid_of(changed, [1, 2, 3, 4]), changed)
    done = config(tmp_path, "fedavg", 1, "x", **{"resume-from": str(folder)})
    with pytest.raises(ConfigError, match="already has round 1"):
        server_app.run(grid_of(done, [1, 2, 3, 4]), done)
    missing = config(tmp_path, "fedavg", 2, "x", **{"resume-from": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="does not exist"):
        server_app.run(grid_of(missing, [1, 2, 3, 4]), missing)


@pytest.mark.parametrize("strategy", ["fedavg", "fedadam", "ditto"])
def test_a_seed_trains_the_same_clients_whatever_the_node_ids(tmp_path: Path,
                                                               strategy: str) -> None:
    """Two launches of a seed whose nodes got other ids, listed in another order (the
    simulation engine draws new ids at each launch): the FedAvg family samples by
    partition id, so both runs are the same run.
    """
    first_cfg, second_cfg = (config(tmp_path, strategy, 3, name) for name in ("a", "b"))
    first = server_app.run(grid_of(first_cfg, [11, 12, 13, 14]), first_cfg)
    second = server_app.run(grid_of(second_cfg, [904, 903, 902, 901]), second_cfg)
    rounds = [untimed(r) for r in read_metrics(first)["rounds"]]
    assert [untimed(r) for r in read_metrics(second)["rounds"]] == rounds
    expected, got = arrays(first / "model.npz"), arrays(second / "model.npz")
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_resumed_rounds_is_a_deprecated_alias_of_resumed_after() -> None:
    from fedgsp_flwr.app.checkpoint import ResumedRounds
    from fedgsp_flwr.strategies import FedAvg

    strategy = FedAvg()
    assert strategy.resumed_after == 0
    with pytest.warns(DeprecationWarning, match="strategy.resumed_after = offset"):
        assert ResumedRounds(strategy, 4) is strategy and strategy.resumed_after == 4
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="offset must be >= 0"):
        ResumedRounds(strategy, -1)
