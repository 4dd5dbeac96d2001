"""FedMMD's method (Yao, Huang, Sun, "Two-Stream Federated Learning: Reduce the
Communication Costs", VCIP 2018), shared by the strategy and the client handler.

Each client trains a local copy of the received global model on its loss plus
``weight`` x MMD^2 between the local and the (frozen) global model's outputs on the same
mini-batch. MMD^2 is the biased kernel two-sample estimate with a sum of Gaussian
kernels k(a, b) = sum_s exp(-||a - b||^2 / (2 s)) over :data:`SIGMAS`, as in the
authors' code (thu-media/TwoStreamFederatedLearning, ``mnist/losses.py``).
"""

from ._moved import moved

DEFAULT_WEIGHT = 0.1
"""The MMD weight of the authors' code (its commented-out call
``losses.mmd_loss(logits_1, logits_2, 0.1)``; the active loss there is an L2 one)."""
SIGMAS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0,
          35.0, 100.0, 1e3, 1e4, 1e5, 1e6)
"""The kernel widths of the authors' ``mmd_loss`` (used as variances: exp(-d / (2 s)))."""


# Names that moved in 0.7.0; they warn until 0.8.0.
_MOVED = {
    "TRAIN_TYPE": "fedgsp_flwr.protocol:TRAIN_FEDMMD",
    "WEIGHT_KEY": "fedgsp_flwr.protocol:MMD_WEIGHT",
}
__getattr__ = moved(__name__, _MOVED)
