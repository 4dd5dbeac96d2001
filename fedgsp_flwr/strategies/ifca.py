"""IFCA: the iterative federated clustering algorithm (Ghosh et al., 2020)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.clustering import agreement_scores
from ..core.ifca import (
    INITS,
    average_by_choice,
    head_arrays,
    pick_model,
    redraw_like,
    share_arrays,
)
from ..protocol import (
    ARRAYS,
    CONFIG,
    IFCA_CHOICE,
    IFCA_LOSSES,
    METRICS,
    SERVER_ROUND,
    TRAIN,
    TRAIN_IFCA,
    ifca_model_record,
)
from . import saved
from .aggregation import GroupModel, array_bytes, average_arrays, npz_bytes
from .exchange import screen
from .hook_support import HookSupport, missing_handler
from .ifca_replies import FALLBACK, RoundReplies, choice_problem, plain_choices, plain_losses
from .metrics import reply_metrics
from .node_registry import node_label
from .params import array_names, check_parameters, non_negative, none_if_empty, positive, setting
from .replies import arrays_problem, error_text, reply_problem
from .rounds import TrainResult
from .server_round import ClusteredRound
from .state import NodeMap, StrategyState, record_arrays, to_record


class IFCA(ClusteredRound):
    """IFCA (Ghosh et al., 2020): k cluster models; each client trains the one with
    the lowest loss on its data.

    The method, the paper's algorithm it implements and every deliberate choice:
    docs/strategies/ifca.md.

    Each round samples ``fraction_train`` of the connected nodes and sends each all k
    models (``train.ifca``). A node computes the loss of every model on its training
    data, trains the one with the lowest loss (its cluster identity estimate) and
    returns it with its choice. Model j becomes the example-weighted mean of the models
    returned by the nodes that chose j (the paper's model averaging); a model nobody
    chose keeps its weights (logged). With ``head_layers`` (the paper's weight sharing)
    only those arrays are cluster-specific: every other array is one shared feature
    extractor, averaged over all the round's nodes.

    A ClientApp without a ``train.ifca`` handler (a plain app: ``train`` and
    ``evaluate`` only) still runs IFCA: each node gets the k models as k plain
    ``evaluate`` messages, the loss is read from the replies (``loss_key``, or the
    metric named like a loss), and the node trains the argmin with a plain ``train``.
    Plain evaluation scores the node's evaluation data, not its training data.

    Evaluation scores each sampled node with its own model: the one it last chose. A
    node that never chose is scored as the authors score test clients: it evaluates all
    k models and the reply of the lowest loss counts (``eval-inferred``); this changes
    no choice.

    Attributes
    ----------
    models : list[ArrayRecord]
        The k cluster models (empty before the first round).
    choice : dict[int, int]
        The model each node chose when it last trained, by node.
    plain : dict[int, str]
        Nodes without a ``train.ifca`` handler (they take the fallback), with why.
    """

    # The state a checkpoint saves (node ids translated on resume):
    models = saved.record_list("models", ifca_model_record)
    rng = saved.generator("ifca-rng")  # node sampling, warm-up groups
    eval_rng = saved.generator("ifca-eval-rng")
    choice = saved.node_map("choice")  # the last choice
    plain = saved.node_map("plain")  # no train.ifca: why
    warmup_group = saved.node_map("warmup-groups")
    rounds_run = saved.value("rounds-run", int, int)
    hooks = saved.learnt("hooks", HookSupport)

    k: int = setting(
        default=4, help="number of cluster models k", check=positive, key="ifca-k")
    init: str = setting(
        default="redraw", help="model initialisation: redraw (model 0 = the run's model, the "
        "others redrawn per array with its mean and std) | seeds (model 0 the run's, model j "
        "with a seed drawn from seed and j)", choices=INITS, key="ifca-init")
    warmup_rounds: int = setting(
        default=0, help="rounds before the first choice in which each node trains the model of a "
        "random group (the authors' FEMNIST warm-up)", check=non_negative, key="ifca-warmup-rounds")
    model_factory: Callable[[int], ArrayRecord] | None = setting(
        default=None, help="builds model j's initial weights (required by init 'seeds')")
    head_layers: Sequence[str] | None = setting(
        default=None, help="the cluster-specific arrays (names, or module prefixes such as "
                           "fc2); the others are shared by the k models and averaged over all "
                           "nodes (None: all cluster-specific, plain IFCA; the run config: "
                           "comma-separated, '' = all)", key="ifca-head-layers",
        app_default="", parse=array_names,
        check=lambda v: v is None or (
            not isinstance(v, str) and len(v) > 0 and all(isinstance(h, str) and h for h in v)),
        rule="None or a list of array names")
    loss_key: str | None = setting(
        default=None, help="the loss metric of plain evaluate replies (None, the run "
        "config's '': found by name)", check=lambda v: v is None or (
            isinstance(v, str) and v != ""), rule="None or a metric name", key="ifca-loss-key",
        app_default="", parse=none_if_empty)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_parameters("IFCA", [
            (self.init != "seeds" or self.model_factory is not None,
             "init='seeds' needs a model_factory (model j's initial weights)")])
        self.head_layers = list(self.head_layers) if self.head_layers is not None else None
        self.hooks = HookSupport("IFCA", {TRAIN_IFCA: FALLBACK})
        self.head: list[str] | None = None
        self.model_metrics: dict[int, dict[str, Any]] = {}  # last evaluation, by model

    def summary(self) -> None:
        """Log IFCA's settings, then FedAvg's."""
        log(INFO, "\t├──> IFCA: k=%d, %s init, %s, %d warm-up round(s)", self.k, self.init,
            f"head {', '.join(self.head_layers)} (the rest shared)" if self.head_layers
            else "no shared layers", self.warmup_rounds)
        super().summary()

    def restore_state(self, state: StrategyState, node_map: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`, and the shared layers of its models."""
        super().restore_state(state, node_map)
        self.head = (head_arrays(list(self.models[0].keys()), self.head_layers)
                     if self.models else None)

    def setup(self, arrays: ArrayRecord) -> None:
        """Build the k models from the initial model (``redraw``) or the factory."""
        self.head = head_arrays(list(arrays.keys()), self.head_layers)
        initial = record_arrays(arrays)
        if self.init == "seeds":
            models = []
            for index in range(self.k):
                record = cast(Callable[[int], ArrayRecord], self.model_factory)(index)
                if (problem := arrays_problem(record, arrays)) is not None:
                    raise ValueError(f"IFCA: model_factory({index}) does not fit the initial "
                                     f"model: {problem}")
                models.append(record_arrays(record))
        else:
            models = [initial] + [
                redraw_like(initial, np.random.default_rng([self.seed, 2, index]), self.head)
                for index in range(1, self.k)]
        self.models = [to_record(m) for m in share_arrays(models, self.head)]

    def sizes(self) -> list[int]:
        """Nodes whose last choice is each model."""
        return np.bincount(list(self.choice.values()), minlength=self.k).tolist()

    def global_model(self) -> ArrayRecord:
        """Mean of the models weighted by their choosers (all equal before any choice),
        for Flower's loop and the server's central evaluation only.
        """
        sizes = self.sizes()
        weights = sizes if sum(sizes) else [1] * self.k
        kept = [(model, w) for model, w in zip(self.models, weights, strict=True) if w > 0]
        return average_arrays([m for m, _ in kept], [w for _, w in kept])

    # --- training ---------------------------------------------------------------------

    def train_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                    grid: Grid, timeout: float) -> TrainResult:
        """Run one IFCA round (or warm-up round) and keep its result."""
        started = time.monotonic()
        if not self.models:
            self.setup(arrays)
        reachable, sampled = self.sample_train(grid, self.rng)
        self.warn_size.unfilled(self.k, "model", len(reachable), "node", "k (run config ifca-k)",
                           label="k=")
        train_config = ConfigRecord({**dict(config), SERVER_ROUND: server_round})
        warmup = self.rounds_run < self.warmup_rounds
        self.rounds_run += 1
        if warmup:
            outcome = self.warmup_round(server_round, grid, sampled, train_config)
        else:
            outcome = self.choice_round(server_round, grid, sampled, train_config)
        used = [(node, *outcome.updates[node]) for node in sampled if node in outcome.updates]
        metrics: dict[str, Any] = {
            "sampled": len(sampled), "warmup": int(warmup),
            "plain-clients": sum(n in self.plain for n in sampled) if not warmup else 0,
            "bytes-sent": array_bytes(outcome.messages),
            "bytes-received": array_bytes(outcome.replies),
        }
        if used:
            metrics.update(self.aggregate_round(server_round, used, warmup))
        else:
            log(WARNING, "IFCA round %d: no usable reply; the models are kept", server_round)
        metrics.update(self.cluster_metrics())
        metrics["train-time"] = time.monotonic() - started
        return self.finish_round(server_round, self.global_model() if used else None,
                                 metrics, len(used), outcome.rejected, len(sampled))

    def train_message(self, node: int, model: int, config: ConfigRecord) -> Message:
        """A plain ``train`` of model ``model``."""
        return Message(RecordDict({ARRAYS: self.models[model], CONFIG: config}),
                       dst_node_id=node, message_type=TRAIN)

    def warmup_round(self, server_round: int, grid: Grid, nodes: Sequence[int],
                     config: ConfigRecord) -> RoundReplies:
        """Each node trains its warm-up group's model (the group drawn at first sight)."""
        for node in nodes:
            if node not in self.warmup_group:
                self.warmup_group[node] = int(self.rng.integers(self.k))
        out = RoundReplies()
        self.plain_training(server_round, grid, {n: self.warmup_group[n] for n in nodes},
                            config, out)
        return out

    def choice_round(self, server_round: int, grid: Grid, nodes: Sequence[int],
                     config: ConfigRecord) -> RoundReplies:
        """``train.ifca`` to the nodes with the handler; the fallback for the others."""
        out = RoundReplies()
        hooked = [n for n in nodes if n not in self.plain]
        messages = [Message(RecordDict({**{ifca_model_record(j): m for j, m in
                                           enumerate(self.models)}, CONFIG: config}),
                            dst_node_id=node, message_type=TRAIN_IFCA) for node in hooked]
        replies = self.hooks.collect(grid, messages, self.reply_timeout)
        out.sent([messages[i] for i in self.hooks.last_sent], replies)
        self.known.forget_unanswered(zip(hooked, replies, strict=True))
        answered: list[tuple[int, Message | None]] = []
        for node, reply in zip(hooked, replies, strict=True):
            if not missing_handler(reply):
                answered.append((node, reply))
                continue
            self.plain[node] = f"no '{TRAIN_IFCA}' handler"
            if self.hooks.has(TRAIN_IFCA):  # else HookSupport warned once for all
                log(WARNING, "IFCA: node %d has no '%s' handler (%s); it takes the "
                    "fallback: %s", node, TRAIN_IFCA,
                    error_text(cast(Message, reply).error.reason), FALLBACK)
        screened = screen("IFCA", server_round, [(n, None) for n, _ in answered],
                          [r for _, r in answered],
                          lambda _, reply: self.ifca_reply_problem(reply),
                          self.known.partition_ids)
        for node, _, reply in screened.sound:
            out.updates[node] = (int(cast(float, reply_metrics(reply.content)[IFCA_CHOICE])),
                                 reply)
        out.rejected.update(screened.rejected())
        fallback = [n for n in nodes if n in self.plain]
        if fallback:
            choices = plain_choices(server_round, grid, fallback, self.models, config,
                                    self.reply_timeout, self.known, self.weighted_by_key,
                                    self.loss_key, out)
            self.plain_training(server_round, grid, choices, config, out)
        return out

    def ifca_reply_problem(self, reply: Message) -> str | None:
        """Why a ``train.ifca`` reply must not be aggregated, or ``None``."""
        problem = reply_problem(reply, reference=self.models[0],
                                weighted_by_key=self.weighted_by_key, require_arrays=True)
        if problem is not None:
            return problem
        metrics = reply_metrics(reply.content)
        return choice_problem(metrics.get(IFCA_CHOICE), metrics.get(IFCA_LOSSES), self.k)

    def plain_training(self, server_round: int, grid: Grid, plan: Mapping[int, int],
                       config: ConfigRecord, out: RoundReplies) -> None:
        """Plain ``train`` of model ``plan[node]`` on each node; sound replies go to
        ``out.updates``.
        """
        messages = self.train_messages(((n, self.models[m]) for n, m in plan.items()), config)
        exchanged = self.exchange(server_round, grid, list(plan.items()), messages,
                                  self.train_problem(self.models[0]))
        out.sent(messages, exchanged.replies)
        out.updates.update((node, (model, reply))
                           for node, model, reply in exchanged.screened.sound)
        out.rejected.update(exchanged.screened.rejected())

    def aggregate_round(self, server_round: int, used: Sequence[tuple[int, int, Message]],
                        warmup: bool) -> dict[str, Any]:
        """Average the models per choice (:func:`~fedgsp_flwr.core.ifca.average_by_choice`),
        record the choices, and return the round's metrics.
        """
        updates = []
        reported = []
        for _, choice, reply in used:
            sent = reply_metrics(reply.content)
            weight = float(cast(float, sent[self.weighted_by_key]))
            updates.append((choice, record_arrays(
                next(iter(reply.content.array_records.values()))), weight))
            reported.append(RecordDict({METRICS: MetricRecord(
                {k: v for k, v in sent.items() if k != IFCA_CHOICE})}))
        step = average_by_choice([record_arrays(m) for m in self.models], updates, self.head)
        self.models = [to_record(m) for m in step.models]
        for model in step.empty:
            log(INFO, "IFCA round %d: model %d was chosen by no node; it keeps its %s",
                server_round, model, "weights" if self.head is None else "head")
        metrics: dict[str, Any] = dict(self.train_metrics_aggr_fn(reported,
                                                                  self.weighted_by_key))
        metrics.update({"choice-counts": step.counts, "unchosen-models": len(step.empty)})
        if not warmup:
            previous = [self.choice.get(node) for node, _, _ in used]
            metrics["choice-changes"] = sum(
                p is not None and p != c for p, (_, c, _) in zip(previous, used, strict=True))
            metrics["new-choosers"] = sum(p is None for p in previous)
            self.choice.update((node, choice) for node, choice, _ in used)
            log(INFO, "IFCA round %d: choices %s, %d changed, %d new", server_round,
                step.counts, metrics["choice-changes"], metrics["new-choosers"])
        return metrics

    def cluster_metrics(self) -> dict[str, Any]:
        """Nodes per model (by last choice), nodes that chose, and ARI/NMI where the
        ground truth is known.
        """
        return {"cluster-sizes": self.sizes(), "chosen-clients": len(self.choice),
                **agreement_scores(self.choice, self.known.partition_ids, self.ground_truth)}

    # --- evaluation -------------------------------------------------------------------

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                       grid: Grid, timeout: float) -> MetricRecord | None:
        """Score each sampled node with the model it last chose; a node that never chose
        with the model of lowest loss among the k it evaluates (``eval-inferred``).
        Nothing the training uses changes here.
        """
        if self.fraction_evaluate == 0.0 or not self.models:
            return None
        started = time.monotonic()
        nodes = self.sample_evaluate(grid, self.eval_rng)
        screened = self.evaluate_groups(server_round, grid, config, [
            (node, model, self.models[model]) for node in nodes
            for model in ([self.choice[node]] if node in self.choice else range(self.k))
        ]).screened
        replies: dict[int, list[tuple[int, Message]]] = {}
        for node, model, reply in screened.sound:
            replies.setdefault(node, []).append((model, reply))
        scored: list[tuple[int, RecordDict]] = []
        out = RoundReplies()
        for node in nodes:
            if node in screened.problems:  # a model it could not score: none
                out.rejected[node] = screened.why(node)
                continue
            mine = replies[node]
            if len(mine) > 1:  # a node that never chose: the model of lowest loss
                losses, problem = plain_losses([r for _, r in mine], self.weighted_by_key,
                                               self.loss_key)
                if losses is None:
                    out.reject(server_round, node, cast(str, problem))
                    continue
                mine = [mine[pick_model(losses)]]
            scored.append((mine[0][0], mine[0][1].content))
        inferred = sum(1 for n in nodes if n not in self.choice and n not in out.rejected)
        evaluation = self.record_evaluation(server_round, scored, out.rejected, started, {
            "eval-inferred": inferred, "eval-clients": len(scored)})
        self.model_metrics = evaluation.by_group
        return evaluation.metrics

    def group_models(self) -> dict[int, GroupModel]:
        """Each model with the nodes that last chose it and its last evaluation."""
        return {m: GroupModel(model, self.known.order(
            [n for n, c in self.choice.items() if c == m]), {
            n: self.known.partition_ids[n] for n, c in self.choice.items()
            if c == m and n in self.known.partition_ids}, self.model_metrics.get(m, {}))
            for m, model in enumerate(self.models)}

    def artifacts(self, final: bool) -> dict[str, bytes | str]:
        """Files of the IFCA state for the run's results folder.

        ``ifca.json`` (every round): each node's last choice (by partition id where
        reported), the sizes, the plain nodes and the settings. With ``final``,
        ``ifca-models.npz`` (arrays ``<model>/<name>``).
        """
        partitions = self.known.partition_ids
        state = {"k": self.k, "init": self.init, "head": self.head,
                 "warmup-rounds": self.warmup_rounds, "sizes": self.sizes(),
                 "choices": {node_label(n, partitions): c
                             for n, c in sorted(self.choice.items())},
                 "plain": {node_label(n, partitions): why for n, why in self.plain.items()}}
        files: dict[str, bytes | str] = {"ifca.json": json.dumps(state, indent=1)}
        if final and self.models:
            files["ifca-models.npz"] = npz_bytes({
                f"{m}/{key}": value for m, model in enumerate(self.models)
                for key, value in record_arrays(model).items()})
        return files


PARAMS = IFCA.spec
