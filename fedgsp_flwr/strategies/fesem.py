"""FeSEM: multi-center federated learning by stochastic expectation maximisation."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.clustering import agreement_scores
from ..core.multicenter import INITS, Layout, em_step, kmeans_centres, least_moved
from ..protocol import SERVER_ROUND
from . import saved
from .aggregation import GroupModel, npz_bytes
from .metrics import reply_metrics
from .node_registry import node_label
from .params import array_names, check_parameters, positive, setting
from .rounds import TrainResult
from .server_round import ClusteredRound
from .state import NodeMap, StrategyState, record_arrays, to_record

NEW_CLIENTS = ("probe", "initial")
class FeSEM(ClusteredRound):
    """FeSEM (Xie et al., 2021): K centre models fitted by stochastic EM.

    The method, the paper's equations it implements and every deliberate choice:
    docs/strategies/fesem.md.

    Each round samples ``fraction_train`` of the connected nodes. A node assigned to a
    centre receives that centre; all fine-tune locally and return their weights W_i.
    A node seen for the first time gets "the nearest centre after one local fit"
    (docs/strategies/fesem.md): with ``new_clients="initial"`` (the paper) it fits the
    initial model and the E-step places that fit; with ``"probe"`` (ours) it fine-tunes
    every centre once and keeps the fit that moved least from its centre (the centre
    whose model its data pulls least, K trainings on its first visit only). In the first
    round of ``kmeans++`` there are no centres yet and every node fits the initial model.

    E-step: each returned W_i joins its nearest centre by squared L2 distance (over all
    parameters, or over ``layers``). M-step: each centre becomes the mean of the W_i
    assigned to it this round (the paper's plain mean, or weighted by examples with
    ``weighted``); a centre that received none keeps its weights (logged). The node
    keeps its assignment until it is sampled again.

    Initialisation (``init``): ``seeds``, K models built by ``centre_factory(k)``
    (differently seeded), or ``kmeans++``, k-means++ over the first round's local
    models (all trained from the initial model).

    Evaluation scores each sampled, assigned node with its own centre (``eval-acc``);
    nodes not assigned yet are counted (``eval-unassigned``), not scored. The global
    model that Flower's loop carries (and the server scores) is the mean of the
    centres weighted by their members; FeSEM itself never trains it.
    """

    # The state a checkpoint saves (node ids translated on resume):
    rng = saved.generator("fesem-rng")  # node sampling, k-means++
    eval_rng = saved.generator("fesem-eval-rng")
    assignment = saved.node_map("assignment")  # node -> centre
    start_model = saved.record("start")  # the initial model
    centres = saved.array("centres", np.float32)  # one row per centre

    k: int = setting(
        default=4, help="number of centres K", check=positive, key="fesem-k")
    init: str = setting(
        default="kmeans++", help="centre initialisation", choices=INITS, key="fesem-init")
    new_clients: str = setting(
        default="initial", help="first-seen nodes: initial (the paper: fit the initial model, "
        "nearest centre) | probe (ours: fine-tune every centre, keep the least moved)",
        choices=NEW_CLIENTS, key="fesem-new-clients")
    weighted: bool = setting(
        default=False, help="the M-step averages by examples (false = plain mean, the paper)",
        key="fesem-weighted")
    centre_factory: Callable[[int], ArrayRecord] | None = setting(
        default=None, help="builds centre k's initial model (required by init 'seeds')")
    layers: Sequence[str] | None = setting(
        default=None, help="array names the distances use (None: all; the run config: "
        "comma-separated, '' = all)", check=lambda v: v is None or len(v) > 0,
        rule="None or a non-empty list of names", key="fesem-layers", app_default="",
        parse=array_names)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_parameters("FeSEM", [
            (self.init != "seeds" or self.centre_factory is not None,
             "init='seeds' needs a centre_factory (centre k's initial model)")])
        self.layers = list(self.layers) if self.layers is not None else None
        self.centre_metrics: dict[int, dict[str, Any]] = {}  # last evaluation, by centre
        self.layout: Layout | None = None

    def summary(self) -> None:
        """Log FeSEM's settings, then FedAvg's."""
        log(INFO, "\t├──> FeSEM: K=%d, %s init, distances over %s, %s M-step", self.k,
            self.init, ", ".join(self.layers) if self.layers else "all layers",
            "example-weighted" if self.weighted else "plain-mean")
        super().summary()

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back the checkpoint state, and the initial model's layout."""
        super().restore_state(state, node_map)
        if self.start_model is not None:
            self.layout = Layout.of(record_arrays(self.start_model))

    # --- centres ----------------------------------------------------------------------

    def setup(self, arrays: ArrayRecord) -> None:
        """Remember the initial model and its layout; build ``seeds`` centres."""
        self.start_model = arrays
        self.layout = Layout.of(record_arrays(arrays))
        self.layout.columns(self.layers)  # fail fast on unknown layer names
        if self.init == "seeds" and self.centre_factory is not None:
            self.centres = self.stack([self.centre_factory(c) for c in range(self.k)])

    def stack(self, records: Sequence[ArrayRecord]) -> np.ndarray:
        """The models as rows of one float32 matrix."""
        assert self.layout is not None
        return self.layout.stack([record_arrays(r) for r in records])

    def centre_record(self, centre: int) -> ArrayRecord:
        """Centre ``centre`` as an ArrayRecord."""
        assert self.layout is not None and self.centres is not None
        return to_record(self.layout.unstack(self.centres[centre]))

    def init_kmeans(self, x: np.ndarray) -> None:
        """Centres from k-means++ over the first round's models (the initial model
        fills the centres beyond the number of models).
        """
        assert self.layout is not None and self.start_model is not None
        if len(x) < self.k:
            log(WARNING, "FeSEM: %d first-round models for %d centres; the initial model "
                "fills the rest", len(x), self.k)
        self.centres = kmeans_centres(x, self.k, self.rng, self.layout.columns(self.layers),
                                      self.stack([self.start_model])[0])

    def sizes(self) -> list[int]:
        """Members of each centre (over every node assigned so far)."""
        return np.bincount(list(self.assignment.values()), minlength=self.k).tolist()

    def global_model(self) -> ArrayRecord:
        """Mean of the centres weighted by their members (for Flower's loop only)."""
        assert self.layout is not None and self.centres is not None
        weights = np.asarray(self.sizes(), dtype=np.float64)
        if weights.sum() == 0:
            weights[:] = 1.0
        mean = (weights / weights.sum()) @ self.centres.astype(np.float64)
        return to_record(self.layout.unstack(mean))

    # --- training ---------------------------------------------------------------------

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Send each sampled node its centre, then run one E-step and one M-step."""
        started = time.monotonic()
        if self.start_model is None:
            self.setup(arrays)
        reachable, sampled = self.sample_train(grid, self.rng)
        self.warn_size.unfilled(self.k, "centre", len(reachable), "node", "k (run config fesem-k)",
                           label="k=")
        records: dict[int | None, ArrayRecord] = {None: cast(ArrayRecord, self.start_model)}
        plan = [(node, centre) for node in sampled for centre in self.starts(node)]
        for _, centre in plan:
            if centre not in records:
                records[centre] = self.centre_record(cast(int, centre))
        train_config = ConfigRecord({**dict(config), SERVER_ROUND: server_round})
        exchanged = self.exchange(server_round, grid, plan, self.train_messages(
            ((node, records[centre]) for node, centre in plan), train_config),
            self.train_problem(arrays))
        fits: dict[int, list[tuple[int | None, Message]]] = {}
        for node, centre, reply in exchanged.screened.sound:
            fits.setdefault(node, []).append((centre, reply))
        sound = [(node, self.closest_fit(fits[node])) for node in sampled if node in fits]
        metrics: dict[str, Any] = {"sampled": len(sampled), "probe-fits": len(plan) - len(sampled),
                                   **exchanged.traffic()}
        if sound:
            metrics.update(self.em_round(server_round, sound))
        else:
            log(WARNING, "FeSEM round %d: no sound reply; the centres are kept", server_round)
        metrics.update(self.cluster_metrics())
        metrics["train-time"] = time.monotonic() - started
        new_global = self.global_model() if self.centres is not None else None
        return self.finish_round(server_round, new_global, metrics, len(sound),
                                 exchanged.screened.rejected(), len(sampled))

    def starts(self, node: int) -> list[int | None]:
        """The centres a sampled node trains from (``None``: the initial model).

        An assigned node: its centre. A new node: the initial model before the centres
        exist (k-means++) or with ``new_clients="initial"``; every centre with
        ``new_clients="probe"``.
        """
        if self.centres is None:
            return [None]
        if node in self.assignment:
            return [self.assignment[node]]
        return list(range(self.k)) if self.new_clients == "probe" else [None]

    def closest_fit(self, fits: Sequence[tuple[int | None, Message]]) -> Message:
        """Of a node's local fits, the one that moved least from the centre it started
        from (a single fit is returned as it is).
        """
        if len(fits) == 1:
            return fits[0][1]
        assert self.layout is not None and self.centres is not None
        x = self.stack([next(iter(r.content.array_records.values())) for _, r in fits])
        starts = self.centres[[cast(int, c) for c, _ in fits]]
        return fits[least_moved(x, starts, self.layout.columns(self.layers))][1]

    def em_round(self, server_round: int, sound: Sequence[tuple[int, Message]]
                 ) -> dict[str, Any]:
        """E-step and M-step over this round's sound replies; return the round metrics."""
        assert self.layout is not None
        nodes = [node for node, _ in sound]
        x = self.stack([next(iter(r.content.array_records.values())) for _, r in sound])
        contents = [reply_metrics(r.content) for _, r in sound]
        weights = (np.array([float(cast(float, m[self.weighted_by_key])) for m in contents])
                   if self.weighted else np.ones(len(contents)))
        columns = self.layout.columns(self.layers)
        if self.centres is None:
            self.init_kmeans(x)
        assert self.centres is not None
        step = em_step(x, weights, self.centres, columns)
        previous = [self.assignment.get(n) for n in nodes]
        self.centres = step.centres
        for centre in step.empty:
            log(INFO, "FeSEM round %d: centre %d received no model; it keeps its weights",
                server_round, centre)
        assignment = step.assignment.tolist()
        self.assignment.update(zip(nodes, assignment, strict=True))
        metrics: dict[str, Any] = dict(self.train_metrics_aggr_fn(
            [r.content for _, r in sound], self.weighted_by_key))
        metrics.update({
            "multicenter-loss": step.loss,
            "assignment-changes": sum(p is not None and p != a
                                      for p, a in zip(previous, assignment, strict=True)),
            "new-clients": sum(p is None for p in previous),
            "empty-centres": len(step.empty),
        })
        log(INFO, "FeSEM round %d: %d models, %d changed centre, %d new, loss %.4g",
            server_round, len(nodes), metrics["assignment-changes"], metrics["new-clients"],
            metrics["multicenter-loss"])
        return metrics

    def cluster_metrics(self) -> dict[str, Any]:
        """Centre sizes, assigned nodes, and ARI/NMI where ground truth is known."""
        return {"cluster-sizes": self.sizes(), "assigned-clients": len(self.assignment),
                **agreement_scores(self.assignment, self.known.partition_ids,
                                   self.ground_truth)}

    # --- evaluation -------------------------------------------------------------------

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """Score each sampled, assigned node with its own centre; keep each centre's
        aggregate (:meth:`group_models`)."""
        if self.fraction_evaluate == 0.0 or self.centres is None:
            return self.record_evaluation(server_round, [], {}, None).metrics
        nodes = self.sample_evaluate(grid, self.eval_rng)
        assigned = {n: self.assignment[n] for n in nodes if n in self.assignment}
        self.history.setdefault(server_round, {})["eval-unassigned"] = len(nodes) - len(
            assigned)
        evaluation = self.evaluate_members(server_round, grid, config, assigned,
                                           self.centre_record)
        self.centre_metrics.update(evaluation.by_group)
        return evaluation.metrics

    def group_models(self) -> dict[int, GroupModel]:
        """Each centre's model with its assigned nodes and last evaluation, by centre."""
        if self.centres is None:
            return {}
        return {c: GroupModel(self.centre_record(c), self.known.order(
            [n for n, a in self.assignment.items() if a == c]), {
            n: self.known.partition_ids[n] for n, a in self.assignment.items()
            if a == c and n in self.known.partition_ids}, self.centre_metrics.get(c, {}))
            for c in range(self.k)}

    # --- results ----------------------------------------------------------------------

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """Files of the centre state for the run's results folder.

        ``centres.json`` (every round): each assigned node's centre (by partition id
        where reported) and the sizes. With ``final``, ``centres.npz`` (arrays
        ``<centre>/<name>``).
        """
        state = {"k": self.k, "init": self.init, "layers": self.layers,
                 "sizes": self.sizes(),
                 "assignment": {node_label(n, self.known.partition_ids): c
                                for n, c in sorted(self.assignment.items())}}
        files: dict[str, bytes | str] = {"centres.json": json.dumps(state, indent=1)}
        if final and self.centres is not None and self.layout is not None:
            files["centres.npz"] = npz_bytes({
                f"{c}/{k}": v for c in range(self.k)
                for k, v in self.layout.unstack(self.centres[c]).items()})
        return files


PARAMS = FeSEM.spec
