"""The round of a strategy that drives the grid itself, in its steps: sample the nodes,
plan what each trains, exchange (send, collect, screen), aggregate, and evaluate each
node with its own group's model.

:class:`ServerSideRound` is the base of every such strategy (relay chains, edge rounds,
k models per node, bi-level models); its helpers are the steps the clustered
strategies (CFL, FeSEM, IFCA, StoCFL) and HierFL's edge rounds share, so each of them
writes only its plan and its aggregation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from ..core.sampling import sample_share
from ..protocol import ARRAYS, CONFIG, EVALUATE, PARTITION, TRAIN
from . import saved
from .aggregation import array_bytes
from .exchange import Screened, collect_reply_list, screen
from .fedavg import FedAvg
from .metrics import metrics_order
from .node_registry import PARTITION_FALLBACK, NodeRegistry
from .params import non_negative, positive, setting
from .replies import reply_problem
from .rounds import TrainResult, own_rounds_error

Key = TypeVar("Key")
Group = TypeVar("Group")


@dataclass
class Exchanged(Generic[Key]):
    """A round's exchange: the replies screened, and the model bytes each way.

    Attributes
    ----------
    screened : Screened
        The sound replies (node, key, reply) in the plan's order and each node's
        problems.
    replies : list[Message | None]
        The answer to each message, in order (``None``: none in time).
    sent, received : int
        Bytes of the ArrayRecords sent and received.
    """

    screened: Screened[Key]
    replies: list[Message | None]
    sent: int
    received: int

    def traffic(self) -> dict[str, int]:
        """The round metrics ``bytes-sent`` and ``bytes-received``."""
        return {"bytes-sent": self.sent, "bytes-received": self.received}


@dataclass
class Evaluation(Generic[Group]):
    """A round's evaluation by group.

    Attributes
    ----------
    metrics : MetricRecord | None
        The aggregate over every scored node (``None``: none scored), as reported.
    by_group : dict
        The aggregate over each group's scored nodes, by group.
    """

    metrics: MetricRecord | None
    by_group: dict[Group, dict[str, Any]]


class ServerSideRound(FedAvg):
    """Base of strategies whose training round drives the grid itself (relay chains,
    edge rounds, k models per node): they override :meth:`train_round` and end it with
    ``return self.finish_round(...)``.

    Flower's ``configure_train`` / ``aggregate_train`` pair cannot make such a round:
    called, they raise ``TypeError`` (use :meth:`start`, or :meth:`train_round` and
    :meth:`evaluate_round` from a loop of your own).
    """

    train_timeout: float = setting(
        default=3600.0, help="seconds to wait for the training (and evaluation) replies the "
                             "strategy collects itself: a round's, an edge round's, a relay "
                             "hop's (capped by start()'s timeout)", check=positive)

    @property
    def reply_timeout(self) -> float:
        """Seconds to wait for replies: ``train_timeout``, capped by ``start()``'s."""
        return min(self.train_timeout, self.start_timeout)

    # --- the steps of a round ---------------------------------------------------------

    def reachable_nodes(self, grid: Grid) -> list[int]:
        """Wait for ``min_available_nodes``; the connected nodes not known to be gone,
        in partition-id order (new ones asked what :attr:`known` asks)."""
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)
        return self.known.reachable(grid, connected)

    def sample_train(self, grid: Grid, rng: np.random.Generator
                     ) -> tuple[list[int], list[int]]:
        """The reachable nodes (:meth:`reachable_nodes`) and ``fraction_train`` of them
        (at least ``min_train_nodes``) drawn with ``rng``."""
        reachable = self.reachable_nodes(grid)
        return reachable, sample_share(reachable, self.fraction_train,
                                       self.min_train_nodes, rng)

    def sample_evaluate(self, grid: Grid, rng: np.random.Generator) -> list[int]:
        """``fraction_evaluate`` of the connected nodes (partition-id order, at least
        ``min_evaluate_nodes``) drawn with ``rng``."""
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)
        return sample_share(self.known.order(connected), self.fraction_evaluate,
                            self.min_evaluate_nodes, rng)

    def exchange(self, server_round: int, grid: Grid, plan: Sequence[tuple[int, Key]],
                 messages: Sequence[Message], problem: Callable[[Key, Message], str | None],
                 forget: bool = True) -> Exchanged[Key]:
        """Send ``messages`` (message i to ``plan[i]`` = (node, key)), collect their
        replies within :attr:`reply_timeout` and screen them with ``problem``
        (:func:`~fedgsp_flwr.strategies.exchange.screen`: one WARNING per refused
        reply). With ``forget``, a node that did not answer is forgotten by
        :attr:`known` (asked again when it comes back).
        """
        replies = collect_reply_list(grid, messages, self.reply_timeout)
        if forget:
            self.known.forget_unanswered(
                (node, reply) for (node, _), reply in zip(plan, replies, strict=True))
        screened = screen(type(self).__name__, server_round, plan, replies, problem,
                          self.known.partition_ids)
        return Exchanged(screened, replies, array_bytes(messages),
                         array_bytes(r for r in replies if r is not None))

    def train_problem(self, reference: ArrayRecord | Callable[[Any], ArrayRecord]
                      ) -> Callable[[Any, Message], str | None]:
        """A ``problem`` for :meth:`exchange`: a training reply must carry one model
        shaped like ``reference`` (or ``reference(key)``, the model its message sent)
        and a sound weight."""
        def problem(key: Any, reply: Message) -> str | None:
            sent = reference(key) if callable(reference) else reference
            return reply_problem(reply, reference=sent, weighted_by_key=self.weighted_by_key,
                                 require_arrays=True)
        return problem

    def eval_problem(self, _: Any, reply: Message) -> str | None:
        """A ``problem`` for :meth:`exchange`: an evaluation reply needs a sound weight
        (never given metric names)."""
        return reply_problem(reply, reference=None, weighted_by_key=self.weighted_by_key,
                             require_arrays=False)

    def train_messages(self, plan: Iterable[tuple[int, ArrayRecord]], config: ConfigRecord
                       ) -> list[Message]:
        """A plain ``train`` message of each (node, model), all with ``config``."""
        return [Message(RecordDict({ARRAYS: model, CONFIG: config}), dst_node_id=node,
                        message_type=TRAIN) for node, model in plan]

    def evaluate_groups(self, server_round: int, grid: Grid, config: ConfigRecord,
                        plan: Sequence[tuple[int, Group, ArrayRecord]]
                        ) -> Exchanged[Group]:
        """Send each (node, group, model) of ``plan`` an ``evaluate`` of the model and
        screen the replies (:meth:`eval_problem`); nodes stay known."""
        messages = [Message(RecordDict({ARRAYS: model, CONFIG: ConfigRecord(dict(config))}),
                            dst_node_id=node, message_type=EVALUATE)
                    for node, _, model in plan]
        return self.exchange(server_round, grid, [(n, g) for n, g, _ in plan], messages,
                             self.eval_problem, forget=False)

    def evaluate_members(self, server_round: int, grid: Grid, config: ConfigRecord,
                         group_of: Mapping[int, Group], model: Callable[[Group], ArrayRecord]
                         ) -> Evaluation[Group]:
        """Score each node of ``group_of`` (node -> group) with its group's model
        (``model(group)``, built once a group): :meth:`evaluate_groups`, then
        :meth:`record_evaluation`."""
        started = time.monotonic()
        records = {group: model(group) for group in set(group_of.values())}
        screened = self.evaluate_groups(server_round, grid, config, [
            (node, group, records[group]) for node, group in group_of.items()]).screened
        return self.record_evaluation(server_round, [
            (group, reply.content) for _, group, reply in screened.sound],
            screened.rejected(), started if group_of else None)

    def record_evaluation(self, server_round: int,
                          scored: Sequence[tuple[Group, RecordDict]],
                          rejected: dict[int, str], started: float | None,
                          extra: dict[str, Any] | None = None) -> Evaluation[Group]:
        """Aggregate the scored nodes' replies (group, content), overall and by group,
        and record the round's evaluation (``eval-time`` counts from ``started``;
        ``None``: nothing was sent).

        The overall aggregate is over the replies sorted by their metrics, as
        FedAvg's ``aggregate_evaluate`` sorts them, so a seed gives the same bits
        whatever order they came in; ``extra`` joins it when a node was scored.
        """
        ordered = sorted(scored, key=lambda s: metrics_order(s[1]))
        contents = [c for _, c in ordered]
        metrics = None
        if contents:
            metrics = MetricRecord({**self.evaluate_metrics_aggr_fn(
                contents, self.weighted_by_key), **(extra or {})})
        by_group: dict[Group, list[RecordDict]] = {}
        for group, content in ordered:
            by_group.setdefault(group, []).append(content)
        self.history.record(server_round, EVALUATE, metrics, len(contents), rejected)
        if started is not None:
            self.history[server_round]["eval-time"] = time.monotonic() - started
        return Evaluation(metrics, {g: dict(self.evaluate_metrics_aggr_fn(
            c, self.weighted_by_key)) for g, c in sorted(by_group.items())})

    def finish_round(self, server_round: int, arrays: ArrayRecord | None,
                     metrics: dict[str, Any], used: int, rejected: dict[int, str],
                     expected: int | None = None) -> TrainResult:
        """Record the round and return its model and metrics.

        ``used`` replies trained ``arrays``; ``rejected`` says why each other node's
        was unusable; of ``expected`` replies the others did not come in time.

        Raises
        ------
        TrainingStalled
            See :class:`~fedgsp_flwr.strategies.progress.TrainingProgress`.
        """
        record = MetricRecord(metrics)
        self.history.record(server_round, TRAIN, record, used, rejected)
        self.progress.record(server_round, arrays, used, rejected, expected)
        return (arrays if used else None), record

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """The strategy's training round (subclasses)."""
        raise NotImplementedError(f"{type(self).__name__} must override train_round")

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Not a step of this strategy's round: raises ``TypeError``."""
        raise own_rounds_error(self, "configure_train")

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Not a step of this strategy's round: raises ``TypeError``."""
        raise own_rounds_error(self, "aggregate_train")


class ClusteredRound(ServerSideRound):
    """Base of the clustered strategies (CFL, FeSEM, IFCA, StoCFL): a seed whose two
    generators draw training's nodes (and the strategy's own draws) and evaluation's
    apart, and the latent groups their clusterings are scored against.
    """

    # Each strategy declares its own checkpoint keys for the two:
    rng = saved.generator("rng")
    eval_rng = saved.generator("eval-rng")

    seed: int = setting(
        default=0, help="seeds training's sampling and the strategy's draws and, apart, "
                        "evaluation's sampling, so that fraction_evaluate changes nothing in "
                        "training (the app: its seed)",
        check=non_negative)
    ground_truth: Mapping[int, int] | None = setting(
        default=None, help="latent group of each partition id, to report ARI and NMI")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ground_truth = dict(self.ground_truth or {})
        self.rng = np.random.default_rng([self.seed, 0])
        self.eval_rng = np.random.default_rng([self.seed, 1])

    def registry(self) -> NodeRegistry:
        """Partition ids only, asked of every node (the clusterings and ARI are by
        partition id; see :meth:`FedAvg.registry`)."""
        return NodeRegistry(type(self).__name__, self.query_timeout, PARTITION_FALLBACK,
                            asks=PARTITION)
