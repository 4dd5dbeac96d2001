"""Sequential-relay engine shared by FedGSP and Semi-FL.

Each group is a chain of nodes: the first node trains the model it is sent, the server
forwards the result to the next node, and so on; the last trained model is the group's
result. All chains run at once through the Grid's ``push_messages``/``pull_messages``
(never ``send_and_receive``, which sleeps 3 s between polls in deployment): a hop's
reply is forwarded as soon as it arrives, independent of the other chains.

A node that fails, times out or returns an unsound reply is skipped: the model it was
given goes on to the next node, so nothing already trained is lost.

A hop is a plain ``train`` message by default: any ClientApp's train handler does what a
hop needs, and the hop's bookkeeping (``relay-group``, ``relay-hop``) rides in config
keys such a handler ignores. With another message type (``train.<name>``), a node whose
ClientApp has no handler for it gets the hop again as ``train``, and every later one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..protocol import ARRAYS, CONFIG, NUM_EXAMPLES, RELAY_GROUP, RELAY_HOP, TRAIN
from .exchange import PollBackoff, from_superlink, unreachable
from .hook_support import missing_handler
from .metrics import reply_metrics
from .replies import reply_problem

HOP_OK = "ok"
HOP_ERROR = "error"
HOP_TIMEOUT = "timeout"
HOP_REJECTED = "rejected"
HOP_LOST = "lost"  # the node is gone: push failed or the SuperLink reports it offline


@dataclass(frozen=True)
class Hop:
    """One hop of a chain.

    Attributes
    ----------
    node_id : int
        The node that was asked to train.
    position : int
        Index of the hop in its chain.
    status : str
        ``ok``, ``error`` (the ClientApp failed), ``rejected`` (unsound reply),
        ``timeout`` or ``lost`` (the node is gone).
    reason : str
        Why the hop was skipped ('' when ok).
    latency : float
        Seconds from push to reply (or to the timeout).
    bytes_sent, bytes_received : int
        Array bytes of the message and of the reply.
    num_examples : int
        Examples the node trained on (0 when skipped).
    metrics : MetricRecord
        The reply's metrics (whatever the ClientApp names them).
    """

    node_id: int
    position: int
    status: str
    reason: str = ""
    latency: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    num_examples: int = 0
    metrics: MetricRecord = field(default_factory=MetricRecord)


@dataclass
class ChainResult:
    """What one chain produced.

    Attributes
    ----------
    group : int
        The chain's index.
    nodes : list[int]
        The chain's nodes, in order.
    arrays : ArrayRecord
        The model after the last successful hop (the start model if none succeeded).
    hops : list[Hop]
        Every hop attempted.
    """

    group: int
    nodes: list[int]
    arrays: ArrayRecord
    hops: list[Hop] = field(default_factory=list)

    @property
    def num_examples(self) -> int:
        """Examples trained on along the chain."""
        return sum(h.num_examples for h in self.hops)

    @property
    def trained(self) -> bool:
        """Whether at least one hop succeeded."""
        return any(h.status == HOP_OK for h in self.hops)

    @property
    def skipped(self) -> dict[int, str]:
        """Why each node whose hop failed, timed out or was rejected was skipped."""
        return {h.node_id: h.reason for h in self.hops if h.status != HOP_OK}


@dataclass
class _Chain:
    result: ChainResult
    next_position: int = 0
    sent_at: float = 0.0
    bytes_sent: int = 0
    message_type: str = TRAIN


def run_relay(
    grid: Grid,
    groups: Sequence[Sequence[int]],
    arrays: ArrayRecord,
    config: ConfigRecord,
    *,
    train_timeout: float,
    message_type: str = TRAIN,
    weighted_by_key: str = NUM_EXAMPLES,
    poll_interval: float = 0.02,
    plain_nodes: set[int] | None = None,
) -> list[ChainResult]:
    """Run every group's chain, all in parallel, and return one result per group.

    Parameters
    ----------
    grid : Grid
        Flower's grid.
    groups : Sequence[Sequence[int]]
        Node ids of each chain, in training order.
    arrays : ArrayRecord
        The model every chain starts from.
    config : ConfigRecord
        Training config sent with every hop; each hop adds ``relay-group`` and
        ``relay-hop``.
    train_timeout : float
        Seconds a node may take for one hop before it is skipped.
    message_type : str
        ``train`` (any ClientApp's train handler) or ``train.<name>``.
    weighted_by_key : str
        Metric holding the number of examples a node trained on.
    poll_interval : float
        Seconds to wait after a poll that brought no reply; doubled with each further
        empty poll, up to ``MAX_POLL_INTERVAL`` (or ``poll_interval`` if longer).
    plain_nodes : set[int] | None
        Nodes that get ``train`` whatever ``message_type`` is; a node that answers
        ``message_type`` with "no function registered" is added (and its hop sent
        again as ``train``).

    Returns
    -------
    list[ChainResult]
        In the order of ``groups``.
    """
    chains = [_Chain(ChainResult(g, list(nodes), arrays)) for g, nodes in enumerate(groups)]
    waiting: dict[str, _Chain] = {}
    plain = plain_nodes if plain_nodes is not None else set()

    def hop_message(chain: _Chain) -> Message | None:
        position = chain.next_position
        if position >= len(chain.result.nodes):
            return None
        hop_config = ConfigRecord(dict(config))
        hop_config[RELAY_GROUP] = chain.result.group
        hop_config[RELAY_HOP] = position
        content = RecordDict({ARRAYS: chain.result.arrays, CONFIG: hop_config})
        node = chain.result.nodes[position]
        chain.message_type = TRAIN if node in plain else message_type
        return Message(content=content, dst_node_id=node, message_type=chain.message_type)

    def send(batch: Sequence[_Chain]) -> None:
        # One push per wave: the grid sees how many hops run at once (thread hints).
        outgoing = [(c, m) for c in batch if (m := hop_message(c)) is not None]
        if not outgoing:
            return
        try:
            pushed = set(grid.push_messages([m for _, m in outgoing]))
        except Exception as err:  # noqa: BLE001 - a node gone between rounds: skip it
            if len(outgoing) > 1:  # which one: push them one by one
                for chain, _ in outgoing:
                    send([chain])
                return
            pushed, reason = set(), f"push failed: {err}"
        else:
            reason = "push returned no message id"
        now = time.monotonic()
        for chain, message in outgoing:
            if message.metadata.message_id not in pushed:
                finish_hop(chain, Hop(message.metadata.dst_node_id, chain.next_position,
                                      HOP_LOST, reason))
                continue
            chain.sent_at = now
            chain.bytes_sent = chain.result.arrays.count_bytes()
            waiting[message.metadata.message_id] = chain

    def finish_hop(chain: _Chain, hop: Hop) -> None:
        chain.result.hops.append(hop)
        if hop.status != HOP_OK:
            log(WARNING, "relay group %d: skipped node %d at hop %d (%s); its model goes on",
                chain.result.group, hop.node_id, hop.position, hop.reason)
        chain.next_position += 1
        send([chain])

    send(chains)
    backoff = PollBackoff(poll_interval)
    while waiting:
        replies = list(grid.pull_messages(list(waiting)))
        now = time.monotonic()
        replies, twice = _screen_hops(replies, waiting)
        for reply in replies:
            answered = waiting.pop(reply.metadata.reply_to_message_id, None)
            if answered is None:
                continue  # a late reply to a hop that already timed out
            if reply.metadata.reply_to_message_id in twice:
                node = answered.result.nodes[answered.next_position]
                finish_hop(answered, Hop(node, answered.next_position, HOP_REJECTED,
                                         f"node {node} replied twice; both replies are "
                                         "refused", now - answered.sent_at,
                                         answered.bytes_sent))
                continue
            if answered.message_type != TRAIN and missing_handler(reply):
                node = answered.result.nodes[answered.next_position]
                plain.add(node)
                log(INFO, "relay: node %d has no '%s' handler; its hops go as 'train'",
                    node, answered.message_type)
                send([answered])
                continue
            finish_hop(answered, _hop_from_reply(answered, reply, now, weighted_by_key))
        for message_id, chain in list(waiting.items()):
            if now - chain.sent_at > train_timeout:
                del waiting[message_id]
                node = chain.result.nodes[chain.next_position]
                finish_hop(chain, Hop(node, chain.next_position, HOP_TIMEOUT,
                                      f"no reply within {train_timeout:g}s",
                                      now - chain.sent_at, chain.bytes_sent))
        if waiting:
            backoff.after(bool(replies))
    done = sum(c.result.trained for c in chains)
    log(INFO, "relay: %d/%d groups trained, %d hops skipped", done, len(chains),
        sum(len(c.result.skipped) for c in chains))
    return [c.result for c in chains]


def _screen_hops(replies: list[Message], waiting: dict[str, _Chain]
                 ) -> tuple[list[Message], set[str]]:
    """The replies of one pull from the node each hop went to (another node's reply is
    ignored, with a WARNING; the SuperLink's for a node gone offline is the node's
    answer), one per hop, and the hops answered twice in it.
    """
    kept: dict[str, Message] = {}
    twice: set[str] = set()
    for reply in replies:
        key, src = reply.metadata.reply_to_message_id, reply.metadata.src_node_id
        chain = waiting.get(key)
        if chain is not None and src != (dst := chain.result.nodes[chain.next_position]) and (
                not from_superlink(reply)):
            log(WARNING, "relay: ignored a reply from node %d to the hop sent to node %d",
                src, dst)
        elif key in kept:
            twice.add(key)
        else:
            kept[key] = reply
    return list(kept.values()), twice


def _hop_from_reply(chain: _Chain, reply: Message, now: float, weighted_by_key: str) -> Hop:
    node, position = chain.result.nodes[chain.next_position], chain.next_position
    latency = now - chain.sent_at
    problem = reply_problem(reply, reference=chain.result.arrays,
                            weighted_by_key=weighted_by_key, require_arrays=True)
    examples = None if problem else reply_metrics(reply.content)[weighted_by_key]
    if isinstance(examples, float) and not examples.is_integer():
        # The chain's final model is averaged by whole example counts.
        problem = (f"metric '{weighted_by_key}' must be a whole number of examples, got "
                   f"{examples!r}")
    if problem is not None:
        status = (HOP_LOST if unreachable(reply) else
                  HOP_ERROR if reply.has_error() else HOP_REJECTED)
        return Hop(node, position, status, problem, latency, chain.bytes_sent)
    trained = next(iter(reply.content.array_records.values()))
    chain.result.arrays = trained
    return Hop(node, position, HOP_OK, "", latency, chain.bytes_sent, trained.count_bytes(),
               int(examples), reply_metrics(reply.content))  # type: ignore[arg-type]  # checked
