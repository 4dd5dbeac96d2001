"""Per-round checkpoints of the server state, and resuming a run from one.

After every round the ServerApp writes ``checkpoint.npz`` into the run's results
folder, atomically (a temporary file, then a rename): the round, the global model, the
strategy's state (cluster/centre/edge models, assignments, cached histograms and
sketches, its random generators) and the global random generators (Python's, which
Flower's node sampling uses, numpy's and torch's). ``resume-from=<folder>`` starts a
run from the last complete round of that folder and continues writing into it.

The file's metadata holds its format version (:data:`CHECKPOINT_FORMAT`) and the
SHA-256 of its arrays (:func:`arrays_checksum`); loading checks both, so a file cut
short or altered after it was written fails with its path, the ``resume-from`` value
and what to do. Checkpoints of fedgsp-flwr 0.5.0 and earlier (format 1: neither) still
load.

Node ids change from run to run (the simulation engine draws them; a restarted
SuperNode gets a new one). A checkpoint therefore keeps each node's reported
``partition-id``; on resume the nodes are asked again (``query.partition``) and the
state of an old node is handed to the new node of the same partition. Strategies save
and restore their state through ``checkpoint_state`` and ``restore_state``
(:class:`~fedgsp_flwr.strategies.FedAvg` and its subclasses).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from .. import __version__
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
CHECKPOINT_FORMAT = 2
"""The format version :func:`save_checkpoint` writes: 2 adds the format version and
the arrays' SHA-256 to format 1 (fedgsp-flwr 0.5.0 and earlier, which had neither)."""
# Run-config keys a resumed run may change; every other key must match the checkpoint's.
# node-wait-timeout is also missing from format-1 checkpoints' run configs.
RESUMABLE_CHANGES = frozenset({
    "num-server-rounds", "results-dir", "run-name", "resume-from", "train-timeout",
    "query-timeout", "relay-poll", "data-dir", "client-state-dir", "node-wait-timeout",
})


# Keys added after checkpoints were written, with the value that keeps the method of the
# code that wrote them: a checkpoint without one resumes with that value (2026-12-02).
LEGACY_VALUES: dict[str, Any] = {"fesem-weighted": True, "hierfl-reach-by": "user"}


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


def arrays_checksum(arrays: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of named arrays: each one's name, dtype, shape and bytes (C
    order), in name order; the same for the arrays written and the arrays read back.
    """
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        header = json.dumps([name, array.dtype.str, list(array.shape)]).encode()
        digest.update(len(header).to_bytes(8, "little") + header)
        digest.update(array.tobytes(order="C"))
    return digest.hexdigest()


def save_checkpoint(folder: str | Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint.npz`` into ``folder`` atomically; return its path.

    The metadata records the format version (:data:`CHECKPOINT_FORMAT`), the package
    version and the SHA-256 of the arrays (:func:`arrays_checksum`).
    """
    torch_state = checkpoint.rng.get("torch")
    arrays = {**prefixed(checkpoint.model, "model"),
              **prefixed(checkpoint.strategy.arrays, "strategy")}
    if torch_state is not None:
        arrays["rng/torch"] = np.asarray(torch_state, dtype=np.uint8)
    meta = {
        "format-version": CHECKPOINT_FORMAT,
        "written-by": f"fedgsp-flwr {__version__}",
        "arrays-sha256": arrays_checksum(arrays),
        "round": checkpoint.round,
        "strategy": checkpoint.strategy.meta,
        "rng": {k: v for k, v in checkpoint.rng.items() if k != "torch"},
        "run-config": checkpoint.run_config,
        "partitions": pairs(checkpoint.partitions),
    }
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy stub quirk
    path = Path(folder) / CHECKPOINT_FILE
    write_atomic(path, buffer.getvalue())
    return path


def load_checkpoint(folder: str | Path) -> Checkpoint:
    """Read ``checkpoint.npz`` of a results folder (``resume-from``).

    Parameters
    ----------
    folder : str | Path
        The results folder, as ``resume-from`` names it.

    Returns
    -------
    Checkpoint
        Its content, the arrays' checksum checked (format 2 on; format 1 has none).

    Raises
    ------
    CheckpointError
        If the folder has no checkpoint, the file is damaged (cut short, altered: not a
        readable zip, a bad CRC, metadata missing or malformed, arrays whose SHA-256
        differs from the stored one), or a newer fedgsp-flwr wrote it. The message names
        the file, the ``resume-from`` value and what to do.
    """
    path = Path(folder).expanduser() / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(
            f"resume-from={str(folder)!r}: {path} does not exist (a run writes it after "
            "its first round): name the results folder of a run that completed a round, "
            "or set resume-from='' to start a new run")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop(META_KEY).tobytes().decode())
        if not isinstance(meta, dict):
            # ValueError: reported with the file as damaged, like the readers' errors
            raise ValueError(  # noqa: TRY004
                f"its metadata is a JSON {type(meta).__name__}, not an object")
    # Anything the zip, npy or JSON readers raise on a damaged file (BadZipFile, a bad
    # CRC, EOFError, zlib.error, NotImplementedError for a garbled compression method,
    # ValueError, KeyError for a missing member, MemoryError for a garbled shape ...).
    except Exception as err:
        raise CheckpointError(_damaged(folder, path, f"{type(err).__name__}: {err}")
                              ) from err
    version = meta.get("format-version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(_damaged(folder, path, f"format version {version!r}"))
    if version > CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"resume-from={str(folder)!r}: {path} has checkpoint format {version} "
            f"({meta.get('written-by', 'a newer fedgsp-flwr')}); fedgsp-flwr {__version__} "
            f"reads formats 1 to {CHECKPOINT_FORMAT}: resume it with the version that "
            "wrote it, or a newer one")
    if version >= 2:
        stored, found = meta.get("arrays-sha256"), arrays_checksum(arrays)
        if stored != found:
            raise CheckpointError(_damaged(
                folder, path, f"the arrays' SHA-256 is {found}, the file records {stored}"))
    try:
        rng = dict(meta["rng"])
        if "rng/torch" in arrays:
            rng["torch"] = arrays.pop("rng/torch")
        return Checkpoint(
            round=int(meta["round"]),
            model=under(arrays, "model"),
            strategy=StrategyState(meta["strategy"], under(arrays, "strategy")),
            rng=rng,
            run_config=dict(meta["run-config"]),
            partitions=from_pairs(meta["partitions"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(_damaged(
            folder, path, f"malformed metadata: {type(err).__name__}: {err}")) from err


def _damaged(folder: str | Path, path: Path, cause: str) -> str:
    """The error message of a damaged checkpoint: the file, the cause, what to do."""
    return (f"resume-from={str(folder)!r}: the checkpoint {path} is damaged ({cause}). "
            "A run writes it whole (a temporary file, then a rename), so it was cut short "
            "or altered afterwards (a full disk, an interrupted copy): copy it again from "
            "where the run wrote it or from a backup, or set resume-from='' to start a new "
            "run")


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The run-config keys a resumed run changes that it must not change (not the keys
    the saved config predates: the run resumes with their :func:`legacy_values`).
    """
    keys = (set(saved) | set(current)) - RESUMABLE_CHANGES - set(legacy_values(saved))
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def legacy_values(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`LEGACY_VALUES` of the keys that the saved run config predates."""
    return {k: v for k, v in LEGACY_VALUES.items() if k not in saved}


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


def ResumedRounds(strategy: FedAvg, offset: int) -> FedAvg:  # was a class
    """Deprecated (0.7.0; goes in 0.8.0): ``strategy`` with ``resumed_after = offset``,
    whose :meth:`~fedgsp_flwr.strategies.fedavg.FedAvg.start` runs rounds
    ``offset + 1 ..``. Its ``configure_*`` and ``aggregate_*`` methods take the round
    numbers they are given (the class added ``offset`` to them).
    """
    warnings.warn("ResumedRounds(strategy, offset) is now strategy.resumed_after = offset "
                  "(0.7.0); it goes in 0.8.0", DeprecationWarning, stacklevel=2)
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    strategy.resumed_after = offset
    return strategy
