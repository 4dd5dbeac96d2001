"""FedAvg with per-reply validation and a per-round history; the base of every strategy
of this package. Shared behaviour lives in objects a strategy holds, not in mixins: the
node registry (``self.known``), the reply checks, the history, the training progress."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result

from ..core._moved import moved
from ..protocol import ARRAYS, CONFIG, EVALUATE, NUM_EXAMPLES, PARTITION, TRAIN
from ..threads import ThreadHintGrid, is_simulation, server_work
from .aggregation import GroupModel, array_bytes, mean_in_dtypes
from .configured import Configured
from .declared import checkpoint, restore
from .exchange import Exchange
from .history import RoundHistory
from .metrics import MetricsAggregation, aggregate_metrics, metrics_order, ours_if_none
from .node_registry import SAMPLING_FALLBACK, NodeRegistry, PartitionOrderGrid
from .params import non_negative, positive, setting, unit
from .progress import SizeWarning, TrainingProgress
from .replies import filter_replies
from .rounds import EvaluateFn, TrainResult, run_rounds
from .state import NodeMap, StrategyState


class FedAvg(Configured, FlowerFedAvg):
    """Flower's FedAvg that validates each reply and keeps a per-round history.

    Takes the parameters of :class:`flwr.serverapp.strategy.FedAvg`. Unsound replies are
    dropped one by one (:func:`~fedgsp_flwr.strategies.replies.filter_replies`) before
    aggregation; metrics are aggregated whatever the ClientApp names them
    (:func:`~fedgsp_flwr.strategies.metrics.aggregate_metrics`, unless given). A round
    that trains nothing keeps the model; ``max_untrained_rounds`` such rounds in a row,
    or a run that trained in no round, stop the run with
    :class:`~fedgsp_flwr.strategies.progress.TrainingStalled` naming the replies' cause.

    Flower's seeded sampling draws from the nodes in partition-id order
    (:class:`~fedgsp_flwr.strategies.node_registry.PartitionOrderGrid`), so a seed
    trains the same partitions in every launch; a ClientApp without our
    ``query.partition`` handler is sampled in node-id order, as Flower's FedAvg does,
    with one INFO line saying so.

    Attributes
    ----------
    history : RoundHistory
        Per-round metrics, by round (a dict; see its class for the keys).
    known : NodeRegistry
        What the strategy knows of the nodes (partition ids; histograms where asked); it
        goes into the checkpoint and translates node ids on resume.
    progress : TrainingProgress
        The last model that trained, and the count of rounds without one.
    resumed_after : int
        Rounds an interrupted run completed, which :meth:`start` goes on from (0, the
        default: a new run). It stays as set: a later :meth:`start` of the same object
        goes on from it too, so set it back to 0 to start over.
    """

    fraction_train: float = setting(default=1.0, help="share of the nodes sampled to train "
                                    "each round", check=unit)
    fraction_evaluate: float = setting(default=1.0, help="share of the nodes sampled to "
                                       "evaluate each round", check=unit)
    min_train_nodes: int = setting(default=2, help="fewest nodes to train a round",
                                   check=non_negative)
    min_evaluate_nodes: int = setting(default=2, help="fewest nodes to evaluate a round",
                                      check=non_negative)
    min_available_nodes: int = setting(default=2, help="nodes to wait for before a round",
                                       check=non_negative)
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
        "start() (None: 1 in Flower's simulation engine, whose ClientApps own the cores; "
        "the process's setting in deployment)",
        check=lambda v: v is None or (type(v) is int and v >= 1), rule="None or an integer >= 1")
    query_timeout: float = setting(
        default=300.0, help="seconds to wait for the nodes' answers to a query (partition "
        "ids; histograms, sketches where the strategy asks for them)", check=positive)

    def __post_init__(self) -> None:
        FlowerFedAvg.__init__(
            self, self.fraction_train, self.fraction_evaluate, self.min_train_nodes,
            self.min_evaluate_nodes, self.min_available_nodes, self.weighted_by_key,
            self.arrayrecord_key, self.configrecord_key,
            ours_if_none(self.train_metrics_aggr_fn),
            ours_if_none(self.evaluate_metrics_aggr_fn))
        self.history = RoundHistory()
        self.warn_size = SizeWarning(type(self).__name__)
        self.known = self.registry()
        self.progress = TrainingProgress(type(self).__name__, self.max_untrained_rounds,
                                         self.weighted_by_key)
        self.start_timeout, self.resumed_after = float("inf"), 0
        self._sent_arrays: ArrayRecord | None = None  # the last round's, to check replies
        self._sent_count = 0

    def start(  # type: ignore[override]  # Flower's parameters, and 1.43's should_stop
        self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
        timeout: float = 3600, train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None, evaluate_fn: EvaluateFn | None = None,
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
        with self.running(grid, initial_arrays, timeout, num_rounds) as run_grid:
            result = run_rounds(self, run_grid, initial_arrays, num_rounds=num_rounds,
                                timeout=timeout, train_config=train_config,
                                evaluate_config=evaluate_config, evaluate_fn=evaluate_fn,
                                name=type(self).__name__, summary=self.summary,
                                offset=self.resumed_after, should_stop=should_stop)
        return self.progress.finish(result, num_rounds)

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """One training round: :meth:`configure_train`, the replies within ``timeout``,
        :meth:`aggregate_train` (Flower's steps)."""
        messages = self.configure_train(server_round, arrays, config, grid)
        return self.aggregate_train(server_round, grid.send_and_receive(messages, timeout=timeout))

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """One evaluation round: :meth:`configure_evaluate`, the replies within
        ``timeout``, :meth:`aggregate_evaluate` (Flower's steps)."""
        messages = self.configure_evaluate(server_round, arrays, config, grid)
        return self.aggregate_evaluate(server_round,
                                       grid.send_and_receive(messages, timeout=timeout))

    @contextmanager
    def running(self, grid: Grid, initial_arrays: ArrayRecord, timeout: float,
                num_rounds: int | None = None) -> Iterator[Grid]:
        """Around a run of ``num_rounds`` rounds (:meth:`start`'s, or a caller's loop):
        resets the run's state, runs the rounds with ``server_threads`` BLAS threads and
        the objects alive before them frozen for the cyclic GC
        (:func:`~fedgsp_flwr.threads.server_work`), yields the grid to use."""
        self.progress.reset(initial_arrays, num_rounds)
        self.start_timeout = timeout
        with server_work(grid, self.server_threads):
            yield ThreadHintGrid(grid) if is_simulation(grid) else grid

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
            Without it, ids are checked to be >= 0 and held by one node each. Either
            must be ``None`` or an integer >= 1 (else ``ValueError``).
        """
        self.known.expect(num_classes, num_partitions)

    def registry(self) -> NodeRegistry:
        """A new registry of what the nodes say about themselves (:attr:`known`): here
        their partition ids, to sample in a run-independent order; strategies that need
        more of the nodes (histograms, edges) return their own."""
        return NodeRegistry(type(self).__name__, self.query_timeout, SAMPLING_FALLBACK,
                            asks=PARTITION, missing_level=INFO,
                            absent="Flower's sampling still sends them their messages")

    def group_models(self) -> dict[int, GroupModel]:
        """Models kept beside the global one, by id, with their member nodes (clusters,
        centres, edges, the last round's relay groups); empty for FedAvg and FedProx."""
        return {}

    def checkpoint_state(self) -> StrategyState:
        """The state to save after a round: what is known of the nodes, and every
        attribute the strategy declares :class:`~fedgsp_flwr.strategies.declared.Saved`."""
        return checkpoint(self, {"known": self.known})

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`, node ids translated by ``node_map``
        (:func:`~fedgsp_flwr.strategies.declared.restore`: a checkpoint of an older
        version without the nodes' state leaves them to be asked again; one of another
        strategy raises ``ValueError`` and nothing is taken back)."""
        restore(self, {"known": self.known}, state, node_map)

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
        remember the arrays sent, to check the replies' shapes against them."""
        self._sent_arrays = arrays
        messages = list(super().configure_train(server_round, arrays, config,
                                                PartitionOrderGrid(grid, self.known)))
        self._sent_count = len(messages)
        self.history.setdefault(server_round, {})["bytes-sent"] = len(messages) * arrays.count_bytes()
        self.history.sent(TRAIN, messages)
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's sampling over the nodes in partition order; note when the
        evaluation messages leave, to time their round trip."""
        messages = list(super().configure_evaluate(server_round, arrays, config,
                                                   PartitionOrderGrid(grid, self.known)))
        self.history.sent(EVALUATE, messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the sound training replies only."""
        replies, sound, rejected = self._screen(server_round, TRAIN, replies,
                                                self._sent_arrays)
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
        IDA overrides it."""
        return mean_in_dtypes(contents, self.weighted_by_key)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Aggregate the sound evaluation replies only."""
        _, sound, rejected = self._screen(server_round, EVALUATE, replies, None)
        sound.sort(key=lambda m: metrics_order(m.content))
        metrics = (self.evaluate_metrics_aggr_fn([m.content for m in sound],
                                                 self.weighted_by_key) if sound else None)
        self.history.record(server_round, EVALUATE, metrics, len(sound), rejected)
        self.evaluated(server_round, sound)
        return metrics

    def evaluated(self, server_round: int, sound: Sequence[Message]) -> None:
        """Called with a round's sound evaluation replies (strategies that score
        several models per round break them down here)."""

    def _screen(self, server_round: int, stage: str, replies: Iterable[Message],
                reference: ArrayRecord | None) -> tuple[list[Message], list[Message],
                                                        dict[int, str]]:
        """Stop the stage's clock; the replies that answer its messages
        (:meth:`~fedgsp_flwr.strategies.exchange.Exchange.answers`), the sound ones among
        them and why each other node's was refused
        (:func:`~fedgsp_flwr.strategies.replies.filter_replies`)."""
        self.history.stop_clock(server_round, stage)
        answers = Exchange.answers(self.history.take_messages(stage), f"aggregate_{stage}",
                                   replies)
        sound, rejected = filter_replies(
            answers, reference=reference, weighted_by_key=self.weighted_by_key,
            require_arrays=stage == TRAIN, stage=f"aggregate_{stage}",
            partition_ids=self.known.partition_ids)
        return answers, sound, rejected


_MOVED = {"FEDPROX_PARAMS": f"{__package__}.fedprox:PARAMS", **{
    name: f"{__package__}.{where}:{name}" for name, where in [
        ("ServerSideRound", "server_round"), ("FedProx", "fedprox"), ("average_arrays",
         "aggregation"), ("weighted_mean", "aggregation"), ("check_parameters", "params")]}}
__getattr__ = moved(__name__, _MOVED)
