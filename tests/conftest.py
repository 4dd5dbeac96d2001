"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from flwr.supercore.task_identity import TaskIdentity
from helpers import REPO, image_bundle

from fedgsp_flwr.data import DataBundle

if TYPE_CHECKING:
    from fedgsp_flwr.tools.launcher import LocalSimulation


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


@pytest.fixture(scope="session")
def local_simulation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSimulation]:
    """One private local SuperLink (simulation mode, own FLWR_HOME and ports) for every
    end-to-end ``flwr run`` of the session, whatever app it runs (``run(app_dir=...)``).

    Started by the first test that asks for it; stopped with every process under it at
    the end of the session, also after a test timed out.
    """
    from fedgsp_flwr.tools.launcher import LocalSimulation

    with LocalSimulation(REPO, tmp_path_factory.mktemp("flwr-home")) as sim:
        yield sim
    assert sim.superlink_pids() == [], "the private SuperLink was not stopped"
