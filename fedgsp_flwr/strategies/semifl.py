"""Semi-FL: static clusters that train sequentially inside, one upload per cluster."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from ..core.cluster_rules import (
    CLUSTER_RULES,
    cluster_with_room,
    label_coverage,
    static_clusters,
)
from ..protocol import CLUSTER_ID, PARTITION_ID
from . import saved
from .aggregation import GroupModel
from .params import check_parameters, non_negative, positive, setting
from .sequential import RelayStrategy

CLUSTER_SOURCES = (*CLUSTER_RULES, "node-config", "file")


def load_cluster_assignment(path: str | Path) -> dict[int, int]:
    """Read a Semi-FL cluster file: partition id -> cluster id.

    JSON: ``{"<partition id>": <cluster id>, ...}``. CSV: the header
    ``partition-id,cluster-id``, then one row per partition.

    Raises
    ------
    ValueError
        On an unreadable file or ids that are not integers >= 0, naming the file.
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".json":
            pairs = list(json.loads(path.read_text()).items())
        elif path.suffix.lower() == ".csv":
            rows = list(csv.reader(io.StringIO(path.read_text())))
            if not rows or [c.strip() for c in rows[0]] != [PARTITION_ID, CLUSTER_ID]:
                raise ValueError("the header must be 'partition-id,cluster-id'")
            pairs = [(r[0], r[1]) for r in rows[1:] if any(c.strip() for c in r)]
        else:
            raise ValueError("expected a .json or .csv file")
        assignment = {int(p): int(c) for p, c in pairs}
        if not assignment or min(assignment) < 0 or min(assignment.values()) < 0:
            raise ValueError("needs at least one partition; ids must be >= 0")
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise ValueError(f"cluster file {path}: {err}") from err
    return assignment


class SemiFL(RelayStrategy):
    """Semi-FL (Chen et al., 2021): static clusters trained sequentially.

    The method, the paper's equations it implements and every deliberate choice:
    docs/strategies/semifl.md.

    The connected nodes are split once into static clusters. Every round every cluster
    trains as one relay chain (the first node starts from the global model and trains
    ``local_epochs`` epochs, hands its model to the next, ...; all clusters run in
    parallel), the last node's model is the cluster's single upload, and the server
    averages the cluster models, uniformly as the paper does or by examples.

    Where the clusters come from (``clusters``):

    - a rule over the class histograms (``query.histogram``, asked once per node):
      ``label-diverse``, ``label-homogeneous`` (``offset`` rotates it), ``random``, or
      the paper's Table II patterns ``c1`` (one class per cluster of one-class
      clients), ``c2`` (two), ``c3`` (every class; the same as ``label-diverse``) and
      ``c4`` (clients that each hold every class: the IID setting); see
      :mod:`~fedgsp_flwr.core.cluster_rules`;
    - ``node-config``: each node's ``cluster-id`` node config (reported with its
      histogram);
    - ``file``: ``assignment``, partition id -> cluster id (nodes report their
      partition id with their histogram).

    The clusters stay fixed. A node that connects later, or that has no histogram,
    stated cluster or listed partition, joins the smallest cluster with fewer than
    ``cluster_size`` nodes, or starts a new one when all are full (logged); a node that
    is gone is left out of its cluster's chain while it is away.
    """

    histogram_fallback = ("nodes without a histogram join the clusters in node order, "
                          "cluster_size each (no label rule)")

    # The state a checkpoint saves (node ids translated on resume):
    clusters = saved.node_lists_by_id("clusters")  # cluster -> its members

    source: str = setting(default="c3", help="where the clusters come from: a rule "
                          "(c1-c4), node-config or file", choices=CLUSTER_SOURCES,
                          alias="clusters")
    cluster_size: int = setting(default=10, help="clients per cluster of the rules",
                                check=positive, key="semifl-cluster-size")
    offset: int = setting(
        default=0, help="label-homogeneous: rotate the class-sorted clients by this many "
        "before cutting (half a cluster = the paper's c2)", check=non_negative, key="semifl-offset")
    assignment: Mapping[int, int] | None = setting(
        default=None, help="partition id -> cluster id, for clusters='file'",
        check=lambda v: v is None or all(c >= 0 for c in v.values()),
        rule="None or cluster ids >= 0")
    shuffle_order: bool = setting(default=False, help="shuffle each cluster's order every "
                                  "round (false = one fixed order)", key="semifl-shuffle")
    weighted_average: bool = setting(default=False, help="average cluster models by "
                                     "examples (false = uniform, the paper)",
                                     key="semifl-weighted")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_parameters("SemiFL", [
            ((self.source == "file") == (self.assignment is not None),
             "clusters='file' needs an assignment, and only it takes one")])
        if self.assignment is not None:
            self.assignment = dict(self.assignment)

    def summary(self) -> None:
        """Log Semi-FL's settings, then the relay's and FedAvg's."""
        log(INFO, "\t├──> SemiFL: %s clusters of %d, %s order", self.source,
            self.cluster_size, "shuffled" if self.shuffle_order else "fixed")
        super().summary()

    def group_models(self) -> dict[int, GroupModel]:
        """Each cluster's model (its head's, after the last round's chain), by cluster."""
        cluster_of = self.cluster_of  # a chain's nodes are all of one cluster
        return {cluster_of[model.nodes[0]]: model for model in super().group_models().values()}

    @property
    def cluster_of(self) -> dict[int, int]:
        """Cluster id of every node placed so far."""
        return {n: c for c, members in self.clusters.items() for n in members}

    def stated_cluster(self, node: int) -> int | None:
        """The cluster a node's config or the assignment file gives it, if any."""
        if self.source == "node-config":
            return self.known.cluster_ids.get(node)
        partition = self.known.partition_ids.get(node)
        if self.assignment is not None and partition is not None:  # clusters="file"
            return self.assignment.get(partition)
        return None

    def place(self, nodes: Sequence[int]) -> None:
        """Put new nodes into clusters: the first call builds the static clusters."""
        rest = list(nodes)
        if not self.clusters and self.source in CLUSTER_RULES:
            with_hist = [n for n in rest if n in self.known.histograms]
            if with_hist:
                groups = static_clusters(
                    np.stack([self.known.histograms[n] for n in with_hist]),
                    self.cluster_size, self.source, self.rng, self.offset)
                self.clusters = {c: [with_hist[i] for i in g] for c, g in enumerate(groups)}
                rest = [n for n in rest if n not in self.known.histograms]
        elif self.source in ("node-config", "file"):
            for node in list(rest):
                if (cluster := self.stated_cluster(node)) is not None:
                    self.clusters.setdefault(cluster, []).append(node)
                    rest.remove(node)
        joined: dict[int, list[int]] = {}
        for node in rest:
            cluster = cluster_with_room(self.clusters, self.cluster_size)
            self.clusters.setdefault(cluster, []).append(node)
            joined.setdefault(cluster, []).append(node)
        if joined:
            log(WARNING, "SemiFL: %d node(s) with no %s joined the clusters with room: %s",
                len(rest), "stated cluster" if self.source in ("node-config", "file") else
                "histogram, or that arrived late,",
                ", ".join(f"cluster {c}: nodes {m}" for c, m in sorted(joined.items())))

    def cluster_metrics(self) -> dict[str, Any]:
        """Cluster sizes and the classes each covers (over nodes with histograms)."""
        sizes = [len(self.clusters[c]) for c in sorted(self.clusters)]
        metrics: dict[str, Any] = {"num-clusters": len(sizes), "cluster-sizes": sizes}
        scored = [[n for n in members if n in self.known.histograms]
                  for members in self.clusters.values()]
        scored = [s for s in scored if s]
        if scored:
            nodes = [n for s in scored for n in s]
            index = {n: i for i, n in enumerate(nodes)}
            coverage = label_coverage(np.stack([self.known.histograms[n] for n in nodes]),
                                      [[index[n] for n in s] for s in scored])
            metrics["label-coverage"] = float(np.mean(coverage))
        return metrics

    def make_chains(self, server_round: int, grid: Grid) -> tuple[list[list[int]], dict[str, Any]]:
        """Place new nodes, then one chain per cluster over its connected members."""
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)  # waits for nodes
        reachable = self.known.reachable(grid, connected)
        placed = self.cluster_of
        if new := [n for n in reachable if n not in placed]:
            self.place(new)
        if len(self.clusters) == 1 and len(reachable) > 1:
            self.warn_size(
                "SemiFL: all %d nodes are in one cluster (cluster_size=%d): every round is "
                "one sequential chain through every node, with no clusters in parallel; "
                "for several clusters set cluster_size (run config semifl-cluster-size) "
                "below %d", len(reachable), self.cluster_size, len(reachable))
        live = set(reachable)
        chains = []
        for cluster in sorted(self.clusters):
            members = self.known.order([n for n in self.clusters[cluster] if n in live])
            if self.shuffle_order:
                members = [members[i] for i in self.rng.permutation(len(members))]
            if members:
                chains.append(members)
        metrics = self.cluster_metrics()
        log(INFO, "SemiFL round %d: %d clusters over %d reachable nodes", server_round,
            len(chains), len(reachable))
        return chains, metrics


PARAMS = SemiFL.spec
