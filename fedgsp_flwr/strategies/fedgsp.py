"""FedGSP: grouped Sequential-to-Parallel training with ICG grouping."""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from ..core.grouping import (
    GROWTH_FUNCTIONS,
    LEFTOVER_POLICIES,
    form_groups,
    group_classes,
    group_cpd,
    join_smallest,
    num_groups,
    plan_groups,
    sample_groups,
    shuffled,
)
from . import saved
from .params import positive, setting
from .sequential import RelayStrategy

GROUPINGS = ("icg", "random")


class FedGSP(RelayStrategy):
    """FedGSP (Zeng et al., DASFAA 2022): STP training over ICG groups.

    The method, the paper's equations it implements and every deliberate choice:
    docs/strategies/fedgsp.md.

    Every round r the connected nodes are regrouped into M = f(r) groups (ICG over
    their class histograms, or at random), max(1, floor(kappa * M + 0.5)) groups are
    sampled, and each sampled group trains as a sequential chain in shuffled order, all
    groups in parallel; the global model is the average of the groups' models.
    Histograms are asked once per node (``query.histogram``); a node that cannot answer
    is logged once and placed by random grouping.

    With ``num_groups`` set, M is fixed: ``grouping="random"`` is NaiveGSP and
    ``grouping="icg"`` NaiveGSP+ICG. As in the paper these two are static: the groups
    and the order inside them are formed once, over the nodes of the first round, and
    kept; a node that is gone is skipped, a node not in any group (a new one, or one
    ICG left out) joins the group with the fewest present nodes, at its end. Only the
    sampling of groups (kappa) changes from round to round.

    The defaults are the paper's ICG: one client drawn at random from every cluster
    into each group, the leftovers (K not divisible) sit the round out.
    """

    histogram_fallback = ("nodes without a histogram are grouped at random (no ICG)")

    # The state a checkpoint saves (node ids translated on resume):
    groups = saved.node_lists("fedgsp-groups")  # the static groups, in training order

    growth: str = setting(default="log", help="growth function of the number of groups",
                          choices=GROWTH_FUNCTIONS, key="fedgsp-growth")
    alpha: float = setting(default=2.0, help="growth rate alpha", check=positive,
                           key="fedgsp-growth-alpha")
    beta: int = setting(
        default=10, help="initial number of groups and growth span beta (the paper: 10 "
        "for 368 clients; the app's 1 starts with one chain through all nodes)",
        check=positive, key="fedgsp-growth-beta", app_default=1)
    kappa: float = setting(default=0.3, help="fraction of groups sampled per round",
                           check=lambda v: 0 < v <= 1, rule="in (0, 1]", key="fedgsp-kappa")
    grouping: str = setting(default="icg", help="icg or random (the app: by strategy "
                            "name)", choices=GROUPINGS)
    num_groups: int | None = setting(default=None, help="a fixed number of groups M (turns "
                                                        "growth off)",
                                     check=lambda v: v is None or v >= 1,
                                     rule="None or >= 1")
    icg_iterations: int = setting(default=10, help="ICG's maximum iterations (tau)",
                                  check=positive, key="fedgsp-icg-iterations")
    icg_leftover: str = setting(
        default="drop", help="ICG clients outside the equal-size clusters: drop (the "
        "paper: they sit the round out) or distribute (ours: they join groups)",
        choices=LEFTOVER_POLICIES, key="fedgsp-icg-leftover")
    icg_normalize: bool = setting(default=False, help="ICG clusters label proportions, "
                                  "not counts", key="fedgsp-icg-normalize")
    icg_balance: bool = setting(
        default=False, help="rearrange ICG's one-per-cluster draw to equalise group "
        "distributions (ours; false = the paper's random draw)", key="fedgsp-icg-balance")
    static_groups: bool | None = setting(default=None, help="keep the first round's groups and "
                                                            "orders (None: when num_groups is "
                                                            "set, as the paper's naive versions"
                                                            " do; regroup every round "
                                                            "otherwise)")
    cpd_sigma: float = setting(default=1.0, help="kernel width of the CPD metric",
                               check=positive)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.static_groups is None:
            self.static_groups = self.num_groups is not None
        self._connected = 0

    def summary(self) -> None:
        """Log FedGSP's settings, then the relay's and FedAvg's."""
        groups = (f"fixed M={self.num_groups}" if self.num_groups else
                  f"{self.growth} growth (alpha={self.alpha}, beta={self.beta})")
        log(INFO, "\t├──> FedGSP: %s, %s %s grouping, kappa=%g", groups,
            "static" if self.static_groups else "per-round", self.grouping, self.kappa)
        super().summary()

    def traffic_estimate(self, model_bytes: int) -> dict[str, float]:
        """The paper's traffic per round (Eq. 17 with R = 1): 2 kappa K |model| bytes."""
        return {"bytes-estimate": 2.0 * self.kappa * self._connected * model_bytes}

    def make_chains(self, server_round: int, grid: Grid) -> tuple[list[list[int]], dict[str, Any]]:
        """This round's groups (regrouped, or the static ones), the sampled groups with
        kappa in training order (:func:`~fedgsp_flwr.core.grouping.plan_groups`).
        """
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)  # waits for nodes
        # Random grouping asks for histograms too: its CPD is reported.
        nodes = self.known.reachable(grid, connected)
        self._connected = len(nodes)
        if not nodes:
            log(WARNING, "FedGSP round %d: none of the %d connected node(s) answered its "
                "histogram query within query-timeout=%gs: no group trains this round "
                "(nodes slow to start need a longer query-timeout)", server_round,
                len(connected), self.query_timeout)
            return [], {"num-groups": 0}
        m = min(self.num_groups or num_groups(server_round, self.growth, self.alpha,
                                              self.beta, len(nodes)), len(nodes))
        if 1 < len(nodes) < 2 * m:
            self.warn_size(
                "FedGSP: %d groups for %d nodes are groups of one node: round %d is FedAvg "
                "on the sampled groups' nodes, with no sequential training (the paper's "
                "beta=10 assumes many more nodes than groups); for chains of at least 2 "
                "nodes set %s to at most %d", m, len(nodes), server_round,
                "num_groups (run config fedgsp-num-groups)" if self.num_groups else
                "beta (run config fedgsp-growth-beta)", len(nodes) // 2)
        options = {"grouping": self.grouping, "max_iter": self.icg_iterations,
                   "normalize": self.icg_normalize, "leftover": self.icg_leftover,
                   "balance": self.icg_balance}
        if self.static_groups:
            groups, chains = self.static_chains(nodes, m, options)
        else:
            plan = plan_groups(nodes, self.known.histograms, m, self.kappa, self.rng,
                               **options)
            groups, chains = plan.groups, plan.chains
        metrics: dict[str, Any] = {"num-groups": len(groups)}
        metrics.update(group_cpd(groups, self.known.histograms, self.cpd_sigma))
        metrics.update(group_classes(chains, self.known.histograms))  # the trained groups
        log(INFO, "FedGSP round %d: %d nodes in %d groups, %d sampled", server_round,
            len(nodes), len(groups), len(chains))
        return chains, metrics

    def static_chains(self, nodes: list[int], m: int, options: dict[str, Any]
                      ) -> tuple[list[list[int]], list[list[int]]]:
        """The static groups' present nodes and the sampled ones' chains (groups formed
        at the first call, new nodes placed by
        :func:`~fedgsp_flwr.core.grouping.join_smallest`)."""
        if self.groups is None:
            self.groups = [shuffled(g, self.rng) for g in form_groups(
                nodes, self.known.histograms, m, self.rng, **options)]
        present = set(nodes)
        grouped = {n for g in self.groups for n in g}
        join_smallest(self.groups, present, [n for n in nodes if n not in grouped])
        live = [g for g in ([n for n in group if n in present] for group in self.groups) if g]
        return live, [live[i] for i in sample_groups(len(live), self.kappa, self.rng)]


PARAMS = FedGSP.spec
