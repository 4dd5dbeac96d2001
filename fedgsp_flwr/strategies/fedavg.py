"""FedAvg with per-reply validation and a per-round history; the base of every
strategy of this package.

Shared behaviour lives in objects a strategy holds, not in mixins: the node registry
(:class:`~fedgsp_flwr.strategies.node_registry.NodeRegistry`, ``self.known``), the reply
checks (:func:`~fedgsp_flwr.strategies.replies.filter_replies`) and the checkpoint
state (:class:`~fedgsp_flwr.strategies.state.StrategyState`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from logging import INFO, WARNING
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result

from ..core._moved import moved
from ..core.arrays import as_dtype
from ..protocol import ARRAYS, CONFIG, EVALUATE, NUM_EXAMPLES, PARTITION, TRAIN
from ..threads import ThreadHintGrid, is_simulation, server_work
from .aggregation import GroupModel, array_bytes, weighted_mean
from .configured import Configured
from .declared import load_declared, missing_declared, refuse_missing, save_declared
from .exchange import Exchange
from .history import RoundHistory
from .metrics import MetricsAggregation, aggregate_metrics, metrics_order
from .node_registry import SAMPLING_FALLBACK, NodeRegistry, PartitionOrderGrid
from .params import check_parameters, non_negative, positive, setting, unit
from .progress import TrainingProgress
from .replies import filter_replies
from .rounds import EvaluateFn, TrainResult, run_rounds
from .state import NodeMap, StrategyState


def ours_if_none(aggregation: MetricsAggregation | None) -> MetricsAggregation:
    """``aggregation``, or :func:`~fedgsp_flwr.strategies.metrics.aggregate_metrics`
    for ``None`` (which Flower's constructors pass on for "the default")."""
    return aggregation or aggregate_metrics


class FedAvg(Configured, FlowerFedAvg):
    """Flower's FedAvg that validates each reply and keeps a per-round history.

    Takes the parameters of :class:`flwr.serverapp.strategy.FedAvg`. Unsound replies
    are dropped one by one (see :func:`~fedgsp_flwr.strategies.replies.filter_replies`)
    before aggregation; metrics are aggregated whatever the ClientApp names them
    (:func:`~fedgsp_flwr.strategies.metrics.aggregate_metrics`, unless
    ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn`` are given). A round that
    trains nothing keeps the model; ``max_untrained_rounds`` such rounds in a row stop
    the run with :class:`~fedgsp_flwr.strategies.progress.TrainingStalled`, naming the
    cause the replies gave, and so does a run that trained in no round at all.

    Flower samples the nodes of a round with the seeded ``random.sample`` over the
    grid's node list; the list it is given here is in partition-id order (each new node
    is asked its ``partition-id`` once with ``query.partition``; no data is shared), so
    a seed draws the same partitions in every launch, although the simulation engine
    and the SuperLink give the nodes new ids each time. A ClientApp without our
    ``query.partition`` handler is probed with one message, and one INFO line says that
    its nodes are sampled in node-id order, as Flower's FedAvg does.

    :attr:`history` records per round the aggregated client metrics, the replies used
    and rejected, the model bytes sent and received in training (``bytes-sent``,
    ``bytes-received``), the models uploaded (``uploads``: replies with content) and
    the seconds from sending a stage's messages to aggregating their replies
    (``train-time``, ``eval-time``).

    Attributes
    ----------
    history : RoundHistory
        Per-round metrics, by round (a dict).
    known : NodeRegistry
        What the strategy knows of the nodes (partition ids; histograms for the
        strategies that ask for them); it goes into the checkpoint and translates node
        ids on resume.
    progress : TrainingProgress
        The last model that trained, and the count of rounds without one.
    """

    fraction_train: float = setting(default=1.0, help="share of the nodes sampled to "
                                    "train each round", check=unit, rule="in [0, 1]")
    fraction_evaluate: float = setting(default=1.0, help="share of the nodes sampled to "
                                       "evaluate each round", check=unit, rule="in [0, 1]")
    min_train_nodes: int = setting(default=2, help="fewest nodes to train a round",
                                   check=non_negative, rule=">= 0")
    min_evaluate_nodes: int = setting(default=2, help="fewest nodes to evaluate a round",
                                      check=non_negative, rule=">= 0")
    min_available_nodes: int = setting(default=2, help="nodes to wait for before a round",
                                       check=non_negative, rule=">= 0")
    weighted_by_key: str = setting(default=NUM_EXAMPLES,
                                   help="the reply metric that weighs each reply")
    arrayrecord_key: str = setting(default=ARRAYS, help="the model's record name")
    configrecord_key: str = setting(default=CONFIG, help="the config's record name")
    train_metrics_aggr_fn: MetricsAggregation = setting(
        default=aggregate_metrics, help="aggregates the training metrics")
    evaluate_metrics_aggr_fn: MetricsAggregation = setting(
        default=aggregate_metrics, help="aggregates the evaluation metrics")
    max_untrained_rounds: int = setting(
        default=3, help="rounds in a row without a trained model that stop the run",
        check=lambda v: v >= 1, rule=">= 1")
    server_threads: int | None = setting(
        default=None, help="BLAS/OpenMP threads for the strategy's own numpy work during "
                           "start() (None: 1 in Flower's simulation engine, whose ClientApps "
                           "own the cores; the process's setting in deployment)",
        check=lambda v: v is None or (type(v) is int and v >= 1),
        rule="None or an integer >= 1")
    query_timeout: float = setting(default=300.0, help="seconds to wait for the nodes' answers "
                                                       "to a query (partition ids; histograms, "
                                                       "sketches where the strategy asks for "
                                                       "them)", check=positive, rule="> 0")

    def __post_init__(self) -> None:
        FlowerFedAvg.__init__(
            self, self.fraction_train, self.fraction_evaluate, self.min_train_nodes,
            self.min_evaluate_nodes, self.min_available_nodes, self.weighted_by_key,
            self.arrayrecord_key, self.configrecord_key,
            ours_if_none(self.train_metrics_aggr_fn),
            ours_if_none(self.evaluate_metrics_aggr_fn))
        self.history = RoundHistory()
        self._size_warned = False
        self.take_run_options(self.max_untrained_rounds, self.server_threads,
                              self.query_timeout)
        self.start_timeout = math.inf
        self._sent_arrays: ArrayRecord | None = None
        self._sent_count = 0

    def start(  # type: ignore[override]  # Flower's parameters, and 1.43's should_stop
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Result:
        """Flower's ``start`` (:func:`~fedgsp_flwr.strategies.rounds.run_rounds`): each
        round is :meth:`train_round`, then :meth:`evaluate_round`; the last model that
        trained is ``result.arrays``.

        ``timeout`` also bounds the replies the strategy waits for itself (relay hops,
        edge rounds, queries' training). ``should_stop``, if given, is asked before each
        round; ``True`` ends the run with the rounds done.

        Raises
        ------
        TrainingStalled
            If ``max_untrained_rounds`` rounds in a row, or every round of the run,
            trained nothing; its ``arrays`` is the last model that trained.
        """
        with self.running(grid, initial_arrays, timeout) as run_grid:
            result = run_rounds(self, run_grid, initial_arrays, num_rounds=num_rounds,
                                timeout=timeout, train_config=train_config,
                                evaluate_config=evaluate_config, evaluate_fn=evaluate_fn,
                                name=type(self).__name__, summary=self.summary,
                                should_stop=should_stop)
        return self.end_run(result, num_rounds)

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """One training round: :meth:`configure_train`, the replies within ``timeout``,
        :meth:`aggregate_train` (Flower's steps)."""
        replies = grid.send_and_receive(
            messages=self.configure_train(server_round, arrays, config, grid),
            timeout=timeout)
        return self.aggregate_train(server_round, replies)

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """One evaluation round: :meth:`configure_evaluate`, the replies within
        ``timeout``, :meth:`aggregate_evaluate` (Flower's steps)."""
        replies = grid.send_and_receive(
            messages=self.configure_evaluate(server_round, arrays, config, grid),
            timeout=timeout)
        return self.aggregate_evaluate(server_round, replies)

    @contextmanager
    def running(self, grid: Grid, initial_arrays: ArrayRecord, timeout: float,
                ) -> Iterator[Grid]:
        """Around a run's rounds (:meth:`start` uses it; so does a wrapper that runs
        Flower's loop itself, such as a resumed run's): resets the run's state, runs the
        rounds with ``server_threads`` BLAS threads and the objects alive before them
        frozen for the cyclic GC (:func:`~fedgsp_flwr.threads.server_work`), and yields
        the grid to use (in simulation a :class:`~fedgsp_flwr.threads.ThreadHintGrid`).
        """
        self.progress.reset(initial_arrays)
        self.start_timeout = timeout
        with server_work(grid, self.server_threads):
            yield ThreadHintGrid(grid) if is_simulation(grid) else grid

    def end_run(self, result: Result, num_rounds: int) -> Result:
        """After a run's last round: fill an empty ``result.arrays`` with the last model
        that trained.

        Raises
        ------
        TrainingStalled
            If no round of the run trained.
        """
        if num_rounds > 0 and self.progress.trained_rounds == 0:
            raise self.progress.stalled(f"no round of the run's {num_rounds} trained")
        if not result.arrays and self.progress.last_trained is not None:
            result.arrays = self.progress.last_trained  # Flower's Result starts empty
        return result

    def warn_size(self, message: str, *args: Any) -> None:
        """Log, once per strategy object, a WARNING that the federation is too small for
        the strategy's settings (what they imply, and the setting to change)."""
        if not self._size_warned:
            self._size_warned = True
            log(WARNING, message, *args)

    def warn_unfilled(self, have: int, group: str, nodes: int, member: str, setting: str,
                      label: str = "") -> None:
        """:meth:`warn_size` when ``have`` groups (singular ``group``, e.g. ``"centre"``;
        counted as ``label`` + ``have``: ``"k=5"``) outnumber the ``nodes`` members
        (singular ``member``) that could fill them."""
        if 0 < nodes < have:
            self.warn_size("%s: %s%d %ss for %d %ss: at least %d %ss get no %s; set %s to at "
                           "most %d", type(self).__name__, label, have, group, nodes, member,
                           have - nodes, group, member, setting, nodes)

    def take_run_options(self, max_untrained_rounds: int, server_threads: int | None,
                         query_timeout: float) -> None:
        """Set this project's run parameters (checked by :func:`run_checks`) and what
        depends on them: the node registry and the training progress."""
        self.server_threads, self.query_timeout = server_threads, query_timeout
        limits = getattr(self, "known", None)
        self.known = self.registry()
        if limits is not None:  # keep what expect_federation said
            self.known.num_classes = limits.num_classes
            self.known.num_partitions = limits.num_partitions
        self.progress = TrainingProgress(type(self).__name__, max_untrained_rounds,
                                         self.weighted_by_key)

    def expect_federation(self, *, num_classes: int | None = None,
                          num_partitions: int | None = None) -> None:
        """Tell the strategy what the caller knows of the federation, so that the nodes'
        answers are checked against it rather than against each other.

        Parameters
        ----------
        num_classes : int | None
            The length of every class histogram (FedGSP, HierFL, Semi-FL). Without it,
            the length most nodes send.
        num_partitions : int | None
            The number of partitions: a node's ``partition-id`` must be below it.
            Without it, ids are checked to be >= 0 and held by one node each.
        """
        check_parameters(type(self).__name__, [
            (num_classes is None or (type(num_classes) is int and num_classes >= 1),
             f"num_classes must be None or an integer >= 1, got {num_classes!r}"),
            (num_partitions is None or (type(num_partitions) is int and num_partitions >= 1),
             f"num_partitions must be None or an integer >= 1, got {num_partitions!r}")])
        self.known.num_classes, self.known.num_partitions = num_classes, num_partitions

    def registry(self) -> NodeRegistry:
        """A new registry of what the nodes say about themselves (:attr:`known`): here
        their partition ids, to sample in a run-independent order; strategies that
        need more of the nodes (histograms, edges) return their own.
        """
        return NodeRegistry(type(self).__name__, self.query_timeout, SAMPLING_FALLBACK,
                            asks=PARTITION, missing_level=INFO,
                            absent="Flower's sampling still sends them their messages")

    def group_models(self) -> dict[int, GroupModel]:
        """The models the strategy keeps beside the global one, by id, with their
        member nodes (clusters, centres, edges, the last round's relay groups); empty
        for FedAvg and FedProx. Call it after :meth:`start` to save them.
        """
        return {}

    # --- checkpoint (written and read by fedgsp_flwr.app.checkpoint) -------------------

    def checkpoint_state(self) -> StrategyState:
        """The state to save after a round: what is known of the nodes, and every
        attribute the strategy declares :class:`~fedgsp_flwr.strategies.declared.Saved`."""
        state = StrategyState()
        state.merge("known", self.known.checkpoint_state())
        save_declared(self, state)
        return state

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`, node ids translated by ``node_map`` (a
        checkpoint of an older version without the nodes' state leaves them to be
        asked again).

        Raises
        ------
        ValueError
            If ``state`` lacks a declared attribute of the strategy or of what it knows
            of the nodes (another strategy's state): nothing is taken back then.
        """
        known = state.part("known")
        refuse_missing(type(self).__name__, missing_declared(self, state) + [
            f"known/{key}" for key in (missing_declared(self.known, known) if known.meta
                                       else [])])
        load_declared(self, state, node_map)
        if known.meta:
            self.known.restore_state(known, node_map)

    def node_partitions(self) -> dict[int, int]:
        """The ``partition-id`` each known node reported (to translate node ids)."""
        return dict(self.known.partition_ids)

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """Files of the strategy's own state for the run's results folder (by name)."""
        return {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's sampling over the nodes in partition order (see the class doc);
        remember the arrays sent, to check the replies' shapes against them.
        """
        self._sent_arrays = arrays
        messages = list(super().configure_train(server_round, arrays, config,
                                                PartitionOrderGrid(grid, self.known)))
        self._sent_count = len(messages)
        self.history.setdefault(server_round, {})["bytes-sent"] = (
            len(messages) * arrays.count_bytes())
        self.history.sent(TRAIN, messages)
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's sampling over the nodes in partition order; note when the
        evaluation messages leave, to time their round trip.
        """
        messages = list(super().configure_evaluate(server_round, arrays, config,
                                                   PartitionOrderGrid(grid, self.known)))
        self.history.sent(EVALUATE, messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the sound training replies only."""
        self.history.stop_clock(server_round, TRAIN)
        replies = self._screen(TRAIN, replies)
        sound, rejected = filter_replies(
            replies,
            reference=self._sent_arrays,
            weighted_by_key=self.weighted_by_key,
            require_arrays=True,
            stage="aggregate_train",
            partition_ids=self.known.partition_ids,
        )
        # Float sums depend on their order and replies arrive in any order: sort them
        # by content so that a seed gives the same model bit for bit.
        sound.sort(key=lambda m: next(iter(m.content.array_records.values())).object_id)
        arrays, metrics = None, None
        if sound:
            contents = [m.content for m in sound]
            arrays = self.combine_models(server_round, contents)
            metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        self.history.record(server_round, TRAIN, metrics, len(sound), rejected)
        self.history[server_round]["bytes-received"] = array_bytes(replies)
        self.history[server_round]["uploads"] = sum(r.has_content() for r in replies)
        self.progress.record(server_round, arrays, len(sound), rejected, self._sent_count)
        return arrays, metrics

    def combine_models(self, server_round: int, contents: list[RecordDict]) -> ArrayRecord:
        """The round's model from the sound replies' contents: the mean weighted by
        ``weighted_by_key`` (Flower's ``aggregate_arrayrecords``) in the replies' dtypes.
        IDA overrides it.

        Flower's mean of an integer array (BatchNorm's ``num_batches_tracked``) is
        float64: sent on as such, every later int64 reply would misfit the model.
        """
        dtypes = {k: a.dtype for k, a in next(iter(contents[0].array_records.values())).items()}
        mean = weighted_mean(contents, self.weighted_by_key)
        return ArrayRecord({k: Array(v if str(v.dtype) == dtypes[k] else as_dtype(v, dtypes[k]))
                            for k, v in mean.items()})

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Aggregate the sound evaluation replies only."""
        self.history.stop_clock(server_round, EVALUATE)
        sound, rejected = filter_replies(
            self._screen(EVALUATE, replies),
            reference=None,
            weighted_by_key=self.weighted_by_key,
            require_arrays=False,
            stage="aggregate_evaluate",
            partition_ids=self.known.partition_ids,
        )
        sound.sort(key=lambda m: metrics_order(m.content))
        metrics = (self.evaluate_metrics_aggr_fn([m.content for m in sound],
                                                 self.weighted_by_key) if sound else None)
        self.history.record(server_round, EVALUATE, metrics, len(sound), rejected)
        self.evaluated(server_round, sound)
        return metrics

    def evaluated(self, server_round: int, sound: Sequence[Message]) -> None:
        """Called with a round's sound evaluation replies (strategies that score
        several models per round break them down here).
        """

    def _screen(self, stage: str, replies: Iterable[Message]) -> list[Message]:
        """The replies that answer this stage's messages, each from the node asked and
        once (see :class:`~fedgsp_flwr.strategies.exchange.Exchange`); without the
        messages (a caller that drives the aggregation itself), duplicates only are
        refused.
        """
        exchange = Exchange(self.history.take_messages(stage), f"aggregate_{stage}")
        for reply in replies:
            exchange.take(reply)
        return [r for r in exchange.result() if r is not None]


_HERE = "fedgsp_flwr.strategies"
_MOVED = {"ServerSideRound": f"{_HERE}.server_round:ServerSideRound",
          "FedProx": f"{_HERE}.fedprox:FedProx", "FEDPROX_PARAMS": f"{_HERE}.fedprox:PARAMS",
          "average_arrays": f"{_HERE}.aggregation:average_arrays"}
__getattr__ = moved(__name__, _MOVED)
