"""The ServerApp of Flower's quickstart-pytorch, with ``FedAvg(...)`` replaced by each
strategy of fedgsp-flwr in turn, default arguments only.

It writes ``<out-dir>/summary.json`` (one entry per strategy: central accuracy per
round, the final model's tensors, rejected replies, warnings about missing hooks, the
group models, the error if the run stopped) and each strategy's final model, as the
quickstart saves ``result.arrays``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedgsp_flwr.strategies import (
    CFL,
    IDA,
    IFCA,
    Ditto,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedFusion,
    FedGSP,
    FedMMD,
    FedProx,
    FedYogi,
    FeSEM,
    HierFL,
    SemiFL,
    StoCFL,
    TrainingStalled,
)
from quickstart_app.task import Net, load_centralized_dataset, test

STRATEGIES = {"fedavg": FedAvg, "fedprox": FedProx, "fedgsp": FedGSP, "semifl": SemiFL,
              "hierfl": HierFL, "stocfl": StoCFL, "fesem": FeSEM, "ifca": IFCA, "cfl": CFL,
              "ditto": Ditto, "fedadagrad": FedAdagrad, "fedadam": FedAdam,
              "fedyogi": FedYogi, "ida": IDA, "fedmmd": FedMMD, "fedfusion": FedFusion}
# Our summary of what a round did beside the client metrics, when the strategy has it.
REPORTED = ("cpd-median", "num-groups", "num-clusters", "ari", "edge-class-coverage-mean",
            "label-coverage")

app = ServerApp()


class Warnings(logging.Handler):
    """Counts the WARNING lines that say the ClientApp lacks one of our hooks."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.missing: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "ClientApp has no '" in record.getMessage():
            self.missing.append(record.getMessage().split(" (")[0])


def run_one(entry: str, grid: Grid, context: Context, out: Path) -> dict[str, Any]:
    """One strategy with default arguments, as the quickstart runs FedAvg
    (``name:key=value;...`` sets arguments, e.g. ``semifl:cluster_size=2``).
    """
    name, _, given = entry.partition(":")
    kwargs = {k: json.loads(v) for k, v in (a.split("=") for a in given.split(";") if a)}
    strategy = STRATEGIES[name](**kwargs)
    testloader = load_centralized_dataset(int(context.run_config["train-examples"]))
    accuracy: dict[int, float] = {}

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = test(model, testloader)
        accuracy[server_round] = acc
        return MetricRecord({"accuracy": acc, "loss": loss})

    torch.manual_seed(0)  # the same initial model in every run
    initial = ArrayRecord(Net().state_dict())
    warnings = Warnings()
    logging.getLogger("flwr").addHandler(warnings)
    started, error = time.monotonic(), ""
    try:
        result = strategy.start(
            grid=grid, initial_arrays=initial,
            num_rounds=int(context.run_config["num-server-rounds"]),
            train_config=ConfigRecord({"lr": float(context.run_config["lr"])}),
            evaluate_fn=global_evaluate)
        arrays = result.arrays
    except TrainingStalled as err:
        error, arrays = str(err), err.arrays or ArrayRecord()
    finally:
        logging.getLogger("flwr").removeHandler(warnings)
    state_dict = arrays.to_torch_state_dict()
    torch.save(state_dict, out / f"{entry.replace(':', '-')}-final_model.pt")
    history = strategy.history
    last = history.get(max(history, default=0), {})
    return {
        "strategy": entry, "error": error, "seconds": time.monotonic() - started,
        "central-accuracy": [accuracy[r] for r in sorted(accuracy)],
        "trained-rounds": strategy.progress.trained_rounds,
        "final-tensors": len(state_dict), "final-bytes": arrays.count_bytes(),
        "moved": any(not torch.equal(state_dict[k], v) for k, v in
                     initial.to_torch_state_dict().items() if k in state_dict),
        "final-shapes-match": [tuple(v.shape) for v in state_dict.values()] == [
            tuple(v.shape) for v in Net().state_dict().values()],
        "rejected": sum(r.get("train-rejected", 0) + r.get("eval-rejected", 0)
                        + r.get("skipped-nodes", 0) for r in history.values()),
        "missing-hook-warnings": warnings.missing,
        "client-metrics": sorted(k for k in last if k.startswith(("train", "eval")) and k
                                 not in ("train-replies", "train-rejected", "train-time",
                                         "eval-replies", "eval-rejected", "eval-time")
                                 and not k.endswith("-clients") and k != "eval-placed"),
        "group-models": {str(g): len(m.nodes) for g, m in strategy.group_models().items()},
        "reported": {k: last[k] for k in REPORTED if k in last},
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run every strategy named in the run config with its default arguments."""
    out = Path(str(context.run_config["out-dir"])).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_one(name.strip(), grid, context, out)
            for name in str(context.run_config["strategies"]).split(",")]
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
