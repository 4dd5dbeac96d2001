"""StoCFL: stochastic clustered FL with gradient sketches and bi-level cluster models."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
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
from .fedavg import ServerSideRound, array_bytes, average_arrays, check_parameters
from .nodes import (
    collect_reply_list,
    node_label,
    reported_partition,
    unreachable,
    vector_problem,
)
from .replies import arrays_problem, reply_problem
from .state import (
    NodeMap,
    StrategyState,
    from_pairs,
    generator_state,
    pairs,
    prefixed,
    record_arrays,
    set_generator_state,
    to_record,
    under,
)

GLOBAL, CLUSTER = "global", "cluster"


class StoCFL(ServerSideRound):
    """StoCFL (Zeng et al.): clusters by sketches, bi-level global and cluster models.

    The method, the paper's equations it implements and every deliberate choice:
    docs/algorithms.md#stocfl.

    Each round samples ``fraction_train`` of the connected nodes (less the held-out
    ones). A sampled node seen for the first time is asked for its sketch
    (``query.sketch``, at the anchor: the initial global model) and joins the
    clustering as a singleton cluster (model: the initial model, as every cluster at
    the start); clusters then merge greedily while their cosine similarity exceeds
    ``tau`` (:class:`~fedgsp_flwr.core.clustering.SketchClustering`). Every
    sampled node gets the global model w and its cluster's model theta_k
    (``train.bilevel``) and returns both trained; w becomes the example-weighted mean
    over all sampled nodes, theta_k over cluster k's sampled members.

    Evaluation scores every evaluated node with its cluster's model and with w (both
    reported); a node never clustered is first placed by inference: it joins the most
    similar cluster if the similarity is at least ``tau``, otherwise a new cluster
    that starts from the nearest cluster's model.

    A node that cannot answer ``query.sketch`` stays a singleton outside the
    clustering: it trains the global model with a plain ``train`` message and is
    evaluated with w; the run goes on with a logged warning.

    Parameters
    ----------
    tau : float (default: 0.5)
        Merge threshold in [-1, 1] (1: no merging, -1: one cluster).
    lambda_ : float (default: 0.05)
        Weight of the proximal term tying theta_k to w (0: plain clustered FL).
    sketch : str (default: "gradient")
        ``gradient`` (the paper's Psi) or ``update`` (the authors' code: the anchor
        minus the anchor trained ``sketch_epochs`` local epochs).
    sketch_dim : int (default: 0)
        Clients project their sketch to this many numbers (0 = the model's size).
    sketch_epochs : int (default: 1)
        Local epochs of the ``update`` sketch.
    sketch_seed : int (default: 0)
        Seed of the clients' common projection.
    merge_model : str (default: "larger")
        Model of a merged cluster: the ``larger`` cluster's, or the size-``weighted``
        average of both.
    holdout_fraction : float (default: 0.0)
        Fraction of the nodes (drawn with the seed when first connected) never sampled
        for training; evaluation places them by inference (the paper's Table 4).
    ground_truth : Mapping[int, int] | None (default: None)
        Latent group of each partition id, to report ARI and NMI each round.
    query_timeout : float (default: 300.0)
        Seconds to wait for sketch replies (``query.sketch``, which carries the round's
        training config beside the sketch settings).
    train_timeout : float (default: 3600.0)
        Seconds to wait for the training (and evaluation) replies of a round.
    seed : int (default: 0)
        Seed of node sampling and hold-out.
    **kwargs : Any
        FedAvg parameters (``fraction_train``, ``fraction_evaluate``,
        ``min_available_nodes``, ...).
    """

    def __init__(
        self,
        *,
        tau: float = 0.5,
        lambda_: float = 0.05,
        sketch: str = "gradient",
        sketch_dim: int = 0,
        sketch_epochs: int = 1,
        sketch_seed: int = 0,
        merge_model: str = "larger",
        holdout_fraction: float = 0.0,
        ground_truth: Mapping[int, int] | None = None,
        query_timeout: float = 300.0,
        train_timeout: float = 3600.0,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        checks = [
            (-1.0 <= tau <= 1.0, f"tau must be in [-1, 1], got {tau}"),
            (lambda_ >= 0, f"lambda_ must be >= 0, got {lambda_}"),
            (sketch in SKETCH_MODES, f"sketch must be one of {SKETCH_MODES}, got {sketch!r}"),
            (sketch_dim >= 0 and sketch_epochs >= 1 and sketch_seed >= 0,
             "sketch_dim and sketch_seed must be >= 0, sketch_epochs >= 1"),
            (merge_model in MERGE_MODELS,
             f"merge_model must be one of {MERGE_MODELS}, got {merge_model!r}"),
            (0.0 <= holdout_fraction < 1.0, "holdout_fraction must be in [0, 1)"),
            (query_timeout > 0 and train_timeout > 0, "timeouts must be > 0"),
        ]
        check_parameters("StoCFL", checks)
        self.tau, self.lambda_ = tau, lambda_
        self.sketch_config = ConfigRecord({
            "sketch-mode": sketch, "sketch-dim": sketch_dim,
            "sketch-epochs": sketch_epochs, "sketch-seed": sketch_seed})
        self.merge_model = merge_model
        self._train_config = ConfigRecord()  # the last round's, for sketch queries
        self.holdout_fraction = holdout_fraction
        self.ground_truth = dict(ground_truth or {})
        self.query_timeout, self.train_timeout = query_timeout, train_timeout
        self.rng = np.random.default_rng([seed, 0])
        self.eval_rng = np.random.default_rng([seed, 1])
        self.clustering = SketchClustering(tau)
        self.models: dict[int, ArrayRecord] = {}
        self.anchor: ArrayRecord | None = None
        self.plain: dict[int, str] = {}  # node -> why it has no sketch
        self.suspects: set[int] = set()  # nodes that did not answer their last message
        self.partition_ids: dict[int, int] = {}
        self.trained: set[int] = set()
        self.held_out: set[int] = set()
        self._decided: set[int] = set()  # nodes whose hold-out draw is done
        self._eval_result: MetricRecord | None = None

    def summary(self) -> None:
        """Log StoCFL's settings, then FedAvg's."""
        log(INFO, "\t├──> StoCFL: tau=%g, lambda=%g, %s sketches (dim %s), merge=%s, "
            "hold-out %g", self.tau, self.lambda_, self.sketch_config["sketch-mode"],
            self.sketch_config["sketch-dim"] or "full", self.merge_model,
            self.holdout_fraction)
        super().summary()

    # --- checkpoint -------------------------------------------------------------------

    def checkpoint_state(self) -> StrategyState:
        """The clustering with its cached sketches, the cluster models and anchor, the
        node sets, the random generators.
        """
        state = super().checkpoint_state()
        meta, arrays = self.clustering.state()
        state.merge("clustering", StrategyState(meta, arrays))
        state.meta.update({
            "stocfl-rng": generator_state(self.rng),
            "stocfl-eval-rng": generator_state(self.eval_rng),
            "models": sorted(self.models), "plain": pairs(self.plain),
            "partition-ids": pairs(self.partition_ids), "trained": sorted(self.trained),
            "held-out": sorted(self.held_out), "decided": sorted(self._decided),
            "suspects": sorted(self.suspects),
        })
        for cluster, model in self.models.items():
            state.arrays.update(prefixed(record_arrays(model), f"model-{cluster}"))
        if self.anchor is not None:
            state.arrays.update(prefixed(record_arrays(self.anchor), "anchor"))
        return state

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`."""
        super().restore_state(state, node_map)
        meta = state.meta
        part = state.part("clustering")
        self.clustering = SketchClustering.from_state(part.meta, part.arrays, node_map)
        set_generator_state(self.rng, meta["stocfl-rng"])
        set_generator_state(self.eval_rng, meta["stocfl-eval-rng"])
        self.models = {int(c): to_record(under(state.arrays, f"model-{c}"))
                       for c in meta["models"]}
        anchor = under(state.arrays, "anchor")
        self.anchor = to_record(anchor) if anchor else None
        self.plain = from_pairs(meta["plain"], node_map)
        self.partition_ids = from_pairs(meta["partition-ids"], node_map)
        self.trained = {node_map(n) for n in meta["trained"]}
        self.held_out = {node_map(n) for n in meta["held-out"]}
        self._decided = {node_map(n) for n in meta["decided"]}
        self.suspects = {node_map(n) for n in meta["suspects"]}

    def node_partitions(self) -> dict[int, int]:
        """The partition ids the nodes reported with their sketches."""
        return {**super().node_partitions(), **self.partition_ids}

    # --- clustering -------------------------------------------------------------------

    def order(self, nodes: Iterable[int]) -> list[int]:
        """The nodes in :func:`~fedgsp_flwr.core.sampling.partition_order`."""
        return partition_order(nodes, self.partition_ids)

    def sketch_queries(self, nodes: Sequence[int]) -> list[Message]:
        """``query.sketch`` messages at the anchor: the sketch settings and the last
        round's training config (the ``update`` sketch trains with it).
        """
        assert self.anchor is not None
        config = ConfigRecord({**dict(self._train_config), **dict(self.sketch_config)})
        return [Message(RecordDict({"arrays": self.anchor, "config": config}),
                        dst_node_id=n, message_type="query.sketch") for n in nodes]

    def ask_sketches(self, grid: Grid, nodes: Sequence[int]) -> dict[int, np.ndarray]:
        """Ask the nodes neither clustered nor plain yet for their sketches at the anchor;
        those without a usable sketch become plain nodes.
        """
        nodes = [n for n in nodes if n not in self.clustering.cluster_of and n not in self.plain]
        if not nodes:
            return {}
        messages = self.sketch_queries(nodes)
        size = self.clustering.dim
        sketches: dict[int, np.ndarray] = {}
        for node, reply in zip(nodes, collect_reply_list(grid, messages, self.query_timeout),
                               strict=True):
            problem = (f"no reply within {self.query_timeout:g}s" if reply is None
                       else vector_problem(reply, "sketch", size))
            if problem is None and reply is not None:
                vector = reply.content.array_records["sketch"]["sketch"].numpy()
                if not np.linalg.norm(vector.astype(np.float64)) > 0:
                    problem = "sketch has zero norm"
                else:
                    sketches[node] = vector.astype(np.float32)
                    size = len(vector)
                    if (partition := reported_partition(reply)) is not None:
                        self.partition_ids[node] = partition
            if problem is not None:
                self.plain[node] = problem
                log(WARNING, "StoCFL: node %d has no sketch (%s); it stays a singleton "
                    "trained on the global model", node, problem)
        return sketches

    def reachable(self, grid: Grid, connected: Sequence[int]) -> list[int]:
        """The connected nodes less the suspects that still do not answer.

        A node that did not answer its last message (crashed, or its SuperNode went
        offline) is asked for its sketch anew before it is sampled again; it keeps its
        cluster. Suspects that left the grid are dropped from the list.
        """
        self.suspects &= set(connected)
        probe = self.order(self.suspects)
        if probe:
            replies = collect_reply_list(grid, self.sketch_queries(probe), self.query_timeout)
            self.suspects = {n for n, r in zip(probe, replies, strict=True) if unreachable(r)}
            log(INFO, "StoCFL: %d of %d silent node(s) answer again; %s sit out",
                len(probe) - len(self.suspects), len(probe), sorted(self.suspects) or "none")
        return [n for n in connected if n not in self.suspects]

    def cluster_new(self, grid: Grid, nodes: Sequence[int]) -> list[Merge]:
        """Sketch and cluster the nodes not seen before; merge the cluster models."""
        sketches = self.ask_sketches(grid, nodes)
        joining = self.order(sketches)
        if not joining:
            return []
        before = set(self.clustering.clusters)
        merges = self.clustering.add(joining, np.stack([sketches[n] for n in joining]))
        created = {self.clustering.cluster_of[n] for n in joining} | {
            m.absorbed for m in merges}
        assert self.anchor is not None
        for cluster in created - before:
            self.models[cluster] = self.anchor  # every cluster starts as the initial model
        for merge in merges:
            absorbed = self.models.pop(merge.absorbed)
            if (weights := merge.model_weights(self.merge_model)) is not None:
                self.models[merge.kept] = average_arrays([self.models[merge.kept], absorbed],
                                                         weights)
        return merges

    def place_new(self, grid: Grid, nodes: Sequence[int]) -> int:
        """Place never-clustered nodes by inference (evaluation); return how many."""
        sketches = self.ask_sketches(grid, nodes)
        for node in self.order(sketches):
            placement = self.clustering.place(node, sketches[node])
            if placement.new:
                self.models[placement.cluster] = (
                    self.models[placement.nearest] if placement.nearest is not None
                    else cast(ArrayRecord, self.anchor))
        return len(sketches)

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

    # --- training ---------------------------------------------------------------------

    def sample_train(self, connected: Sequence[int]) -> list[int]:
        """Draw the hold-out of newly connected nodes, then sample the training nodes."""
        fresh = [n for n in sorted(connected) if n not in self._decided]
        if fresh and self.holdout_fraction > 0:
            take = int(round(self.holdout_fraction * len(fresh)))
            picked = self.rng.choice(len(fresh), take, replace=False)
            self.held_out.update(fresh[i] for i in picked.tolist())
        self._decided.update(fresh)
        eligible = self.order(n for n in connected if n not in self.held_out)
        return sample_share(eligible, self.fraction_train, self.min_train_nodes, self.rng)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sketch and cluster new nodes, run the bi-level round, keep its result."""
        started = time.monotonic()
        if self.anchor is None:
            self.anchor = arrays
        self._train_config = config
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)  # waits for nodes
        sampled = self.sample_train(self.reachable(grid, connected))
        merges = self.cluster_new(grid, sampled)
        train_config = ConfigRecord(dict(config))
        train_config["server-round"] = server_round
        train_config["lambda"] = self.lambda_
        messages = []
        for node in sampled:
            if node in self.plain:
                content = RecordDict({"arrays": arrays, "config": train_config})
                messages.append(Message(content, dst_node_id=node, message_type="train"))
            else:
                theta = self.models[self.clustering.cluster_of[node]]
                content = RecordDict({GLOBAL: arrays, CLUSTER: theta, "config": train_config})
                messages.append(Message(content, dst_node_id=node,
                                        message_type="train.bilevel"))
        replies = collect_reply_list(grid, messages, self.train_timeout)
        self.suspects.update(n for n, r in zip(sampled, replies, strict=True) if unreachable(r))
        global_parts: list[tuple[ArrayRecord, float]] = []
        cluster_parts: dict[int, list[tuple[ArrayRecord, float]]] = {}
        losses: list[tuple[float, float, float]] = []
        rejected: dict[int, str] = {}
        for node, reply in zip(sampled, replies, strict=True):
            cluster = None if node in self.plain else self.clustering.cluster_of[node]
            problem = ("no reply within the round's timeout" if reply is None else
                       self.train_reply_problem(reply, arrays, cluster))
            if problem is not None or reply is None:
                rejected[node] = problem or ""
                log(WARNING, "StoCFL round %d: rejected reply from node %d: %s",
                    server_round, node, problem)
                continue
            metrics = reply.content["metrics"]
            weight = float(cast(float, metrics[self.weighted_by_key]))
            self.trained.add(node)
            if cluster is None:  # a plain train reply: one ArrayRecord, whatever its name
                global_parts.append((next(iter(reply.content.array_records.values())),
                                     weight))
                continue
            global_parts.append((reply.content.array_records[GLOBAL], weight))
            cluster_parts.setdefault(cluster, []).append(
                (reply.content.array_records[CLUSTER], weight))
            losses.append((weight, float(cast(float, metrics.get("train-loss", 0.0))),
                           float(cast(float, metrics.get("global-train-loss", 0.0)))))
        for cluster, parts in cluster_parts.items():
            self.models[cluster] = average_arrays(*zip(*parts, strict=True))
        new_global = average_arrays(*zip(*global_parts, strict=True)) if global_parts else None
        if new_global is None:
            log(WARNING, "StoCFL round %d: no sound reply; the models are kept", server_round)
        round_metrics = self.cluster_metrics()
        round_metrics.update({
            "merges": len(merges), "sampled": len(sampled),
            "clusters-trained": len(cluster_parts), "bytes-sent": array_bytes(messages),
            "bytes-received": array_bytes(r for r in replies if r is not None),
            "train-time": time.monotonic() - started,
        })
        if losses:
            w = np.array([x[0] for x in losses])
            round_metrics["train-loss"] = float(np.average([x[1] for x in losses], weights=w))
            round_metrics["global-train-loss"] = float(
                np.average([x[2] for x in losses], weights=w))
        log(INFO, "StoCFL round %d: %d clusters over %d clients (%d merges)%s", server_round,
            round_metrics["num-clusters"], round_metrics["clustered-clients"], len(merges),
            f", ARI {round_metrics['ari']:.3f}" if "ari" in round_metrics else "")
        return self.finish_round(server_round, new_global, round_metrics,
                                 len(sampled) - len(rejected), rejected)

    def train_reply_problem(self, reply: Message, sent: ArrayRecord,
                            cluster: int | None) -> str | None:
        """Why a training reply must not be aggregated, or ``None``.

        A bi-level reply carries ``global`` and ``cluster`` models shaped like the
        global model; a plain node's reply one ``arrays`` model.
        """
        problem = reply_problem(reply, reference=sent, weighted_by_key=self.weighted_by_key,
                                require_arrays=cluster is None)
        if problem is not None or cluster is None:
            return problem
        records = reply.content.array_records
        if set(records) != {GLOBAL, CLUSTER}:
            return f"expected ArrayRecords '{GLOBAL}' and '{CLUSTER}', got {sorted(records)}"
        for key in (GLOBAL, CLUSTER):
            if (problem := arrays_problem(records[key], sent)) is not None:
                return f"{key}: {problem}"
        return None

    # --- evaluation -------------------------------------------------------------------

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Score sampled nodes on their cluster's model and on w; keep the metrics."""
        self._eval_result = None
        if self.fraction_evaluate == 0.0:
            return []
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)
        nodes = sample_share(self.order(n for n in connected if n not in self.suspects),
                             self.fraction_evaluate,
                             self.min_evaluate_nodes, self.eval_rng)
        placed = self.place_new(grid, nodes)
        messages = []
        for node in nodes:
            cluster = self.clustering.cluster_of.get(node)
            own = arrays if cluster is None else self.models[cluster]
            for model in (own, arrays):
                content = RecordDict({"arrays": model, "config": ConfigRecord(dict(config))})
                messages.append(Message(content, dst_node_id=node, message_type="evaluate"))
        replies = collect_reply_list(grid, messages, self.train_timeout)
        scores: dict[str, list[tuple[float, float, float]]] = {}
        rejected: dict[int, str] = {}
        for i, node in enumerate(nodes):
            pair = replies[2 * i: 2 * i + 2]
            problem = next((p for p in map(self.eval_reply_problem, pair) if p), None)
            if problem is not None:
                rejected[node] = problem
                log(WARNING, "StoCFL evaluation: rejected node %d: %s", node, problem)
                continue
            for label, reply in zip(("cluster", "global"), pair, strict=True):
                metrics = cast(Message, reply).content["metrics"]
                entry = (float(cast(float, metrics[self.weighted_by_key])),
                         float(cast(float, metrics["eval-acc"])),
                         float(cast(float, metrics["eval-loss"])))
                scores.setdefault(label, []).append(entry)
                group = "trained" if node in self.trained else "new"
                scores.setdefault(f"{label}-{group}", []).append(entry)
        result: dict[str, Any] = {"eval-placed": placed}
        names = {"cluster": "eval", "global": "eval-global"}
        for label, entries in scores.items():
            base, _, group = label.partition("-")
            prefix = names[base] + (f"-{group}" if group else "")
            weights = np.array([e[0] for e in entries])
            result[f"{prefix}-acc"] = float(np.average([e[1] for e in entries], weights=weights))
            result[f"{prefix}-loss"] = float(np.average([e[2] for e in entries],
                                                        weights=weights))
            result[f"{prefix}-clients"] = len(entries)
        self._eval_result = MetricRecord(result) if scores else None
        self._record(server_round, "evaluate", self._eval_result, len(scores.get("cluster", [])),
                     rejected)
        return []

    def eval_reply_problem(self, reply: Message | None) -> str | None:
        """Why an evaluation reply is unusable, or ``None``."""
        if reply is None:
            return "no reply within the round's timeout"
        problem = reply_problem(reply, reference=None, weighted_by_key=self.weighted_by_key,
                                require_arrays=False)
        if problem is None and not {"eval-acc", "eval-loss"} <= set(reply.content["metrics"]):
            problem = "metrics lack 'eval-acc' or 'eval-loss'"
        return problem

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Return the metrics computed in ``configure_evaluate``."""
        result, self._eval_result = self._eval_result, None
        return result

    # --- results ----------------------------------------------------------------------

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """Files of the cluster state for the run's results folder.

        ``clusters.json`` (every round): each clustered node's cluster, by partition id
        where reported, the sizes, the plain and held-out nodes. With ``final``, also
        ``cluster-models.npz`` (arrays ``<cluster>/<name>``) and ``sketches.npz``
        (by partition id, or node id).
        """
        def name(node: int) -> str:
            return node_label(node, self.partition_ids)

        state = {
            "tau": self.tau, "lambda": self.lambda_,
            "clusters": {str(c): [name(n) for n in members]
                         for c, members in self.clustering.clusters.items()},
            "plain": {name(n): reason for n, reason in self.plain.items()},
            "held-out": sorted(name(n) for n in self.held_out),
        }
        files: dict[str, bytes | str] = {"clusters.json": json.dumps(state, indent=1)}
        if final:
            for filename, arrays in (
                ("cluster-models.npz", {f"{c}/{k}": v.numpy() for c, record in
                                        self.models.items() for k, v in record.items()}),
                ("sketches.npz", {name(n): s for n, s in self.clustering.sketches.items()}),
            ):
                buffer = io.BytesIO()
                np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy stub quirk
                files[filename] = buffer.getvalue()
        return files
