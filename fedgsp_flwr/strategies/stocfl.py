"""StoCFL: stochastic clustered FL with gradient sketches and bi-level cluster models."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from functools import partial
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

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
    QUERY_SKETCH,
    SERVER_ROUND,
    SKETCH_DIM,
    SKETCH_EPOCHS,
    SKETCH_MODE,
    SKETCH_SEED,
    TRAIN_BILEVEL,
)
from . import saved
from .aggregation import GroupModel, array_bytes, average_arrays, npz_bytes
from .decoding import values
from .exchange import collect_reply_list, screen, unreachable
from .fedavg import FedAvg
from .hook_support import HookSupport
from .node_queries import query_partitions
from .node_registry import NodeRegistry, node_label
from .params import non_negative, setting
from .rounds import TrainResult
from .server_round import ClusteredRound
from .sketch_queries import (
    SketchReplies,
    query_sketches,
    silent_still,
    sketch_length,
    sketch_messages,
)
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
    :attr:`eval_sketches`), the paper's Sec. 4.4, and with w where there is no
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
    eval_sketches : dict[int, np.ndarray]
        Sketches of evaluated nodes outside the clustering, for inference only.
    """

    # The state a checkpoint saves (node ids translated on resume):
    rng = saved.generator("stocfl-rng")  # node sampling, hold-out
    eval_rng = saved.generator("stocfl-eval-rng")
    models = saved.records("models", "model")  # theta_k of the clusters that trained
    anchor = saved.record("anchor")  # the initial global model: sketches are taken at it
    plain = saved.node_map("plain")  # node -> why no sketch
    partition_ids = saved.node_map("partition-ids")
    trained = saved.node_set("trained")
    held_out = saved.node_set("held-out")
    _decided = saved.node_set("decided")  # nodes whose hold-out draw is done
    suspects = saved.node_set("suspects")  # nodes that did not answer their last message
    hooks = saved.learnt("hooks", HookSupport)
    eval_partitions = saved.node_map(  # with an eval sketch
        "eval-partitions", optional=True)
    clustering = saved.part("clustering", SketchClustering.state, SketchClustering.from_state)
    eval_sketches = saved.node_vectors("eval-sketch-nodes", "eval-sketch")  # for inference

    tau: float = setting(
        default=0.5, help="merge threshold on cluster cosine similarity (1: no merging, -1: "
        "one cluster)", check=lambda v: -1 <= v <= 1, rule="in [-1, 1]", key="stocfl-tau")
    lambda_: float = setting(
        default=0.05, help="weight of the proximal term tying each cluster model theta_k to "
        "the global model w (0: plain clustered FL)", check=non_negative, rule=">= 0",
        key="stocfl-lambda")
    sketch: str = setting(
        default="gradient", help="client sketch: gradient (the paper's Psi) or update (the "
        "authors' code: the anchor minus the anchor trained sketch_epochs local epochs)",
        choices=SKETCH_MODES, key="stocfl-sketch")
    sketch_dim: int = setting(
        default=0, help="sketch projected on the client to this many numbers (0 = model size)",
        check=non_negative, rule=">= 0", key="stocfl-sketch-dim")
    sketch_epochs: int = setting(
        default=1, help="local epochs of the update sketch", check=lambda v: v >= 1, rule=">= 1",
        key="stocfl-sketch-epochs")
    sketch_seed: int = setting(
        default=0, help="seed of the sketch projection (the app: its seed)", check=non_negative,
        rule=">= 0")
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
        self._train_config = ConfigRecord()  # the last round's, for sketch queries
        self.hooks = HookSupport("StoCFL", FALLBACKS)
        self.cluster_eval: dict[int, dict[str, Any]] = {}  # last evaluation, by cluster
        self.clustering = SketchClustering(self.tau)
        self._asked: set[int] = set()  # nodes asked for their partition id

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
        return {**super().node_partitions(), **self.eval_partitions, **self.partition_ids}

    def order(self, nodes: Iterable[int]) -> list[int]:
        """The nodes in :func:`~fedgsp_flwr.core.sampling.partition_order`."""
        return partition_order(nodes, self.partition_ids)

    def sketch_queries(self, nodes: Sequence[int]) -> list[Message]:
        """``query.sketch`` messages at the anchor: the sketch settings and the last
        round's training config (the ``update`` sketch trains with it).
        """
        assert self.anchor is not None
        return sketch_messages(self.anchor, ConfigRecord(
            {**dict(self._train_config), **dict(self.sketch_config)}), nodes)

    def query_sketches(self, grid: Grid, nodes: Sequence[int]) -> SketchReplies:
        """Ask the nodes for their sketches at the anchor; change no state."""
        if not nodes:
            return SketchReplies()
        size = sketch_length(self.anchor, cast(int, self.sketch_config[SKETCH_DIM]),
                             self.clustering.dim)
        return query_sketches(grid, self.sketch_queries(nodes), size, self.hooks,
                              self.query_timeout,
                              {p: n for n, p in self.partition_ids.items()},
                              self.known.num_partitions)

    def ask_sketches(self, grid: Grid, nodes: Sequence[int]) -> dict[int, np.ndarray]:
        """Ask the nodes neither clustered nor plain yet for their sketches at the anchor
        (training); those without a usable sketch become plain nodes.
        """
        nodes = [n for n in nodes if n not in self.clustering.cluster_of and n not in self.plain]
        replies = self.query_sketches(grid, nodes)
        self.partition_ids.update(replies.partitions)
        for node in nodes:  # an evaluation's sketch is never reused for the clustering
            self.eval_sketches.pop(node, None)
        for node in replies.partitions:
            self.eval_partitions.pop(node, None)
        for node, problem in replies.problems.items():
            self.plain[node] = problem
            if self.hooks.has(QUERY_SKETCH):  # else HookSupport warned once for all
                log(WARNING, "StoCFL: node %d has no sketch (%s); it stays a singleton "
                    "trained on the global model", node, problem)
        return replies.sketches

    def reachable(self, grid: Grid, connected: Sequence[int]) -> list[int]:
        """The connected nodes less the suspects that still do not answer.

        A node that did not answer its last message (crashed, or its SuperNode went
        offline) is asked for its sketch anew (an ``evaluate`` where the ClientApp has no
        sketch handler) before it is sampled again; it keeps its cluster. Suspects that
        left the grid are dropped from the list.
        """
        self.suspects &= set(connected)
        probe = self.order(self.suspects)
        if probe:
            self.suspects = silent_still(grid, self.sketch_queries(probe), self.hooks,
                                         self.query_timeout)
            log(INFO, "StoCFL: %d of %d silent node(s) answer again; %s sit out",
                len(probe) - len(self.suspects), len(probe), sorted(self.suspects) or "none")
        return [n for n in connected if n not in self.suspects]

    def cluster_new(self, grid: Grid, nodes: Sequence[int]) -> list[Merge]:
        """Sketch and cluster the nodes not seen before; merge the cluster models."""
        sketches = self.ask_sketches(grid, nodes)
        joining = self.order(sketches)
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
            "plain-clients": len(self.plain),
        }
        metrics.update(agreement_scores(self.clustering.cluster_of, self.partition_ids,
                                        self.ground_truth))
        return metrics

    def learn_partitions(self, grid: Grid, nodes: Sequence[int]) -> None:
        """Ask the nodes not asked yet for their partition id (``query.partition``: no
        data), so that hold-out and samples follow partition ids, the same in every run
        of a seed, from the first round on. A node asked once is not asked again.
        """
        new = [n for n in nodes if n not in self.partition_ids and n not in self._asked]
        self._asked.update(new)
        if not new:
            return
        replies = query_partitions(grid, new, self.query_timeout, self.hooks)
        self.partition_ids.update(replies.partition_ids)

    def sample_not_held_out(self, connected: Sequence[int]) -> list[int]:
        """Draw the hold-out of newly connected nodes, then sample the training nodes
        (both in partition-id order).
        """
        fresh = [n for n in self.order(connected) if n not in self._decided]
        if fresh and self.holdout_fraction > 0:
            take = round(self.holdout_fraction * len(fresh))
            picked = self.rng.choice(len(fresh), take, replace=False)
            self.held_out.update(fresh[i] for i in picked.tolist())
        self._decided.update(fresh)
        eligible = self.order(n for n in connected if n not in self.held_out)
        return sample_share(eligible, self.fraction_train, self.min_train_nodes, self.rng)

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Sketch and cluster new nodes, run the bi-level round, keep its result."""
        started = time.monotonic()
        if self.anchor is None:
            self.anchor = arrays
        self._train_config = config
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)  # waits for nodes
        self.learn_partitions(grid, connected)
        sampled = self.sample_not_held_out(self.reachable(grid, connected))
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
        self.suspects.update(n for (n, _, _), r in zip(plan, replies, strict=True)
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
        theta = (None if node in self.plain
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
            (n for n in connected if n not in self.suspects),
            {**self.eval_partitions, **self.partition_ids}),
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
                   and n not in self.plain]
        self.fetch_eval_sketches(grid, outside)
        nearest = self.inferred_clusters(outside)
        models = [self.cluster_model(self.clustering.cluster_of.get(n, nearest.get(n)),
                                     arrays) for n in nodes]
        return models, len(nearest)

    def fetch_eval_sketches(self, grid: Grid, nodes: Sequence[int]) -> None:
        """Ask the nodes without one in :attr:`eval_sketches` for a sketch and keep it
        there, for inference only (never in the clustering; a node without a sketch
        does not become plain).

        Only once training's queries showed that the ClientApp answers ``query.sketch``:
        an evaluation's probe must not decide which nodes training clusters.
        """
        if QUERY_SKETCH not in self.hooks.present:
            return
        dim = self.clustering.dim
        for node in [n for n in nodes if dim is not None and n in self.eval_sketches
                     and len(self.eval_sketches[n]) != dim]:
            del self.eval_sketches[node]  # sent before the clustering had a dimension
        replies = self.query_sketches(grid, [n for n in nodes if n not in self.eval_sketches])
        self.eval_sketches.update(replies.sketches)
        self.eval_partitions.update(replies.partitions)
        for node, problem in replies.problems.items():
            log(WARNING, "StoCFL evaluation: node %d has no sketch (%s); it is scored with "
                "the global model", node, problem)

    def inferred_clusters(self, nodes: Iterable[int] | None = None) -> dict[int, int]:
        """The nearest cluster of each node (default: all) with a sketch in
        :attr:`eval_sketches`, by the read-only :meth:`SketchClustering.infer_all`.
        """
        chosen = self.eval_sketches if nodes is None else nodes
        usable = {n: self.eval_sketches[n] for n in chosen if n in self.eval_sketches
                  and len(self.eval_sketches[n]) == self.clustering.dim}
        if not usable or not self.clustering.num_clusters:
            return {}
        placements = self.clustering.infer_all(np.stack(list(usable.values())))
        return {n: cast(int, p.nearest) for n, p in zip(usable, placements, strict=True)}

    def group_models(self) -> dict[int, GroupModel]:
        """Each cluster's model theta_k with its members and last evaluation, by cluster
        (the global model for a cluster that has not trained).
        """
        fallback = cast(ArrayRecord, self.progress.last_trained)
        return {c: GroupModel(self.models.get(c, fallback), self.order(members), {
            n: self.partition_ids[n] for n in members if n in self.partition_ids},
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
        partitions = {**self.eval_partitions, **self.partition_ids}
        name = partial(node_label, partition_ids=partitions)
        state = cluster_state(name, self.clustering.clusters, self.models, self.plain,
                              self.held_out, self.inferred_clusters(),
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
