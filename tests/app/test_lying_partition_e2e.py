"""End to end through Flower's simulation engine (issue 46): one partition lies in its
train replies, and every strategy exported by ``fedgsp_flwr.strategies`` still completes.

One ``flwr run`` of the test app ``tests/lying`` on 4 simulated nodes: a plain ClientApp
(quickstart-shaped ``train`` / ``evaluate`` handlers, plus our hooks so that every
strategy runs its own algorithm) behind a mod through which partition 0 corrupts the
first array of each ArrayRecord of every train reply, keeping its declared dtype and
shape:

- ``garbage``: garbage bytes (behind numpy's magic string);
- ``shape``: the bytes of a (1,)-shaped array (numpy would broadcast it into a mean).

Its ServerApp runs each exported strategy at default arguments (4 nodes are enough for
every default) for 2 rounds, once per lie, and records whether ``start()`` completed,
whether the final model is finite with the initial model's shapes, every train message
sent to partition 0's node (an exchange whose reply is a lie) and the WARNING lines.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from flwr.serverapp.strategy import Strategy

import fedgsp_flwr.strategies as exported
from fedgsp_flwr.tools.launcher import LocalSimulation

pytestmark = pytest.mark.e2e

APP = Path(__file__).resolve().parents[1] / "lying"
NODES, ROUNDS = 4, 2
LIES = ("garbage", "shape")
# Exported base classes, not strategies one runs.
BASES = ("ServerSideRound", "RelayStrategy")
PARTITION = re.compile(r"partition[- =:]*(-?\d+)")


def exported_strategies() -> list[str]:
    return [name for name in exported.__all__
            if inspect.isclass(cls := getattr(exported, name)) and issubclass(cls, Strategy)
            and not inspect.isabstract(cls) and name not in BASES]


def naming(lines: list[str], node: int) -> list[str]:
    """The lines that name node ``node`` (``node <id>``, the id not a prefix)."""
    pattern = re.compile(rf"\bnode {node}(?!\d)")
    return [line for line in lines if pattern.search(line)]


def problems(row: dict[str, Any], liar: int, sound: list[int]) -> list[str]:
    """What is wrong with one strategy's run against the lying partition."""
    found = []
    if not row["completed"]:
        found.append(f"start() did not complete: {row['error']}\n{row['traceback']}")
    if not row["model-ok"]:
        found.append(f"final model: {row['model-problem']}")
    asked = row["asked"]
    if not asked:
        found.append("partition 0 was never asked to train: the lie was not exercised")
    if any(a["lie"] != row["lie"] for a in asked):
        found.append(f"a train message to partition 0 lost the train config: {asked}")
    named = naming(row["warnings"], liar)
    # one WARNING line naming the node per refused exchange, none more
    if len(named) != len(asked):
        found.append(f"{len(asked)} lying replies ({[a['message-type'] for a in asked]}), "
                     f"{len(named)} WARNING lines naming node {liar}: {named}")
    wrong = [line for line in named
             if any(int(p) != 0 for p in PARTITION.findall(line))]
    if wrong:
        found.append(f"WARNING lines give node {liar} a partition other than 0: {wrong}")
    blamed = [line for node in sound for line in naming(row["warnings"], node)]
    if blamed:
        found.append(f"WARNING lines name sound nodes: {blamed}")
    return found


def test_every_strategy_completes_against_a_lying_partition(
        local_simulation: LocalSimulation, tmp_path: Path) -> None:
    app = tmp_path / "lying"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    outcome = local_simulation.run(
        {"num-server-rounds": ROUNDS, "num-nodes": NODES, "every-lie": True,
         "out-dir": str(out)},
        num_supernodes=NODES, log_path=tmp_path / "run.log", timeout=900, app_dir=app)
    print(f"flwr run: {outcome.status} in {outcome.wall_time:.0f} s")
    # flwr run --stream exits 0 on a failed run: the status is `flwr ls`'s
    assert outcome.ok, outcome.cause()
    summary = json.loads((out / "summary.json").read_text())
    liar = summary["liar-node"]
    sound = [node for partition, node in summary["nodes"].items() if partition != "0"]
    assert summary["liar-partition"] == 0 and len(sound) == NODES - 1, summary["nodes"]
    rows = summary["rows"]
    expected = [(name, lie) for name in exported_strategies() for lie in LIES]
    assert [(r["strategy"], r["lie"]) for r in rows] == expected
    failures = {f"{r['strategy']} ({r['lie']})": found for r in rows
                if (found := problems(r, liar, sound))}
    report = "\n".join(f"{run}:\n  " + "\n  ".join(found) for run, found in failures.items())
    assert not failures, (f"{len(failures)} of {len(rows)} runs went wrong "
                          f"(partition 0 is node {liar}):\n{report}")
