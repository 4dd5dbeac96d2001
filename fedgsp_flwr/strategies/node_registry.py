"""The node registry: what each node said about itself (class histogram, partition id,
stated edges and cluster), each node asked once, and the node order it gives.

:class:`NodeRegistry` asks the nodes (see :mod:`~fedgsp_flwr.strategies.node_queries`)
and remembers the answers; :class:`PartitionOrderGrid` lists a grid's nodes in that
order for Flower's own sampling.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from logging import WARNING

import numpy as np
from flwr.app import Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from ..core.sampling import partition_order
from ..grids import GridView
from ..protocol import EDGES, HISTOGRAM, PARTITION
from . import saved
from .exchange import unreachable
from .hook_support import MISSING_HANDLER_TEXT, HookSupport
from .node_queries import query_histograms, query_partitions
from .state import NodeMap, StrategyState

# What IFCA, CFL and FeSEM do for nodes that state no partition id (asks="partition").
PARTITION_FALLBACK = ("nodes are ordered by node id (no partition ids: the order differs "
                      "from run to run and no ARI is reported)")
# What Flower's own sampling (the FedAvg family) does for such nodes.
SAMPLING_FALLBACK = ("nodes are sampled in node-id order, as Flower's FedAvg does (the "
                     "simulation engine draws new node ids at each launch, so a seed "
                     "then trains other clients each time)")


def node_label(node: int, partition_ids: Mapping[int, int]) -> str:
    """``partition-<id>`` for a node that reported its partition, else ``node-<id>``: the
    name results files give a node (node ids change from run to run).
    """
    return f"partition-{partition_ids[node]}" if node in partition_ids else f"node-{node}"


class NodeRegistry:
    """What the nodes seen so far said about themselves, each asked once.

    Parameters
    ----------
    owner : str
        Strategy name for log lines.
    timeout : float
        Seconds to wait for the query replies.
    fallback : str
        What the strategy does for nodes that cannot answer (named in the warning when
        the nodes' ClientApp has no handler for the query).
    asks : str
        ``"histogram"`` (default): ``query.histogram``, the class histogram plus the
        partition id, edges and cluster the node config states (FedGSP, HierFL,
        Semi-FL). ``"partition"``: ``query.partition``, the partition id only, no data
        (for strategies that only order nodes by it: IFCA, CFL, FeSEM, the FedAvg
        family).
    absent : str
        What happens to nodes that did not answer at all (said in the warning).
    missing_level : int (default: WARNING)
        Log level of the line that says the nodes' ClientApp lacks the query's handler
        (see :class:`HookSupport`) or that nodes answered without a usable reply.
    num_classes : int | None (default: None)
        The histograms' length when the caller knows it (else the length most of the
        first replies agree on).
    num_partitions : int | None (default: None)
        The federation's partition count when known: a ``partition-id`` must be below
        it. Ids are always checked to be >= 0 and held by one node only.

    Attributes
    ----------
    histograms : dict[int, np.ndarray]
        Label counts by node id (empty when ``asks="partition"``).
    without : dict[int, str]
        Why each node that answered told nothing usable (asked once only).
    partition_ids : dict[int, int]
        The ``partition-id`` nodes reported.
    edges : dict[int, list[int]]
        The HierFL edges nodes reported in range.
    cluster_ids : dict[int, int]
        The Semi-FL clusters nodes reported.
    unreachable : set[int]
        Nodes that did not answer their last query at all (asked again next time).
    """

    # What a checkpoint saves (node ids translated on resume):
    histograms = saved.node_rows("histogram-nodes", "histograms", np.int64)
    without: saved.Saved[dict[int, str]] = saved.node_map("without")
    partition_ids: saved.Saved[dict[int, int]] = saved.node_map("partition-ids")
    edges: saved.Saved[dict[int, list[int]]] = saved.node_map(EDGES)
    cluster_ids: saved.Saved[dict[int, int]] = saved.node_map("cluster-ids")
    unreachable = saved.node_set("unreachable")

    def __init__(self, owner: str, timeout: float,
                 fallback: str = "nodes without a histogram are placed at random",
                 asks: str = HISTOGRAM, absent: str = "they sit out until they do",
                 missing_level: int = WARNING, num_classes: int | None = None,
                 num_partitions: int | None = None) -> None:
        if asks not in (HISTOGRAM, PARTITION):
            raise ValueError(f"asks must be 'histogram' or 'partition', got {asks!r}")
        self.owner, self.timeout, self.asks, self.absent = owner, timeout, asks, absent
        self.num_classes, self.num_partitions = num_classes, num_partitions
        self.message_type = f"query.{asks}"
        self.hooks = HookSupport(owner, {self.message_type: fallback}, missing_level)

    def refresh(self, grid: Grid, nodes: Sequence[int]) -> None:
        """Ask the nodes not seen before (or forgotten) the registry's query.

        A node that answers without a usable answer (a ClientApp without our handler)
        is remembered as such; one that does not answer at all is put in
        :attr:`unreachable` and asked again on the next call.
        """
        known = self.known_nodes()
        new = [n for n in nodes if n not in known]
        self.unreachable.difference_update(nodes)
        if not new:
            return
        held = {p: n for n, p in self.partition_ids.items()}
        if self.asks == PARTITION:
            replies = query_partitions(grid, new, self.timeout, self.hooks, held,
                                       self.num_partitions)
        else:
            width = next(iter(self.histograms.values()), None)
            replies = query_histograms(
                grid, new, self.timeout,
                self.num_classes or (None if width is None else len(width)), self.hooks,
                held, self.num_partitions)
        self.histograms.update(replies.histograms)
        self.partition_ids.update(replies.partition_ids)
        self.edges.update(replies.edges)
        self.cluster_ids.update(replies.cluster_ids)
        self.unreachable |= replies.unreachable
        answered = {n: r for n, r in replies.failed.items() if n not in replies.unreachable}
        self.without.update(answered)
        if any(MISSING_HANDLER_TEXT not in reason for reason in answered.values()):
            log(self.hooks.level, "%s: %d node(s) without a usable %s reply: %s", self.owner,
                len(answered), self.message_type, self.hooks.fallbacks[self.message_type])
        if self.unreachable:
            log(WARNING, "%s: node(s) %s did not answer; %s", self.owner,
                sorted(self.unreachable), self.absent)

    def reachable(self, grid: Grid, connected: Sequence[int]) -> list[int]:
        """The connected nodes that can take part in a round, in :meth:`order`.

        Forgets nodes that are no longer connected, asks new and forgotten nodes (see
        :meth:`forget`) for their histograms, and leaves out those that did not answer.
        """
        self.update(grid, connected)
        return self.order([n for n in connected if n not in self.unreachable])

    def update(self, grid: Grid, connected: Sequence[int],
               skip: Iterable[int] = ()) -> None:
        """Forget the nodes no longer ``connected`` and :meth:`refresh` the others,
        except those in ``skip``.
        """
        here, skipped = set(connected), set(skip)
        self.forget([n for n in self.known_nodes() if n not in here])
        self.refresh(grid, [n for n in connected if n not in skipped])

    def known_nodes(self) -> set[int]:
        """Nodes with an answer (histogram or partition id) or a reason for having none."""
        return set(self.histograms) | set(self.partition_ids) | set(self.without)

    def forget_unanswered(self, answers: Iterable[tuple[int, Message | None]]) -> None:
        """Forget the nodes whose message got no answer (see :func:`unreachable`): a node
        that is gone answers the registry's query again before it takes part again.
        """
        self.forget([node for node, reply in answers if unreachable(reply)])

    def forget(self, nodes: Sequence[int]) -> None:
        """Drop what is known of nodes that left (a node that comes back is asked anew)."""
        for node in nodes:
            self.histograms.pop(node, None)
            self.without.pop(node, None)
            self.partition_ids.pop(node, None)
            self.edges.pop(node, None)
            self.cluster_ids.pop(node, None)

    def order(self, nodes: Sequence[int]) -> list[int]:
        """The nodes in :func:`partition_order`."""
        return partition_order(nodes, self.partition_ids)

    def expect(self, num_classes: int | None, num_partitions: int | None) -> None:
        """Check replies against ``num_classes`` and ``num_partitions`` (see the class
        doc) from now on.

        Raises
        ------
        ValueError
            If one is neither ``None`` nor an integer >= 1.
        """
        for name, value in (("num_classes", num_classes), ("num_partitions", num_partitions)):
            if not (value is None or (type(value) is int and value >= 1)):
                raise ValueError(f"{self.owner}: {name} must be None or an integer >= 1, "
                                 f"got {value!r}")
        self.num_classes, self.num_partitions = num_classes, num_partitions

    def checkpoint_state(self) -> StrategyState:
        """Everything known of the nodes (see :mod:`fedgsp_flwr.checkpoint`)."""
        state = StrategyState()
        saved.save_declared(self, state)
        return state

    def restore_state(self, state: StrategyState, nodes: NodeMap) -> None:
        """Take back :meth:`checkpoint_state`, node ids translated by ``nodes``."""
        saved.load_declared(self, state, nodes)


class PartitionOrderGrid(GridView):
    """A view of ``grid`` whose ``get_node_ids()`` lists the connected nodes in
    :func:`partition_order`, asking new nodes their partition id first.

    Flower's ``sample_nodes`` draws with the seeded ``random.sample`` from that list, so
    a seed samples the same partitions in every launch, whatever node ids the engine or
    the SuperLink gave the nodes. A node that did not answer stays in the list (Flower
    sends it its message, as it would have) and is asked again by the next view.

    Parameters
    ----------
    grid : Grid
        The run's grid (every other call goes to it).
    registry : NodeRegistry
        What is known of the nodes; it asks the new ones.
    """

    def __init__(self, grid: Grid, registry: NodeRegistry) -> None:
        super().__init__(grid)
        self.registry = registry
        self.asked: set[int] = set()

    def get_node_ids(self) -> list[int]:
        connected = list(self.grid.get_node_ids())
        self.registry.update(self.grid, connected, skip=self.asked)
        self.asked.update(connected)  # Flower asks again while it waits for nodes
        return self.registry.order(connected)

