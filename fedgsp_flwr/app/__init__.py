"""The bundled Flower app: :mod:`~fedgsp_flwr.app.server_app` and
:mod:`~fedgsp_flwr.app.client_app`, over the run configuration
(:mod:`~fedgsp_flwr.app.config`) and the strategy registry
(:mod:`~fedgsp_flwr.app.registry`). Needs the ``app`` extra.
"""
