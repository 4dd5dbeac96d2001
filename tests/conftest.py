"""Shared fixtures."""

from __future__ import annotations

import pytest
from flwr.supercore.task_identity import TaskIdentity
from helpers import image_bundle

from fedgsp_flwr.data import DataBundle

# Flower 1.41 stamps every new message with the running task's identity; tests build
# messages outside a task (some at import time), so give the test process one.
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


@pytest.fixture
def bundle() -> DataBundle:
    return image_bundle()


@pytest.fixture(autouse=True, scope="session")
def private_data_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the tests' dataset and partition caches out of the user's cache.

    Set in the environment, so that simulations started by the tests inherit it.
    """
    import os

    os.environ["FEDGSP_DATA_DIR"] = str(tmp_path_factory.mktemp("data-cache"))
