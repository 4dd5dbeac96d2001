"""One train message through the bundled ClientApp, in a simulated worker's process.

    python benchmarks/client_message.py [--nodes 100] [--messages 300] [--model mlp-dropout]
        [--label NAME] [--out FILE.json]

In one process, ``--nodes`` nodes of one-class MNIST, each message a full-batch step
(HierFL's FedSGD user step, batch 600) through ``fedgsp_flwr.app.client_app.app`` with
the thread hint, to a node drawn at random (a worker's share of a round comes in no
order): every node answers once first, then ``--messages`` messages are timed. Prints the
median and mean milliseconds per message and the fedgsp_flwr in use. Run it with another
checkout's interpreter (its editable install) to compare code versions; ``--out``
appends the result, under ``--label``, to a JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedgsp_flwr
from fedgsp_flwr.app import client_app


def main() -> None:
    """Time the messages and print the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--model", default="mlp-dropout")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a Ray worker with one CPU
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    run_config = {"dataset": "mnist", "partition": "one-class", "model": args.model,
                  "batch-size": 600}
    contexts = [Context(run_id=1, node_id=p + 1, state=RecordDict(), run_config=run_config,
                        node_config={"partition-id": p, "num-partitions": args.nodes})
                for p in range(args.nodes)]
    model = client_app.make_model(contexts[0], client_app.load_data(contexts[0]))
    arrays = ArrayRecord(model.state_dict())

    def message() -> Message:
        config = ConfigRecord({"lr": 0.1, "server-round": 1, "local-steps": 1,
                               "batch-size": 600, "num-threads": 1})
        return Message(RecordDict({"arrays": arrays, "config": config}), dst_node_id=1,
                       message_type="train")

    for context in contexts:
        assert not client_app.app(message(), context).has_error()
    rng = random.Random(0)
    seconds = []
    for _ in range(args.messages):
        context = contexts[rng.randrange(args.nodes)]
        started = time.perf_counter()
        client_app.app(message(), context)
        seconds.append(time.perf_counter() - started)
    result = {"fedgsp_flwr": str(Path(fedgsp_flwr.__file__).parent), "nodes": args.nodes,
              "messages": args.messages, "model": args.model,
              "command": " ".join(["python", "benchmarks/client_message.py", *sys.argv[1:]]),
              "median-ms": 1e3 * statistics.median(seconds),
              "mean-ms": 1e3 * statistics.mean(seconds)}
    print(json.dumps(result, indent=1))
    if args.out:
        path = Path(args.out)
        runs = json.loads(path.read_text()) if path.exists() else {}
        runs.setdefault(args.label or "run", []).append(result)
        path.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
