"""Words of the protocol between our strategies and our client handlers that are not
one strategy's."""

UNSUPPORTED_HOOK_TEXT = "hook unsupported by this ClientApp"
"""Starts the error of a handler that is registered but cannot serve the app (FedFusion
on a model it cannot cut): the strategy then treats the node as having no handler and
takes its fallback."""
