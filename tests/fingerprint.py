"""A seeded run of every strategy, hashed: the check that a refactor changes no behaviour.

    python tests/fingerprint.py [--rounds 3] [--out fingerprint.json] [--against old.json]

Each strategy of ``test_resume_identical.STRATEGIES`` (small and seeded, over a FakeGrid
of our handlers, as that test runs them) runs ``--rounds`` rounds uninterrupted, once
with every training hook and once over the plain handlers. For each run it records a
SHA-256 of the final model's bytes, of every group model (members, arrays, metrics), of
every round's metrics (clock metrics aside), of the messages sent (partition, type,
thread hint), of the metrics in the returned ``Result`` and of the strategy's
checkpoint state after the run (what a checkpoint file holds of it), and prints them as
JSON.
``--against`` compares with an earlier output and exits 1 naming every run and part
that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from flwr.supercore.task_identity import TaskIdentity

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "strategies"))

import test_resume_identical as base

from fedgsp_flwr.clients import HANDLERS
from fedgsp_flwr.strategies.state import record_arrays

# as tests/conftest.py: a message needs a task identity outside a ClientApp process
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
PLAIN = ("train", "evaluate", "partition")  # a ClientApp without the training hooks


def digest(value: Any) -> str:
    """SHA-256 of ``value``: arrays by dtype, shape and bytes, the rest by its JSON."""
    h = hashlib.sha256()

    def feed(v: Any) -> None:
        if isinstance(v, np.ndarray):
            h.update(f"array:{v.dtype}:{v.shape}:".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, dict):  # by key: the order keys were set in is not behaviour
            h.update(b"{")
            for k in sorted(v, key=repr):
                h.update(repr(k).encode() + b":")
                feed(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for item in v:
                feed(item)
            h.update(b",")
            h.update(b"]")
        else:
            h.update(repr(v).encode())

    feed(value)
    return h.hexdigest()


def untimed_tree(value: Any) -> Any:
    """``value`` without its clock entries (dict keys naming a time) at any depth."""
    if isinstance(value, dict):
        return {k: untimed_tree(v) for k, v in base.untimed(value).items()}
    if isinstance(value, list):
        return [untimed_tree(v) for v in value]
    return value


def fingerprint(name: str, handlers: tuple[str, ...], rounds: int) -> dict[str, str]:
    base.seed_everything()
    federation, strategy = base.Federation(base.FIRST_IDS, handlers=handlers), \
        base.STRATEGIES[name]()
    result = base.start(strategy, federation.grid, base.model_of(0), rounds,
                        base.Recorder(strategy, federation))
    return {
        "final-model": digest(record_arrays(result.arrays)),
        "group-models": digest(base.groups(strategy)),
        "round-metrics": digest({r: base.untimed(row) for r, row in strategy.history.items()}),
        "messages": digest(federation.sent()),
        "result-metrics": digest({
            part: {r: base.untimed(dict(m)) for r, m in getattr(result, part).items()}
            for part in ("train_metrics_clientapp", "evaluate_metrics_clientapp",
                         "evaluate_metrics_serverapp")}),
        "checkpoint": digest({"meta": untimed_tree((state := strategy.checkpoint_state()).meta),
                              "arrays": state.arrays}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--against", type=Path)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    runs = {}
    for name in base.STRATEGIES:
        for label, handlers in (("hooks", HANDLERS), ("plain", PLAIN)):
            runs[f"{name}/{label}"] = fingerprint(name, handlers, args.rounds)
            print(f"{name}/{label} done", file=sys.stderr)
    out = {"rounds": args.rounds, "runs": runs}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    if args.against:
        old = json.loads(args.against.read_text())["runs"]
        differ = [f"{run}: {part}" for run in sorted(set(old) | set(runs))
                  for part in sorted(set(old.get(run, {})) | set(runs.get(run, {})))
                  if old.get(run, {}).get(part) != runs.get(run, {}).get(part)]
        for line in differ:
            print("differs:", line, file=sys.stderr)
        print(f"{len(runs)} runs compared, {len(differ)} parts differ", file=sys.stderr)
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
