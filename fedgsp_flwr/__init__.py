"""fedgsp-flwr: Flower strategies for federated learning on non-IID data.

Subpackages: :mod:`fedgsp_flwr.strategies` (server side), :mod:`fedgsp_flwr.clients`
(message handlers any ClientApp can register), :mod:`fedgsp_flwr.data` (datasets and
partitions). The Flower app is :mod:`fedgsp_flwr.server_app` + :mod:`fedgsp_flwr.client_app`.
"""

__version__ = "0.1.0"
