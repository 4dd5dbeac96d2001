"""Experiment runner: ``python simulation.py experiments/<name>.toml``.

Runs every (strategy, seed) of an experiment file through Flower's simulation engine
(one ``flwr run`` per run, against a private local SuperLink), then writes a comparison
plot and a summary table. Runs whose results folder is already complete are skipped,
so an interrupted experiment resumes where it stopped; an interrupted run goes on from
its last checkpoint (``resume-from``). ``--summarize`` runs nothing and rewrites the
plots and tables from the runs complete so far; ``--only LABEL,...`` and ``--seeds
SEED,...`` run a part of the experiment.

Experiment file::

    name = "fedavg-vs-fedprox"      # results go to <results>/<name>/
    num-supernodes = 10
    seeds = [0, 1, 2]
    target-accuracy = 0.9           # optional: report rounds to reach it
    reference = "fedavg"            # optional: report rounds to reach this strategy's
                                    # mean final accuracy
    timeout = 7200                  # optional: seconds per run
    metric = "eval-acc"             # optional: the accuracy compared (default
                                    # central-acc; eval-acc = clients on their models)
    report = ["ari", "num-clusters"]  # optional: more per-round metrics, summarised at
                                    # the last round and plotted per round
    report-rounds = [5, 10, 25]     # optional: the summary also gives the accuracy
                                    # (mean, std over seeds) at these rounds
    final-rounds = 5                # optional: a run's final accuracy is the mean over
                                    # its last 5 rounds (default 1: the last round)
    loss-metric = "eval-loss"       # optional: the loss summarised beside it, over the
                                    # same rounds (default: the metric's twin,
                                    # eval-acc -> eval-loss, central-acc -> central-loss)

    [run-config]                    # shared by every run (keys of pyproject's config)
    dataset = "mnist"
    partition = "dirichlet"
    num-server-rounds = 10

    [strategies.fedavg]             # one table per compared strategy: its overrides
    strategy = "fedavg"

    [strategies.fedprox]
    strategy = "fedprox"
    fedprox-mu = 0.01
    num-supernodes = 20             # a strategy table may override num-supernodes
    seeds = [0]                     # and run fewer of the seeds (a diagnostic row)

    [strategies.central]            # the centralized baseline, trained in this process
    strategy = "centralized"        # on the pooled data of num-supernodes partitions

    [paper]                         # optional: the paper's numbers as printed, put
    source = "Table 1, N = 1200"    # beside ours in paper.{csv,json}
    [paper.fedavg]                  # a strategy label: acc, acc-std (in %), loss,
    acc = 94.96                     # loss-std, rounds (to the paper's target, or
    acc-std = 0.11                  # "never")

Output::

    <results>/<name>/experiment.toml           the exact experiment file
    <results>/<name>/runs/<label>-seed<s>/     one results folder per run (see results.py)
    <results>/<name>/logs/<label>-seed<s>.log  each run's streamed log
    <results>/<name>/comparison.png            accuracy per round, mean and spread
    <results>/<name>/comparison-<metric>.png   each reported metric per round
    <results>/<name>/summary.{csv,json,md}     final accuracy, rounds to target, wall time
    <results>/<name>/paper.{csv,json}          with [paper]: ours beside the paper's, in %
    <results>/<name>/divergence.{csv,json,png} with a centralized strategy: RED and ACS
                                               per layer of each final model against it
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import tempfile
import tomllib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from fedgsp_flwr.app.checkpoint import CheckpointError, load_checkpoint
from fedgsp_flwr.app.config import ConfigError, RunConfig
from fedgsp_flwr.app.results import (
    is_complete,
    mean_if_every,
    read_metrics,
    rounds_to,
    rows_to_csv,
    series,
    write_atomic,
)
from fedgsp_flwr.tools.centralized import CENTRALIZED, run_centralized
from fedgsp_flwr.tools.divergence import layer_divergence
from fedgsp_flwr.tools.launcher import LocalSimulation

APP_DIR = Path(__file__).resolve().parent
LOSS_METRIC = "central-loss"


def loss_twin(metric: str) -> str:
    """The loss that goes with an accuracy metric: ``eval-acc`` -> ``eval-loss``,
    ``eval-acc-global`` -> ``eval-loss-global``; ``central-loss`` for any other."""
    return metric.replace("-acc", "-loss", 1) if "-acc" in metric else LOSS_METRIC
CLIENT_STATE = "client-state"  # a run folder's client-state-dir (Ditto's personal models)


@dataclass(frozen=True)
class Experiment:
    """A parsed experiment file.

    Attributes
    ----------
    name : str
        Experiment name (results sub-folder).
    num_supernodes : int
        Simulated SuperNodes per run.
    seeds : list[int]
        Seeds; every strategy runs once per seed.
    run_config : dict[str, Any]
        Run config shared by all runs.
    strategies : dict[str, dict[str, Any]]
        Label -> run-config overrides of each compared strategy.
    target_accuracy : float | None
        Accuracy whose first round is reported.
    reference : str | None
        Strategy label whose mean final accuracy is a second target.
    timeout : float
        Seconds allowed per run.
    metric : str
        The per-round accuracy compared: ``central-acc`` (the global model on the
        server's test set) or a client metric such as ``eval-acc``.
    report : list[str]
        More per-round metrics to summarise (last round) and plot.
    report_rounds : list[int]
        Rounds at which the summary also gives the accuracy (mean and std over seeds),
        for tables that follow a run's course (e.g. rounds 5, 10, 25, 50).
    final_rounds : int
        A run's final accuracy is the mean of ``metric`` over its last this many
        rounds (1: the last round). More than 1 averages out the draw of the clients
        that a client metric such as ``eval-acc`` scores in a round.
    loss_metric : str
        The per-round loss summarised beside the accuracy (over the same last rounds):
        ``central-loss`` (the global model on the server's test set) or a client
        metric such as ``eval-loss``, which clustered and personalised strategies need
        (their central model serves no client). Default: ``metric``'s twin
        (:func:`loss_twin`) when loaded from a file; ``central-loss`` when built here.
    paper : dict[str, dict[str, float | str]]
        Label -> the paper's numbers for it, as printed (``acc`` and ``acc-std`` in %,
        ``loss``, ``loss-std``, ``rounds``: to the paper's target, or ``"never"``).
    paper_source : str
        Where in the paper those numbers are.
    """

    name: str
    num_supernodes: int
    seeds: list[int]
    run_config: dict[str, Any]
    strategies: dict[str, dict[str, Any]]
    target_accuracy: float | None = None
    reference: str | None = None
    timeout: float = 4 * 3600
    metric: str = "central-acc"
    report: list[str] = field(default_factory=list)
    report_rounds: list[int] = field(default_factory=list)
    final_rounds: int = 1
    loss_metric: str = LOSS_METRIC
    paper: dict[str, dict[str, float | str]] = field(default_factory=dict)
    paper_source: str = ""
    source: str = field(default="", repr=False)

    @classmethod
    def load(cls, path: str | Path) -> Experiment:
        """Parse and validate an experiment file.

        Raises
        ------
        ConfigError
            On a missing or bad field, or a run config that does not validate.
        """
        text = Path(path).read_text()
        raw = tomllib.loads(text)
        allowed = {"name", "num-supernodes", "seeds", "run-config", "strategies",
                   "target-accuracy", "reference", "timeout", "metric", "report",
                   "report-rounds", "final-rounds", "loss-metric", "paper"}
        if unknown := set(raw) - allowed:
            raise ConfigError(f"{path}: unknown experiment field(s) {sorted(unknown)}")
        if not isinstance(raw.get("paper", {}), dict):
            raise ConfigError(f"{path}: [paper] must be a table of strategy labels")
        paper = dict(raw.get("paper", {}))
        paper_source = str(paper.pop("source", ""))
        metric = str(raw.get("metric", "central-acc"))
        try:
            exp = cls(
                name=str(raw["name"]),
                num_supernodes=int(raw.get("num-supernodes", 10)),
                seeds=[int(s) for s in raw.get("seeds", [0])],
                run_config=dict(raw.get("run-config", {})),
                strategies={k: dict(v) for k, v in raw["strategies"].items()},
                target_accuracy=raw.get("target-accuracy"),
                reference=raw.get("reference"),
                timeout=float(raw.get("timeout", 4 * 3600)),
                metric=metric,
                report=[str(m) for m in raw.get("report", [])],
                report_rounds=report_rounds(path, raw.get("report-rounds", [])),
                final_rounds=final_rounds(path, raw.get("final-rounds", 1)),
                loss_metric=str(raw.get("loss-metric", loss_twin(metric))),
                paper=paper_numbers(path, paper, raw.get("strategies", {})),
                paper_source=paper_source,
                source=text,
            )
        except KeyError as err:
            raise ConfigError(f"{path}: missing field {err}") from err
        if exp.num_supernodes < 1 or not exp.seeds or not exp.strategies:
            raise ConfigError(f"{path}: needs num-supernodes >= 1, seeds and strategies")
        for label, table in exp.strategies.items():
            own = table.get("seeds", exp.seeds)
            if (not isinstance(own, list) or not own
                    or not all(type(s) is int and s in exp.seeds for s in own)):
                raise ConfigError(f"{path}: [strategies.{label}] seeds must be a non-empty "
                                  f"list of the experiment's seeds {exp.seeds}, got {own!r}")
        if exp.reference is not None and exp.reference not in exp.strategies:
            raise ConfigError(f"{path}: reference '{exp.reference}' is not one of the "
                              f"strategies {sorted(exp.strategies)}")
        for label, seed in exp.runs():
            overrides = exp.run_config_of(label, seed, Path("/results"))
            if exp.is_centralized(label):  # not a Flower strategy: validate the rest
                overrides["strategy"] = RunConfig.defaults()["strategy"]
            RunConfig.from_mapping(overrides)
        return exp

    def is_centralized(self, label: str) -> bool:
        """Whether a strategy label is the ``centralized`` baseline (run in-process)."""
        return self.strategies[label].get("strategy") == CENTRALIZED

    def runs(self) -> list[tuple[str, int]]:
        """All (strategy label, seed) pairs, seed-major so early results cover all."""
        return [(label, seed) for seed in self.seeds for label in self.strategies
                if seed in self.seeds_of(label)]

    def seeds_of(self, label: str) -> list[int]:
        """Seeds of one strategy's runs: its own ``seeds`` (a subset of the
        experiment's: a diagnostic row on fewer seeds), else the experiment's."""
        return [int(s) for s in self.strategies[label].get("seeds", self.seeds)]

    def supernodes_of(self, label: str) -> int:
        """Simulated SuperNodes of one strategy's runs."""
        return int(self.strategies[label].get("num-supernodes", self.num_supernodes))

    def run_config_of(self, label: str, seed: int, root: Path) -> dict[str, Any]:
        """Return the full run-config overrides of one run."""
        overrides = {k: v for k, v in self.strategies[label].items()
                     if k not in ("num-supernodes", "seeds")}
        return {
            **self.run_config,
            **overrides,
            "seed": seed,
            "results-dir": str(root / "runs"),
            "run-name": run_name(label, seed),
            "client-state-dir": str(root / "runs" / run_name(label, seed) / CLIENT_STATE),
        }


def report_rounds(path: str | Path, value: Any) -> list[int]:
    """The ``report-rounds`` of an experiment file: positive round numbers, sorted."""
    if not (isinstance(value, list) and all(
            isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in value)):
        raise ConfigError(f"{path}: report-rounds must be a list of positive round "
                          f"numbers such as [5, 10, 25, 50], not {value!r}")
    return sorted(set(value))


def final_rounds(path: str | Path, value: Any) -> int:
    """The ``final-rounds`` of an experiment file: a positive number of rounds."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{path}: final-rounds must be a positive number of rounds "
                          f"(1: the last round), not {value!r}")
    return value


PAPER_KEYS = ("acc", "acc-std", "loss", "loss-std", "rounds")


def paper_numbers(path: str | Path, paper: Mapping[str, Any],
                  strategies: Mapping[str, Any]) -> dict[str, dict[str, float | str]]:
    """The ``[paper]`` tables of an experiment file, checked.

    Raises
    ------
    ConfigError
        For a label that is not a strategy, an unknown key, an accuracy outside
        [0, 100] (it is in %, as papers print it), or rounds that are neither a
        non-negative number nor ``"never"``.
    """
    out: dict[str, dict[str, float | str]] = {}
    for label, values in paper.items():
        where = f"{path}: [paper.{label}]"
        if label not in strategies:
            raise ConfigError(f"{where} names no strategy; the strategies are "
                              f"{sorted(strategies)}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where} must be a table, got {values!r}")
        if unknown := set(values) - set(PAPER_KEYS):
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; the keys are "
                              f"{', '.join(PAPER_KEYS)}")
        numbers: dict[str, float | str] = {}
        for key, value in values.items():
            if key == "rounds" and value == "never":
                numbers[key] = value
            elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                also = ' or "never"' if key == "rounds" else ""
                raise ConfigError(f"{where} {key} must be a number >= 0{also}, got {value!r}")
            elif key in ("acc", "acc-std") and value > 100:
                raise ConfigError(f"{where} {key} is in % (0-100), got {value!r}")
            else:
                numbers[key] = float(value)
        out[label] = numbers
    return out


def run_name(label: str, seed: int) -> str:
    """Results-folder name of one run."""
    return f"{label}-seed{seed}"


def clear_client_state(folder: Path, resuming: bool) -> None:
    """Delete a run's client state (Ditto's personal models: GBs at N = 1,200) unless an
    interrupted run goes on from it: kept only while the run is not complete and
    ``resuming`` (before a fresh start, old files would pass for the new nodes' state).
    """
    if is_complete(folder) or not resuming:
        shutil.rmtree(folder / CLIENT_STATE, ignore_errors=True)


def resumable(folder: Path, rounds: int) -> bool:
    """Whether an interrupted run's folder has a checkpoint to go on from."""
    try:
        return load_checkpoint(folder).round < rounds
    except CheckpointError:
        return False


def run_experiment(exp: Experiment, results: Path, force: bool = False,
                   only: Collection[str] | None = None,
                   seeds: Collection[int] | None = None) -> Path:
    """Run every missing run of ``exp``, then write the comparison outputs.

    Parameters
    ----------
    exp : Experiment
        The experiment.
    results : Path
        The results root.
    force : bool
        Re-run complete runs too.
    only, seeds : Collection | None
        Run only these strategy labels and seeds (``None``: all); the comparison
        outputs still cover every complete run of the experiment.

    Returns
    -------
    Path
        The experiment's results folder.
    """
    root = results.resolve() / exp.name
    root.mkdir(parents=True, exist_ok=True)
    write_atomic(root / "experiment.toml", exp.source)
    chosen = [(label, seed) for label, seed in exp.runs()
              if (only is None or label in only) and (seeds is None or seed in seeds)]
    pending = [
        (label, seed) for label, seed in chosen
        if force or not is_complete(root / "runs" / run_name(label, seed))
    ]
    skipped = len(chosen) - len(pending)
    if skipped:
        print(f"Skipping {skipped} complete run(s) of {exp.name}", file=sys.stderr)
    failures = []
    if pending:
        home = Path(tempfile.mkdtemp(prefix="fedgsp-flwr-home-"))
        with LocalSimulation(APP_DIR, home) as sim, tqdm(pending, desc=exp.name,
                                                           unit="run") as bar:
            for label, seed in bar:
                bar.set_postfix_str(run_name(label, seed))
                if exp.is_centralized(label):
                    if (failure := run_baseline(exp, root, label, seed)) is not None:
                        failures.append(failure)
                    continue
                config = exp.run_config_of(label, seed, root)
                folder = root / "runs" / run_name(label, seed)
                if not force and resumable(folder, int(config.get(
                        "num-server-rounds", RunConfig.num_server_rounds))):
                    config["resume-from"] = str(folder)  # keep the rounds it finished
                clear_client_state(folder, resuming="resume-from" in config)
                outcome = sim.run(
                    config,
                    num_supernodes=exp.supernodes_of(label),
                    log_path=root / "logs" / f"{run_name(label, seed)}.log",
                    timeout=exp.timeout,
                )
                clear_client_state(folder, resuming=True)  # kept if interrupted
                if not outcome.ok:
                    failures.append(f"{run_name(label, seed)}: {outcome.status}: "
                                    f"{outcome.cause()} (log: {outcome.log_path})")
                    bar.write(f"{failures[-1]}", file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)
    write_comparison(exp, root)
    if failures:
        raise RuntimeError("Some runs did not complete:\n" + "\n".join(failures))
    return root


def run_baseline(exp: Experiment, root: Path, label: str, seed: int) -> str | None:
    """Run the ``centralized`` baseline in this process, logging to the run's log file as
    the federated runs do; return why it failed, if it did.
    """
    cfg = RunConfig.from_mapping({**exp.run_config_of(label, seed, root), "strategy": "fedavg"})
    log_path = root / "logs" / f"{run_name(label, seed)}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_path, mode="w")
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s: %(message)s"))
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        run_centralized(cfg, exp.supernodes_of(label))
    except (OSError, ValueError, RuntimeError) as err:
        logger.exception("centralized baseline failed")
        return f"{run_name(label, seed)}: {type(err).__name__}: {err} (log: {log_path})"
    finally:
        logger.removeHandler(handler)
        handler.close()
    return None


def divergence_rows(exp: Experiment, root: Path) -> list[dict[str, Any]]:
    """RED and ACS per layer of every complete run's final model against the
    ``centralized`` run of the same seed (none without a centralized strategy, and none
    for a run whose folder kept no ``model.npz``).
    """
    rows = []
    for reference in (label for label in exp.strategies if exp.is_centralized(label)):
        for label, seed in exp.runs():
            if label == reference:
                continue
            ref_path = root / "runs" / run_name(reference, seed) / "model.npz"
            path = root / "runs" / run_name(label, seed) / "model.npz"
            if not (is_complete(path.parent) and is_complete(ref_path.parent)
                    and path.exists() and ref_path.exists()):
                continue  # kept raw runs (docs/results/raw) have no model.npz
            with np.load(path) as model, np.load(ref_path) as ref:
                for row in layer_divergence(dict(model), dict(ref)):
                    rows.append({"strategy": label, "reference": reference, "seed": seed,
                                 **row})
    return rows


def write_divergence(rows: Sequence[Mapping[str, Any]], root: Path) -> None:
    """Write divergence.{csv,json,png}: per layer, mean RED and ACS of each strategy."""
    import matplotlib.pyplot as plt

    write_atomic(root / "divergence.json", json.dumps(list(rows), indent=2))
    write_atomic(root / "divergence.csv", rows_to_csv(rows))
    layers = list(dict.fromkeys(str(r["layer"]) for r in rows))
    labels = list(dict.fromkeys(str(r["strategy"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        for ax, key in zip(axes, ("red", "acs"), strict=True):
            means = [np.mean([float(r[key]) for r in rows
                              if r["strategy"] == label and r["layer"] == layer])
                     for layer in layers]
            ax.bar(np.arange(len(layers)) + i * width, means, width, label=label)
    for ax, title in zip(axes, ("relative Euclidean distance (lower = closer)",
                                "averaged cosine similarity (higher = closer)"), strict=True):
        ax.set_xticks(np.arange(len(layers)) + 0.4 - width / 2, layers, rotation=30,
                      ha="right", fontsize=8)
        ax.set_title(f"{title}\nvs {rows[0]['reference']}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(root / "divergence.png", dpi=100)
    plt.close(fig)


def short_rounds(metrics: Mapping[str, Any]) -> int:
    """Rounds that lost training replies: a reply rejected, a relay hop skipped, fewer
    replies than clients sampled, or fewer than the run's usual count (the mode).

    Lost nodes cause them; so did a runner stopped mid-run before the ServerApp was
    killed first. A table built on such rounds should say so. Relay rounds (they report
    ``hops``) are judged by their skipped hops alone: their ``train-replies`` counts the
    groups that trained, which grows with FedGSP's group count, so the mode says nothing.
    """
    rounds = [r for r in metrics["rounds"] if r["round"] > 0]
    counted = [r for r in rounds if "train-replies" in r and "hops" not in r]
    replies = [r["train-replies"] for r in counted]
    usual = max(set(replies), key=replies.count) if replies else 0
    few = {r["round"] for r in counted if r["train-replies"] < max(usual, r.get("sampled", 0))}
    return sum(1 for r in rounds
               if r.get("train-rejected", 0) > 0 or r.get("skipped-nodes", 0) > 0
               or r["round"] in few)


def complete_seeds(exp: Experiment, root: Path, label: str
                   ) -> list[tuple[int, dict[str, Any]]]:
    """(seed, metrics) of each complete seed of one strategy."""
    found = [(s, read_metrics(root / "runs" / run_name(label, s))) for s in exp.seeds_of(label)]
    return [(s, m) for s, m in found if m and m.get("status") == "complete"]


def complete_runs(exp: Experiment, root: Path, label: str) -> list[dict[str, Any]]:
    """The metrics of each complete seed of one strategy."""
    return [m for _, m in complete_seeds(exp, root, label)]


def final_value(metrics: Mapping[str, Any], key: str, last: int = 1) -> float | None:
    """The mean of a per-round metric over a run's last ``last`` rounds."""
    values = series(metrics, key)[1]
    return float(np.mean(values[-last:])) if values else None


def reference_accuracy(exp: Experiment, root: Path) -> float | None:
    """The reference strategy's final accuracy, the mean over its complete seeds."""
    if exp.reference is None:
        return None
    finals = [v for m in complete_runs(exp, root, exp.reference)
              if (v := final_value(m, exp.metric, exp.final_rounds)) is not None]
    return float(np.mean(finals)) if finals else None


LAST_ROUNDS = 10  # the per-seed summary's range over a run's last values of its metric


def seed_rows(exp: Experiment, root: Path) -> list[dict[str, Any]]:
    """One row per complete run: strategy, seed, final accuracy (the last
    ``final-rounds`` rounds' mean), the first round at the target and at the
    reference's final accuracy (``None``: never), and the lowest and highest of the
    run's last :data:`LAST_ROUNDS` values of the experiment's metric (the rounds that
    have it)."""
    reference = reference_accuracy(exp, root)
    rows = []
    for label in exp.strategies:
        for seed, metrics in complete_seeds(exp, root, label):
            last = series(metrics, exp.metric)[1][-LAST_ROUNDS:]
            row: dict[str, Any] = {
                "strategy": label, "seed": seed,
                "final-acc": final_value(metrics, exp.metric, exp.final_rounds)}
            for name, target in (("target", exp.target_accuracy), ("reference", reference)):
                if target is not None:
                    row[f"rounds-to-{name}"] = rounds_to(metrics, exp.metric, target)
            row.update({f"last{LAST_ROUNDS}-min": min(last) if last else None,
                        f"last{LAST_ROUNDS}-max": max(last) if last else None})
            rows.append(row)
    return rows


def curves(exp: Experiment, root: Path, label: str, key: str | None = None
           ) -> tuple[list[int], list[list[float]]]:
    """Rounds and per-seed values of a metric (default: the experiment's) of one
    strategy, over the rounds every complete seed has.
    """
    runs = [series(m, key or exp.metric) for m in complete_runs(exp, root, label)]
    runs = [r for r in runs if r[0]]
    if not runs:
        return [], []
    common = sorted(set.intersection(*(set(rounds) for rounds, _ in runs)))
    return common, [[dict(zip(rounds, values, strict=True))[r] for r in common]
                    for rounds, values in runs]


def cost_to(metrics: Mapping[str, Any], last_round: int) -> dict[str, float | None]:
    """Cost-model time and traffic (FedGSP Eq. 15-17) and the bytes the run moved in
    training, summed over rounds 1..``last_round``.

    The cost-model sums are None unless every one of those rounds was priced (the
    ServerApp prices only rounds that report ``uploads``; StoCFL, IFCA, CFL, FeSEM and
    HierFL rounds are not).
    """
    rows = [r for r in metrics["rounds"] if 0 < r["round"] <= last_round]
    priced = all("cost-comp-s" in r for r in rows)
    return {
        "cost-time": (sum(r["cost-comp-s"] + r["cost-comm-s"] for r in rows)
                      if priced else None),
        "cost-traffic": sum(r["cost-traffic"] for r in rows) if priced else None,
        "train-bytes": sum(r.get("bytes-sent", 0) + r.get("bytes-received", 0) for r in rows),
    }


def summarize(exp: Experiment, root: Path) -> list[dict[str, Any]]:
    """One summary row per strategy: seeds, rounds run (the runs' last round), final
    accuracy and loss (the experiment's metrics, averaged over its last
    ``final-rounds`` rounds; the loss where the runs have one), rounds
    to the target and to the reference's final accuracy (with the cost model's time and
    traffic and the bytes moved until then), the reported metrics at the last round,
    model bytes moved in training, wall time, rounds that lost replies (all seeds).
    """
    done = {label: runs for label in exp.strategies
            if (runs := complete_runs(exp, root, label))}

    def final_acc(metrics: Mapping[str, Any]) -> float | None:
        return final_value(metrics, exp.metric, exp.final_rounds)

    reference = reference_accuracy(exp, root)
    rows = []
    for label, runs in done.items():
        finals = [v for m in runs if (v := final_acc(m)) is not None]
        row: dict[str, Any] = {
            "strategy": label,
            "seeds": len(runs),
            "rounds": max(max(r["round"] for r in m["rounds"]) for m in runs),
            "final-rounds": exp.final_rounds,
            "final-acc-mean": float(np.mean(finals)) if finals else None,
            "final-acc-std": float(np.std(finals)) if finals else None,
        }
        courses = [dict(zip(*series(m, exp.metric), strict=True)) for m in runs]
        for at in exp.report_rounds:  # None unless every seed has the round
            values = [course.get(at) for course in courses]
            ok = all(v is not None for v in values)
            row[f"acc-r{at}-mean"] = float(np.mean(values)) if ok else None
            row[f"acc-r{at}-std"] = float(np.std(values)) if ok else None
        losses = [v for m in runs
                  if (v := final_value(m, exp.loss_metric, exp.final_rounds)) is not None]
        if losses:  # FedGSP's Table 1 and Fig. 4 report the central loss
            row["final-loss-mean"] = float(np.mean(losses))
            row["final-loss-std"] = float(np.std(losses))
        for name, target in (("target", exp.target_accuracy), ("reference", reference)):
            if target is None:
                continue
            reached = [rounds_to(m, exp.metric, target) for m in runs]
            hits = [r for r in reached if r is not None]
            everywhere = len(hits) == len(reached)
            row[f"rounds-to-{name}"] = mean_if_every(reached)
            row[f"seeds-reaching-{name}"] = len(hits)
            costs = [cost_to(m, r) for m, r in zip(runs, reached, strict=True)
                     if r is not None]
            for key in ("cost-time", "cost-traffic", "train-bytes"):
                values = [c[key] for c in costs]
                known = everywhere and None not in values
                row[f"{key}-to-{name}"] = float(np.mean(values)) if known else None
        for key in exp.report:
            values = [v for m in runs if (v := final_value(m, key)) is not None]
            row[key] = float(np.mean(values)) if values else None
        traffic = [sum(r.get("bytes-sent", 0) + r.get("bytes-received", 0)
                       for r in m["rounds"]) for m in runs]
        row["train-bytes-mean"] = float(np.mean(traffic)) if any(traffic) else None
        row["wall-time-mean"] = float(np.mean([m["summary"]["wall-time"] for m in runs]))
        row["short-rounds"] = sum(map(short_rounds, runs))
        rows.append(row)
    return rows


def paper_rows(exp: Experiment,
               summary: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The summary beside the paper's numbers (``[paper]``), accuracies in % as papers
    print them: one row per strategy with complete runs.

    Columns: strategy, metric, seeds, rounds (the runs' last round), final-rounds (the
    accuracy's mean over the runs' last rounds), acc-mean and acc-std (%, population
    std over seeds), loss-metric, loss-mean and loss-std where the runs have the
    experiment's loss metric, rounds-to-target/-reference where the experiment sets
    one, the paper's acc, acc-std, loss and rounds (empty where it gives none), and
    acc-diff (ours minus the paper's, in points).
    """
    rows = []
    for row in summary:
        label = row["strategy"]
        paper = exp.paper.get(label, {})
        out: dict[str, Any] = {
            "strategy": label, "metric": exp.metric, "seeds": row["seeds"],
            "rounds": row["rounds"], "final-rounds": row["final-rounds"],
            "acc-mean": _percent(row["final-acc-mean"]),
            "acc-std": _percent(row["final-acc-std"]),
        }
        if "final-loss-mean" in row:
            out["loss-metric"] = exp.loss_metric
            out["loss-mean"] = round(row["final-loss-mean"], 4)
            out["loss-std"] = round(row["final-loss-std"], 4)
        for name in ("target", "reference"):
            if f"rounds-to-{name}" in row:
                out[f"rounds-to-{name}"] = row[f"rounds-to-{name}"]
        for key in PAPER_KEYS:
            out[f"paper-{key}"] = paper.get(key)
        both = out["acc-mean"] is not None and out["paper-acc"] is not None
        out["acc-diff"] = round(out["acc-mean"] - out["paper-acc"], 2) if both else None
        rows.append(out)
    return rows


def _percent(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 2)


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Render summary rows as a Markdown table."""
    if not rows:
        return "(no complete runs)\n"
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [f"{v:.4f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_comparison(exp: Experiment, root: Path) -> None:
    """Write comparison.png and summary.{csv,json,md} from the complete runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    for key in [exp.metric, *exp.report]:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for i, label in enumerate(exp.strategies):
            rounds, runs = curves(exp, root, label, key)
            if not runs:
                continue
            values = np.array(runs)
            mean, std = values.mean(0), values.std(0)
            # ten colours: from the 11th strategy on dashed, or it would repeat a colour
            (line,) = ax.plot(rounds, mean, label=f"{label} (n={len(runs)})",
                              color=colours(i % 10), linestyle="-" if i < 10 else "--")
            ax.fill_between(rounds, mean - std, mean + std, alpha=0.2,
                            color=line.get_color())
        if exp.target_accuracy is not None and key == exp.metric:
            ax.axhline(exp.target_accuracy, color="grey", linestyle=":", linewidth=1)
        ax.set(xlabel="round", ylabel=key, title=exp.name)
        ax.grid(alpha=0.3)
        # beside the axes: inside, a long legend hides the first rounds' curves
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.tight_layout()
        name = "comparison.png" if key == exp.metric else f"comparison-{key}.png"
        fig.savefig(root / name, dpi=100)
        plt.close(fig)
    if divergence := divergence_rows(exp, root):
        write_divergence(divergence, root)
    rows = summarize(exp, root)
    write_atomic(root / "summary.json", json.dumps(rows, indent=2))
    write_atomic(root / "summary.csv", rows_to_csv(rows))
    write_atomic(root / "summary.md", markdown_table(rows))
    seeds = seed_rows(exp, root)
    write_atomic(root / "seeds.json", json.dumps(seeds, indent=2))
    write_atomic(root / "seeds.csv", rows_to_csv(seeds))
    if exp.paper:
        beside = paper_rows(exp, rows)
        write_atomic(root / "paper.json", json.dumps(
            {"source": exp.paper_source, "rows": beside}, indent=2))
        write_atomic(root / "paper.csv", rows_to_csv(beside))


def comma_list(text: str) -> list[str]:
    """An argument such as ``fedprox,ifca-2``, as its non-empty items."""
    return [item.strip() for item in text.split(",") if item.strip()]


def int_list(text: str) -> list[int]:
    """An argument such as ``0,2``, as integers."""
    try:
        return [int(item) for item in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"integers separated by commas, such as 0,2, not {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("experiments", nargs="+", type=Path, help="experiment TOML files")
    parser.add_argument("--results", type=Path, default=APP_DIR / "results",
                        help="results root (default: ./results)")
    parser.add_argument("--force", action="store_true", help="re-run complete runs too")
    parser.add_argument("--summarize", action="store_true",
                        help="run nothing: rewrite the plots and tables from the runs "
                             "complete so far")
    parser.add_argument("--only", type=comma_list, metavar="LABEL[,LABEL...]",
                        help="run only these strategies (labels of the experiment "
                             "file); the tables still cover every complete run")
    parser.add_argument("--seeds", type=int_list, metavar="SEED[,SEED...]",
                        help="run only these seeds of the experiment file")
    args = parser.parse_args(argv)
    # A terminated runner unwinds like Ctrl-C: its private SuperLink is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        experiments = [Experiment.load(path) for path in args.experiments]
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as err:
        parser.error(str(err))
    for flag, wanted in (("--only", args.only), ("--seeds", args.seeds)):
        if wanted == []:
            parser.error(f"{flag} names nothing: give at least one, or leave {flag} out")
    for exp in experiments:  # every selection checked before anything runs
        for flag, wanted, known in (("--only", args.only, list(exp.strategies)),
                                    ("--seeds", args.seeds, exp.seeds)):
            if wanted is not None and (unknown := [w for w in wanted if w not in known]):
                parser.error(f"{flag}: {unknown} not in {exp.name}'s {known}")
    for exp in experiments:
        if args.summarize:
            root = args.results.resolve() / exp.name
            if not (root / "runs").is_dir():
                parser.error(f"no runs of {exp.name} in {root}: run the experiment first")
            write_comparison(exp, root)
        else:
            root = run_experiment(exp, args.results, force=args.force, only=args.only,
                                  seeds=args.seeds)
        print((root / "summary.md").read_text())
        print(f"Results: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
