"""What a fresh ClientApp process loads: in deployment a SuperNode starts one per message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# In a fresh interpreter: the bundled ClientApp answers two queries, then trains once.
SCRIPT = """
import json, sys
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
import fedgsp_flwr.app.client_app as client

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
context = Context(run_id=1, node_id=1, state=RecordDict(),
                  node_config={"partition-id": 0, "num-partitions": 3},
                  run_config={"dataset": "synthetic", "partition": "natural"})
seen = {}
for kind in ("query.partition", "query.histogram"):
    reply = client.app(Message(RecordDict(), dst_node_id=1, message_type=kind), context)
    seen[kind] = [reply.has_error(), "torch" in sys.modules]
model = client.make_model(context, client.load_data(context))
content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                      "config": ConfigRecord({"lr": 0.1, "server-round": 1})})
reply = client.app(Message(content, dst_node_id=1, message_type="train"), context)
seen["train"] = [reply.has_error(), "torch._dynamo" in sys.modules]
print(json.dumps(seen))
"""


def test_queries_load_no_torch_and_training_no_torch_dynamo(tmp_path: Path) -> None:
    # torch costs 2.5 s of CPU to import here, and any torch.optim optimizer imports
    # torch._dynamo (2.4 s more): per message, on every SuperNode
    # (benchmarks/client_process.py). No wall-clock bound of its own (pytest-timeout's
    # applies): on CI's units worker (niceness 19) beside the Flower runs it took > 120 s.
    env = {"FEDGSP_DATA_DIR": str(tmp_path), "PATH": "",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"query.partition": [False, False], "query.histogram": [False, False],
                    "train": [False, False]}, seen
