"""User-edge assignment for hierarchical FL: minimise the edges' distribution distance.

Pure numpy and OR-Tools; no Flower imports. See docs/strategies/hierfl.md and Mhaisen et
al., "Optimal User-Edge Assignment in Hierarchical Federated Learning".

Users hold class counts V_n (rows of ``counts``); edge e gets D_e = sum of its users'
counts, n_e = |D_e|; T is the total and P = T / n. The objective is the weighted
distance of every edge's class distribution to the global one,

    J(X) = sum_e (n_e / n) ||D_e / n_e - P||_1 = sum_e ||n D_e - n_e T||_1 / n^2,

which is linear in the assignment after an epigraph step: an exact MILP.

The package's modules, each importing only those above it:

- :mod:`.problem`: :class:`AssignmentProblem`, :class:`AssignmentResult`,
  :func:`objective`, :func:`brute_force`, :func:`edge_class_coverage`;
- :mod:`.search`: :func:`local_search`, :func:`chain_search`;
- :mod:`.heuristics`: Algorithm 1 (:func:`similar_groups`), the greedy policy,
  :func:`class_targets`, :func:`fill_targets`;
- :mod:`.exact`: the CP-SAT models;
- :mod:`.topology`: :data:`REACH_BY`, :func:`paper_topology`, :class:`Topology`,
  :func:`load_topology`;
- :mod:`.policies`: :data:`POLICIES`, :func:`assign`, :func:`warm_start`.
"""

from .heuristics import class_targets, fill_targets, similar_groups
from .policies import POLICIES, assign, warm_start
from .problem import (
    AssignmentProblem,
    AssignmentResult,
    brute_force,
    edge_class_coverage,
    objective,
)
from .search import chain_search, local_search
from .topology import REACH_BY, Topology, load_topology, paper_topology

__all__ = [
    "POLICIES",
    "REACH_BY",
    "AssignmentProblem",
    "AssignmentResult",
    "Topology",
    "assign",
    "brute_force",
    "chain_search",
    "class_targets",
    "edge_class_coverage",
    "fill_targets",
    "load_topology",
    "local_search",
    "objective",
    "paper_topology",
    "similar_groups",
    "warm_start",
]
