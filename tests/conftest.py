"""Shared fixtures."""

from __future__ import annotations

import pytest
from flwr.supercore.task_identity import TaskIdentity

from fedgsp_flwr.data import DataBundle
from helpers import image_bundle

# Flower 1.41 stamps every new message with the running task's identity; tests build
# messages outside a task (some at import time), so give the test process one.
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


@pytest.fixture
def bundle() -> DataBundle:
    return image_bundle()
