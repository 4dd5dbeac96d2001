"""Whom does IDA weigh? One round of IDA from a Table 1 run's last model.

    python benchmarks/ida_weights.py RUN_FOLDER [RUN_FOLDER ...] [--sample-seeds 0,1]
        [--clients 30] [--out docs/results/ida-weights.json]

RUN_FOLDER is a complete run of ``experiments/fedgsp_table1_mnist.toml`` (its
``config.json`` and ``checkpoint.npz``, e.g. ``results/fedgsp-table1-mnist/runs/ida-seed2``).
Per sample seed: ``--clients`` of the run's clients drawn at random train the run's last
global model one local epoch as the run's clients do (its lr and batch size, one
thread), then IDA's weights (``fedgsp_flwr.core.ida.inverse_distance_weights``, IDA
alone) are set beside FedAvg's (the example counts): their Spearman correlation with
the example counts, and the share of the ten largest clients under each. Prints JSON
and, with ``--out``, writes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmark_io import emit_json

from fedgsp_flwr.app.checkpoint import load_checkpoint
from fedgsp_flwr.app.config import RunConfig
from fedgsp_flwr.app.datasets import bundle_for, load_partitions
from fedgsp_flwr.core.ida import inverse_distance_weights
from fedgsp_flwr.data.partition import client_data
from fedgsp_flwr.models import build_model
from fedgsp_flwr.training import train


def probe(folder: Path, sample_seed: int, clients: int) -> dict[str, Any]:
    """One IDA round of ``clients`` clients from the run's last model."""
    meta = json.loads((folder / "config.json").read_text())
    cfg = RunConfig.from_mapping(meta["run-config"])
    nodes = int(meta["num-nodes"])
    parts, bundle = load_partitions(cfg, nodes), bundle_for(cfg, nodes)
    state = {k: torch.from_numpy(v) for k, v in load_checkpoint(folder).model.items()}
    chosen = sorted(int(k) for k in np.random.default_rng(sample_seed).choice(
        nodes, clients, replace=False))
    models, counts = [], []
    for k in chosen:
        data = client_data(bundle, parts[k])
        net = build_model(cfg.model, data.x_train.shape[1:], data.num_classes, cfg.seed)
        net.load_state_dict(state)
        train(net, data.x_train, data.y_train, epochs=cfg.local_epochs, lr=cfg.lr,
              batch_size=cfg.batch_size, seed=k)
        models.append([v.detach().numpy().copy() for v in net.state_dict().values()
                       if v.is_floating_point()])
        counts.append(len(data.y_train))
    ida = inverse_distance_weights(models)
    examples = np.array(counts, dtype=float)
    fedavg = examples / examples.sum()
    largest = np.argsort(-examples, kind="stable")[:10]
    rho = spearmanr(examples, ida)
    return {
        "run": folder.name, "sample-seed": sample_seed, "clients": chosen,
        "examples": counts, "ida-weights": [round(float(w), 5) for w in ida],
        "spearman-ida-weight-vs-examples": round(float(rho.statistic), 3),
        "p-value": float(rho.pvalue),
        "largest-10-share-ida": round(float(ida[largest].sum()), 4),
        "largest-10-share-fedavg": round(float(fedavg[largest].sum()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="complete run folders")
    parser.add_argument("--sample-seeds", default="0",
                        help="comma-separated seeds of the client samples")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [probe(folder, int(seed), args.clients) for folder in args.runs
            for seed in args.sample_seeds.split(",")]
    for row in rows:
        print(f"{row['run']} sample {row['sample-seed']}: Spearman "
              f"{row['spearman-ida-weight-vs-examples']}, ten largest "
              f"{row['largest-10-share-ida']:.3f} (IDA) vs "
              f"{row['largest-10-share-fedavg']:.3f} (FedAvg)", file=sys.stderr)
    emit_json({"benchmark": "ida_weights", "clients": args.clients, "rows": rows},
              args.out)


if __name__ == "__main__":
    main()
