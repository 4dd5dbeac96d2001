"""Per-round checkpoints of the server state, and resuming a run from one.

After every round the ServerApp writes ``checkpoint.npz`` into the run's results
folder, atomically (a temporary file, then a rename): the round, the global model, the
strategy's state (cluster/centre/edge models, assignments, cached histograms and
sketches, its random generators) and the global random generators (Python's, which
Flower's node sampling uses, numpy's and torch's). ``resume-from=<folder>`` starts a
run from the last complete round of that folder and continues writing into it.

Node ids change from run to run (the simulation engine draws them; a restarted
SuperNode gets a new one). A checkpoint therefore keeps each node's reported
``partition-id``; on resume the nodes are asked again (``query.partition``) and the
state of an old node is handed to the new node of the same partition. Strategies save
and restore their state through ``checkpoint_state`` and ``restore_state``
(:class:`~fedgsp_flwr.strategies.FedAvg` and its subclasses).
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO
from pathlib import Path
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from ..strategies import FedAvg
from ..strategies.state import (
    NodeMap,
    StrategyState,
    from_pairs,
    pairs,
    prefixed,
    under,
)
from .results import write_atomic

CHECKPOINT_FILE = "checkpoint.npz"
META_KEY = "__meta__"
# Run-config keys a resumed run may change; every other key must match the checkpoint's.
RESUMABLE_CHANGES = frozenset({
    "num-server-rounds", "results-dir", "run-name", "resume-from", "train-timeout",
    "query-timeout", "relay-poll", "data-dir", "client-state-dir",
})


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or does not fit the run."""


@dataclass
class Checkpoint:
    """One checkpoint.

    Attributes
    ----------
    round : int
        The last complete round.
    model : dict[str, np.ndarray]
        The global model after that round.
    strategy : StrategyState
        The strategy's state.
    rng : dict[str, Any]
        The global random generators (see :func:`capture_global_rngs`).
    run_config : dict[str, Any]
        The run config of the checkpointed run.
    partitions : dict[int, int]
        Node id -> reported partition id, of the checkpointed run.
    """

    round: int
    model: dict[str, np.ndarray]
    strategy: StrategyState
    rng: dict[str, Any]
    run_config: dict[str, Any]
    partitions: dict[int, int] = field(default_factory=dict)


def save_checkpoint(folder: str | Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint.npz`` into ``folder`` atomically; return its path."""
    torch_state = checkpoint.rng.get("torch")
    meta = {
        "round": checkpoint.round,
        "strategy": checkpoint.strategy.meta,
        "rng": {k: v for k, v in checkpoint.rng.items() if k != "torch"},
        "run-config": checkpoint.run_config,
        "partitions": pairs(checkpoint.partitions),
    }
    arrays = {**prefixed(checkpoint.model, "model"),
              **prefixed(checkpoint.strategy.arrays, "strategy")}
    if torch_state is not None:
        arrays["rng/torch"] = np.asarray(torch_state, dtype=np.uint8)
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy stub quirk
    path = Path(folder) / CHECKPOINT_FILE
    write_atomic(path, buffer.getvalue())
    return path


def load_checkpoint(folder: str | Path) -> Checkpoint:
    """Read ``checkpoint.npz`` of a results folder.

    Raises
    ------
    CheckpointError
        If the folder has no checkpoint, or it cannot be read.
    """
    path = Path(folder).expanduser() / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(
            f"resume-from: {path} does not exist (a run writes it after its first round)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop(META_KEY).tobytes().decode())
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"resume-from: cannot read {path}: {err}") from err
    rng = dict(meta["rng"])
    if "rng/torch" in arrays:
        rng["torch"] = arrays.pop("rng/torch")
    return Checkpoint(
        round=int(meta["round"]),
        model=under(arrays, "model"),
        strategy=StrategyState(meta["strategy"], under(arrays, "strategy")),
        rng=rng,
        run_config=meta["run-config"],
        partitions=from_pairs(meta["partitions"]),
    )


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The run-config keys a resumed run changes that it must not change."""
    keys = (set(saved) | set(current)) - RESUMABLE_CHANGES
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def node_map(saved: Mapping[int, int], current: Mapping[int, int]) -> NodeMap:
    """Translate old node ids to the new node of the same partition id.

    Parameters
    ----------
    saved : Mapping[int, int]
        Old node id -> partition id.
    current : Mapping[int, int]
        New node id -> partition id.

    Returns
    -------
    NodeMap
        Old id -> new id; a node without a new counterpart keeps its id.
    """
    by_partition = {p: n for n, p in current.items()}
    table = {old: by_partition[p] for old, p in saved.items() if p in by_partition}
    return lambda node: table.get(node, node)


def capture_global_rngs() -> dict[str, Any]:
    """The states of Python's, numpy's and torch's global random generators."""
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float],
                                              np.random.get_state())
    return {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().numpy(),
    }


def restore_global_rngs(state: Mapping[str, Any]) -> None:
    """Set the global random generators to a state of :func:`capture_global_rngs`."""
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        torch.set_rng_state(torch.from_numpy(np.asarray(state["torch"], dtype=np.uint8)))


class ResumedRounds(Strategy):
    """A strategy whose rounds continue after ``offset`` completed ones.

    Flower's ``Strategy.start`` counts rounds from 1; this wrapper passes round
    ``offset + r`` to the wrapped strategy, so a resumed run of ``N - offset`` rounds
    is rounds ``offset + 1 .. N`` of the interrupted one.

    Parameters
    ----------
    strategy : FedAvg
        The strategy (ours), its state restored.
    offset : int
        Rounds already completed.
    """

    def __init__(self, strategy: FedAvg, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self.strategy, self.offset = strategy, offset

    def start(  # type: ignore[override]  # Flower's parameters, passed on
        self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
        timeout: float = 3600, **kwargs: Any,
    ) -> Result:
        """Flower's loop over the remaining rounds, with the wrapped strategy's checks
        before and after (see :meth:`FedAvg.start`).
        """
        with self.strategy.running(grid, initial_arrays, timeout) as run_grid:
            result = super().start(run_grid, initial_arrays, num_rounds=num_rounds,
                                   timeout=timeout, **kwargs)
        return self.strategy.end_run(result, num_rounds)

    def summary(self) -> None:
        """Log the wrapped strategy's summary and where it resumes."""
        self.strategy.summary()
        log(INFO, "\t└──> Resumed after round %d", self.offset)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's, at round ``offset + server_round``."""
        return self.strategy.configure_train(self.offset + server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message],
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's, at round ``offset + server_round``."""
        return self.strategy.aggregate_train(self.offset + server_round, replies)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord,
                           config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's, at round ``offset + server_round``."""
        return self.strategy.configure_evaluate(self.offset + server_round, arrays, config,
                                                grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message],
                           ) -> MetricRecord | None:
        """The wrapped strategy's, at round ``offset + server_round``."""
        return self.strategy.aggregate_evaluate(self.offset + server_round, replies)
