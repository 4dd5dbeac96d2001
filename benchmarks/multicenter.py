"""FeSEM's EM core at model scale: time and extra memory of one round's E- and M-step.

    python benchmarks/multicenter.py [--models 20,100] [--centres 2,4,6] [--dim 1627658]
        [--out FILE.json]

For each (n models, K centres): n random float32 models of ``dim`` parameters (the
MLP 784-2048-10 has 1,627,658) are stacked once (:meth:`Layout.stack`), then one
E-step and one M-step run on the stack. Prints one JSON document per line: seconds of
the stack, the E-step and the M-step (median of 3), and the peak memory they allocate
beyond the stack itself (``tracemalloc``), against the size of one model and of the
stack, which shows that no step copies the models again. ``--out`` also writes them, as the
``rows`` of one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from benchmark_io import emit_json

from fedgsp_flwr.core.multicenter import Layout, e_step, m_step


def timed(step: Callable[[], Any], repeats: int = 3) -> tuple[float, int]:
    """Median seconds of ``step`` and the peak bytes it allocates (traced once)."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    tracemalloc.start()
    step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return statistics.median(seconds), peak


def main() -> None:
    """Run the grid of sizes and print JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="20,100")
    parser.add_argument("--centres", default="2,4,6")
    parser.add_argument("--dim", type=int, default=1_627_658)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    rng = np.random.default_rng(0)
    split = args.dim - args.dim // 10  # two arrays, as a model's layers
    for n in [int(v) for v in args.models.split(",")]:
        models = [{"w": rng.normal(size=split).astype(np.float32),
                   "b": rng.normal(size=args.dim - split).astype(np.float32)}
                  for _ in range(n)]
        layout = Layout.of(models[0])
        stack_seconds, stack_peak = timed(partial(layout.stack, models), repeats=1)
        x = layout.stack(models)
        for k in [int(v) for v in args.centres.split(",")]:
            centres = x[rng.choice(n, k, replace=False)].copy()
            assignment, _ = e_step(x, centres)
            weights = np.ones(n)
            e_seconds, e_peak = timed(partial(e_step, x, centres))
            m_seconds, m_peak = timed(partial(m_step, x, assignment, weights, centres))
            rows.append({
                "models": n, "centres": k, "dim": args.dim,
                "stack-seconds": round(stack_seconds, 4),
                "e-step-seconds": round(e_seconds, 4), "m-step-seconds": round(m_seconds, 4),
                "model-mb": round(x[0].nbytes / 2**20, 2),
                "stack-mb": round(x.nbytes / 2**20, 1),
                "stack-peak-mb": round(stack_peak / 2**20, 1),
                "e-step-peak-mb": round(e_peak / 2**20, 2),
                "m-step-peak-mb": round(m_peak / 2**20, 2),
            })
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        emit_json({"benchmark": "multicenter", "models": args.models, "centres": args.centres,
                   "dim": args.dim, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
