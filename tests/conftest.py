"""Shared fixtures; the two groups of a parallel run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from flwr.supercore.task_identity import TaskIdentity
from helpers import REPO, image_bundle

from fedgsp_flwr.data import DataBundle

if TYPE_CHECKING:
    from fedgsp_flwr.tools.launcher import LocalSimulation


# The tests that start Flower (a local SuperLink with Ray, or real SuperNodes): files, or
# single tests as "file::name". Checked against the e2e and deployment marks at collection.
FLOWER_TESTS = (
    "tests/app/test_lying_partition_e2e.py",
    "tests/app/test_quickstart_e2e.py",
    "tests/app/test_simulation_e2e.py",
    "tests/tools/test_deployment.py",
    "tests/tools/test_deployment_faults.py",
    "tests/tools/test_federation_security.py::test_sigterm_stops_a_real_secure_federation",
)
FLOWER_MARKS = ("e2e", "deployment")


def starts_flower(nodeid: str) -> bool:
    """Whether the test ``nodeid`` is one of FLOWER_TESTS."""
    return any(nodeid == t or nodeid.startswith(t + "::") for t in FLOWER_TESTS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test marked e2e or deployment that FLOWER_TESTS does not list."""
    unlisted = [item.nodeid for item in items if not starts_flower(item.nodeid)
                and any(item.get_closest_marker(mark) for mark in FLOWER_MARKS)]
    if unlisted:
        raise pytest.UsageError(f"add these Flower tests to FLOWER_TESTS in tests/conftest.py"
                                f": {unlisted}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (pytest-xdist, ``-n 2``): two groups, the Flower tests one
    after another on one worker, every other test on the other. (pytest-xdist's own
    ``xdist_group`` marks do not group under pytest 9.2: a node id is no longer a string
    it can append the group to.)

    Flower runs beside each other fail on 2 cores (two Ray engines, hop timeouts); the
    rest fills the CPU they leave idle (polls, process starts), at a lower priority.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FlowerOrNot(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "flower" if starts_flower(nodeid) else "units"

    return FlowerOrNot(config, log)


_niced = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a pytest-xdist worker, run the tests that start no Flower at nice 19: the
    Flower runs' waits and timeouts then see an otherwise quiet machine.
    """
    global _niced
    if not _niced and "PYTEST_XDIST_WORKER" in os.environ and not starts_flower(item.nodeid):
        os.nice(19)
        _niced = True


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
