"""Which learning rate for HierFL's Fashion-MNIST model? Central full-batch gradient
descent of ``lenet5`` (and ``mlp-dropout``, MNIST's model, beside it) on the examples
the 100 one-class users hold together (600 a class), scored on 2,000 test images.

A cloud round of experiments/hierfl_fmnist_paper.toml is 5 edge rounds of one FedSGD
step each, so its 100 rounds are 500 gradient steps of edge models; full-batch descent
on the pooled data is what those steps approach when the edges are balanced, so a rate
that does not learn here will not learn there. The paper used "the same FL parameters"
for every dataset.

    python benchmarks/hierfl_paper_lr.py [--lrs 0.1 0.2 0.3] [--steps 500] [--out docs/results/hierfl-paper-lr.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.data.sources import load_dataset
from fedgsp_flwr.models import build_model

PER_CLASS, TEST, CHECKPOINTS = 600, 2000, (20, 50, 100, 200, 300, 400, 500)


def curve(model_name: str, lr: float, steps: int, seed: int) -> dict[int, float]:
    """Test accuracy after each of :data:`CHECKPOINTS` (up to ``steps``) steps."""
    import numpy as np
    import torch

    bundle = load_dataset("fashion-mnist")
    rng = np.random.default_rng(seed)
    train = np.concatenate([rng.choice(np.flatnonzero(bundle.y_train == c), PER_CLASS,
                                       replace=False) for c in range(bundle.num_classes)])
    test = rng.choice(len(bundle.y_test), TEST, replace=False)
    x = torch.tensor(bundle.x_train[train].astype(np.float32) / 255.0)
    y = torch.tensor(bundle.y_train[train]).long()
    x_test = torch.tensor(bundle.x_test[test].astype(np.float32) / 255.0)
    y_test = torch.tensor(bundle.y_test[test]).long()
    model = build_model(model_name, tuple(x.shape[1:]), bundle.num_classes, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    accuracy = {}
    for step in range(1, steps + 1):
        model.train()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step in CHECKPOINTS or step == steps:
            model.eval()
            with torch.no_grad():
                accuracy[step] = float((model(x_test).argmax(1) == y_test).float().mean())
            print(f"{model_name} lr {lr}: step {step} accuracy {accuracy[step]:.4f}",
                  file=sys.stderr, flush=True)
    return accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    parser.add_argument("--models", nargs="+", default=["lenet5", "mlp-dropout"])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    runs = [{"model": m, "lr": lr, "accuracy": curve(m, lr, args.steps, args.seed)}
            for m in args.models for lr in args.lrs]
    emit_json({"setting": {"dataset": "fashion-mnist", "train-examples": PER_CLASS * 10,
                           "test-examples": TEST, "steps": args.steps, "seed": args.seed,
                           "threads": args.threads, "optimizer": "full-batch SGD"},
               "command": " ".join(["python", "benchmarks/hierfl_paper_lr.py", *sys.argv[1:]]),
               "runs": runs, "seconds": round(time.perf_counter() - started, 1)}, args.out)


if __name__ == "__main__":
    main()
