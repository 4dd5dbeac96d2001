"""Shared fixtures; the groups of a parallel run."""

from __future__ import annotations

import os

# One OpenMP/BLAS thread a process, in the tests and every process they start (Ray sets
# it for its actors; LocalFederation's nodes default to it): three workers and their
# federations share 2 cores, and torch's spinning threads then waste them.
# tests/clients/test_handlers.py + test_training.py beside a background run: 35.6 s
# (22 s CPU) with two threads, 22.5 s (14 s CPU) with one (2026-12-02).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from flwr.supercore.task_identity import TaskIdentity
from helpers import bundled_app, image_bundle

from fedgsp_flwr.data import DataBundle

if TYPE_CHECKING:
    from fedgsp_flwr.tools.launcher import LocalSimulation


# The tests that start Flower, by kind: files, or single tests as "file::name". Checked
# against their marks at collection.
FLOWER_TESTS = {
    # e2e: a local SuperLink in simulation mode, Ray
    "simulation": ("tests/app/test_lying_partition_e2e.py",
                   "tests/app/test_quickstart_e2e.py",
                   "tests/app/test_simulation_e2e.py"),
    # deployment: real flower-superlink and flower-supernode processes
    "deployment": ("tests/tools/test_deployment.py",
                   ("tests/tools/test_federation_security.py::"
                    "test_sigterm_stops_a_real_secure_federation")),
    # deployment too, on a worker of their own: each waits out a killed node's reply
    # timeout, idle, while the secure federation runs its checks
    "faults": ("tests/tools/test_deployment_faults.py",),
}
GROUPS_OF_MARK = {"e2e": ("simulation",), "deployment": ("deployment", "faults")}
# A worker's niceness by group: the SuperNodes' reply timeouts first, then the engine's
# runs, then the rest in the CPU they leave idle.
NICENESS = {"deployment": 0, "faults": 0, "simulation": 5, "units": 19}


def group_of(nodeid: str) -> str:
    """The test's group: a key of ``FLOWER_TESTS``, or ``units``."""
    for group, tests in FLOWER_TESTS.items():
        if any(nodeid == t or nodeid.startswith(t + "::") for t in tests):
            return group
    return "units"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse an e2e or deployment test that FLOWER_TESTS does not list under its mark."""
    unlisted = [item.nodeid for item in items for mark, groups in GROUPS_OF_MARK.items()
                if item.get_closest_marker(mark) and group_of(item.nodeid) not in groups]
    if unlisted:
        raise pytest.UsageError(f"list these tests in FLOWER_TESTS (tests/conftest.py) under "
                                f"their mark: {unlisted}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n 4 --dist loadgroup`` (pytest-xdist): one worker per group of ``group_of``.

    Each group runs one test at a time: two simulations at once would share one Ray on
    2 cores. The killed-node tests' federations (group ``faults``) run beside the secure
    federation's, with a live-reply timeout that allows for it. A deployment run waits on
    Flower's polls (a SuperNode's 3 s idle poll, a ClientApp process per message) while
    a simulation keeps the cores busy, so the two overlap, each slower beside the other
    (README, "Run the tests"). (pytest-xdist's own
    ``xdist_group`` marks do not group under pytest 9.2: a node id is no longer a string
    it can append the group to.)
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


_niced = False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a pytest-xdist worker, take the niceness of the first test's group (NICENESS)."""
    global _niced
    if not _niced and "PYTEST_XDIST_WORKER" in os.environ:
        os.nice(NICENESS[group_of(item.nodeid)])
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

    app = bundled_app(tmp_path_factory.mktemp("app"))
    with LocalSimulation(app, tmp_path_factory.mktemp("flwr-home")) as sim:
        yield sim
    assert sim.superlink_pids() == [], "the private SuperLink was not stopped"
