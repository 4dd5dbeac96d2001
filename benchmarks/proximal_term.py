"""Cost of FedProx's proximal term in one client's local epoch, FedGSP's Table 1 setting.

    python benchmarks/proximal_term.py [--repeats 5] [--out docs/results/proximal-term.json]

One client of Table 1 (226 MNIST-shaped examples, the paper's CNN ``cnn-leaf`` with 6.6M
parameters, SGD lr 0.01, batch 5, 1 epoch, one torch thread as a simulation actor has)
trains three ways in the same process, alternating: without the term (FedAvg), with the
term's gradient added in place (``fedgsp_flwr.training.train``, mu 0.01), and with the
term back-propagated through autograd (the reference form, ``loss + mu/2 ||w - w0||^2``).
Reports the median seconds of each, the ratios, and whether the last two trained the same
weights bit for bit. Prints JSON and, with ``--out``, writes it.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.models import build_model
from fedgsp_flwr.training import train

EXAMPLES, BATCH, LR, MU = 226, 5, 0.01, 0.01


def autograd_epoch(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, seed: int) -> None:
    """One epoch as :func:`train` does it, the proximal term back-propagated."""
    x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
    anchor = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    order = torch.randperm(len(y_t), generator=torch.Generator().manual_seed(seed))
    model.train()
    for start in range(0, len(order), BATCH):
        batch = order[start : start + BATCH]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_t[batch]), y_t[batch])
        loss = loss + MU / 2 * sum((p - a).pow(2).sum()
                                   for p, a in zip(model.parameters(), anchor, strict=True))
        loss.backward()
        optimizer.step()


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run(repeats: int) -> dict[str, Any]:
    """Median seconds per local epoch of each form, and their ratios."""
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.random((EXAMPLES, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, EXAMPLES)
    start = build_model("cnn-leaf", (1, 28, 28), 10, seed=0)
    forms = {
        "no-term": lambda m: train(m, x, y, epochs=1, lr=LR, batch_size=BATCH, seed=0),
        "gradient-in-place": lambda m: train(m, x, y, epochs=1, lr=LR, batch_size=BATCH,
                                             seed=0, proximal_mu=MU),
        "autograd": lambda m: autograd_epoch(m, x, y, seed=0),
    }
    seconds: dict[str, list[float]] = {name: [] for name in forms}
    trained: dict[str, torch.Tensor] = {}
    for _ in range(repeats):
        for name, form in forms.items():
            model = copy.deepcopy(start)
            began = time.perf_counter()
            form(model)
            seconds[name].append(time.perf_counter() - began)
            trained[name] = flat(model)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    return {
        "setting": {"model": "cnn-leaf", "parameters": int(flat(start).numel()),
                    "examples": EXAMPLES, "batch-size": BATCH, "lr": LR, "mu": MU,
                    "torch-threads": 1, "repeats": repeats},
        "median-seconds": median,
        "term-cost-ratio": (median["autograd"] - median["no-term"])
        / max(median["gradient-in-place"] - median["no-term"], 1e-9),
        "epoch-ratio-autograd-over-in-place": median["autograd"] / median["gradient-in-place"],
        "same-weights-bit-for-bit": bool(torch.equal(trained["autograd"],
                                                     trained["gradient-in-place"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    emit_json(run(args.repeats), args.out)


if __name__ == "__main__":
    main()
