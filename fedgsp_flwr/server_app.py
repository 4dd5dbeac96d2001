"""The app's ServerApp: builds the configured strategy, runs it, records the results."""

from __future__ import annotations

import platform
import random
import time
from datetime import UTC, datetime
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from .config import RunConfig
from .data import bundle_for, load_partitions, load_server_test_set
from .models import build_model, resolve_model_name
from .results import RunRecorder
from .strategies import build_strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy of the run config and write the run's results folder."""
    run(grid, RunConfig.from_mapping(context.run_config))


def wait_for_nodes(grid: Grid, minimum: int, poll_seconds: float = 1.0) -> int:
    """Block until ``minimum`` nodes are connected; return how many are."""
    while (count := len(list(grid.get_node_ids()))) < minimum:
        log(INFO, "Waiting for nodes: %d connected, %d needed", count, minimum)
        time.sleep(poll_seconds)
    return count


def results_folder(cfg: RunConfig) -> Path:
    """The run's results folder: ``<results-dir>/<run-name>``."""
    name = cfg.run_name or "-".join(
        [cfg.strategy, cfg.dataset.replace("/", "_"), cfg.partition,
         datetime.now(UTC).strftime("%Y%m%d-%H%M%S")]
    )
    return Path(cfg.results_dir).expanduser().resolve() / name


def training_config(cfg: RunConfig) -> ConfigRecord:
    """The training settings sent to clients with every train message."""
    return ConfigRecord(
        {
            "lr": cfg.lr,
            "local-epochs": cfg.local_epochs,
            "batch-size": cfg.batch_size,
            "momentum": cfg.momentum,
        }
    )


class CentralEvaluator:
    """Scores the global model on the server's test set after every round.

    Used as Flower's ``evaluate_fn``: it also logs one line per round, merges the
    strategy's per-round history (client metrics, rejected replies) and hands the row
    to the recorder, so that the results folder is current after every round.
    """

    def __init__(
        self,
        cfg: RunConfig,
        model: Any,
        test_set: tuple[np.ndarray, np.ndarray],
        strategy: Strategy,
        recorder: RunRecorder,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.x_test, self.y_test = test_set
        self.strategy = strategy
        self.recorder = recorder
        self.started = self.last = time.perf_counter()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate ``arrays``, record and log the round."""
        from .training import evaluate

        now = time.perf_counter()
        round_time, self.last = now - self.last, now
        self.model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(self.model, self.x_test, self.y_test)
        row: dict[str, Any] = {
            "round": server_round,
            "central-acc": accuracy,
            "central-loss": loss,
            "round-time": round_time,
            "elapsed": now - self.started,
        }
        row.update(getattr(self.strategy, "history", {}).get(server_round, {}))
        self.recorder.add_round(row)
        if server_round > 0 and hasattr(self.strategy, "artifacts"):
            self.recorder.write_files(self.strategy.artifacts(final=False))
        log(
            INFO,
            "Round %d/%d: central accuracy %.4f, loss %.4f, %.1fs",
            server_round, self.cfg.num_server_rounds, accuracy, loss, round_time,
        )
        self.last = time.perf_counter()  # evaluation time is not the next round's
        return MetricRecord({"central-acc": accuracy, "central-loss": loss})


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators.

    Flower's strategies sample nodes with Python's ``random``.
    """
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_metadata(cfg: RunConfig, num_nodes: int, model_name: str) -> dict[str, Any]:
    """What a run's ``config.json`` holds: the run config, nodes, model, versions."""
    import flwr
    import torch

    return {
        "run-config": cfg.to_mapping(),
        "num-nodes": num_nodes,
        "resolved-model": model_name,
        "versions": {"flwr": flwr.__version__, "torch": torch.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
    }


def run_summary(recorder: RunRecorder, rounds: int, wall_time: float,
                num_nodes: int) -> dict[str, Any]:
    """The ``summary`` of a finished run: final and best central accuracy, rounds, wall
    time and nodes.
    """
    return {
        "final-central-acc": recorder.rounds[-1]["central-acc"],
        "best-central-acc": max(r["central-acc"] for r in recorder.rounds),
        "rounds": rounds,
        "wall-time": wall_time,
        "num-nodes": num_nodes,
    }


def run(grid: Grid, cfg: RunConfig) -> Path:
    """Run one federated experiment on ``grid`` and return its results folder.

    Parameters
    ----------
    grid : Grid
        Flower's grid of connected nodes.
    cfg : RunConfig
        The validated run configuration.

    Returns
    -------
    Path
        The results folder.
    """
    cfg.check_names()  # fail fast, before waiting for nodes or loading data
    seed_everything(cfg.seed)
    strategy = build_strategy(cfg)
    num_nodes = wait_for_nodes(grid, cfg.min_available_nodes)
    bundle = bundle_for(cfg, num_nodes)
    # Partitioning here validates the scheme against the dataset before any round, and
    # fills the on-disk partition cache that the nodes of this machine then read.
    parts = load_partitions(cfg, num_nodes)
    sizes = [len(p.train_idx) for p in parts]
    if hasattr(strategy, "ground_truth"):  # clustering strategies report ARI / NMI
        strategy.ground_truth = {p.partition_id: p.latent_group for p in parts}
    log(INFO, "%s over %d partitions: %d to %d training examples each",
        cfg.partition, num_nodes, min(sizes), max(sizes))
    model_name = resolve_model_name(cfg.model, bundle.input_shape)
    model = build_model(model_name, bundle.input_shape, bundle.num_classes, cfg.seed)
    if getattr(strategy, "centre_factory", False) is None:  # FeSEM's seeded centres
        strategy.centre_factory = lambda k: ArrayRecord(build_model(  # type: ignore[attr-defined]
            model_name, bundle.input_shape, bundle.num_classes, cfg.seed + k).state_dict())
    folder = results_folder(cfg)
    recorder = RunRecorder(folder, run_metadata(cfg, num_nodes, model_name))
    log(INFO, "Results of this run go to %s", folder)
    evaluator = CentralEvaluator(
        cfg, model, load_server_test_set(cfg, num_nodes), strategy, recorder
    )
    initial_arrays = ArrayRecord(model.state_dict())
    result = strategy.start(
        grid=grid,
        initial_arrays=initial_arrays,
        num_rounds=cfg.num_server_rounds,
        timeout=cfg.round_timeout,
        train_config=training_config(cfg),
        evaluate_config=ConfigRecord(),
        evaluate_fn=evaluator,
    )
    last = recorder.rounds[-1]
    if hasattr(strategy, "artifacts"):
        recorder.write_files(strategy.artifacts(final=True))
    recorder.finish(
        run_summary(recorder, cfg.num_server_rounds, time.perf_counter() - evaluator.started,
                    num_nodes),
        # Result.arrays stays empty when no round produced an aggregate.
        {k: v.numpy() for k, v in (result.arrays or initial_arrays).items()},
    )
    log(INFO, "Final central accuracy %.4f; results in %s", last["central-acc"], folder)
    return folder
