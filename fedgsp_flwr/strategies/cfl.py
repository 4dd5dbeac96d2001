"""CFL: clustered federated learning by recursive bipartitions of the clients' updates."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.cfl import (
    LINKAGES,
    ClusterStep,
    SplitNode,
    SplitRule,
    cluster_step,
    flat_update,
    mean_update,
    moved,
    nearest_direction,
    splits_below,
)
from ..core.clustering import agreement_scores
from ..protocol import SERVER_ROUND
from . import saved
from .aggregation import GroupModel, average_arrays, npz_bytes
from .metrics import reply_metrics
from .node_registry import node_label
from .params import non_negative, positive, setting
from .rounds import TrainResult
from .server_round import ClusteredRound
from .state import NodeMap, StrategyState, prefixed, record_arrays, to_record, under

ROOT = 0  # the tree node of the first cluster, which holds every client at the start
Model = dict[str, np.ndarray]


def save_splits(splits: dict[int, SplitNode], state: StrategyState, key: str) -> None:
    """The splits under ``key``, with their cached models and directions."""
    state.meta[key] = [[t, *s.children, s.server_round, s.alpha_cross, s.gamma, *s.sizes]
                       for t, s in sorted(splits.items())]
    for t, split in splits.items():
        state.arrays.update(prefixed(split.model, f"split-{t}"))
        state.arrays[f"directions-{t}"] = split.directions


def load_splits(state: StrategyState, key: str, _: NodeMap, __: object
                ) -> dict[int, SplitNode]:
    """The splits :func:`save_splits` saved."""
    arrays = state.arrays
    return {int(t): SplitNode({k: np.array(v) for k, v in under(arrays, f"split-{t}").items()},
                              (int(a), int(b)),
                              np.array(arrays[f"directions-{t}"], dtype=np.float32),
                              int(r), float(alpha), float(gamma), (int(n1), int(n2)))
            for t, a, b, r, alpha, gamma, n1, n2 in state.meta[key]}


class CFL(ClusteredRound):
    """CFL (Sattler, Müller, Samek, 2021): clusters split in two, recursively, by the
    cosine similarity of their members' updates, one model per cluster.

    The method, the paper's items it implements and every deliberate choice:
    docs/strategies/cfl.md.

    Clusters are the leaves of a binary tree whose root, cluster 0, starts with every
    client and the initial model. Each round samples ``fraction_train`` of the reachable
    nodes (CFL assumes 1.0, the default). A node in a cluster trains that cluster's
    model W_c (plain ``train``) and returns W_i; the update is dW_i = W_i - W_c. For
    each cluster, over the members that replied soundly (weights w_i: their examples):

    - mean norm ||sum_i w_i dW_i|| and max norm max_i ||dW_i||;
    - if mean norm < ``eps1`` and max norm > ``eps2``, with at least ``min_split_size``
      updates, after ``warmup_rounds`` rounds, the members are bipartitioned by the
      cosine similarity of their updates (``linkage``) into two new clusters;
    - each cluster's model (each part's, after a split) moves by its members' weighted
      mean update: W_c + sum_i w_i dW_i.

    A cluster can split again in a later round. Splits are reported with the paper's
    alpha_max^cross (largest similarity across the two parts) and gamma_max.

    **Partial participation.** A cluster's model moves with the members that replied
    soundly; a cluster without one keeps its model. Its split test runs only in a
    round where at least ``split_quorum`` of its reachable members replied soundly
    (default 1.0: all of them, the paper's full participation); otherwise the round
    counts in ``quorum-missed``. With ``fraction_train`` < 1 this is logged once per
    run. A member that did not reply in the round its cluster split stays at the split
    (an inner node of the tree) and is placed as a new node is, below.

    **New nodes.** A node seen after the root split, or one that missed a split, is
    placed by descending the tree as the paper's parameter tree allows: it trains,
    once each and in parallel, the model cached at every split below its position,
    then goes, at each split, to the part whose mean update at the split its own update
    is most similar to (cosine), until it reaches a cluster. These trainings
    (``placement-fits``) place it and enter no cluster model; it trains with its
    cluster from the next round it is sampled. Before the root splits, a new node just
    joins cluster 0.

    Evaluation scores each sampled node that is in a cluster with that cluster's model;
    nodes still to be placed are counted (``eval-unplaced``). The model Flower's loop
    carries (which the server scores) is the member-weighted mean of the cluster models:
    with one cluster, the FedAvg model.
    """

    # The state a checkpoint saves (node ids translated on resume):
    rng = saved.generator("cfl-rng")
    eval_rng = saved.generator("cfl-eval-rng")
    position = saved.node_map("position")  # node -> tree node
    leaves = saved.arrays_by_id("leaves", "leaf")  # cluster (a leaf of the tree) -> model
    next_id = saved.value("next-id", lambda: ROOT + 1, int)
    splits = saved.Saved("splits", dict, save_splits, load_splits)  # the tree's inner nodes

    eps1: float = setting(
        default=0.4, help="split a cluster only while the norm of its weighted mean update is "
                          "below this (the authors' notebook: 0.4; it depends on the model, the"
                          " learning rate and the local epochs: read mean-norms and max-norms "
                          "of a run to set it)", check=positive, key="cfl-eps1")
    eps2: float = setting(
        default=1.6, help="... and while its largest client update norm is above this (the "
        "authors' notebook: 1.6)", check=non_negative, key="cfl-eps2")
    min_split_size: int = setting(
        default=3, help="fewest client updates a split is tested on (the authors' code: > 2)",
        check=lambda v: v >= 2, rule=">= 2", key="cfl-min-split-size")
    warmup_rounds: int = setting(
        default=20, help="no split in rounds 1..this (the authors' code: 20)", check=non_negative,
        key="cfl-warmup-rounds")
    linkage: str = setting(
        default="complete", help="bipartition: complete (the authors' code) | optimal (the "
        "paper's: minimise the largest cross-part similarity; single linkage)", choices=LINKAGES,
        key="cfl-linkage")
    split_quorum: float = setting(
        default=1.0, help="share of a cluster's reachable members whose sound replies a split "
        "test needs (1 = all, the paper's full participation)", check=lambda v: 0 < v <= 1,
        rule="in (0, 1]", key="cfl-split-quorum")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rule = SplitRule(float(self.eps1), float(self.eps2), self.min_split_size,
                              self.warmup_rounds)
        self.split_quorum = float(self.split_quorum)
        self.leaf_metrics: dict[int, dict[str, Any]] = {}  # last evaluation, by cluster
        self._warned_partial = False

    def summary(self) -> None:
        """Log CFL's settings, then FedAvg's."""
        log(INFO, "\t├──> CFL: eps1=%g, eps2=%g, min split size %d, warm-up %d rounds, "
            "%s linkage, split quorum %g", self.rule.eps1, self.rule.eps2,
            self.rule.min_size, self.rule.warmup_rounds, self.linkage, self.split_quorum)
        super().summary()

    # --- the tree ---------------------------------------------------------------------

    def setup(self, arrays: ArrayRecord) -> None:
        """One cluster, the root, with the initial model."""
        self.leaves = {ROOT: record_arrays(arrays)}
        self.splits, self.next_id = {}, ROOT + 1

    def position_of(self, node: int) -> int:
        """The node's tree node (a cluster, or a split it has still to descend)."""
        return self.position.get(node, ROOT)

    def model_of(self, tree_node: int) -> Model:
        """A cluster's model, or the model a split cached."""
        return self.leaves[tree_node] if tree_node in self.leaves else (
            self.splits[tree_node].model)

    def starts(self, node: int) -> list[int]:
        """The tree nodes whose models a sampled node trains this round: its cluster's,
        or, to place it, those of every split below its position.
        """
        position = self.position_of(node)
        return [position] if position in self.leaves else splits_below(self.splits, position)

    def sizes(self) -> dict[int, int]:
        """Nodes in each cluster (every node placed so far)."""
        counts = Counter(self.position.values())
        return {leaf: counts.get(leaf, 0) for leaf in sorted(self.leaves)}

    def members(self, leaf: int) -> list[int]:
        """A cluster's nodes, in partition-id order."""
        return self.known.order([n for n, t in self.position.items() if t == leaf])

    def global_model(self) -> ArrayRecord:
        """The member-weighted mean of the cluster models (for Flower's loop only)."""
        sizes = self.sizes()
        if len(sizes) == 1:
            return to_record(self.leaves[next(iter(sizes))])
        weighted = [(leaf, n) for leaf, n in sizes.items() if n > 0] or [
            (leaf, 1) for leaf in sizes]
        return average_arrays([to_record(self.leaves[leaf]) for leaf, _ in weighted],
                              [float(n) for _, n in weighted])

    # --- training ---------------------------------------------------------------------

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Train every sampled node from its cluster's model (new nodes: from the
        splits' models, to place them), then update, test and split the clusters.
        """
        started = time.monotonic()
        if not self.leaves:
            self.setup(arrays)
        self.warn_partial_participation()
        reachable, sampled = self.sample_train(grid, self.rng)
        at_start = Counter(self.position_of(n) for n in reachable)
        plan = [(node, t) for node in sampled for t in self.starts(node)]
        records = {t: to_record(self.model_of(t)) for t in dict.fromkeys(t for _, t in plan)}
        train_config = ConfigRecord({**dict(config), SERVER_ROUND: server_round})
        exchanged = self.exchange(server_round, grid, plan, self.train_messages(
            ((node, records[t]) for node, t in plan), train_config),
            self.train_problem(lambda t: records[t]))
        fits: dict[int, dict[int, Message]] = {}
        for node, t, reply in exchanged.screened.sound:
            fits.setdefault(node, {})[t] = reply
        by_leaf: dict[int, list[tuple[int, Message]]] = {}
        for node in sampled:
            start = self.position_of(node)
            if start in self.leaves and start in fits.get(node, {}):
                by_leaf.setdefault(start, []).append((node, fits[node][start]))
        to_place = [n for n in sampled if self.position_of(n) in self.splits and n in fits]
        member_replies = [r.content for leaf in sorted(by_leaf) for _, r in by_leaf[leaf]]
        metrics: dict[str, Any] = {
            "sampled": len(sampled), "placement-fits": sum(
                len(self.starts(n)) for n in sampled if self.position_of(n) in self.splits),
            **exchanged.traffic()}
        if member_replies:
            metrics.update(self.train_metrics_aggr_fn(member_replies, self.weighted_by_key))
        metrics.update(self.train_clusters(server_round, by_leaf, at_start))
        metrics["placements"] = sum(self.place(node, fits[node]) for node in to_place)
        metrics.update(self.cluster_metrics(reachable))
        metrics["train-time"] = time.monotonic() - started
        return self.finish_round(server_round, self.global_model(), metrics, len(fits),
                                 exchanged.screened.rejected(), len(sampled))

    def warn_partial_participation(self) -> None:
        """Say once per run what CFL does when not every node trains every round."""
        if self.fraction_train < 1.0 and not self._warned_partial:
            self._warned_partial = True
            log(WARNING, "CFL: fraction_train=%g, but CFL assumes every client trains "
                "every round. A cluster's model moves with the members that replied; it "
                "is tested for a split only in a round where at least %g of its "
                "reachable members replied (split_quorum), so large clusters may rarely "
                "or never split; members that miss their cluster's split are placed by "
                "descending the split tree when next sampled", self.fraction_train,
                self.split_quorum)

    def train_clusters(self, server_round: int,
                       by_leaf: Mapping[int, Sequence[tuple[int, Message]]],
                       at_start: Mapping[int, int]) -> dict[str, Any]:
        """Update, test and maybe split every cluster with sound replies; return the
        round's norms and splits.
        """
        norms: dict[int, tuple[float, float]] = {}
        split_steps: list[ClusterStep] = []
        missed = 0
        for leaf in sorted(by_leaf):
            nodes = [node for node, _ in by_leaf[leaf]]
            models = [record_arrays(next(iter(r.content.array_records.values())))
                      for _, r in by_leaf[leaf]]
            weights = [float(reply_metrics(r.content)[self.weighted_by_key])  # type: ignore[arg-type]
                       for _, r in by_leaf[leaf]]
            base = self.leaves[leaf]
            quorum = len(nodes) >= math.ceil(self.split_quorum * at_start[leaf] - 1e-9)
            missed += not quorum
            step = cluster_step(models, base, weights, server_round, self.rule,
                                self.linkage, test=quorum)
            norms[leaf] = (step.norms.mean, step.norms.max)
            if step.sides is None:
                self.leaves[leaf] = moved(base, step.update)
                self.position.update((node, leaf) for node in nodes)
            else:
                self.split(server_round, leaf, nodes, models, weights, step)
                split_steps.append(step)
        return {"norm-clusters": list(norms), "mean-norms": [m for m, _ in norms.values()],
                "max-norms": [m for _, m in norms.values()], "splits": len(split_steps),
                "split-alpha-cross": [float(s.alpha_cross or 0.0) for s in split_steps],
                "split-gamma": [float(s.gamma or 0.0) for s in split_steps],
                "quorum-missed": missed}

    def split(self, server_round: int, leaf: int, nodes: Sequence[int],
              models: Sequence[Model], weights: Sequence[float], step: ClusterStep) -> None:
        """Replace cluster ``leaf`` by its two parts, each with the cluster's model moved
        by the part's weighted mean update; cache the split in the tree.
        """
        assert step.sides is not None
        base = self.leaves.pop(leaf)
        children = (self.next_id, self.next_id + 1)
        self.next_id += 2
        directions = []
        for child, side in zip(children, step.sides, strict=True):
            update = mean_update([models[i] for i in side], base, [weights[i] for i in side])
            self.leaves[child] = moved(base, update)
            directions.append(np.concatenate([u.reshape(-1) for u in update.values()]))
            self.position.update((nodes[i], child) for i in side)
        sizes = (len(step.sides[0]), len(step.sides[1]))
        self.splits[leaf] = SplitNode(base, children, np.stack(directions).astype(np.float32),
                                      server_round, float(step.alpha_cross or 0.0),
                                      float(step.gamma or 0.0), sizes)
        log(INFO, "CFL round %d: cluster %d splits into %d (%d members) and %d (%d): mean "
            "norm %.4g < eps1, max norm %.4g > eps2, alpha_cross %.4g, gamma_max %.4g",
            server_round, leaf, children[0], sizes[0], children[1], sizes[1],
            step.norms.mean, step.norms.max, step.alpha_cross, step.gamma)

    def place(self, node: int, fits: Mapping[int, Message]) -> bool:
        """Move a node down the tree from its position: at each split, to the part whose
        mean update at the split its own update (from the split's model) is most similar
        to; stop at a cluster or at a split it has no sound fit for.

        Returns
        -------
        bool
            Whether it reached a cluster.
        """
        start = tree_node = self.position_of(node)
        while tree_node in self.splits and tree_node in fits:
            split = self.splits[tree_node]
            fitted = record_arrays(next(iter(fits[tree_node].content.array_records.values())))
            side = nearest_direction(flat_update(fitted, split.model), split.directions)
            tree_node = split.children[side]
        if tree_node != start:
            self.position[node] = tree_node
        return tree_node != start and tree_node in self.leaves

    def cluster_metrics(self, reachable: Sequence[int]) -> dict[str, Any]:
        """Clusters, their sizes, placed and unplaced nodes, ARI/NMI where known."""
        sizes = self.sizes()
        placed = {n: t for n, t in self.position.items() if t in self.leaves}
        metrics: dict[str, Any] = {
            "clusters": len(sizes), "cluster-sizes": list(sizes.values()),
            "placed-clients": len(placed),
            "unplaced-clients": sum(self.position_of(n) in self.splits for n in reachable)}
        metrics.update(agreement_scores(placed, self.known.partition_ids, self.ground_truth))
        return metrics

    # --- evaluation -------------------------------------------------------------------

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """Score each sampled node in a cluster with that cluster's model; keep each
        cluster's aggregate (:meth:`group_models`)."""
        if self.fraction_evaluate == 0.0 or not self.leaves:
            return self.record_evaluation(server_round, [], {}, None).metrics
        nodes = self.sample_evaluate(grid, self.eval_rng)
        placed = {n: self.position_of(n) for n in nodes if self.position_of(n) in self.leaves}
        self.history.setdefault(server_round, {})["eval-unplaced"] = len(nodes) - len(placed)
        evaluation = self.evaluate_members(server_round, grid, config, placed,
                                           lambda leaf: to_record(self.leaves[leaf]))
        self.leaf_metrics.update(evaluation.by_group)
        return evaluation.metrics

    def group_models(self) -> dict[int, GroupModel]:
        """Each cluster's model with its nodes and last evaluation, by cluster."""
        partitions = self.known.partition_ids
        groups = {}
        for leaf, model in sorted(self.leaves.items()):
            members = self.members(leaf)
            groups[leaf] = GroupModel(to_record(model), members,
                                      {n: partitions[n] for n in members if n in partitions},
                                      self.leaf_metrics.get(leaf, {}))
        return groups

    # --- results ----------------------------------------------------------------------

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """Files of the tree for the run's results folder.

        ``cfl-clusters.json`` (every round): each cluster's nodes (by partition id where
        reported), the splits (round, parts, sizes, alpha_cross, gamma_max) and the
        nodes still to be placed. With ``final``, ``cfl-clusters.npz`` (arrays
        ``<cluster>/<name>``).
        """
        partitions = self.known.partition_ids
        state = {
            "eps1": self.rule.eps1, "eps2": self.rule.eps2, "linkage": self.linkage,
            "clusters": {str(leaf): [node_label(n, partitions) for n in self.members(leaf)]
                         for leaf in sorted(self.leaves)},
            "splits": [{"cluster": t, "children": list(s.children), "round": s.server_round,
                        "sizes": list(s.sizes), "alpha-cross": s.alpha_cross,
                        "gamma-max": s.gamma} for t, s in sorted(self.splits.items())],
            "unplaced": {node_label(n, partitions): t for n, t in sorted(self.position.items())
                         if t in self.splits},
        }
        files: dict[str, bytes | str] = {"cfl-clusters.json": json.dumps(state, indent=1)}
        if final and self.leaves:
            files["cfl-clusters.npz"] = npz_bytes({
                f"{leaf}/{k}": v for leaf, model in sorted(self.leaves.items())
                for k, v in model.items()})
        return files


PARAMS = CFL.spec
