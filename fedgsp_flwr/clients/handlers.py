"""Message handlers that any Flower ClientApp can register.

Message types and contents (their names are the constants of
:mod:`fedgsp_flwr.protocol`, whose ``MESSAGES`` table says the same):

``train``
    in: ``arrays`` (model), ``config`` (``lr``, ``local-epochs`` or ``local-steps``,
    ``batch-size``, ``momentum``, ``proximal-mu``, ``server-round``; relay hops add
    ``relay-group`` and ``relay-hop``, which seed the hop's training). out: ``arrays``
    (trained model), ``metrics`` (``train-loss``, ``num-examples``). Relay hops
    (FedGSP, Semi-FL) are plain ``train`` messages: any ClientApp's train handler
    answers them.
``evaluate``
    in: ``arrays``. out: ``metrics`` (``eval-loss``, ``eval-acc``, ``num-examples``).
``query.histogram``
    in: nothing. out: ``histogram`` (ArrayRecord with one int64 array of label counts),
    ``metrics`` (``num-examples``, and ``partition-id`` if the node config has one;
    ``edges``, the HierFL edges in the node's range, if its node config states them
    as ``edges="0,3"``; ``cluster-id``, the node's Semi-FL cluster, if its node config
    states one as ``cluster-id=2``).
``query.partition``
    in: nothing. out: ``metrics`` (``partition-id`` if the node config has one, else
    empty): a run-independent node order without asking for data (StoCFL samples in it).
``query.sketch``
    in: ``arrays`` (the anchor model), ``config`` (optional: ``sketch-mode``
    ``gradient`` | ``update``, ``sketch-epochs``, ``sketch-dim`` (0 = the model's size),
    ``sketch-seed``, and the training settings of ``update``). out: ``sketch``
    (ArrayRecord with one float32 unit-norm vector), ``metrics`` (``num-examples``,
    ``partition-id`` as above).
``train.ifca``
    (:mod:`fedgsp_flwr.clients.ifca`) in: ArrayRecords ``model-0`` ... ``model-{k-1}``
    (IFCA's cluster models) and ``config`` (the training settings of ``train``).
    Computes each model's loss on the node's training data, trains the lowest (ties: the
    lower index) as ``train`` does. out: ``arrays`` (the trained model), ``metrics``
    (``train-loss``, ``num-examples``, ``ifca-choice``, ``ifca-losses``: the k losses
    before training).
``train.bilevel``
    in: ``global`` (w) and ``cluster`` (theta) ArrayRecords, ``config`` (training
    settings and ``lambda``). Trains theta on the local loss + lambda/2 ||theta - w||^2
    and w on the local loss, from the same seed. out: ``global`` and ``cluster``
    (trained), ``metrics`` (``train-loss`` of theta, ``global-train-loss``,
    ``num-examples``).

:mod:`fedgsp_flwr.clients.registration` registers them on a ClientApp. A handler raises
on bad input (no model in the message, arrays that do not fit the
model); Flower turns the exception into an error reply that strategies skip.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

from ..core._moved import moved
from ..data import ClientData
from ..protocol import (
    ARRAYS,
    BATCH_SIZE,
    CLUSTER,
    CLUSTER_ID,
    CONFIG,
    EDGES,
    EVAL_ACC,
    EVAL_LOSS,
    GLOBAL,
    HISTOGRAM,
    LAMBDA,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
    LR,
    METRICS,
    MOMENTUM,
    NUM_EXAMPLES,
    PARTITION_ID,
    PROXIMAL_MU,
    RELAY_GROUP,
    RELAY_HOP,
    SERVER_ROUND,
    SKETCH,
    SKETCH_DIM,
    SKETCH_EPOCHS,
    SKETCH_MODE,
    SKETCH_SEED,
    TRAIN_LOSS,
)
from ..training import TrainResult, evaluate, train
from .privacy import laplace_histogram
from .sketches import compute_sketch

# What a MetricRecord holds (its constructor wants exactly this value type).
MetricValue = int | float | list[int] | list[float]

if TYPE_CHECKING:
    import torch

# A DataLoader's dict batches: the label under one of these keys.
LABEL_KEYS = ("label", "labels", "y", "target", "targets", "character", "fine_label")
DataSource = Any
"""What ``ClientHooks.load_data`` returns: :class:`~fedgsp_flwr.data.ClientData`,
``(x, y)`` arrays, ``(x_train, y_train, x_test, y_test)``, a torch ``DataLoader``, or a
``(train_loader, test_loader)`` pair."""


@dataclass(frozen=True)
class TrainSettings:
    """Local training hyper-parameters, read from a message's config.

    Attributes
    ----------
    local_epochs, batch_size : int
        Epochs and mini-batch size.
    local_steps : int
        If > 0, this many mini-batch steps instead of ``local_epochs`` (HierFL's tau1).
    lr, momentum, proximal_mu : float
        SGD learning rate and momentum; FedProx proximal weight.
    """

    local_epochs: int = 1
    lr: float = 0.05
    batch_size: int = 32
    momentum: float = 0.0
    proximal_mu: float = 0.0
    local_steps: int = 0

    @classmethod
    def from_config(cls, config: ConfigRecord, defaults: TrainSettings) -> TrainSettings:
        """Take each setting from ``config`` if present, else from ``defaults``.

        Raises
        ------
        ValueError
            If a setting is out of range.
        """
        def number(key: str, default: float) -> float:
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(  # noqa: TRY004 - a bad message, as the range checks
                    f"message config '{key}' must be a number, got {value!r}")
            return value

        settings = cls(
            local_epochs=int(number(LOCAL_EPOCHS, defaults.local_epochs)),
            lr=float(number(LR, defaults.lr)),
            batch_size=int(number(BATCH_SIZE, defaults.batch_size)),
            momentum=float(number(MOMENTUM, defaults.momentum)),
            proximal_mu=float(number(PROXIMAL_MU, defaults.proximal_mu)),
            local_steps=int(number(LOCAL_STEPS, defaults.local_steps)),
        )
        if (settings.local_epochs < 1 or settings.batch_size < 1 or settings.lr <= 0
                or not 0 <= settings.momentum < 1 or settings.proximal_mu < 0
                or settings.local_steps < 0):
            raise ValueError(f"invalid training settings in the message config: {settings}")
        return settings


@dataclass(frozen=True)
class ClientHooks:
    """What the handlers need from a ClientApp: its data, its model, its defaults.

    Attributes
    ----------
    load_data : Callable[[Context], DataSource]
        Returns this node's data (called per message; cache inside it if it is slow):
        a :class:`~fedgsp_flwr.data.ClientData`, ``(x, y)`` numpy arrays or tensors,
        ``(x_train, y_train, x_test, y_test)``, a torch ``DataLoader`` of ``(x, y)``
        batches or of dict batches with a label key (``label``, ``labels``, ``y``,
        ...) and one feature key, or a ``(train_loader, test_loader)`` pair (what
        Flower's quickstart's ``load_data`` returns). Loaders are read once per call.
        Features become float32, labels int64; without a test split our ``evaluate``
        handler scores the training data.
    build_model : Callable[[Context, ClientData], torch.nn.Module]
        Returns a model whose ``state_dict`` keys and shapes match the server's arrays
        (an app's ``lambda *_: Net()`` will do).
    defaults : Callable[[Context], TrainSettings]
        Training settings used where a message's config does not set them.
    num_classes : int | None
        Length of the class histograms; ``None`` takes the width of the model's
        output (needed only when ``load_data`` does not return ``ClientData``).
    state_dir : Callable[[Context], str | None]
        A node-local directory where handlers keep state that must outlive the run
        (Ditto's personal models, which a resumed run, a new Flower run, would otherwise
        start again), or ``None`` (the default) to keep it in the node state only.
    """

    load_data: Callable[[Context], DataSource]
    build_model: Callable[[Context, ClientData], torch.nn.Module]
    defaults: Callable[[Context], TrainSettings] = lambda _context: TrainSettings()
    num_classes: int | None = None
    state_dir: Callable[[Context], str | None] = lambda _context: None

    def client_data(self, context: Context) -> ClientData:
        """This node's data as :class:`~fedgsp_flwr.data.ClientData`.

        Raises
        ------
        ValueError
            If ``load_data`` returns something else than the forms listed above.
        """
        source = self.load_data(context)
        if isinstance(source, ClientData):
            return source
        x_train, y_train, x_test, y_test = _arrays_of(source)
        data = ClientData(x_train, y_train, x_test, y_test, self.num_classes or 0)
        if self.num_classes is None:
            data = ClientData(x_train, y_train, x_test, y_test, _output_width(
                self.build_model(context, data), x_train))
        return data


def _arrays_of(source: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) from the forms ``ClientHooks.load_data`` takes."""
    if isinstance(source, (tuple, list)) and len(source) in (2, 4) and all(
            _is_array(a) for a in source):
        parts = [_numpy(a).astype(np.int64 if i % 2 else np.float32, copy=False)
                 for i, a in enumerate(source)]
        return (*parts, *parts) if len(parts) == 2 else (  # type: ignore[return-value]
            parts[0], parts[1], parts[2], parts[3])
    if isinstance(source, (tuple, list)) and len(source) == 2 and all(
            _is_loader(a) for a in source):
        return (*_read_loader(source[0]), *_read_loader(source[1]))
    if _is_loader(source):
        x, y = _read_loader(source)
        return x, y, x, y
    raise ValueError(
        f"ClientHooks.load_data returned {type(source).__name__}; return ClientData, "
        "(x, y) arrays, (x_train, y_train, x_test, y_test), a DataLoader or a "
        "(train_loader, test_loader) pair")


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _is_loader(value: Any) -> bool:
    return hasattr(value, "__iter__") and hasattr(value, "dataset") and not _is_array(value)


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def _read_loader(loader: Any) -> tuple[np.ndarray, np.ndarray]:
    """All (x, y) of a DataLoader, batches of (x, y) or of dicts with a label key."""
    xs, ys = [], []
    for batch in loader:
        if isinstance(batch, dict):
            label = next((k for k in LABEL_KEYS if k in batch), None)
            features = [k for k in batch if k != label and _is_array(batch[k])]
            if label is None or len(features) != 1:
                raise ValueError(
                    f"a DataLoader batch has keys {sorted(batch)}: need one label key "
                    f"(one of {', '.join(LABEL_KEYS)}) and one feature tensor")
            x, y = batch[features[0]], batch[label]
        else:
            x, y = batch[0], batch[1]
        xs.append(_numpy(x))
        ys.append(_numpy(y))
    if not xs:
        raise ValueError("the DataLoader yielded no batch")
    return (np.concatenate(xs).astype(np.float32, copy=False),
            np.concatenate(ys).astype(np.int64, copy=False))


def _output_width(model: torch.nn.Module, x: np.ndarray) -> int:
    """The number of classes a model predicts: the width of its output for one example.

    Raises
    ------
    ValueError
        If the model predicts no class (a builder that reads ``data.num_classes``).
    """
    import torch

    model.eval()
    with torch.no_grad():
        width = int(model(torch.from_numpy(x[:1])).shape[-1])
    if width < 1:
        raise ValueError("ClientHooks could not tell the number of classes from the model's "
                         "output: pass ClientHooks(num_classes=...)")
    return width


def model_from_message(
    message: Message, hooks: ClientHooks, context: Context, data: ClientData,
    key: str = ARRAYS,
) -> torch.nn.Module:
    """Build the app's model and load the message's ArrayRecord ``key`` into it.

    Parameters
    ----------
    message : Message
        The received message.
    hooks : ClientHooks
        The app's hooks (``build_model``).
    context : Context
        The node's context.
    data : ClientData
        The node's data (some models read their input size from it).
    key : str
        The ArrayRecord to load.

    Returns
    -------
    torch.nn.Module
        The model with the message's weights (with FedFusion's ``fusion.*`` arrays, the
        fused model: :func:`fedgsp_flwr.clients.fusion.load_model`).

    Raises
    ------
    ValueError
        If the message has no ArrayRecord ``key``.
    """
    if key not in message.content.array_records:
        raise ValueError(
            f"message of type '{message.metadata.message_type}' carries no ArrayRecord "
            f"'{key}'"
        )
    from .fusion import load_model  # FedFusion's arrays load as a fused model

    return load_model(hooks.build_model(context, data), message.content.array_records[key])


def message_config(message: Message) -> ConfigRecord:
    """The message's ConfigRecord ``config`` (empty if it has none)."""
    records = message.content.config_records
    return records[CONFIG] if CONFIG in records else ConfigRecord()


def local_seed(context: Context, config: ConfigRecord) -> int:
    """A training seed unique to (run seed, node, round, relay hop), stable across runs."""
    parts = (
        context.run_config.get("seed", 0),
        context.node_config.get(PARTITION_ID, context.node_id),
        config.get(SERVER_ROUND, 0),
        config.get(RELAY_GROUP, -1),
        config.get(RELAY_HOP, -1),
    )
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def _vector_reply(
    message: Message, context: Context, key: str, vector: Any, num_examples: int
) -> Message:
    """Reply with one array under ``key`` (record and array) and the node's weight.

    The node's ``partition-id``, when its node config has one, goes along: it gives
    servers an order of nodes that is the same in every run (node ids are random).
    """
    metrics = MetricRecord({NUM_EXAMPLES: num_examples, **partition_metric(context)})
    content = RecordDict(
        {key: ArrayRecord({key: Array(vector)}), METRICS: metrics}
    )
    return Message(content=content, reply_to=message)


def make_train_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``train`` (also a relay hop: a train message whose config
    names the hop's ``relay-group`` and ``relay-hop``).
    """

    def handle(message: Message, context: Context) -> Message:
        config = message_config(message)
        data = hooks.client_data(context)
        model = model_from_message(message, hooks, context, data)
        settings = TrainSettings.from_config(config, hooks.defaults(context))
        result = train_with_settings(model, data, settings, local_seed(context, config))
        metrics: dict[str, MetricValue] = {TRAIN_LOSS: result.loss,
                                           NUM_EXAMPLES: result.num_examples}
        content = RecordDict(
            {
                ARRAYS: ArrayRecord(model.state_dict()),
                METRICS: MetricRecord(metrics),
            }
        )
        return Message(content=content, reply_to=message)

    return handle


def train_with_settings(model: torch.nn.Module, data: ClientData, settings: TrainSettings,
                        seed: int, proximal_mu: float | None = None,
                        proximal_center: torch.nn.Module | None = None,
                        penalty: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
                        = None) -> TrainResult:
    """Train ``model`` in place on the node's data with the message's settings.

    Parameters
    ----------
    model : torch.nn.Module
        The model to train (changed in place).
    data : ClientData
        The node's data.
    settings : TrainSettings
        Epochs or steps, learning rate, batch size, momentum, proximal mu.
    seed : int
        Seed of the batch order (see :func:`local_seed`).
    proximal_mu : float | None
        Overrides ``settings.proximal_mu`` (``None``: keep it).
    proximal_center : torch.nn.Module | None
        Centre of the proximal term (``None``: the model's starting weights).
    penalty : Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
        Added to each mini-batch's loss (see :func:`fedgsp_flwr.training.train`).

    Returns
    -------
    TrainResult
        Mean loss and examples seen.
    """
    return train(
        model,
        data.x_train,
        data.y_train,
        epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        momentum=settings.momentum,
        proximal_mu=settings.proximal_mu if proximal_mu is None else proximal_mu,
        proximal_center=proximal_center,
        seed=seed,
        steps=settings.local_steps,
        penalty=penalty,
    )


def make_bilevel_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``train.bilevel``: StoCFL's cluster and global updates.

    theta (``cluster``) is trained on the local loss + lambda/2 ||theta - w||^2 with w
    (``global``) as received, and w on the local loss alone; both start from the same
    seed, so lambda = 0 gives two independent plain trainings.
    """

    def handle(message: Message, context: Context) -> Message:
        config = message_config(message)
        data = hooks.client_data(context)
        received = model_from_message(message, hooks, context, data, GLOBAL)
        cluster = model_from_message(message, hooks, context, data, CLUSTER)
        settings = TrainSettings.from_config(config, hooks.defaults(context))
        lam = config.get(LAMBDA, 0.0)
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam >= 0:
            raise ValueError(f"message config 'lambda' must be a number >= 0, got {lam!r}")
        seed = local_seed(context, config)
        cluster_result = train_with_settings(cluster, data, settings, seed, float(lam),
                                             received)
        global_result = train_with_settings(received, data, settings, seed, 0.0)
        metrics = MetricRecord({
            TRAIN_LOSS: cluster_result.loss,
            "global-train-loss": global_result.loss,
            NUM_EXAMPLES: cluster_result.num_examples,
        })
        content = RecordDict({
            GLOBAL: ArrayRecord(received.state_dict()),
            CLUSTER: ArrayRecord(cluster.state_dict()),
            METRICS: metrics,
        })
        return Message(content=content, reply_to=message)

    return handle


def make_evaluate_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``evaluate``: the message's model on the node's test split."""

    def handle(message: Message, context: Context) -> Message:
        data = hooks.client_data(context)
        model = model_from_message(message, hooks, context, data)
        loss, accuracy = evaluate(model, data.x_test, data.y_test)
        metrics = MetricRecord(
            {EVAL_LOSS: loss, EVAL_ACC: accuracy, NUM_EXAMPLES: len(data.y_test)}
        )
        return Message(content=RecordDict({METRICS: metrics}), reply_to=message)

    return handle


def histogram_epsilon(context: Context) -> float:
    """The node's privacy budget for its histogram: node config ``histogram-epsilon``,
    else the run config's; 0 (the default) reports exact counts.

    Raises
    ------
    ValueError
        If the value is not a number >= 0.
    """
    value = context.node_config.get("histogram-epsilon",
                                    context.run_config.get("histogram-epsilon", 0.0))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"histogram-epsilon must be a number >= 0, got {value!r}")
    return float(value)


def partition_metric(context: Context) -> dict[str, MetricValue]:
    """``{"partition-id": p}`` if the node config has an integer ``partition-id``."""
    partition = context.node_config.get(PARTITION_ID)
    if isinstance(partition, int) and not isinstance(partition, bool):
        return {PARTITION_ID: partition}
    return {}


def make_partition_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``query.partition``: the node's ``partition-id`` only (no
    data is loaded or shared).
    """

    def handle(message: Message, context: Context) -> Message:
        metrics = MetricRecord(partition_metric(context))
        return Message(content=RecordDict({METRICS: metrics}), reply_to=message)

    return handle


def make_histogram_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``query.histogram``: the node's train label counts, with
    Laplace noise if the node has a ``histogram-epsilon`` (see
    :mod:`fedgsp_flwr.clients.privacy`).
    """

    def handle(message: Message, context: Context) -> Message:
        data = hooks.client_data(context)
        counts = data.histogram()
        if (epsilon := histogram_epsilon(context)) > 0:
            seed = local_seed(context, ConfigRecord({SERVER_ROUND: -1}))
            counts = laplace_histogram(counts, epsilon, np.random.default_rng(seed))
        reply = _vector_reply(message, context, HISTOGRAM, counts,
                              max(1, int(counts.sum())) if epsilon > 0 else len(data.y_train))
        if (edges := node_edges(context)) is not None:
            reply.content.metric_records[METRICS][EDGES] = edges
        if (cluster := node_cluster_id(context)) is not None:
            reply.content.metric_records[METRICS][CLUSTER_ID] = cluster
        return reply

    return handle


def node_edges(context: Context) -> list[int] | None:
    """The HierFL edges a node states in its node config (``edges="0,3"``), if any.

    Raises
    ------
    ValueError
        If the value is not a list of edge indices >= 0.
    """
    value = context.node_config.get(EDGES)
    if value is None:
        return None
    try:
        edges = sorted({int(x) for x in str(value).split(",") if x.strip()})
    except ValueError:
        edges = []
    if not edges or edges[0] < 0:
        raise ValueError(f"node config 'edges' must list edge indices >= 0 like \"0,3\", "
                         f"got {value!r}")
    return edges


def node_cluster_id(context: Context) -> int | None:
    """The Semi-FL cluster a node states in its node config (``cluster-id=2``), if any.

    Raises
    ------
    ValueError
        If the value is not an integer >= 0.
    """
    value = context.node_config.get(CLUSTER_ID)
    if value is None:
        return None
    try:
        cluster = int(str(value))
    except ValueError:
        cluster = -1
    if cluster < 0:
        raise ValueError(f"node config 'cluster-id' must be an integer >= 0, got {value!r}")
    return cluster


def make_sketch_handler(hooks: ClientHooks) -> Callable[[Message, Context], Message]:
    """Return a handler for ``query.sketch``: StoCFL's sketch at the anchor model.

    See :func:`fedgsp_flwr.clients.sketches.compute_sketch` for the modes and the projection.
    """

    def handle(message: Message, context: Context) -> Message:
        config = message_config(message)
        data = hooks.client_data(context)
        model = model_from_message(message, hooks, context, data)
        settings = TrainSettings.from_config(config, hooks.defaults(context))
        options = {}
        for key, default in ((SKETCH_EPOCHS, 1), (SKETCH_DIM, 0), (SKETCH_SEED, 0)):
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"message config '{key}' must be an integer >= 0, "
                                 f"got {value!r}")
            options[key] = value
        sketch = compute_sketch(
            model, data.x_train, data.y_train, mode=str(config.get(SKETCH_MODE, "gradient")),
            epochs=max(1, options[SKETCH_EPOCHS]), lr=settings.lr,
            batch_size=settings.batch_size, seed=local_seed(context, config),
            dim=options[SKETCH_DIM], projection_seed=options[SKETCH_SEED],
        )
        return _vector_reply(message, context, SKETCH, sketch, len(data.y_train))

    return handle


# Names that moved to fedgsp_flwr.protocol in 0.7.0; they warn until 0.8.0.
_MOVED = {
    "ARRAYS_KEY": "fedgsp_flwr.protocol:ARRAYS",
    "METRICS_KEY": "fedgsp_flwr.protocol:METRICS",
    "HISTOGRAM_KEY": "fedgsp_flwr.protocol:HISTOGRAM",
    "SKETCH_KEY": "fedgsp_flwr.protocol:SKETCH",
    "GLOBAL_KEY": "fedgsp_flwr.protocol:GLOBAL",
    "CLUSTER_KEY": "fedgsp_flwr.protocol:CLUSTER",
}
__getattr__ = moved(__name__, _MOVED)
