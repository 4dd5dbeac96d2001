"""HierFL: hierarchical user-edge-cloud training over an optimised user-edge assignment."""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.edge_assignment import (
    POLICIES,
    REACH_BY,
    AssignmentProblem,
    Topology,
    assign,
    edge_class_coverage,
    load_topology,
    objective,
    paper_topology,
    warm_start,
)
from ..protocol import LOCAL_STEPS, SERVER_ROUND
from . import saved
from .aggregation import GroupModel, average_arrays
from .metrics import reply_metrics
from .node_registry import NodeRegistry
from .params import check_parameters, non_negative, positive, setting
from .rounds import TrainResult
from .server_round import ServerSideRound
from .state import (
    NodeMap,
    StrategyState,
)

Generated = dict[int, tuple[np.ndarray, int]]  # node -> (edges it reaches, original edge)


def save_generated(generated: Generated, state: StrategyState, key: str) -> None:
    """The topology generated for the users: their nodes under ``key``."""
    nodes = list(generated)
    state.meta.update({key: nodes, "generated-original": [generated[n][1] for n in nodes]})
    state.arrays["generated-reach"] = (np.stack([generated[n][0] for n in nodes]) if nodes
                                       else np.zeros((0, 0), dtype=bool))


def load_generated(state: StrategyState, key: str, node_map: NodeMap, _: object
                   ) -> Generated:
    """The topology :func:`save_generated` saved."""
    return {node_map(n): (reach.astype(bool), int(original)) for n, reach, original in zip(
        state.meta[key], state.arrays["generated-reach"], state.meta["generated-original"],
        strict=True)}


def _topology_file(path: str) -> Topology | None:
    return load_topology(path) if path else None


class HierFL(ServerSideRound):
    """Hierarchical FL (Mhaisen et al.): users train with their edge, edges with the cloud.

    The method, the paper's equations it implements and every deliberate choice:
    docs/strategies/hierfl.md.

    Histograms are asked once per node (``query.histogram``). The users (nodes, ordered
    by reported partition id) are assigned to edges with the configured policy (see
    :func:`~fedgsp_flwr.core.edge_assignment.assign`), again, warm-started from the
    previous assignment, whenever the set of connected nodes changes. Each cloud round
    (one server round) runs ``tau2`` edge rounds: every user of an edge (a
    ``fraction_train`` sample) takes ``tau1`` local SGD steps from its edge's model and
    the edge averages its users' models weighted by examples; then the cloud averages
    the edge models weighted by the examples each edge trained over its ``tau2`` edge
    rounds. Edges are virtual aggregators on the server; replies are averaged in
    partition-id order, so a run is bit-reproducible whatever the node ids.
    """

    # The state a checkpoint saves (node ids translated on resume):
    rng = saved.generator("hierfl-rng")
    users = saved.node_list("users")  # in user index order
    edge_of = saved.node_map("edge-of")
    _assignment_metrics = saved.value("assignment-metrics", dict, dict)
    _generated = saved.Saved(  # the topology generated so far
        "generated-nodes", dict, save_generated, load_generated)

    policy: str = setting(
        default="heuristic", help="user-edge assignment policy (the paper: heuristic, Algorithm "
        "1)", choices=POLICIES, key="hierfl-policy")
    num_edges: int = setting(
        default=10, help="edges of a generated topology", check=positive, key="hierfl-edges")
    reach_per_user: int = setting(
        default=2, help="edges in range of each user of a generated topology (r; the paper's "
                        "setting, core.edge_assignment.paper_topology); a node whose node "
                        "config states its edges (edges=\"0,3\", reported with its histogram) "
                        "reaches those instead", check=positive, key="hierfl-reach")
    reach_by: str = setting(
        default="group", help="generated topology: a group of users of one class on one edge "
        "shares its extra edges (group, the paper) or each user draws its own (user)",
        choices=REACH_BY, key="hierfl-reach-by")
    tau1: int = setting(
        default=1, help="local SGD steps per user per edge round (1: the paper's FedSGD)",
        check=positive, key="hierfl-tau1")
    tau2: int = setting(
        default=2, help="edge rounds per cloud round", check=positive, key="hierfl-tau2")
    time_limit: float = setting(
        default=10.0, help="CP-SAT time limit in seconds (optimal, equal-size)", check=positive,
        key="hierfl-time-limit")
    size_tolerance: float = setting(
        default=0.05, help="equal-size: each edge's examples within this fraction of n/E (the "
        "paper's constraint (29))", check=non_negative, key="hierfl-size-tolerance")
    seed: int = setting(
        default=0, help="seed of node sampling and generated topologies (the app: its seed)",
        check=non_negative)
    topology: Topology | None = setting(
        default=None, help="a given topology, user i the node of partition id i (overrides "
        "the generated one; the run config: a JSON or CSV file, '' = generated)",
        key="hierfl-topology", app_default="", parse=_topology_file)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_parameters("HierFL", [
            (self.reach_per_user <= self.num_edges, "reach_per_user must be in [1, num_edges]"),
            (self.policy != "original" or self.topology is None
             or self.topology.original is not None,
             "policy 'original' needs a topology with an original assignment")])
        self.rng = np.random.default_rng(self.seed)
        self.edge_models: dict[int, ArrayRecord] = {}
        self._unplaceable: set[int] = set()  # nodes a topology file cannot place (logged)

    def registry(self) -> NodeRegistry:
        """Class histograms, partition ids and the edges each user reaches."""
        return NodeRegistry("HierFL", self.query_timeout, "users without class counts "
                            "count as empty in the assignment objective (with none, the "
                            "assignment is arbitrary)")

    def summary(self) -> None:
        """Log HierFL's settings, then FedAvg's."""
        where = ("a topology file" if self.topology is not None else
                 f"{self.num_edges} edges, r={self.reach_per_user} by {self.reach_by}")
        log(INFO, "\t├──> HierFL: %s assignment over %s, tau1=%d, tau2=%d", self.policy,
            where, self.tau1, self.tau2)
        super().summary()

    # --- assignment -------------------------------------------------------------------

    def placeable(self, nodes: list[int]) -> list[int]:
        """The nodes a topology file can place: those with a partition id it covers (all
        nodes without a file). The others sit out, each logged once unless its query
        reply was refused (that refusal was logged)."""
        if self.topology is None:
            return nodes
        width = self.topology.reach.shape[1]
        ok = [u for u in nodes if 0 <= self.known.partition_ids.get(u, -1) < width]
        for u in sorted(set(nodes) - set(ok) - self._unplaceable - set(self.known.without)):
            log(WARNING, "HierFL: node %d reported no partition-id in [0, %d); the topology "
                "file places users by partition id, so it sits out", u, width)
        self._unplaceable.update(set(nodes) - set(ok))
        if nodes and not ok:
            raise ValueError("HierFL: a topology file needs the nodes to report a "
                             f"partition-id in [0, {width}); none of the {len(nodes)} did "
                             "(set partition-id in each SuperNode's node config)")
        return ok

    def problem_for(self, users: list[int]) -> tuple[AssignmentProblem, np.ndarray | None]:
        """The assignment problem over ``users`` (node ids) and their original edges."""
        width = max((len(h) for h in self.known.histograms.values()), default=1)
        counts = np.stack([self.known.histograms.get(u, np.zeros(width, np.int64))
                           for u in users])
        if self.topology is not None:
            index = [self.known.partition_ids.get(u, -1) for u in users]
            if min(index) < 0 or max(index) >= self.topology.reach.shape[1]:
                raise ValueError(
                    "HierFL: a topology file needs every node to report a partition-id "
                    f"in [0, {self.topology.reach.shape[1]})")
            reach = self.topology.reach[:, index]
            original = (None if self.topology.original is None
                        else self.topology.original[index])
            return AssignmentProblem(counts, reach, self.topology.capacity), original
        new = [i for i, u in enumerate(users) if u not in self._generated]
        if new:
            reach, original = paper_topology(counts[new], self.num_edges,
                                             self.reach_per_user, self.rng,
                                             reach_by=self.reach_by)
            for j, i in enumerate(new):
                self._generated[users[i]] = (reach[:, j], int(original[j]))
        reach = np.stack([self._generated[u][0] for u in users], axis=1)
        original = np.array([self._generated[u][1] for u in users], dtype=np.int64)
        for i, u in enumerate(users):  # a node's stated edges replace generated ones
            stated = [e for e in self.known.edges.get(u, []) if e < self.num_edges]
            if len(stated) < len(self.known.edges.get(u, [])):
                log(WARNING, "HierFL: node %d states edges %s; only %d edges exist", u,
                    self.known.edges[u], self.num_edges)
            if stated:
                reach[:, i] = False
                reach[stated, i] = True
                if not reach[original[i], i]:
                    original[i] = stated[0]
        return AssignmentProblem(counts, reach), original

    def reassign(self, users: list[int]) -> None:
        """Solve the assignment over ``users``, warm-started from the previous one."""
        problem, original = self.problem_for(users)
        hint = None
        if self.edge_of and self.policy in ("optimal", "equal-size"):
            hint = warm_start(problem, [self.edge_of.get(u) for u in users], self.rng)
        result = assign(problem, self.policy, self.rng, original=original, hint=hint,
                        time_limit=self.time_limit, size_tolerance=self.size_tolerance)
        moved = sum(1 for i, u in enumerate(users)
                    if u in self.edge_of and self.edge_of[u] != result.assignment[i])
        joined = sum(1 for u in users if u not in self.edge_of)
        left = len(set(self.edge_of) - set(users))
        self.users = list(users)
        self.edge_of = {u: int(e) for u, e in zip(users, result.assignment, strict=True)}
        coverage = edge_class_coverage(problem.counts, result.assignment, problem.num_edges)
        self._assignment_metrics = {
            "assignment-objective": result.objective,
            "assignment-seconds": result.seconds,
            "edge-class-coverage-min": float(min(coverage, default=0.0)),
            "edge-class-coverage-mean": float(np.mean(coverage)) if coverage else 0.0,
        }
        if result.bound is not None:
            self._assignment_metrics["assignment-bound"] = result.bound
        if original is not None:
            self._assignment_metrics["original-objective"] = objective(
                problem.counts, original, problem.num_edges)[0]
        log(INFO, "HierFL: %s assignment of %d users to %d edges: J=%.4f (%s, %.2fs); "
            "%d joined, %d left, %d moved", self.policy, len(users), problem.num_edges,
            result.objective, result.status, result.seconds, joined, left, moved)

    # --- training ---------------------------------------------------------------------

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Run the cloud round's ``tau2`` edge rounds, then average the edges' models."""
        started = time.monotonic()
        users = self.placeable(self.reachable_nodes(grid))
        self.warn_size.unfilled(self.num_edges, "edge", len(users), "user",
                           "num_edges (run config hierfl-edges)")
        if set(users) != set(self.edge_of):
            self.reassign(users)
        rank = {u: i for i, u in enumerate(self.users)}
        members_of: dict[int, list[int]] = {}
        for u in self.users:
            members_of.setdefault(self.edge_of[u], []).append(u)
        edge_models = dict.fromkeys(sorted(members_of), arrays)
        edge_weight: dict[int, float] = {}
        rejected: dict[int, str] = {}
        user_replies: list[Message] = []
        asked: set[int] = set()
        sent = received = messages = used = 0
        for edge_round in range(self.tau2):
            train_config = ConfigRecord({**dict(config), SERVER_ROUND: server_round,
                                         "edge-round": edge_round, LOCAL_STEPS: self.tau1})
            plan: list[tuple[int, int]] = []
            for edge in edge_models:
                members = members_of[edge]
                take = max(1, round(self.fraction_train * len(members)))
                # Node ids may exceed int64: sample positions, never the ids.
                plan.extend((members[i], edge) for i in sorted(
                    self.rng.choice(len(members), take, replace=False).tolist()))
            exchanged = self.exchange(server_round, grid, plan, self.train_messages(
                ((user, edge_models[edge]) for user, edge in plan), train_config),
                self.train_problem(lambda edge: edge_models[edge]))
            sent, received = sent + exchanged.sent, received + exchanged.received
            messages += len(plan)
            asked.update(user for user, _ in plan)
            rejected.update(exchanged.screened.rejected())
            by_edge: dict[int, list[Message]] = {}
            for _, edge, reply in exchanged.screened.sound:
                by_edge.setdefault(edge, []).append(reply)
            for edge, sound in sorted(by_edge.items()):  # an edge without one keeps its model
                used += len(sound)
                sound.sort(key=lambda m: rank[m.metadata.src_node_id])  # partition order
                user_replies.extend(sound)
                # reply_problem checked the weights: finite numbers > 0
                weights = [float(cast(float, reply_metrics(m.content)[self.weighted_by_key]))
                           for m in sound]
                edge_models[edge] = average_arrays(
                    [next(iter(m.content.array_records.values())) for m in sound], weights)
                # The cloud weighs an edge by every example it trained in this cloud round.
                edge_weight[edge] = edge_weight.get(edge, 0.0) + sum(weights)
        trained = [e for e in edge_models if e in edge_weight]
        cloud = (average_arrays([edge_models[e] for e in trained],
                                [edge_weight[e] for e in trained]) if trained else None)
        if cloud is None:
            log(WARNING, "HierFL round %d: no edge trained; the global model is kept",
                server_round)
        self.edge_models = {e: edge_models[e] for e in trained}
        metrics: dict[str, Any] = (dict(self.train_metrics_aggr_fn(
            [m.content for m in user_replies], self.weighted_by_key)) if user_replies else {})
        metrics.update(self._assignment_metrics)
        metrics.update({"edges-trained": len(trained), "edge-rounds": self.tau2,
                        "user-edge-messages": messages, "bytes-sent": sent,
                        "bytes-received": received, "train-time":
                        time.monotonic() - started})
        return self.finish_round(server_round, cloud, metrics, used, rejected, len(asked))

    def group_models(self) -> dict[int, GroupModel]:
        """Each edge's model after the last cloud round, with its users, by edge."""
        return {edge: GroupModel(model, [u for u in self.users if self.edge_of[u] == edge], {
            u: self.known.partition_ids[u] for u in self.users
            if self.edge_of[u] == edge and u in self.known.partition_ids})
            for edge, model in self.edge_models.items()}


PARAMS = HierFL.spec
