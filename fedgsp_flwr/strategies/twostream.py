"""FedGSP's client-side baselines: FedMMD (Yao, Huang, Sun, VCIP 2018) and FedFusion
(Yao, Huang, Wu, Zhang, Sun, ICIP 2019). Both keep FedAvg's server and change the
clients' step; both need our client handler and fall back to FedAvg without it."""

from __future__ import annotations

from logging import INFO
from types import MappingProxyType

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log

from ..core import fedmmd, fusion
from ..core.fusion import init_fusion, split_fusion
from ..protocol import ARRAYS, EVALUATE_FEDFUSION, MMD_WEIGHT, TRAIN_FEDFUSION, TRAIN_FEDMMD
from .decoding import values
from .hooked import HookedTrain, retyped
from .params import non_negative, setting


def without_fusion(arrays: ArrayRecord) -> ArrayRecord:
    """``arrays`` without the fusion module's (the same record if it has none)."""
    base, fused = split_fusion(list(arrays.keys()))
    return ArrayRecord({k: arrays[k] for k in base}) if fused else arrays

FEDMMD_FALLBACKS = MappingProxyType({
    TRAIN_FEDMMD: "plain 'train' messages: FedMMD reduces to FedAvg ('mmd-clients' is 0)"})
FEDFUSION_FALLBACKS = MappingProxyType({
    TRAIN_FEDFUSION: "plain 'train' messages of the model without the fusion module: "
    "FedFusion reduces to FedAvg",
    EVALUATE_FEDFUSION: "plain 'evaluate' messages of the model without the fusion "
    "module: the nodes score the base model, not the fused one"})


class FedMMD(HookedTrain):
    """FedMMD, "two-stream" FL (Yao et al., 2018): FedAvg whose clients train on their
    loss plus ``mmd_weight`` x MMD^2 between the outputs of the model they train and of
    the (frozen) global model they received, on the same mini-batches.

    The messages are ``train.fedmmd`` (handler:
    :func:`fedgsp_flwr.clients.fedmmd.make_fedmmd_handler`) with ``mmd-weight`` in the
    config. A ClientApp without the handler trains with plain ``train`` messages: FedMMD
    is then FedAvg (one WARNING; ``mmd-clients`` counts the nodes that ran the hook).
    The method and our choices: docs/strategies/baselines.md#fedmmd-and-fedfusion.
    """

    owner, train_type, hooked_metric = "FedMMD", TRAIN_FEDMMD, "mmd-clients"
    fallbacks = FEDMMD_FALLBACKS

    mmd_weight: float = setting(
        default=fedmmd.DEFAULT_WEIGHT, help="weight of the MMD between the trained and the "
        "global model's outputs (the authors' code: 0.1)", check=non_negative, key="fedmmd-weight")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.mmd_weight = float(self.mmd_weight)

    def summary(self) -> None:
        """Log FedMMD's weight, then FedAvg's settings."""
        log(INFO, "\t├──> FedMMD: mmd-weight %g", self.mmd_weight)
        super().summary()

    def hook_config(self, config: ConfigRecord) -> None:
        """``mmd-weight`` in the train config."""
        config[MMD_WEIGHT] = self.mmd_weight


class FedFusion(HookedTrain):
    """FedFusion (Yao et al., 2019): each client fuses the features of the model it
    trains with those of the frozen global model it received, through a fusion module
    that is trained and averaged with the model.

    The global model carries the module's arrays (``fusion.*``, added in the first
    round, see :mod:`fedgsp_flwr.core.fusion`); the round is FedAvg's over all of them.
    The messages are ``train.fedfusion`` (handler:
    :func:`fedgsp_flwr.clients.fedfusion.make_fedfusion_handler`) and
    ``evaluate.fedfusion`` (our ``evaluate`` handler); evaluation and the app's central
    evaluation score the fused model with the global model as its own reference. A node
    with ``train.fedfusion`` but no ``evaluate.fedfusion`` (an app that keeps its own
    ``@app.evaluate()``) is evaluated with plain ``evaluate`` messages of the model
    without the module (one WARNING): its scores are the base model's, not the fused
    one's.

    A ClientApp without the handler: if none has it, one WARNING, the module is dropped
    and the run is FedAvg of the plain model; in a mixed federation a node without it is
    sent the model without the module, trains it with plain ``train``, and its reply
    counts the module as received (unchanged). ``fusion-clients`` counts the nodes that
    ran the hook. The method and our choices: docs/strategies/baselines.md#fedmmd-and-fedfusion.
    """

    owner, train_type, hooked_metric = "FedFusion", TRAIN_FEDFUSION, "fusion-clients"
    evaluate_type, fallbacks = EVALUATE_FEDFUSION, FEDFUSION_FALLBACKS

    operator: str = setting(
        default="conv", help="fusion operator: conv (1x1 convolution of both feature maps) "
        "| multi (a weight per channel) | single (one weight)", choices=fusion.OPERATORS,
        key="fedfusion-operator")
    seed: int = setting(default=0, help="seed of the fusion module's initialisation (the "
                        "app: its seed)")
    gamma_momentum: float = setting(
        default=fusion.SHADOW_MOMENTUM, help="multi and single only: the new global gamma is "
                                             "gamma_momentum x the gamma sent + (1 - "
                                             "gamma_momentum) x the clients' mean (the authors'"
                                             " server-side shadow update); 0 averages gamma as "
                                             "FedAvg averages the rest", check=lambda v: 0 <= v < 1,
        rule="in [0, 1)", key="fedfusion-gamma-momentum")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gamma_momentum = float(self.gamma_momentum)

    def summary(self) -> None:
        """Log FedFusion's operator, then FedAvg's settings."""
        log(INFO, "\t├──> FedFusion: operator %s%s", self.operator,
            f", gamma momentum {self.gamma_momentum:g}" if self.operator != "conv" else "")
        super().summary()

    def combine_models(self, server_round: int, contents: list[RecordDict]) -> ArrayRecord:
        """FedAvg's mean, with gamma (``multi``, ``single``) moved by the shadow update
        from the gamma the round sent."""
        mean = super().combine_models(server_round, contents)
        sent = self._sent_arrays
        key = fusion.GAMMA_KEY
        if self.gamma_momentum == 0.0 or key not in mean or sent is None or key not in sent:
            return mean
        mean[key] = Array(fusion.shadow_gamma(values(sent[key]), values(mean[key]),
                                              self.gamma_momentum))
        return mean

    def train_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """``arrays`` with the fusion module (added if missing), or without it once no
        node has the handler.

        Raises
        ------
        ValueError
            If the model has no convolution or linear layer to fuse at.
        """
        if not self.hooks.has(self.train_type):
            return without_fusion(arrays)
        base, fused = split_fusion(list(arrays.keys()))
        if fused:
            return arrays
        added = init_fusion([tuple(arrays[k].shape) for k in base], self.operator, self.seed)
        return ArrayRecord({**{k: arrays[k] for k in base},
                            **{k: Array(v) for k, v in added.items()}})

    def as_plain(self, message: Message, plain_type: str) -> Message:
        """The message without the fusion module's arrays."""
        content = message.content
        record = content.array_records.get(ARRAYS)
        if record is None or (base := without_fusion(record)) is record:
            return retyped(message, plain_type)
        stripped = RecordDict({**{k: v for k, v in content.items() if k != ARRAYS},
                               ARRAYS: base})
        return Message(stripped, dst_node_id=message.metadata.dst_node_id,
                       message_type=plain_type)

    def complete_reply(self, message: Message, reply: Message) -> None:
        """A plain node's model with the fusion module as the round sent it; once no
        node has the handler, the round's model without the module instead.
        """
        sent = self._sent_arrays
        if sent is None:
            return
        if not self.hooks.has(self.train_type):
            self._sent_arrays = without_fusion(sent)
            return
        fused = split_fusion(list(sent.keys()))[1]
        records = list(reply.content.array_records.values()) if reply.has_content() else []
        if len(records) == 1:  # the app's own name for it; validation rejects the rest
            record = records[0]
            for key in fused:
                if key not in record:
                    record[key] = sent[key]


FEDMMD_PARAMS = FedMMD.spec
FEDFUSION_PARAMS = FedFusion.spec
