"""Damaged checkpoints fail with the file, the ``resume-from`` value and what to do;
the format version and the arrays' SHA-256 are stored and checked; checkpoints of
fedgsp-flwr 0.5.0 (format 1: neither) still load and resume."""

from __future__ import annotations

import io
import itertools
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Context, Message, RecordDict

import fedgsp_flwr
from fedgsp_flwr.app import client_app, server_app
from fedgsp_flwr.app.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_FORMAT,
    META_KEY,
    Checkpoint,
    CheckpointError,
    arrays_checksum,
    capture_global_rngs,
    config_changes,
    legacy_values,
    load_checkpoint,
    save_checkpoint,
)
from fedgsp_flwr.app.config import ConfigError, RunConfig
from fedgsp_flwr.app.results import read_metrics, write_atomic
from fedgsp_flwr.strategies.state import StrategyState, pairs, prefixed


def a_checkpoint() -> Checkpoint:
    rng = np.random.default_rng(0)
    return Checkpoint(
        round=2,
        model={"fc.weight": rng.standard_normal((64, 40)).astype(np.float32),
               "fc.bias": np.zeros(40, np.float32),
               "bn.num_batches_tracked": np.array(7, np.int64)},
        strategy=StrategyState({"clusters": [[1, 2]]},
                               {"clustering/gram": np.eye(3), "flags": np.array([True])}),
        rng=capture_global_rngs(),
        run_config=RunConfig().to_mapping(),
        partitions={11: 0, 12: 1},
    )


def save_checkpoint_0_5_0(folder: Path, checkpoint: Checkpoint) -> Path:
    """``save_checkpoint`` of fedgsp-flwr 0.5.0, as it was (format 1)."""
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
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    path = Path(folder) / CHECKPOINT_FILE
    write_atomic(path, buffer.getvalue())
    return path


def raw(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A checkpoint file's arrays and metadata, unchecked."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return arrays, json.loads(arrays.pop(META_KEY).tobytes().decode())


def rewrite(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write a well-formed zip (every CRC right) of these arrays and metadata."""
    buffer = io.BytesIO()
    content = {**arrays, META_KEY: np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    np.savez(buffer, **content)  # type: ignore[arg-type]
    path.write_bytes(buffer.getvalue())


def assert_equal(got: Checkpoint, expected: Checkpoint) -> None:
    assert got.round == expected.round and got.partitions == expected.partitions
    assert got.run_config == expected.run_config
    assert got.strategy.meta == expected.strategy.meta
    for mine, theirs in ((got.model, expected.model),
                         (got.strategy.arrays, expected.strategy.arrays)):
        assert list(mine) == list(theirs)
        for key in theirs:
            assert mine[key].dtype == theirs[key].dtype and mine[key].shape == theirs[key].shape
            np.testing.assert_array_equal(mine[key], theirs[key])
    np.testing.assert_array_equal(got.rng["torch"], expected.rng["torch"])


def assert_damaged(err: CheckpointError, folder: Path, cause: str) -> None:
    """The message names the file, the resume-from value, the cause, and what to do."""
    message = str(err)
    assert f"resume-from={str(folder)!r}" in message, message
    assert str(folder / CHECKPOINT_FILE) in message and "is damaged" in message, message
    assert cause in message, message
    assert "copy it again" in message and "resume-from=''" in message, message


def test_a_checkpoint_records_its_format_version_and_arrays_checksum(tmp_path: Path
                                                                     ) -> None:
    checkpoint = a_checkpoint()
    path = save_checkpoint(tmp_path, checkpoint)
    arrays, meta = raw(path)
    assert meta["format-version"] == CHECKPOINT_FORMAT == 2
    assert meta["written-by"] == f"fedgsp-flwr {fedgsp_flwr.__version__}"
    assert meta["arrays-sha256"] == arrays_checksum(arrays)
    assert_equal(load_checkpoint(tmp_path), checkpoint)


def test_the_package_version_is_0_7_0() -> None:
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["version"]
    assert fedgsp_flwr.__version__ == declared == "0.7.0"


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_a_truncated_checkpoint_names_the_file_and_resume_from(tmp_path: Path,
                                                               keep: float) -> None:
    path = save_checkpoint(tmp_path, a_checkpoint())
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    # BadZipFile ("File is not a zip file"), or EOFError for an empty file
    assert_damaged(err.value, tmp_path, "BadZipFile" if keep else "EOFError")


def test_a_corrupted_byte_names_the_file_and_resume_from(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, a_checkpoint())
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:  # a byte in the middle of the weights' data
        info = archive.getinfo("model/fc.weight.npy")
    data[info.header_offset + 200 + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert_damaged(err.value, tmp_path, "Bad CRC-32 for file 'model/fc.weight.npy'")


def test_arrays_changed_in_a_well_formed_file_fail_the_checksum(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, a_checkpoint())
    arrays, meta = raw(path)
    arrays["model/fc.bias"] = arrays["model/fc.bias"] + 1.0
    rewrite(path, arrays, meta)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert_damaged(err.value, tmp_path, f"the file records {meta['arrays-sha256']}")
    for change in ({"model/extra": np.zeros(1)},  # an array added
                   {"model/fc.bias": np.zeros(40, np.float64)}):  # same values, new dtype
        arrays, meta = raw(save_checkpoint(tmp_path, a_checkpoint()))
        rewrite(path, {**arrays, **change}, meta)
        with pytest.raises(CheckpointError, match="SHA-256"):
            load_checkpoint(tmp_path)


@pytest.mark.parametrize("meta_change", [
    {"round": None}, {"rng": 3}, {"format-version": "2"}, {"format-version": 0}])
def test_malformed_metadata_is_a_damaged_file(tmp_path: Path,
                                              meta_change: dict[str, Any]) -> None:
    arrays, meta = raw(save_checkpoint(tmp_path, a_checkpoint()))
    for key, value in meta_change.items():
        if value is None:
            del meta[key]
        else:
            meta[key] = value
    rewrite(tmp_path / CHECKPOINT_FILE, arrays, meta)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert_damaged(err.value, tmp_path, "")


def test_metadata_that_is_not_json_is_a_damaged_file(tmp_path: Path) -> None:
    arrays, _ = raw(save_checkpoint(tmp_path, a_checkpoint()))
    buffer = io.BytesIO()
    content = {**arrays, META_KEY: np.frombuffer(b"\xff{not json", dtype=np.uint8)}
    np.savez(buffer, **content)  # type: ignore[arg-type]
    (tmp_path / CHECKPOINT_FILE).write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert_damaged(err.value, tmp_path, "UnicodeDecodeError")


def test_a_checkpoint_of_a_newer_format_is_refused_with_the_versions(tmp_path: Path
                                                                     ) -> None:
    arrays, meta = raw(save_checkpoint(tmp_path, a_checkpoint()))
    meta.update({"format-version": CHECKPOINT_FORMAT + 1, "written-by": "fedgsp-flwr 9.0"})
    rewrite(tmp_path / CHECKPOINT_FILE, arrays, meta)
    with pytest.raises(CheckpointError, match=r"format 3 \(fedgsp-flwr 9.0\); fedgsp-flwr "
                                              r"0.7.0 reads formats 1 to 2"):
        load_checkpoint(tmp_path)


def test_a_checkpoint_written_by_0_5_0_still_loads(tmp_path: Path) -> None:
    checkpoint = a_checkpoint()
    path = save_checkpoint_0_5_0(tmp_path, checkpoint)
    assert "format-version" not in raw(path)[1]
    assert_equal(load_checkpoint(tmp_path), checkpoint)


def test_the_serverapp_reports_a_damaged_checkpoint_as_a_config_error(tmp_path: Path
                                                                      ) -> None:
    folder = tmp_path / "run"
    path = save_checkpoint(folder, a_checkpoint())
    path.write_bytes(path.read_bytes()[:100])
    cfg = RunConfig.from_mapping({"resume-from": str(folder), "num-server-rounds": 5})
    with pytest.raises(ConfigError) as err:
        server_app.resumable_checkpoint(cfg)
    assert_damaged(err.value, folder, "BadZipFile")  # type: ignore[arg-type]


def test_a_0_5_0_run_config_without_node_wait_timeout_resumes() -> None:
    old = RunConfig().to_mapping()
    del old["node-wait-timeout"]
    assert config_changes(old, RunConfig.from_mapping({"node-wait-timeout": 30.0})
                          .to_mapping()) == []


def test_a_run_config_without_the_keys_added_since_resumes_with_their_old_values() -> None:
    old = RunConfig().to_mapping()
    del old["fesem-weighted"], old["hierfl-reach-by"]
    assert legacy_values(old) == {"fesem-weighted": True, "hierfl-reach-by": "user"}
    assert config_changes(old, RunConfig().to_mapping()) == []
    # a checkpoint that has them is held to them
    new = RunConfig().to_mapping()
    assert config_changes(new, RunConfig.from_mapping({"fesem-weighted": True})
                          .to_mapping()) == ["fesem-weighted"]


RUN_IDS = itertools.count(7000)


def app_grid(cfg: RunConfig, node_ids: list[int]) -> FakeGrid:
    """Nodes running the app's ClientApp for ``cfg``; node i holds partition i."""
    handlers, run_id = {}, next(RUN_IDS)
    for partition, node in enumerate(node_ids):
        context = Context(run_id=run_id, node_id=node, state=RecordDict(),
                          node_config={"partition-id": partition,
                                       "num-partitions": len(node_ids)},
                          run_config=cfg.to_mapping())

        def handle(message: Message, c: Context = context) -> Message:
            return client_app.app(message, c)
        handlers[node] = handle
    return FakeGrid(handlers)


def test_a_run_checkpointed_by_0_5_0_resumes(tmp_path: Path) -> None:
    base = {"dataset": "synthetic", "partition": "natural", "batch-size": 16, "lr": 0.1,
            "min-available-nodes": 3, "train-examples": 300, "test-examples": 100,
            "fraction-evaluate": 0.0, "seed": 5, "results-dir": str(tmp_path),
            "data-dir": str(tmp_path / "data"), "strategy": "fedavg"}
    cfg = RunConfig.from_mapping({**base, "num-server-rounds": 1, "run-name": "old"})
    folder = server_app.run(app_grid(cfg, [1, 2, 3]), cfg)
    # What 0.5.0 wrote after round 1: format 1, a run config without node-wait-timeout.
    written = load_checkpoint(folder)
    del written.run_config["node-wait-timeout"]
    save_checkpoint_0_5_0(folder, written)
    resumed_cfg = RunConfig.from_mapping({**base, "num-server-rounds": 2,
                                          "resume-from": str(folder)})
    assert server_app.run(app_grid(resumed_cfg, [4, 5, 6]), resumed_cfg) == folder
    metrics = read_metrics(folder)
    assert metrics is not None and metrics["status"] == "complete"
    assert [r["round"] for r in metrics["rounds"]] == [0, 1, 2]
    assert raw(folder / CHECKPOINT_FILE)[1]["format-version"] == CHECKPOINT_FORMAT
