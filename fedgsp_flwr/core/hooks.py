"""Deprecated: :data:`fedgsp_flwr.protocol.UNSUPPORTED_HOOK_TEXT` (0.7.0); this module goes
in 0.8.0."""

from ._moved import moved

# Names that moved in 0.7.0; they warn until 0.8.0.
_MOVED = {"UNSUPPORTED_HOOK_TEXT": "fedgsp_flwr.protocol:UNSUPPORTED_HOOK_TEXT"}
__getattr__ = moved(__name__, _MOVED)
