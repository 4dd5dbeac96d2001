"""fedgsp-flwr: Flower strategies for federated learning on non-IID data.

Layers, each importing only from the ones below it:

- :mod:`fedgsp_flwr.core`: the algorithms (grouping, edge assignment, clustering,
  EM, cluster rules), pure numpy/scipy/OR-Tools;
- :mod:`fedgsp_flwr.strategies`: Flower message-API strategies over the cores (no
  torch);
- :mod:`fedgsp_flwr.clients`: message handlers any ClientApp can register (torch),
  with :mod:`fedgsp_flwr.data`, :mod:`fedgsp_flwr.models`, :mod:`fedgsp_flwr.training`;
- :mod:`fedgsp_flwr.app`: the bundled Flower app (ServerApp, ClientApp, run config);
- :mod:`fedgsp_flwr.tools`: launchers, the centralized baseline, divergence metrics.
"""

__version__ = "0.7.0"
