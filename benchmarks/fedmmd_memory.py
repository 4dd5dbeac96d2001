"""FedMMD's MMD^2 on large outputs: pairwise distances by ``torch.cdist`` (now) against
by broadcasting (through 0.5.0).

    python benchmarks/fedmmd_memory.py [--shapes 5x10,32x10,8x65536,8x1048576]
        [--repeats 3] [--out docs/results/fedmmd-memory.json]

Per shape B x D (a mini-batch of B outputs of D values: 10 logits, or a segmentation
map's D), one forward and backward of ``fedgsp_flwr.clients.fedmmd.mmd2`` (float32,
the authors' 19 kernel widths) against the form it had through 0.5.0, which built the
B x B x D difference tensor ``(a[:, None] - b[None]).pow(2).sum(-1)``. Each variant runs
in its own fresh process, so its peak resident memory above the inputs (``ru_maxrss``)
is its own; reports that, the median seconds of ``--repeats`` calls, the ratios, and
the largest difference between the two values and gradients. Prints JSON and, with
``--out``, writes it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json


def broadcast_mmd2(x: Any, y: Any) -> Any:
    """MMD^2 as computed through 0.5.0: squared distances by broadcasting."""
    import torch

    from fedgsp_flwr.clients.fedmmd import SIGMAS

    x, y = x.flatten(1), y.flatten(1)
    scale = 1.0 / (2.0 * torch.tensor(SIGMAS, dtype=x.dtype)).reshape(-1, 1, 1)

    def kernel(a: Any, b: Any) -> Any:
        distances = (a.unsqueeze(1) - b.unsqueeze(0)).pow(2).sum(-1)
        return torch.exp(-scale * distances).sum(0)

    return (kernel(x, x).mean() + kernel(y, y).mean() - 2 * kernel(x, y).mean()
            ).clamp_min(0)


def measure(variant: str, batch: int, dim: int, repeats: int, out: Any) -> None:
    """In a fresh process: peak memory above the inputs, median time, value and
    gradient of one variant (sent through ``out``)."""
    import torch

    from fedgsp_flwr.clients.fedmmd import mmd2

    torch.set_num_threads(1)
    fn = mmd2 if variant == "cdist" else broadcast_mmd2
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, dim, generator=generator, requires_grad=True)
    y = torch.randn(batch, dim, generator=generator) + 0.1
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        x.grad = None
        start = time.perf_counter()
        value = fn(x, y)
        value.backward()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.send({"peak-mb": (peak - base) / 1024, "seconds": statistics.median(times),
              "value": value.item(), "grad": x.grad.numpy().copy()})


def run(variant: str, batch: int, dim: int, repeats: int) -> dict[str, Any]:
    """:func:`measure` in a spawned process."""
    context = mp.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=measure, args=(variant, batch, dim, repeats, send))
    process.start()
    result = receive.recv()
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="5x10,32x10,8x65536,8x1048576",
                        help="comma-separated BxD (batch x output values)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        batch, dim = (int(v) for v in shape.lower().split("x"))
        new = run("cdist", batch, dim, args.repeats)
        old = run("broadcast", batch, dim, args.repeats)
        rows.append({
            "batch": batch, "dim": dim,
            "cdist-peak-mb": round(new["peak-mb"], 1),
            "broadcast-peak-mb": round(old["peak-mb"], 1),
            "cdist-seconds": new["seconds"], "broadcast-seconds": old["seconds"],
            "time-ratio-broadcast-over-cdist": old["seconds"] / new["seconds"],
            "value-diff": abs(new["value"] - old["value"]),
            "grad-max-diff": float(abs(new["grad"] - old["grad"]).max()),
        })
        print(f"{shape}: peak {rows[-1]['cdist-peak-mb']} MB against "
              f"{rows[-1]['broadcast-peak-mb']} MB", file=sys.stderr)
    emit_json({"benchmark": "fedmmd_memory", "repeats": args.repeats, "threads": 1,
               "rows": rows}, args.out)


if __name__ == "__main__":
    main()
