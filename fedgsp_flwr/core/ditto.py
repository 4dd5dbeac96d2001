"""Deprecated: Ditto's message names are in :mod:`fedgsp_flwr.protocol` (0.7.0); this
module goes in 0.8.0."""

from ._moved import moved

# Names that moved in 0.7.0; they warn until 0.8.0.
_MOVED = {
    "TRAIN_TYPE": "fedgsp_flwr.protocol:TRAIN_DITTO",
    "EVALUATE_TYPE": "fedgsp_flwr.protocol:EVALUATE_DITTO",
    "PERSONAL_FLAG": "fedgsp_flwr.protocol:PERSONAL_MODEL",
}
__getattr__ = moved(__name__, _MOVED)
