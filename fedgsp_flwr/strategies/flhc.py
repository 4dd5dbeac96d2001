"""FL+HC: federated learning with hierarchical clustering of local updates."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.cfl import flat_update
from ..core.clustering import agreement_scores
from ..core.flhc import LINKAGES, METRICS, check_choice, cluster_updates, nearest_cluster
from ..protocol import SERVER_ROUND
from . import saved
from .aggregation import GroupModel, average_arrays, npz_bytes
from .metrics import reply_metrics
from .node_registry import node_label
from .params import non_negative, positive, setting
from .rounds import TrainResult
from .server_round import ClusteredRound
from .state import record_arrays, to_record

GLOBAL = -1  # the plan key of a warm-up round's training (the one global model)
PLACE = -2  # ... and of a new node's training from the clustering round's model


class FLHC(ClusteredRound):
    """FL+HC (Briggs, Fan and Andras, 2020): FedAvg warm-up rounds, one agglomerative
    clustering of the clients' local updates at a distance threshold, then each
    cluster trained as a federation of its own.

    The method, the paper against our choices and the results:
    docs/strategies/flhc.md.

    The first ``warmup_rounds`` rounds are FedAvg: the sampled nodes train the global
    model W (plain ``train``), which becomes their example-weighted mean. The next round
    with sound replies is the clustering round: the sampled nodes train W as before, their
    updates dW_i = W_i - W are clustered bottom-up (``linkage`` over ``metric``
    distances, merges up to ``threshold`` kept: :func:`~fedgsp_flwr.core.flhc.cluster_updates`),
    and each cluster's model is its members' example-weighted mean W_i. From then on
    a node trains its cluster's model, which becomes the mean of its members' replies;
    a cluster without a sound reply keeps its model. The number of clusters comes from
    the threshold, not a given k; one cluster, or one a node, is logged as a WARNING
    with the merge heights to set ``threshold`` from.

    **New nodes** (not sampled in the clustering round; the paper has every client
    take part): when first sampled, a node trains W of the clustering round once and
    joins the cluster whose mean update at the clustering is nearest to its own
    (``metric``); that training enters no model, and it trains with its cluster from
    the next round it is sampled.

    Evaluation scores each sampled node with its cluster's model (before the
    clustering, with W); nodes not placed yet are counted (``eval-unplaced``). The
    model Flower's loop carries (which the server scores) is the member-weighted mean
    of the cluster models.
    """

    # The state a checkpoint saves (node ids translated on resume):
    rng = saved.generator("flhc-rng")
    eval_rng = saved.generator("flhc-eval-rng")
    cluster_of = saved.node_map("cluster-of")  # node -> cluster, from the clustering round
    models = saved.arrays_by_id("cluster-models", "flhc-cluster")  # cluster -> model
    anchor = saved.named_arrays("anchor")  # W of the clustering round (places new nodes)
    centroids = saved.array("centroids", np.float32)  # each cluster's mean update there
    clustered_at = saved.value("clustered-at", int, int)  # the clustering round (0: not yet)
    rounds_run = saved.value("rounds-run", int, int)

    warmup_rounds: int = setting(
        default=10, help="FedAvg rounds before the clustering round", check=non_negative,
        key="flhc-warmup-rounds")
    threshold: float = setting(
        default=3.0, help="distance up to which clusters of updates merge (it depends on the "
        "model, the learning rate and the local epochs: the clustering round logs the merge "
        "heights)", check=positive, key="flhc-threshold")
    metric: str = setting(
        default="euclidean", help="distance between updates: euclidean | manhattan | cosine",
        choices=METRICS, key="flhc-metric")
    linkage: str = setting(
        default="ward", help="linkage of the clustering: ward (Euclidean only) | complete | "
        "average | single", choices=LINKAGES, key="flhc-linkage")

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            check_choice(self.metric, self.linkage)
        except ValueError as error:
            raise ValueError(f"FLHC: {error}") from None
        self.cluster_eval: dict[int, dict[str, Any]] = {}  # last evaluation, by cluster

    def summary(self) -> None:
        """Log FL+HC's settings, then FedAvg's; warn when the run ends before its
        clustering round."""
        log(INFO, "\t├──> FL+HC: %d warm-up round(s), then %s linkage of %s distances up to "
            "%g", self.warmup_rounds, self.linkage, self.metric, self.threshold)
        rounds = self.progress.rounds_planned
        if not self.models and rounds is not None and self.rounds_run + rounds <= self.warmup_rounds:
            log(WARNING, "FL+HC: %d round(s) to run and %d warm-up round(s): the run ends "
                "before its clustering round, so it is FedAvg; set warmup_rounds (run config "
                "flhc-warmup-rounds) below %d", rounds, self.warmup_rounds - self.rounds_run,
                self.rounds_run + rounds)
        super().summary()

    def sizes(self) -> dict[int, int]:
        """Nodes in each cluster."""
        counts = np.bincount(list(self.cluster_of.values()), minlength=len(self.models))
        return {c: int(counts[c]) for c in sorted(self.models)}

    def global_model(self, arrays: ArrayRecord) -> ArrayRecord:
        """W before the clustering; then the member-weighted mean of the cluster models
        (for Flower's loop and the server's evaluation only)."""
        if not self.models:
            return arrays
        weighted = [(c, n) for c, n in self.sizes().items() if n > 0]
        return average_arrays([to_record(self.models[c]) for c, _ in weighted],
                              [float(n) for _, n in weighted])

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """A FedAvg round, the clustering round, or a round of every cluster."""
        started = time.monotonic()
        self.rounds_run += 1
        reachable, sampled = self.sample_train(grid, self.rng)
        plan = [(node, self.start_of(node)) for node in sampled]
        records = {GLOBAL: arrays, **({PLACE: to_record(self.anchor)} if self.anchor else {}),
                   **{c: to_record(m) for c, m in self.models.items()}}
        exchanged = self.exchange(server_round, grid, plan, self.train_messages(
            ((node, records[key]) for node, key in plan),
            ConfigRecord({**dict(config), SERVER_ROUND: server_round})),
            self.update_problem(records, clustering=not self.models
                                and self.rounds_run > self.warmup_rounds))
        sound = exchanged.screened.sound
        metrics: dict[str, Any] = {"sampled": len(sampled), **exchanged.traffic()}
        trained = [(n, key, r) for n, key, r in sound if key != PLACE]
        if trained:
            metrics.update(self.train_metrics_aggr_fn([r.content for _, _, r in trained],
                                                      self.weighted_by_key))
        new_global = None
        if not self.models and trained:
            models = [next(iter(r.content.array_records.values())) for _, _, r in trained]
            weights = [self.weight(r) for _, _, r in trained]
            if self.rounds_run > self.warmup_rounds:
                metrics["merge-heights"] = self.cluster(
                    server_round, [n for n, _, _ in trained], models, weights,
                    record_arrays(arrays))
            else:
                new_global = average_arrays(models, weights)
        elif trained:
            self.train_clusters(trained)
        placing = [(node, reply) for node, key, reply in sound if key == PLACE]
        for node, reply in placing:
            self.place(node, reply)
        metrics.update(self.cluster_metrics(reachable, len(placing)))
        metrics["train-time"] = time.monotonic() - started
        model = new_global if new_global is not None else self.global_model(arrays)
        return self.finish_round(server_round, model if trained else None, metrics,
                                 len(trained), exchanged.screened.rejected(), len(sampled))

    def start_of(self, node: int) -> int:
        """The model a sampled node trains: W before the clustering; then its cluster's,
        or the clustering round's W for a node not placed yet."""
        if not self.models:
            return GLOBAL
        return self.cluster_of.get(node, PLACE)

    def update_problem(self, records: Mapping[int, ArrayRecord], clustering: bool
                       ) -> Callable[[int, Message], str | None]:
        """The exchange's check of a training reply (``records``: the model each plan key
        sent); with the cosine metric, an update that is to be clustered or placed must
        not be zero, which has no cosine distance."""
        sound = self.train_problem(lambda key: records[key])
        if self.metric != "cosine":
            return sound

        def problem(key: int, reply: Message) -> str | None:
            found = sound(key, reply)
            if found is None and (key == PLACE or (key == GLOBAL and clustering)):
                fitted = record_arrays(next(iter(reply.content.array_records.values())))
                update = flat_update(fitted, record_arrays(records[key]))
                if not np.linalg.norm(update) > 0:  # as core.flhc: a tiny float64 one too
                    return ("its update has zero norm (the model it was sent, returned "
                            "unchanged?), which has no cosine distance")
            return found
        return problem

    def weight(self, reply: Message) -> float:
        """A reply's weight (``weighted_by_key``, checked by the exchange)."""
        return float(reply_metrics(reply.content)[self.weighted_by_key])  # type: ignore[arg-type]

    def cluster(self, server_round: int, nodes: Sequence[int],
                models: Sequence[ArrayRecord], weights: Sequence[float],
                base: dict[str, np.ndarray]) -> list[float]:
        """The clustering round: cluster the updates ``models[i] - base``; each cluster's
        model is its members' weighted mean. Returns the merge heights (ascending)."""
        updates = np.stack([flat_update(record_arrays(m), base) for m in models])
        found = cluster_updates(updates, weights, self.threshold, self.metric, self.linkage)
        labels = found.labels.tolist()
        self.models = {c: record_arrays(average_arrays(
            [m for m, label in zip(models, labels, strict=True) if label == c],
            [w for w, label in zip(weights, labels, strict=True) if label == c]))
            for c in range(found.num_clusters)}
        self.cluster_of.update(zip(nodes, labels, strict=True))
        # float32 like the models: a checkpoint holds k x d of them every round
        self.centroids = found.centroids.astype(np.float32)
        self.anchor, self.clustered_at = dict(base), server_round
        heights = ", ".join(f"{h:.4g}" for h in np.quantile(found.heights, [0, 0.5, 1])
                            ) if len(found.heights) else "none"
        log(INFO, "FL+HC round %d: %d clusters of %d updates (sizes %s); merge heights "
            "min/median/max %s", server_round, found.num_clusters, len(nodes),
            list(self.sizes().values()), heights)
        if len(nodes) > 1 and found.num_clusters in (1, len(nodes)):
            log(WARNING, "FL+HC: the threshold %g %s; the merge heights run from %s: set "
                "threshold (run config flhc-threshold) between them", self.threshold,
                "merged every update into one cluster (FedAvg from now on)"
                if found.num_clusters == 1 else "merged no updates (each node alone)", heights)
        return found.heights.tolist()

    def train_clusters(self, trained: Sequence[tuple[int, int, Message]]) -> None:
        """Each cluster with sound replies takes their weighted mean (FedAvg within it)."""
        by_cluster: dict[int, list[Message]] = {}
        for _, cluster, reply in trained:
            by_cluster.setdefault(cluster, []).append(reply)
        for cluster, replies in sorted(by_cluster.items()):
            self.models[cluster] = record_arrays(average_arrays(
                [next(iter(r.content.array_records.values())) for r in replies],
                [self.weight(r) for r in replies]))

    def place(self, node: int, reply: Message) -> None:
        """Put a new node in the cluster whose mean update its own is nearest to."""
        assert self.anchor is not None and self.centroids is not None
        fitted = record_arrays(next(iter(reply.content.array_records.values())))
        self.cluster_of[node] = nearest_cluster(flat_update(fitted, self.anchor),
                                                self.centroids, self.metric)

    def cluster_metrics(self, reachable: Sequence[int], placed: int) -> dict[str, Any]:
        """Clusters, their sizes, placed and unplaced nodes, ARI/NMI where known."""
        if not self.models:
            return {"clusters": 1}
        sizes = self.sizes()
        return {"clusters": len(sizes), "cluster-sizes": list(sizes.values()),
                "placements": placed, "clustered-at": self.clustered_at,
                "unplaced-clients": sum(n not in self.cluster_of for n in reachable),
                **agreement_scores(self.cluster_of, self.known.partition_ids,
                                   self.ground_truth)}

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """Score each sampled node with its cluster's model (W before the clustering);
        keep each cluster's aggregate (:meth:`group_models`)."""
        if self.fraction_evaluate == 0.0:
            return self.record_evaluation(server_round, [], {}, None).metrics
        nodes = self.sample_evaluate(grid, self.eval_rng)
        group_of: Mapping[int, int] = ({n: GLOBAL for n in nodes} if not self.models else
                                       {n: self.cluster_of[n] for n in nodes
                                        if n in self.cluster_of})
        self.history.setdefault(server_round, {})["eval-unplaced"] = len(nodes) - len(group_of)
        evaluation = self.evaluate_members(server_round, grid, config, group_of, lambda c: (
            arrays if c == GLOBAL else to_record(self.models[c])))
        self.cluster_eval.update({c: m for c, m in evaluation.by_group.items() if c != GLOBAL})
        return evaluation.metrics

    def group_models(self) -> dict[int, GroupModel]:
        """Each cluster's model with its nodes and last evaluation (none before the
        clustering round)."""
        partitions = self.known.partition_ids
        groups = {}
        for cluster, model in sorted(self.models.items()):
            members = self.known.order([n for n, c in self.cluster_of.items() if c == cluster])
            groups[cluster] = GroupModel(to_record(model), members, {
                n: partitions[n] for n in members if n in partitions},
                self.cluster_eval.get(cluster, {}))
        return groups

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """``flhc.json`` (every round): the settings, the clustering round and each
        cluster's nodes (by partition id where reported); with ``final``,
        ``flhc-models.npz`` (arrays ``<cluster>/<name>``)."""
        partitions = self.known.partition_ids
        state = {"warmup-rounds": self.warmup_rounds, "threshold": self.threshold,
                 "metric": self.metric, "linkage": self.linkage,
                 "clustered-at": self.clustered_at or None,
                 "clusters": {str(c): [node_label(n, partitions) for n in g.nodes]
                              for c, g in self.group_models().items()}}
        files: dict[str, bytes | str] = {"flhc.json": json.dumps(state, indent=1)}
        if final and self.models:
            files["flhc-models.npz"] = npz_bytes({
                f"{c}/{k}": v for c, model in sorted(self.models.items()) for k, v in model.items()})
        return files


PARAMS = FLHC.spec
