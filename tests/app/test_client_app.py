"""The bundled ClientApp's node data: kept per process within a byte budget."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedgsp_flwr.app import client_app


def node(partition: int, data_dir: Path) -> Context:
    return Context(run_id=1, node_id=partition + 1, state=RecordDict(),
                   node_config={"partition-id": partition, "num-partitions": 4},
                   run_config={"dataset": "synthetic", "partition": "natural",
                               "data-dir": str(data_dir)})


def test_a_process_keeps_the_nodes_data_that_fit_its_budget(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(client_app, "_PARSED", {})
    monkeypatch.delenv(client_app.DATA_CACHE_ENV, raising=False)
    cfg = client_app.run_config(node(0, tmp_path))
    sizes = [client_app._nbytes(client_app.load_client_data(cfg, p, 4)) for p in range(3)]
    monkeypatch.setattr(client_app, "DATA_CACHE_BYTES", sizes[0] + max(sizes[1:]))
    monkeypatch.setattr(client_app, "_data", OrderedDict())
    monkeypatch.setattr(client_app, "_data_bytes", 0)
    first = [client_app.load_data(node(p, tmp_path)) for p in range(2)]
    assert all(client_app.load_data(node(p, tmp_path)) is first[p] for p in (1, 0))
    client_app.load_data(node(2, tmp_path))  # over budget: node 1, used least lately, goes
    assert client_app.load_data(node(0, tmp_path)) is first[0]
    again = client_app.load_data(node(1, tmp_path))
    assert again is not first[1]
    np.testing.assert_array_equal(again.x_train, first[1].x_train)
    monkeypatch.setenv(client_app.DATA_CACHE_ENV, "0")
    newest = client_app.load_data(node(3, tmp_path))
    assert [d is newest for d in client_app._data.values()] == [True], "the newest is kept"
    assert client_app._data_bytes == client_app._nbytes(newest)


def test_a_bad_cache_size_in_the_environment_is_refused(monkeypatch) -> None:
    monkeypatch.setenv(client_app.DATA_CACHE_ENV, "512")
    assert client_app.data_cache_bytes() == 512 * 2**20
    for bad in ("-1", "lots", "nan"):
        monkeypatch.setenv(client_app.DATA_CACHE_ENV, bad)
        with pytest.raises(ValueError, match="FEDGSP_DATA_CACHE_MB must be a number"):
            client_app.data_cache_bytes()
