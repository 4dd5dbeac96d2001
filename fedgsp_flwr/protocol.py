"""The wire protocol between our strategies and our client handlers.

Every name a message carries: its type, its records, its config keys, its metric keys,
and the node-config keys a handler reads. Strategies and client handlers (which must not
import each other) both import them from here; no other module of the package writes
one as a literal (``tests/test_protocol.py``). :data:`MESSAGES` says what each message
carries each way.

A message type is Flower's category (``train``, ``evaluate``, ``query``), then, for our
hooks, a dot and the action: a ClientApp registers ``@app.train("ifca")`` for
``train.ifca``. This module imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

# Message types ------------------------------------------------------------------------
TRAIN = "train"
EVALUATE = "evaluate"
QUERY = "query"
QUERY_PARTITION = "query.partition"
QUERY_HISTOGRAM = "query.histogram"
QUERY_SKETCH = "query.sketch"
TRAIN_BILEVEL = "train.bilevel"
TRAIN_IFCA = "train.ifca"
TRAIN_DITTO = "train.ditto"
EVALUATE_DITTO = "evaluate.ditto"
TRAIN_FEDMMD = "train.fedmmd"
TRAIN_FEDFUSION = "train.fedfusion"
EVALUATE_FEDFUSION = "evaluate.fedfusion"
CATEGORIES = (TRAIN, EVALUATE, QUERY)
"""Flower's message categories: a ClientApp registers ``@app.train()``, ``@app.query("x")``."""
BASIC_TYPES = (TRAIN, EVALUATE)
"""The types every Flower ClientApp may answer (``@app.train()``, ``@app.evaluate()``)."""

# Query actions (after ``query.``): the reply holds a record of the action's name
PARTITION = "partition"
HISTOGRAM = "histogram"
"""``query.histogram``'s action, and its reply's ArrayRecord of label counts."""
SKETCH = "sketch"
"""``query.sketch``'s action, and its reply's ArrayRecord (one unit-norm vector)."""

# Records ------------------------------------------------------------------------------
ARRAYS = "arrays"
"""The model's ArrayRecord, sent and returned."""
CONFIG = "config"
"""The message's ConfigRecord."""
METRICS = "metrics"
"""The reply's MetricRecord."""
GLOBAL = "global"
"""``train.bilevel``: the global model w's ArrayRecord, sent and returned."""
CLUSTER = "cluster"
"""``train.bilevel``: the cluster model theta's ArrayRecord, sent and returned."""
IFCA_MODEL_PREFIX = "model-"
"""``train.ifca``: ArrayRecords ``model-0`` ... ``model-{k-1}``, the k cluster models."""

# Config keys (server -> node) ---------------------------------------------------------
SERVER_ROUND = "server-round"
LR = "lr"
LOCAL_EPOCHS = "local-epochs"
LOCAL_STEPS = "local-steps"
BATCH_SIZE = "batch-size"
MOMENTUM = "momentum"
PROXIMAL_MU = "proximal-mu"
NUM_THREADS = "num-threads"
"""The thread count the node's training may use (simulation: cores // messages in
flight)."""
RELAY_GROUP = "relay-group"
RELAY_HOP = "relay-hop"
LAMBDA = "lambda"
"""``train.bilevel`` and ``train.ditto``: the proximal weight (StoCFL's lambda, Ditto's
lambda)."""
PERSONAL_EPOCHS = "personal-epochs"
PERSONAL_STEPS = "personal-steps"
SKETCH_MODE = "sketch-mode"
SKETCH_DIM = "sketch-dim"
SKETCH_EPOCHS = "sketch-epochs"
SKETCH_SEED = "sketch-seed"
MMD_WEIGHT = "mmd-weight"
"""``train.fedmmd``: the MMD term's weight (>= 0)."""

# Metric keys (node -> server) ---------------------------------------------------------
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
EVAL_LOSS = "eval-loss"
EVAL_ACC = "eval-acc"
PARTITION_ID = "partition-id"
"""A reply's partition id; also the node-config key that states it."""
EDGES = "edges"
"""The HierFL edges in the node's range (``query.histogram``); also the node-config key
that states them as ``edges="0,3"``."""
CLUSTER_ID = "cluster-id"
"""The node's Semi-FL cluster (``query.histogram``); also the node-config key."""
PERSONAL_MODEL = "personal-model"
"""``evaluate.ditto``: 1 if the node had a personal model, else 0."""
IFCA_CHOICE = "ifca-choice"
"""``train.ifca``: the index of the model the node chose (and trained)."""
IFCA_LOSSES = "ifca-losses"
"""``train.ifca``: the k models' losses on the node's data, before training."""

# Node-config keys (the SuperNode's ``--node-config``) -------------------------------
NUM_PARTITIONS = "num-partitions"

# Errors -------------------------------------------------------------------------------
UNSUPPORTED_HOOK_TEXT = "hook unsupported by this ClientApp"
"""Starts the error of a handler that is registered but cannot serve the app (FedFusion
on a model it cannot cut): the strategy then treats the node as having no handler and
takes its fallback."""


@dataclass(frozen=True)
class MessageSpec:
    """What one message type carries: server to node, and node to server."""

    sends: str
    replies: str


MESSAGES: dict[str, MessageSpec] = {
    TRAIN: MessageSpec(
        f"{ARRAYS} (the model), {CONFIG} ({LR}, {LOCAL_EPOCHS} or {LOCAL_STEPS}, "
        f"{BATCH_SIZE}, {PROXIMAL_MU}, {SERVER_ROUND}, {NUM_THREADS}; relay hops add "
        f"{RELAY_GROUP} and {RELAY_HOP}, which seed the hop's training)",
        f"{ARRAYS} (the trained model), {METRICS} ({TRAIN_LOSS}, {NUM_EXAMPLES})"),
    EVALUATE: MessageSpec(
        f"{ARRAYS}", f"{METRICS} ({EVAL_LOSS}, {EVAL_ACC}, {NUM_EXAMPLES})"),
    QUERY_PARTITION: MessageSpec(
        "nothing", f"{METRICS} ({PARTITION_ID} if the node config has one, else empty)"),
    QUERY_HISTOGRAM: MessageSpec(
        "nothing",
        f"{HISTOGRAM} (one int64 array of label counts), {METRICS} ({NUM_EXAMPLES}, and "
        f"{PARTITION_ID}, {EDGES}, {CLUSTER_ID} where the node config states them)"),
    QUERY_SKETCH: MessageSpec(
        f"{ARRAYS} (the anchor model), {CONFIG} ({SKETCH_MODE} gradient | update, "
        f"{SKETCH_EPOCHS}, {SKETCH_DIM} (0: the model's size), {SKETCH_SEED}, and the "
        "training settings of train for update)",
        f"{SKETCH} (one float32 unit-norm vector), {METRICS} ({NUM_EXAMPLES}, "
        f"{PARTITION_ID})"),
    TRAIN_BILEVEL: MessageSpec(
        f"{GLOBAL} (w), {CLUSTER} (theta), {CONFIG} (the settings of train, {LAMBDA})",
        f"{GLOBAL}, {CLUSTER} (trained), {METRICS} ({TRAIN_LOSS} of theta, "
        f"global-{TRAIN_LOSS}, {NUM_EXAMPLES})"),
    TRAIN_IFCA: MessageSpec(
        f"{IFCA_MODEL_PREFIX}0 ... {IFCA_MODEL_PREFIX}(k-1) (the cluster models), {CONFIG} "
        "(the settings of train)",
        f"{ARRAYS} (the lowest-loss model, trained), {METRICS} ({TRAIN_LOSS}, "
        f"{NUM_EXAMPLES}, {IFCA_CHOICE}, {IFCA_LOSSES})"),
    TRAIN_DITTO: MessageSpec(
        f"{ARRAYS} (w), {CONFIG} (the settings of train, {LAMBDA}; {PERSONAL_EPOCHS} or "
        f"{PERSONAL_STEPS})",
        f"{ARRAYS} (w trained), {METRICS} ({TRAIN_LOSS} of w, personal-{TRAIN_LOSS}, "
        f"{NUM_EXAMPLES})"),
    EVALUATE_DITTO: MessageSpec(
        f"{ARRAYS} (w)",
        f"{METRICS} ({EVAL_LOSS}, {EVAL_ACC}, {NUM_EXAMPLES} of the personal model; "
        f"{EVAL_LOSS}-global, {EVAL_ACC}-global of w; {PERSONAL_MODEL})"),
    TRAIN_FEDMMD: MessageSpec(
        f"{ARRAYS}, {CONFIG} (the settings of train, {MMD_WEIGHT})",
        f"{ARRAYS}, {METRICS} ({TRAIN_LOSS}, {NUM_EXAMPLES})"),
    TRAIN_FEDFUSION: MessageSpec(
        f"{ARRAYS} (the global model and the fusion.* arrays), {CONFIG} (the settings "
        "of train)",
        f"{ARRAYS} (the trained local model and fusion module), {METRICS} ({TRAIN_LOSS}, "
        f"{NUM_EXAMPLES})"),
    EVALUATE_FEDFUSION: MessageSpec(
        f"{ARRAYS} (the model and the fusion.* arrays)",
        f"{METRICS} ({EVAL_LOSS}, {EVAL_ACC}, {NUM_EXAMPLES} of the fused model)"),
}
"""Each message type's contents, as the handlers of :mod:`fedgsp_flwr.clients` read and
write them."""


def ifca_model_record(index: int) -> str:
    """The name of model ``index``'s ArrayRecord in a ``train.ifca`` message."""
    return f"{IFCA_MODEL_PREFIX}{index}"
