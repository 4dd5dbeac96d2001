"""The app's ServerApp: builds the configured strategy, runs it, records the results."""

from __future__ import annotations

import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from ..core.cost import CostModel, round_cost
from ..grids import NodeWaitGrid, NodeWaitTimeoutError
from ..models import (
    build_model,
    centre_seed,
    parameter_count,
    resolve_model_name,
    training_flops,
)
from ..protocol import BATCH_SIZE, LOCAL_EPOCHS, LR, MOMENTUM
from ..strategies import FedAvg
from ..strategies.node_queries import query_partitions
from ..strategies.state import record_arrays, to_record
from ..threads import is_simulation, server_work
from .checkpoint import (
    RESUMABLE_CHANGES,
    Checkpoint,
    CheckpointError,
    capture_global_rngs,
    config_changes,
    legacy_values,
    load_checkpoint,
    node_map,
    restore_global_rngs,
    save_checkpoint,
)
from .config import ConfigError, RunConfig, run_name_problem
from .datasets import bundle_for, load_partitions, load_server_test_set
from .registry import RunContext, build_strategy
from .results import RunRecorder, read_metrics

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy of the run config and write the run's results folder.

    A run that fails logs its cause as the last ERROR line before Flower's traceback.
    """
    try:
        cfg = RunConfig.from_mapping(context.run_config)  # parsed and checked once
        # Also the partitioning and central evaluation, outside the strategy's rounds.
        with server_work(grid, cfg.server_threads or None):
            run(grid, cfg)
    except Exception as err:
        log(ERROR, "The run failed: %s: %s", type(err).__name__, err)
        raise


def wait_for_nodes(
    grid: Grid, minimum: int, timeout: float = RunConfig.node_wait_timeout, *,
    simulation: bool | None = None, poll_seconds: float = 1.0, settle_seconds: float = 3.0,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Block until ``minimum`` nodes are connected; return how many are.

    In Flower's simulation engine every simulated node is registered at the start, one
    after another within milliseconds, and none joins later: once the count has been
    the same (and above 0) for ``settle_seconds``, a count below ``minimum`` fails at
    once. In deployment nodes connect when they start: the wait ends after ``timeout``
    seconds (``node-wait-timeout``), as it does in simulation when no node shows up.

    Parameters
    ----------
    grid : Grid
        The run's grid.
    minimum : int
        Nodes to wait for (``min-available-nodes``).
    timeout : float
        Seconds to wait at most (``node-wait-timeout``).
    simulation : bool | None
        Whether ``grid`` is the simulation engine's (``None``: found out from it).
    poll_seconds : float
        Seconds between two looks in deployment (a tenth of a second in simulation).
    settle_seconds : float
        Simulation: seconds an unchanged count takes to be final.
    clock, sleep : Callable
        Monotonic time and sleeping (tests pass fakes).

    Returns
    -------
    int
        The connected nodes, ``minimum`` or more.

    Raises
    ------
    ConfigError
        In simulation, if ``min-available-nodes`` is more than the simulated nodes
        (``num-supernodes``); both numbers are named.
    NodeWaitTimeoutError
        If fewer than ``minimum`` nodes are connected after ``timeout`` seconds.
    """
    simulation = is_simulation(grid) if simulation is None else simulation
    poll = min(poll_seconds, 0.1) if simulation else poll_seconds
    started = clock()
    last_count, count_since, logged = -1, started, float("-inf")
    while (count := len(list(grid.get_node_ids()))) < minimum:
        now = clock()
        if count != last_count:
            last_count, count_since = count, now
        if simulation and count > 0 and now - count_since >= settle_seconds:
            raise ConfigError(
                f"min-available-nodes={minimum} is more than the {count} nodes of this "
                f"simulation (num-supernodes={count}): set min-available-nodes to at most "
                f"{count}, or run {minimum} nodes (flwr run ... --federation-config "
                f"\"num-supernodes={minimum}\")")
        if now - started >= timeout:
            raise NodeWaitTimeoutError(
                f"{count} node(s) connected after node-wait-timeout={timeout:g} s, "
                f"min-available-nodes={minimum} needed: start the missing SuperNodes, "
                "lower min-available-nodes or raise node-wait-timeout",
                count, minimum, now - started)
        if now == count_since or now - logged >= 10.0:
            log(INFO, "Waiting for nodes: %d connected, %d needed (at most %g s)", count,
                minimum, timeout)
            logged = now
        sleep(poll)
    return count


def bounded_node_waits(grid: Grid, cfg: RunConfig) -> Grid:
    """``grid``, with every later wait for ``min-available-nodes`` (the strategies'
    node sampling in each round) bounded by ``node-wait-timeout`` in deployment.

    The simulation's grid is returned as it is: its nodes never leave, and the
    strategies recognise it by its type (thread hints).
    """
    if is_simulation(grid):
        return grid
    return NodeWaitGrid(
        grid, cfg.min_available_nodes, cfg.node_wait_timeout,
        hint=f"min-available-nodes={cfg.min_available_nodes}, node-wait-timeout="
        f"{cfg.node_wait_timeout:g}: restart the lost SuperNodes, lower "
        "min-available-nodes or raise node-wait-timeout (resume-from continues the run "
        "from its last checkpoint)")


def results_folder(cfg: RunConfig) -> Path:
    """The run's results folder: ``<results-dir>/<run-name>``.

    Raises
    ------
    ConfigError
        If ``run-name`` is not a single folder name (a config built without
        :meth:`RunConfig.from_mapping`'s checks).
    """
    if (problem := run_name_problem(cfg.run_name)) is not None:
        raise ConfigError(f"Run-config key 'run-name' must be a single folder name inside "
                          f"results-dir, got {cfg.run_name!r} ({problem}); put the parent "
                          "folders in results-dir")
    name = cfg.run_name or "-".join(
        [cfg.strategy, cfg.dataset.replace("/", "_"), cfg.partition,
         datetime.now(UTC).strftime("%Y%m%d-%H%M%S")]
    )
    return Path(cfg.results_dir).expanduser().resolve() / name


def training_config(cfg: RunConfig) -> ConfigRecord:
    """The training settings sent to clients with every train message."""
    return ConfigRecord(
        {
            LR: cfg.lr,
            LOCAL_EPOCHS: cfg.local_epochs,
            BATCH_SIZE: cfg.batch_size,
            MOMENTUM: cfg.momentum,
        }
    )


@dataclass(frozen=True)
class RoundPricer:
    """Prices each round with FedGSP's cost model (Eq. 15-17) from what it did.

    A round's participants are its relay hops or its training replies, its longest
    chain the hops that trained one after another in one group (1 when clients train
    in parallel), its aggregated models its uploads. Rounds that report no ``uploads``
    are not priced: HierFL's (several edge rounds each), and StoCFL's, IFCA's, CFL's
    and FeSEM's (several models broadcast per round, which Eq. 16 does not describe).

    Attributes
    ----------
    model : CostModel
        The constants.
    examples_per_client : float
        Mean training examples per client.
    epochs : float
        Local epochs per client.
    model_bytes : float
        Size of the model.
    """

    model: CostModel
    examples_per_client: float
    epochs: float
    model_bytes: float

    @classmethod
    def for_run(cls, cfg: RunConfig, model: Any, input_shape: tuple[int, ...],
                examples_per_client: float) -> RoundPricer:
        """The run's pricer: FLOPs and size from its model unless the config sets them."""
        constants = CostModel(
            flops_per_example=cfg.cost_flops_per_example or training_flops(model, input_shape),
            aggregation_flops=cfg.cost_aggregation_flops or float(parameter_count(model)),
            device_flops=cfg.cost_device_flops, rate_in_mbps=cfg.cost_rate_in,
            rate_out_mbps=cfg.cost_rate_out)
        return cls(constants, examples_per_client, cfg.local_epochs,
                   float(ArrayRecord(model.state_dict()).count_bytes()))

    def __call__(self, row: dict[str, Any]) -> dict[str, float]:
        """``cost-comp-s``, ``cost-comm-s``, ``cost-traffic`` of a round's metrics row."""
        if "edge-rounds" in row or not row.get("uploads"):
            return {}
        relay = "hops" in row
        cost = round_cost(
            self.model, participants=int(row["hops"] if relay else row.get("train-replies", 0)),
            longest_chain=int(row.get("longest-chain", 1)), uploads=int(row["uploads"]),
            examples_per_client=self.examples_per_client, epochs=self.epochs,
            model_bytes=self.model_bytes)
        return {"cost-comp-s": cost.comp_seconds, "cost-comm-s": cost.comm_seconds,
                "cost-traffic": cost.traffic_bytes}


class CentralEvaluator:
    """Scores the global model on the server's test set after every round.

    Used as Flower's ``evaluate_fn``: it also logs one line per round, merges the
    strategy's per-round history (client metrics, rejected replies), prices the round
    with the cost model (``pricer``) and hands the row to the recorder, so that the
    results folder is current after every round.
    """

    def __init__(
        self,
        cfg: RunConfig,
        model: Any,
        test_set: tuple[np.ndarray, np.ndarray],
        strategy: FedAvg,
        recorder: RunRecorder,
        offset: int = 0,
        pricer: RoundPricer | None = None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.x_test, self.y_test = test_set
        self.strategy = strategy
        self.recorder = recorder
        self.offset = offset
        self.pricer = pricer
        self.last = time.perf_counter()
        # A resumed run's clock goes on from the interrupted run's (`elapsed` of the
        # checkpoint's round, the recorder's last row), so `elapsed` and the summary's
        # wall time cover every recorded round, not only those since the restart.
        self.started = self.last - (recorder.rounds[-1].get("elapsed", 0.0)
                                    if recorder.rounds else 0.0)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Evaluate ``arrays``, record and log the round, write the checkpoint.

        In a resumed run, Flower's round ``r`` is round ``offset + r``; its round 0 (the
        model of the checkpoint) was recorded by the interrupted run.
        """
        from ..clients.fusion import load_model
        from ..training import evaluate

        if self.offset and server_round == 0:
            return None
        server_round += self.offset
        now = time.perf_counter()
        round_time, self.last = now - self.last, now
        model = load_model(self.model, arrays)  # FedFusion's: the fused model
        loss, accuracy = evaluate(model, self.x_test, self.y_test)
        row: dict[str, Any] = {
            "round": server_round,
            "central-acc": accuracy,
            "central-loss": loss,
            "round-time": round_time,
            "elapsed": now - self.started,
        }
        row.update(self.strategy.history.get(server_round, {}))
        if self.pricer is not None:
            row.update(self.pricer(row))
        self.recorder.add_round(row)
        if server_round > 0:
            self.recorder.write_files(self.strategy.artifacts(final=False))
            self.checkpoint(server_round, arrays)
        log(
            INFO,
            "Round %d/%d: central accuracy %.4f, loss %.4f, %.1fs",
            server_round, self.cfg.num_server_rounds, accuracy, loss, round_time,
        )
        self.last = time.perf_counter()  # evaluation time is not the next round's
        return MetricRecord({"central-acc": accuracy, "central-loss": loss})

    def checkpoint(self, server_round: int, arrays: ArrayRecord) -> None:
        """Write the round's checkpoint (model, strategy state, random generators)."""
        save_checkpoint(self.recorder.folder, Checkpoint(
            round=server_round,
            model=record_arrays(arrays),
            strategy=self.strategy.checkpoint_state(),
            rng=capture_global_rngs(),
            run_config=self.cfg.to_mapping(),
            partitions=self.strategy.node_partitions(),
        ))


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


def resumable_checkpoint(cfg: RunConfig) -> Checkpoint:
    """The checkpoint of ``cfg.resume_from``, checked against the run config.

    Raises
    ------
    ConfigError
        If there is no readable checkpoint, the run config changes a key that shapes
        the run, or the checkpoint already has every round.
    """
    try:
        checkpoint = load_checkpoint(cfg.resume_from)
    except CheckpointError as err:
        raise ConfigError(str(err)) from err
    changed = config_changes(checkpoint.run_config, cfg.to_mapping())
    if changed:
        raise ConfigError(
            "resume-from: the run config differs from the interrupted run's in "
            + ", ".join(f"'{k}' ({checkpoint.run_config.get(k)!r} there, "
                        f"{cfg.to_mapping().get(k)!r} here)" for k in changed)
            + f"; only {', '.join(sorted(RESUMABLE_CHANGES))} may change")
    if checkpoint.round >= cfg.num_server_rounds:
        raise ConfigError(
            f"resume-from: the checkpoint already has round {checkpoint.round} of "
            f"num-server-rounds={cfg.num_server_rounds}; raise num-server-rounds to go on")
    return checkpoint


def resume(strategy: FedAvg, checkpoint: Checkpoint, grid: Grid, cfg: RunConfig) -> FedAvg:
    """Restore ``strategy``'s state, to go on after the checkpoint's round
    (``resumed_after``): nodes that reported a partition id in the interrupted run are
    found again by asking the connected nodes theirs (``query.partition``: no data is
    shared).
    """
    current: dict[int, int] = {}
    if checkpoint.partitions:
        nodes = sorted(grid.get_node_ids())
        current = query_partitions(grid, nodes, cfg.query_timeout).partition_ids
    try:
        strategy.restore_state(checkpoint.strategy, node_map(checkpoint.partitions, current))
        strategy.resumed_after = checkpoint.round
    except ValueError as err:  # a state that lacks a declared field
        raise ConfigError(f"resume-from: {err}") from err
    log(INFO, "Resuming after round %d of %d: %d of %d known nodes found again",
        checkpoint.round, cfg.num_server_rounds,
        len(set(checkpoint.partitions.values()) & set(current.values())),
        len(checkpoint.partitions))
    return strategy


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
    checkpoint = resumable_checkpoint(cfg) if cfg.resume_from else None
    if checkpoint is not None and (legacy := legacy_values(checkpoint.run_config)):
        log(INFO, "resume-from: the checkpoint predates %s; the run goes on with %s, "
            "as it started", ", ".join(legacy),
            ", ".join(f"{k}={v!r}" for k, v in legacy.items()))
        cfg = RunConfig.from_mapping({**cfg.to_mapping(), **legacy})
    seed_everything(cfg.seed)
    num_nodes = wait_for_nodes(grid, cfg.min_available_nodes, cfg.node_wait_timeout)
    grid = bounded_node_waits(grid, cfg)
    bundle = bundle_for(cfg, num_nodes)
    # Partitioning here validates the scheme against the dataset before any round, and
    # fills the on-disk partition cache that the nodes of this machine then read.
    parts = load_partitions(cfg, num_nodes)
    sizes = [len(p.train_idx) for p in parts]
    log(INFO, "%s over %d partitions: %d to %d training examples each",
        cfg.partition, num_nodes, min(sizes), max(sizes))
    model_name = resolve_model_name(cfg.model, bundle.input_shape)
    model = build_model(model_name, bundle.input_shape, bundle.num_classes, cfg.seed)
    strategy = build_strategy(cfg, RunContext(
        ground_truth={p.partition_id: p.latent_group for p in parts},
        centre_factory=lambda k: ArrayRecord(build_model(
            model_name, bundle.input_shape, bundle.num_classes,
            centre_seed(cfg.seed, k)).state_dict()),
    ))
    # Histograms (and, in simulation, whose partition ids are 0 .. num-supernodes - 1,
    # partition ids) are checked against the data, not against the first reply.
    strategy.expect_federation(num_classes=bundle.num_classes,
                               num_partitions=num_nodes if is_simulation(grid) else None)
    metadata = run_metadata(cfg, num_nodes, model_name)
    if checkpoint is None:
        folder, done, previous = results_folder(cfg), 0, []
        initial_arrays = ArrayRecord(model.state_dict())
    else:
        folder, done = Path(cfg.resume_from).expanduser().resolve(), checkpoint.round
        previous = (read_metrics(folder) or {}).get("rounds", [])[:done + 1]
        metadata["resumed-after-round"] = done
        initial_arrays = to_record(checkpoint.model)
        strategy = resume(strategy, checkpoint, grid, cfg)
    recorder = RunRecorder(folder, metadata, previous)
    log(INFO, "Results of this run go to %s", folder)
    evaluator = CentralEvaluator(
        cfg, model, load_server_test_set(cfg, num_nodes), strategy, recorder, done,
        RoundPricer.for_run(cfg, model, bundle.input_shape, float(np.mean(sizes))),
    )
    if checkpoint is not None:
        restore_global_rngs(checkpoint.rng)  # last: as they were after round `done`
    try:
        result = strategy.start(
            grid=grid,
            initial_arrays=initial_arrays,
            num_rounds=cfg.num_server_rounds - done,
            timeout=cfg.train_timeout,
            train_config=training_config(cfg),
            evaluate_config=ConfigRecord(),
            evaluate_fn=evaluator,
        )
    except Exception as err:
        recorder.fail(f"{type(err).__name__}: {err}")  # the rounds and checkpoint stay
        raise
    last = recorder.rounds[-1]
    recorder.write_files(strategy.artifacts(final=True))
    recorder.finish(
        run_summary(recorder, cfg.num_server_rounds, time.perf_counter() - evaluator.started,
                    num_nodes),
        # Result.arrays stays empty when no round produced an aggregate.
        record_arrays(result.arrays or initial_arrays),
    )
    log(INFO, "Final central accuracy %.4f; results in %s", last["central-acc"], folder)
    return folder
