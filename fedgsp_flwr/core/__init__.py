"""The algorithms behind the strategies, in pure numpy/scipy/OR-Tools.

No Flower and no torch: :mod:`~fedgsp_flwr.core.grouping` (FedGSP's growth, ICG, CPD
and round plan; ICG's equal-size assignment in :mod:`~fedgsp_flwr.core.equal_size`
over :mod:`~fedgsp_flwr.core.min_cost_flow`), :mod:`~fedgsp_flwr.core.edge_assignment`
(HierFL),
:mod:`~fedgsp_flwr.core.clustering` (StoCFL), :mod:`~fedgsp_flwr.core.multicenter`
(FeSEM), :mod:`~fedgsp_flwr.core.cluster_rules` (Semi-FL), :mod:`~fedgsp_flwr.core.ifca`
(IFCA), :mod:`~fedgsp_flwr.core.cfl` (CFL), with the shared
:mod:`~fedgsp_flwr.core.kmeans`, :mod:`~fedgsp_flwr.core.sampling` and
:mod:`~fedgsp_flwr.core.arrays` (models back in their own dtypes). The methods are
described in the documentation's strategy pages, docs/strategies/.
"""
