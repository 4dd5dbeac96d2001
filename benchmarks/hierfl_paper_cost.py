"""Compute of one HierFL cloud round in the paper's setting, per model: is the
Fashion-MNIST grid (the paper's CNN) affordable on this machine?

One cloud round of experiments/hierfl_mnist_paper.toml is 100 users x tau2 = 5 edge
rounds x tau1 = 1 full-batch step over 600 examples: 500 steps of a 600-example batch.
This times that step (SGD, cross-entropy, torch on ``--threads`` threads; random
28x28 inputs: the cost does not depend on the pixels) for ``mlp-dropout`` (the MNIST
run's model), ``cnn`` (the FedAvg CNN) and ``lenet5`` (LeNet-5, the standard small
CNN: candidates for the paper's Fashion-MNIST CNN, whose widths are lost), and reports the training compute of a cloud round and of a
100-round run. Message hops and evaluation come on top (the MNIST runs took 11-14 s
a round against the 4 s of compute this reports for ``mlp-dropout``).

    python benchmarks/hierfl_paper_cost.py [--steps 10] [--out docs/results/hierfl-paper-cost.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.models import build_model

STEPS_PER_CLOUD_ROUND = 100 * 5 * 1  # users x tau2 x tau1
BATCH = 600


def step_seconds(name: str, steps: int) -> float:
    """Mean seconds of one SGD step of ``name`` over a batch of ``BATCH`` examples."""
    import torch

    model = build_model(name, (1, 28, 28), 10, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(2):  # warm-up
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    report = {"batch": BATCH, "steps-per-cloud-round": STEPS_PER_CLOUD_ROUND,
              "threads": args.threads, "models": {}}
    for name in ("mlp-dropout", "cnn", "lenet5"):
        seconds = step_seconds(name, args.steps)
        report["models"][name] = {
            "step-s": seconds, "cloud-round-compute-s": seconds * STEPS_PER_CLOUD_ROUND,
            "run-100-rounds-compute-h": seconds * STEPS_PER_CLOUD_ROUND * 100 / 3600}
    emit_json(report, args.out)


if __name__ == "__main__":
    main()
