"""A resumed run is the uninterrupted run, bit for bit, for every strategy.

Each strategy runs R rounds in-process over a FakeGrid, and the same seeded run is
"killed" after round r: its checkpoint is taken in the round's ``evaluate_fn`` as the
app takes it (``checkpoint_state`` and the global generators, written and read back
by the app's ``save_checkpoint`` / ``load_checkpoint``), and a fresh strategy resumes
from it as the app resumes (``query.partition`` to nodes with other ids,
``node_map``, ``restore_state``, the generators, ``resumed_after``). The final
model, every group model and every round's metrics (clock ones aside) must be
identical.

The grid is the one strategies use in simulation: a :class:`ThreadHintGrid`, which
gives each message ``num-threads`` = cores // messages in flight. Each node's float
results depend on that hint in their last bits, as the results of a multi-threaded
torch/BLAS reduction do (the app's ClientApp applies the hint: ``threads_mod``). So a
resumed run that sends the same messages in other batches (a hook type probed again,
its probe alone) gives other bits, as it did with StoCFL's ``train.bilevel`` under
``flwr run`` (issue 46, point 8). The same holds over a ClientApp without the
training hooks: the resumed run knows they are missing and does not ask again.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fedgsp_flwr import strategies
from fedgsp_flwr.app.checkpoint import (
    Checkpoint,
    capture_global_rngs,
    load_checkpoint,
    restore_global_rngs,
    save_checkpoint,
)
from fedgsp_flwr.app.server_app import resume
from fedgsp_flwr.clients import HANDLERS, ClientHooks, register_hooks
from fedgsp_flwr.clients.handlers import message_config
from fedgsp_flwr.data import ClientData
from fedgsp_flwr.protocol import NUM_THREADS
from fedgsp_flwr.strategies import saved
from fedgsp_flwr.strategies.state import StrategyState, record_arrays, to_record
from fedgsp_flwr.threads import ThreadHintGrid

NODES, CLASSES, FEATURES = 4, 4, 6
ROUNDS, STOP = 3, 1  # an uninterrupted run of ROUNDS rounds; one killed after STOP
CORES = 8  # of the simulated machine: hints 8 // messages in flight
FIRST_IDS = [11, 12, 13, 14]  # node i holds partition i
RESTARTED_IDS = [904, 903, 902, 901]  # other ids, in another order: found by partition
TRAIN_CONFIG: dict[str, Any] = {"lr": 0.1, "batch-size": 8, "local-epochs": 1}
CLOCK_WORDS = ("time", "seconds", "elapsed", "round-trip", "latency")


def node_data(partition: int) -> ClientData:
    """Two latent groups (partition % 2; group 1's labels shifted by one)."""
    rng = np.random.default_rng(partition)
    n = 24 + 4 * partition
    y = rng.integers(0, CLASSES, n)
    x = (rng.normal(size=(n, FEATURES)) + np.eye(CLASSES, FEATURES)[y] * 3).astype(np.float32)
    y = (y + partition % 2) % CLASSES
    return ClientData(x, y, x[:8], y[:8], CLASSES, latent_group=partition % 2)


@functools.cache
def seeded_net(seed: int) -> nn.Module:
    """A tiny MLP (FedFusion needs features to fuse), seeded without touching torch's
    global generator (the runs' own randomness).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, CLASSES))


def net(*_: object) -> nn.Module:
    """The nodes' model (a copy: seeding torch for each message is slow)."""
    return copy.deepcopy(seeded_net(0))


def model_of(seed: int) -> ArrayRecord:
    return ArrayRecord(seeded_net(seed).state_dict())


def thread_bits(values: np.ndarray, threads: int) -> np.ndarray:
    """``values`` with their last bits set by the thread count, as a reduction split
    over ``threads`` threads sets them (1 thread: the values themselves).
    """
    if threads == 1 or not np.issubdtype(values.dtype, np.floating):
        return values
    return (values.astype(np.float64) * (1.0 + (threads - 1) * 2.0**-20)).astype(values.dtype)


def threaded(reply: Message | None, threads: int) -> Message | None:
    """The reply as a node whose float results depend on its thread count gives it."""
    if reply is None or threads == 1 or reply.has_error():
        return reply
    content = reply.content
    for name, record in list(content.array_records.items()):
        content[name] = ArrayRecord({k: Array(thread_bits(v.numpy(), threads))
                                     for k, v in record.items()})
    for name, metrics in list(content.metric_records.items()):
        content[name] = MetricRecord({k: float(thread_bits(np.asarray(v), threads))
                                      if isinstance(v, float) else v
                                      for k, v in metrics.items()})
    return reply


class Federation:
    """The nodes, running our handlers; each node's state (Ditto's personal models)
    lives in its Context, which :meth:`snapshot` copies at a checkpoint.
    """

    def __init__(self, node_ids: list[int], states: list[RecordDict] | None = None,
                 handlers: tuple[str, ...] = HANDLERS) -> None:
        self.contexts: dict[int, Context] = {}
        nodes = {}
        for partition, node in enumerate(node_ids):
            hooks = ClientHooks(load_data=lambda _c, p=partition: node_data(p),
                                build_model=net)
            app = register_hooks(ClientApp(), hooks, handlers=handlers)
            context = Context(run_id=1, node_id=node, node_config={
                "partition-id": partition, "num-partitions": NODES},
                state=copy.deepcopy(states[partition]) if states else RecordDict(),
                run_config={})
            self.contexts[node] = context
            nodes[node] = self.handler(app, context)
        self.raw = FakeGrid(dict(sorted(nodes.items())))  # by node id, as a SuperLink
        self.grid = ThreadHintGrid(self.raw, cores=CORES)  # what a simulation run uses

    @staticmethod
    def handler(app: ClientApp, context: Context) -> Callable[[Message], Message | None]:
        def handle(message: Message) -> Message | None:
            config = message_config(message) if message.has_content() else {}
            return threaded(app(message, context), cast(int, config.get(NUM_THREADS, 1)))
        return handle

    def snapshot(self) -> list[RecordDict]:
        return [copy.deepcopy(c.state) for c in self.contexts.values()]

    def sent(self, since: int = 0) -> list[tuple[int, str, int | None]]:
        """(partition, message type, thread hint) of each message pushed since the
        ``since``-th one.
        """
        partition = {n: cast(int, c.node_config["partition-id"])
                     for n, c in self.contexts.items()}
        return [(partition[node], kind, cast(int | None, message_config(message).get(
                 NUM_THREADS)) if message.has_content() else None)
                for _, node, kind, message in self.raw.pushed[since:]]


# Every strategy, small and seeded; the same settings build the interrupted, the
# uninterrupted and the resumed run's strategy.
COMMON: dict[str, Any] = {"min_available_nodes": NODES, "min_train_nodes": 1,
                          "min_evaluate_nodes": 1}
RELAY: dict[str, Any] = {"train_timeout": 30.0, "poll_interval": 0.001, "seed": 3}
STRATEGIES: dict[str, Callable[[], strategies.FedAvg]] = {
    "FedAvg": lambda: strategies.FedAvg(fraction_train=0.5, **COMMON),
    "FedProx": lambda: strategies.FedProx(proximal_mu=0.1, fraction_train=0.75, **COMMON),
    "FedAdagrad": lambda: strategies.FedAdagrad(eta_l=0.1, fraction_train=0.75, **COMMON),
    "FedAdam": lambda: strategies.FedAdam(eta_l=0.1, fraction_train=0.75, **COMMON),
    "FedYogi": lambda: strategies.FedYogi(eta_l=0.1, fraction_train=0.75, **COMMON),
    "IDA": lambda: strategies.IDA(fraction_train=0.75, **COMMON),
    "FedGSP": lambda: strategies.FedGSP(kappa=0.5, growth="linear", alpha=1.0, **RELAY,
                                        **COMMON),
    "SemiFL": lambda: strategies.SemiFL(cluster_size=2, shuffle_order=True, **RELAY,
                                        **COMMON),
    "HierFL": lambda: strategies.HierFL(num_edges=2, tau2=1, fraction_train=0.75, seed=3,
                                        **COMMON),
    "StoCFL": lambda: strategies.StoCFL(tau=0.3, fraction_train=0.75, seed=3, **COMMON),
    "FeSEM": lambda: strategies.FeSEM(k=2, centre_factory=model_of, fraction_train=0.75,
                                      seed=3, **COMMON),
    "IFCA": lambda: strategies.IFCA(k=2, init="seeds", model_factory=model_of,
                                    fraction_train=0.75, seed=3, **COMMON),
    "CFL": lambda: strategies.CFL(warmup_rounds=0, eps1=100.0, eps2=0.0, min_split_size=2,
                                  fraction_train=1.0, seed=3, **COMMON),
    "FLHC": lambda: strategies.FLHC(warmup_rounds=1, threshold=0.05, fraction_train=0.75,
                                    seed=3, **COMMON),
    "Ditto": lambda: strategies.Ditto(fraction_train=0.75, **COMMON),
    "FedMMD": lambda: strategies.FedMMD(mmd_weight=0.5, fraction_train=0.75, **COMMON),
    "FedFusion": lambda: strategies.FedFusion(operator="multi", fraction_train=0.75,
                                              **COMMON),
}
BASES = {"ServerSideRound", "RelayStrategy"}  # not run on their own
HOOKED = ["StoCFL", "IFCA", "Ditto", "FedMMD", "FedFusion"]  # train with hook types


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """The nodes' torch on one thread: tiny models train faster that way on a busy
    machine (the hints change only the bits :func:`threaded` sets).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_strategy_with_checkpoint_state_is_here() -> None:
    exported = {name for name in strategies.__all__
                if inspect.isclass(cls := getattr(strategies, name))
                and issubclass(cls, strategies.FedAvg)
                and hasattr(cls, "checkpoint_state") and hasattr(cls, "restore_state")}
    assert exported - BASES == set(STRATEGIES)


class Recorder:
    """The runs' ``evaluate_fn``: after round ``stop`` it writes the checkpoint into
    ``folder`` as the app's ServerApp does, and the nodes' own state beside it.
    """

    def __init__(self, strategy: strategies.FedAvg, federation: Federation,
                 folder: Path | None = None, stop: int = 0) -> None:
        self.strategy, self.federation, self.folder, self.stop = (strategy, federation,
                                                                  folder, stop)
        self.node_states: list[RecordDict] = []
        self.pushed = 0  # messages pushed up to the checkpoint

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if self.folder is not None and server_round == self.stop:
            save_checkpoint(self.folder, Checkpoint(
                round=server_round, model=record_arrays(arrays),
                strategy=self.strategy.checkpoint_state(), rng=capture_global_rngs(),
                run_config={}, partitions=self.strategy.node_partitions()))
            self.node_states = self.federation.snapshot()
            self.pushed = len(self.federation.raw.pushed)
        return None


def seed_everything() -> None:
    """As the app seeds a run: Flower's node sampling uses Python's ``random``."""
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)


def start(strategy: Any, grid: Any, initial: ArrayRecord, rounds: int,
          recorder: Recorder) -> Any:
    return strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, timeout=30,
                          train_config=ConfigRecord(TRAIN_CONFIG),
                          evaluate_config=ConfigRecord(), evaluate_fn=recorder)


def untimed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not any(w in k for w in CLOCK_WORDS)}


def groups(strategy: strategies.FedAvg) -> dict[int, tuple[list[int | None], dict, dict]]:
    """Each group model's members (by partition), arrays and last evaluation."""
    partitions = strategy.node_partitions()
    return {g: ([partitions.get(n) for n in model.nodes], record_arrays(model.arrays),
                model.metrics) for g, model in strategy.group_models().items()}


def assert_identical(got: Any, expected: Any, where: str, why: str = "") -> None:
    """``got`` is ``expected``, arrays bit for bit; ``why`` is added to a failure."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), where + why
        for key in expected:
            assert_identical(got[key], expected[key], f"{where}/{key}", why)
    elif isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape, where + why
        assert got.tobytes() == expected.tobytes(), (
            f"{where}: differs by up to {np.abs(got - expected).max():.3g}{why}")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), where + why
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_identical(a, b, f"{where}[{i}]", why)
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}{why}"


def first_difference(got: list[Any], expected: list[Any]) -> str:
    """Where two message lists part, for a failure's text ('' if they do not)."""
    for i, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            return (f"; the resumed run's message {i} after the checkpoint is "
                    f"(partition, type, num-threads) = {a}, the uninterrupted run's {b}")
    if len(got) != len(expected):
        return f"; the resumed run sent {len(got)} messages, the uninterrupted {len(expected)}"
    return ""


def check_resume(tmp_path: Path, name: str, handlers: tuple[str, ...]) -> None:
    """Run ``name`` uninterrupted, and resumed after round STOP; compare bit for bit."""
    build = STRATEGIES[name]
    initial = model_of(0)

    # The uninterrupted run; the interrupted run is the same run up to its checkpoint
    # after round STOP (then killed: nothing after the checkpoint survives).
    seed_everything()
    full_federation, full = Federation(FIRST_IDS, handlers=handlers), build()
    recorder = Recorder(full, full_federation, tmp_path, STOP)
    full_result = start(full, full_federation.grid, initial, ROUNDS, recorder)

    # The resumed run: a fresh process's strategy, nodes with other ids holding their
    # own state as of the checkpoint, the app's resume steps.
    seed_everything()
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.round == STOP
    federation = Federation(RESTARTED_IDS, recorder.node_states, handlers)
    strategy = resume(build(), checkpoint, federation.raw,
                      cast(Any, SimpleNamespace(query_timeout=30.0,  # what it reads
                                                num_server_rounds=ROUNDS)))
    restore_global_rngs(checkpoint.rng)
    resumed_from = len(federation.raw.pushed)  # after the app's query.partition
    assert strategy.resumed_after == STOP
    result = start(strategy, federation.grid,
                   to_record(checkpoint.model), ROUNDS - STOP, Recorder(strategy, federation))

    sent, expected_sent = federation.sent(resumed_from), full_federation.sent(recorder.pushed)
    why = first_difference(sent, expected_sent)
    assert_identical(record_arrays(result.arrays), record_arrays(full_result.arrays),
                     "final model", why)
    assert_identical(groups(strategy), groups(full), "group models", why)
    resumed_rounds = {r: untimed(row) for r, row in strategy.history.items()}
    expected_rounds = {r: untimed(row) for r, row in full.history.items() if r > STOP}
    assert_identical(resumed_rounds, expected_rounds, "round metrics", why)
    # and the same messages (by partition), in the same batches (the same thread hints)
    assert sent == expected_sent, why


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_resumed_run_is_the_uninterrupted_run_bit_for_bit(tmp_path: Path,
                                                            name: str) -> None:
    check_resume(tmp_path, name, HANDLERS)


@pytest.mark.parametrize("name", HOOKED)
def test_so_it_is_over_a_clientapp_without_the_training_hooks(tmp_path: Path,
                                                              name: str) -> None:
    """The hook types were found missing before the checkpoint: the resumed run knows
    (it neither asks again nor sends the nodes anything the uninterrupted run did not).
    """
    check_resume(tmp_path, name, ("train", "evaluate", "partition", "histogram"))


CHECKPOINTS_0_6_0 = Path(__file__).parent / "data" / "checkpoints-0.6.0"
NEW_SINCE_0_6_0 = {"FLHC"}  # no 0.6.0 checkpoint can exist


@pytest.mark.parametrize("name", [n for n in STRATEGIES if n not in NEW_SINCE_0_6_0])
def test_a_checkpoint_written_by_0_6_0_restores_whole(name: str) -> None:
    """What 0.6.0 wrote after round 1 of the hooked run (data/write_checkpoints.py at
    6ff3bbe) restores into this version's strategy, and saved again (through a
    restore under other node ids and back) it is the same state, value for value and
    array for array."""
    saved = load_checkpoint(CHECKPOINTS_0_6_0 / name).strategy
    moved = STRATEGIES[name]()  # as if every node came back under another id ...
    moved.restore_state(saved, lambda node: node + 1000)
    strategy = STRATEGIES[name]()  # ... and then under its first one
    strategy.restore_state(moved.checkpoint_state(), lambda node: node - 1000)
    again = strategy.checkpoint_state()
    assert json.loads(json.dumps(again.meta)) == saved.meta
    assert sorted(again.arrays) == sorted(saved.arrays)  # in any order: an npz is by name
    for key, value in saved.arrays.items():
        assert again.arrays[key].dtype == value.dtype, key
        np.testing.assert_array_equal(again.arrays[key], value, err_msg=key)


def test_a_state_that_lacks_a_declared_field_is_refused_naming_it() -> None:
    saved = load_checkpoint(CHECKPOINTS_0_6_0 / "FeSEM").strategy
    del saved.meta["assignment"]
    strategy = STRATEGIES["FeSEM"]()
    with pytest.raises(ValueError, match="FeSEM: the checkpoint's strategy state lacks "
                                         "'assignment': it was written by another strategy"):
        strategy.restore_state(saved, lambda node: node)
    assert strategy.assignment == {} and strategy.centres is None  # nothing taken back
    assert strategy.known.partition_ids == {}


@pytest.mark.parametrize("damage", ["lacks", "damaged"])
def test_a_state_refused_for_what_it_knows_of_the_nodes_changes_nothing(damage: str) -> None:
    saved = load_checkpoint(CHECKPOINTS_0_6_0 / "HierFL").strategy
    if damage == "lacks":
        del saved.meta["known"]["partition-ids"]
        match = "lacks 'known/partition-ids'"
    else:
        del saved.arrays["generated-reach"]
        match = "HierFL: the checkpoint's 'generated-nodes' cannot be read"
    strategy = STRATEGIES["HierFL"]()
    rng = strategy.rng.bit_generator.state
    with pytest.raises(ValueError, match=match):
        strategy.restore_state(saved, lambda node: node)
    assert strategy.users == [] and strategy.edge_of == {} and strategy._generated == {}
    assert strategy.rng.bit_generator.state == rng and strategy.known.partition_ids == {}


def test_a_declared_field_is_saved_once_under_its_own_key() -> None:
    class Base:
        a = saved.node_map("a")
        b = saved.node_set("b")

    class Redefined(Base):
        b = None  # no longer state

    class Clash(Base):
        c = saved.node_map("a")

    assert [s.key for s in saved.declared(Redefined)] == ["a"]
    with pytest.raises(TypeError, match="Clash: two saved attributes share the state "
                                        "key\\(s\\) 'a'"):
        saved.declared(Clash)
    with pytest.raises(ValueError, match="key must name"):
        saved.node_map("")

    class Unset:
        rng = saved.generator("rng")

    with pytest.raises(AttributeError, match="Unset.rng is read before its __init__ set it"):
        Unset().rng  # noqa: B018


def test_an_optional_field_the_state_lacks_goes_back_to_its_initial_value() -> None:
    class Holder:
        seen = saved.node_map("seen", optional=True)

    holder = Holder()
    holder.seen = {3: 1}
    saved.load_declared(holder, StrategyState(), lambda node: node)
    assert holder.seen == {}
