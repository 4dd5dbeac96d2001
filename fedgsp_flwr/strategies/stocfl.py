"""StoCFL: stochastic clustered FL with gradient sketches and bi-level cluster models."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import partial
from logging import INFO
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from ..core._moved import moved
from ..core.clustering import (
    MERGE_MODELS,
    SKETCH_MODES,
    Merge,
    SketchClustering,
    agreement_scores,
)
from ..core.sampling import partition_order, sample_share
from ..protocol import (
    EVALUATE,
    GLOBAL,
    LAMBDA,
    SERVER_ROUND,
    SKETCH_DIM,
    SKETCH_EPOCHS,
    SKETCH_MODE,
    SKETCH_SEED,
    TRAIN_BILEVEL,
)
from . import saved
from .aggregation import GroupModel, array_bytes, average_arrays, npz_bytes
from .declared import load_declared, missing_declared, refuse_missing, save_declared
from .decoding import values
from .exchange import collect_reply_list, screen, unreachable
from .fedavg import FedAvg
from .hook_support import HookSupport
from .node_registry import NodeRegistry, node_label
from .params import non_negative, setting
from .rounds import TrainResult
from .server_round import ClusteredRound
from .sketch_queries import SketchRegistry
from .state import NodeMap, StrategyState
from .stocfl_replies import (
    FALLBACKS,
    OWN,
    BilevelParts,
    BilevelScores,
    bilevel_messages,
    cluster_state,
    train_reply_problem,
)


class StoCFL(ClusteredRound):
    """StoCFL (Zeng et al.): clusters by sketches, bi-level global and cluster models.

    The method, the paper's equations it implements and every deliberate choice:
    docs/strategies/stocfl.md.

    Each round samples ``fraction_train`` of the connected nodes (less the held-out
    ones). A sampled node seen for the first time is asked for its sketch
    (``query.sketch``, at the anchor: the initial global model) and joins the
    clustering as a singleton cluster; clusters then merge greedily while their cosine
    similarity exceeds ``tau`` (:class:`~fedgsp_flwr.core.clustering.SketchClustering`).
    Only nodes sampled for training enter the clustering. Every sampled node gets the
    global model w and its cluster's model theta_k (``train.bilevel``) and returns both
    trained; w becomes the example-weighted mean over all sampled nodes, theta_k over
    cluster k's sampled members. A cluster that has not trained yet has no model of its
    own: it trains from the current w (as in the authors' code), and a merge never keeps
    such a model over a trained one (``merge_model``).

    Evaluation scores every evaluated node with its cluster's model and with w (both
    reported). It changes nothing in the clustering, the cluster models or what
    training uses. A node outside the clustering is scored with the model of the
    cluster nearest to its sketch (asked for once, kept apart in
    ``sketches.eval_sketches``), the paper's Sec. 4.4, and with w where there is no
    trained one; its sketch never enters the clustering, which asks again when the
    node is first sampled for training. Evaluation samples with its own generator, so
    ``fraction_evaluate`` changes neither which nodes train nor the clustering.

    A node that cannot answer ``query.sketch`` stays a singleton outside the
    clustering: it trains the global model with a plain ``train`` message and is
    evaluated with w; the run goes on with a logged warning.

    Attributes
    ----------
    clustering : SketchClustering
        The clustering of the nodes sampled for training, with their sketches.
    models : dict[int, ArrayRecord]
        The model theta_k of every cluster that has trained, by cluster id.
    sketches : SketchRegistry
        What the nodes' sketches told: partition ids, plain and silent nodes, the
        evaluation's sketches (for inference only).
    """

    # The state a checkpoint saves (node ids translated on resume):
    rng = saved.generator("stocfl-rng")  # node sampling, hold-out
    eval_rng = saved.generator("stocfl-eval-rng")
    models = saved.records("models", "model")  # theta_k of the clusters that trained
    trained = saved.node_set("trained")
    held_out = saved.node_set("held-out")
    _decided = saved.node_set("decided")  # nodes whose hold-out draw is done
    hooks = saved.learnt("hooks", HookSupport)
    clustering = saved.part("clustering", SketchClustering.state, SketchClustering.from_state)

    tau: float = setting(
        default=0.5, help="merge threshold on cluster cosine similarity (1: no merging, -1: "
        "one cluster)", check=lambda v: -1 <= v <= 1, rule="in [-1, 1]", key="stocfl-tau")
    lambda_: float = setting(
        default=0.05, help="weight of the proximal term tying each cluster model theta_k to "
        "the global model w (0: plain clustered FL)", check=non_negative, key="stocfl-lambda")
    sketch: str = setting(
        default="gradient", help="client sketch: gradient (the paper's Psi) or update (the "
        "authors' code: the anchor minus the anchor trained sketch_epochs local epochs)",
        choices=SKETCH_MODES, key="stocfl-sketch")
    sketch_dim: int = setting(
        default=0, help="sketch projected on the client to this many numbers (0 = model size)",
        check=non_negative, key="stocfl-sketch-dim")
    sketch_epochs: int = setting(
        default=1, help="local epochs of the update sketch", check=lambda v: v >= 1, rule=">= 1",
        key="stocfl-sketch-epochs")
    sketch_seed: int = setting(
        default=0, help="seed of the sketch projection (the app: its seed)", check=non_negative)
    merge_model: str = setting(
        default="larger", help="model of a merged cluster when both clusters' models have "
        "trained: the larger cluster's (the older one's on a tie; the authors' unite) or the "
        "size-weighted mean; a cluster that never trained never passes its model on over a "
        "trained one", choices=MERGE_MODELS, key="stocfl-merge-model")
    holdout_fraction: float = setting(
        default=0.0, help="fraction of the nodes (drawn with the seed when first connected) "
        "never sampled for training, scored by read-only inference (the paper's Table 4)",
        check=lambda v: 0 <= v < 1, rule="in [0, 1)", key="stocfl-holdout-fraction")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sketch_config = ConfigRecord({
            SKETCH_MODE: self.sketch, SKETCH_DIM: self.sketch_dim,
            SKETCH_EPOCHS: self.sketch_epochs, SKETCH_SEED: self.sketch_seed})
        self.hooks = HookSupport("StoCFL", FALLBACKS)
        self.sketches = SketchRegistry(self.hooks, self.sketch_config, self.query_timeout,
                                       self.known)
        self.cluster_eval: dict[int, dict[str, Any]] = {}  # last evaluation, by cluster
        self.clustering = SketchClustering(self.tau)

    def registry(self) -> NodeRegistry:
        """FedAvg's: StoCFL learns partition ids itself, with its sketches."""
        return FedAvg.registry(self)

    def summary(self) -> None:
        """Log StoCFL's settings, then FedAvg's."""
        log(INFO, "\t├──> StoCFL: tau=%g, lambda=%g, %s sketches (dim %s), merge=%s, "
            "hold-out %g", self.tau, self.lambda_, self.sketch_config[SKETCH_MODE],
            self.sketch_config[SKETCH_DIM] or "full", self.merge_model,
            self.holdout_fraction)
        super().summary()

    def node_partitions(self) -> dict[int, int]:
        """The partition ids the nodes reported with their sketches."""
        return {**super().node_partitions(), **self.sketches.labels()}

    def checkpoint_state(self) -> StrategyState:
        """FedAvg's, with the sketch registry's attributes beside StoCFL's."""
        state = super().checkpoint_state()
        save_declared(self.sketches, state)
        return state

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back :meth:`checkpoint_state` (nothing, if it lacks a key of either)."""
        refuse_missing("StoCFL", missing_declared(self.sketches, state))
        super().restore_state(state, node_map)
        load_declared(self.sketches, state, node_map)

    def cluster_new(self, grid: Grid, nodes: Sequence[int]) -> list[Merge]:
        """Sketch and cluster the nodes not seen before; merge the cluster models."""
        sketches = self.sketches.ask(grid, nodes, self.clustering)
        joining = self.sketches.order(sketches)
        if not joining:
            return []
        merges = self.clustering.add(joining, np.stack([sketches[n] for n in joining]))
        self.merge_models(merges)
        return merges

    def merge_models(self, merges: Sequence[Merge]) -> None:
        """Give each merged cluster its model (:meth:`Merge.model_weights`, rule
        ``merge_model``); a cluster without a model has not trained yet.
        """
        for merge in merges:
            kept, absorbed = self.models.get(merge.kept), self.models.pop(merge.absorbed, None)
            weights = merge.model_weights(self.merge_model, kept is not None,
                                          absorbed is not None)
            if weights is None or weights[1] == 0.0:
                continue  # no model yet, or the kept one stays
            self.models[merge.kept] = (cast(ArrayRecord, absorbed) if weights[0] == 0.0
                                       else average_arrays([cast(ArrayRecord, kept),
                                                            cast(ArrayRecord, absorbed)],
                                                           weights))

    def cluster_model(self, cluster: int | None, arrays: ArrayRecord) -> ArrayRecord:
        """A cluster's model theta_k, or the global model ``arrays`` for no cluster or one
        that has not trained yet.
        """
        return arrays if cluster is None else self.models.get(cluster, arrays)

    def cluster_metrics(self) -> dict[str, Any]:
        """Number and sizes of clusters, clients seen, and ARI/NMI if ground truth."""
        sizes = sorted(self.clustering.sizes().values(), reverse=True)
        metrics: dict[str, Any] = {
            "num-clusters": len(sizes), "cluster-sizes": sizes,
            "clustered-clients": len(self.clustering.cluster_of),
            "plain-clients": len(self.sketches.plain),
        }
        metrics.update(agreement_scores(self.clustering.cluster_of, self.sketches.partition_ids,
                                        self.ground_truth))
        return metrics

    def sample_not_held_out(self, connected: Sequence[int]) -> list[int]:
        """Draw the hold-out of newly connected nodes, then sample the training nodes
        (both in partition-id order).
        """
        fresh = [n for n in self.sketches.order(connected) if n not in self._decided]
        if fresh and self.holdout_fraction > 0:
            take = round(self.holdout_fraction * len(fresh))
            picked = self.rng.choice(len(fresh), take, replace=False)
            self.held_out.update(fresh[i] for i in picked.tolist())
        self._decided.update(fresh)
        eligible = self.sketches.order(n for n in connected if n not in self.held_out)
        return sample_share(eligible, self.fraction_train, self.min_train_nodes, self.rng)

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Sketch and cluster new nodes, run the bi-level round, keep its result."""
        started = time.monotonic()
        if self.sketches.anchor is None:
            self.sketches.anchor = arrays
        self.sketches.train_config = config
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)  # waits for nodes
        self.sketches.learn_partitions(grid, connected)
        sampled = self.sample_not_held_out(self.sketches.reachable(grid, connected))
        merges = self.cluster_new(grid, sampled)
        train_config = ConfigRecord(dict(config))
        train_config[SERVER_ROUND] = server_round
        train_config[LAMBDA] = self.lambda_
        plan = [part for node in sampled for part in self.training_plan(node, arrays,
                                                                         train_config)]
        replies = self.hooks.collect(grid, [m for _, _, m in plan], self.reply_timeout)
        if not self.hooks.has(TRAIN_BILEVEL) and any(kind == TRAIN_BILEVEL for _, kind, _ in plan):
            # The probe found no bi-level handler: those nodes train twice, plainly.
            kept = [(part, r) for part, r in zip(plan, replies, strict=True)
                    if part[1] != TRAIN_BILEVEL]
            redo = [part for node, kind, _ in plan if kind == TRAIN_BILEVEL
                    for part in self.training_plan(node, arrays, train_config)]
            plan = [part for part, _ in kept] + redo
            replies = [r for _, r in kept] + collect_reply_list(
                grid, [m for _, _, m in redo], self.reply_timeout)
        self.sketches.suspects.update(n for (n, _, _), r in zip(plan, replies, strict=True)
                             if unreachable(r))
        screened = screen("StoCFL", server_round, [(node, kind) for node, kind, _ in plan],
                          replies, lambda kind, reply: train_reply_problem(
                              reply, arrays, self.weighted_by_key, kind == TRAIN_BILEVEL),
                          self.known.partition_ids)
        parts = BilevelParts.of(screened.sound, self.clustering.cluster_of,
                                self.weighted_by_key)
        self.trained |= parts.trained
        for cluster, trained_parts in parts.cluster_parts.items():
            self.models[cluster] = average_arrays(*zip(*trained_parts, strict=True))
        new_global = (average_arrays(*zip(*parts.global_parts, strict=True))
                      if parts.global_parts else None)
        round_metrics: dict[str, Any] = (dict(self.train_metrics_aggr_fn(
            parts.reported, self.weighted_by_key)) if parts.reported else {})
        round_metrics.update(self.cluster_metrics())
        messages = [m for _, _, m in plan]
        round_metrics.update({
            "merges": len(merges), "sampled": len(sampled),
            "clusters-trained": len(parts.cluster_parts), "bytes-sent": array_bytes(messages),
            "bytes-received": array_bytes(r for r in replies if r is not None),
            "train-time": time.monotonic() - started,
        })
        log(INFO, "StoCFL round %d: %d clusters over %d clients (%d merges)%s", server_round,
            round_metrics["num-clusters"], round_metrics["clustered-clients"], len(merges),
            f", ARI {round_metrics['ari']:.3f}" if "ari" in round_metrics else "")
        return self.finish_round(server_round, new_global, round_metrics, len(parts.trained),
                                 screened.rejected(), len(sampled))

    def training_plan(self, node: int, arrays: ArrayRecord,
                      config: ConfigRecord) -> list[tuple[int, str, Message]]:
        """A sampled node's training messages, as (node, kind, message)
        (:func:`~fedgsp_flwr.strategies.stocfl_replies.bilevel_messages`): w alone for a
        plain node, else w and its cluster's theta_k."""
        theta = (None if node in self.sketches.plain
                 else self.cluster_model(self.clustering.cluster_of[node], arrays))
        return bilevel_messages(node, arrays, theta, config, self.hooks.has(TRAIN_BILEVEL))

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """Score sampled nodes on their cluster's model and on w; keep the metrics.

        Whatever the ClientApp names its metrics (``eval_acc``), each is reported for
        the nodes' own models under its name, for w with ``-global`` appended, and for
        the nodes that trained and the new ones with ``-trained`` / ``-new`` (and
        ``-global-trained`` / ``-global-new``); per cluster in :meth:`group_models`.
        ``eval-placed`` counts the nodes outside the clustering scored by inference
        (:meth:`eval_models`). Nothing the training uses changes here.
        """
        if self.fraction_evaluate == 0.0:
            return None
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)
        nodes = sample_share(partition_order(
            (n for n in connected if n not in self.sketches.suspects), self.sketches.labels()),
            self.fraction_evaluate, self.min_evaluate_nodes, self.eval_rng)
        models, inferred = self.eval_models(grid, nodes, arrays)
        screened = self.evaluate_groups(server_round, grid, config, [
            (node, kind, model) for node, own in zip(nodes, models, strict=True)
            for kind, model in ((OWN, own), (GLOBAL, arrays))]).screened
        scores = BilevelScores.of(nodes, screened, self.trained, self.clustering.cluster_of)
        aggregate = self.evaluate_metrics_aggr_fn
        self.cluster_eval = {c: dict(aggregate(contents, self.weighted_by_key))
                             for c, contents in scores.by_cluster.items()}
        metrics = (MetricRecord({"eval-placed": inferred,
                                 **scores.metrics(aggregate, self.weighted_by_key)})
                   if scores.subsets else None)
        self.history.record(server_round, EVALUATE, metrics, len(scores.subsets.get("", [])),
                            scores.rejected)
        return metrics
    def eval_models(self, grid: Grid, nodes: Sequence[int], arrays: ArrayRecord
                    ) -> tuple[list[ArrayRecord], int]:
        """The model to score each node with, and how many were chosen by inference.

        A clustered node: its cluster's model. A node outside the clustering with a
        sketch: the model of the nearest cluster (the one it would join, or the one a
        new cluster would start from: the paper's Sec. 4.4), found by the read-only
        :meth:`SketchClustering.infer_all`. The global model ``arrays`` for the others
        and where that cluster has not trained yet.
        """
        outside = [n for n in nodes if n not in self.clustering.cluster_of
                   and n not in self.sketches.plain]
        self.sketches.fetch_eval(grid, outside, self.clustering.dim)
        nearest = self.sketches.inferred(self.clustering, outside)
        models = [self.cluster_model(self.clustering.cluster_of.get(n, nearest.get(n)),
                                     arrays) for n in nodes]
        return models, len(nearest)

    def group_models(self) -> dict[int, GroupModel]:
        """Each cluster's model theta_k with its members and last evaluation, by cluster
        (the global model for a cluster that has not trained).
        """
        fallback = cast(ArrayRecord, self.progress.last_trained)
        return {c: GroupModel(self.models.get(c, fallback), self.sketches.order(members), {
            n: self.sketches.partition_ids[n] for n in members if n in self.sketches.partition_ids},
            self.cluster_eval.get(c, {})) for c, members in self.clustering.clusters.items()}

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """Files of the cluster state for the run's results folder.

        ``clusters.json`` (every round): each clustered node's cluster, by partition id
        where reported, the clusters not trained yet (their model is w), the plain and
        held-out nodes, and the nearest cluster of each node outside the clustering
        that sent an evaluation sketch (``inferred``). With ``final``, also
        ``cluster-models.npz`` (arrays ``<cluster>/<name>``, the trained clusters) and
        ``sketches.npz`` (the clustered nodes', by partition id, or node id).
        """
        name = partial(node_label, partition_ids=self.sketches.labels())
        state = cluster_state(name, self.clustering.clusters, self.models, self.sketches.plain,
                              self.held_out, self.sketches.inferred(self.clustering),
                              {"tau": self.tau, "lambda": self.lambda_})
        files: dict[str, bytes | str] = {"clusters.json": json.dumps(state, indent=1)}
        if final:
            for filename, arrays in (
                ("cluster-models.npz", {f"{c}/{k}": values(v) for c, record in
                                        self.models.items() for k, v in record.items()}),
                ("sketches.npz", {name(n): s for n, s in self.clustering.sketches.items()}),
            ):
                files[filename] = npz_bytes(arrays)
        return files


PARAMS = StoCFL.spec
_MOVED = {name: f"{__package__}.sketch_queries:{name}"
          for name in ("SketchReplies", "BUFFER_SUFFIXES")}
__getattr__ = moved(__name__, _MOVED)
