"""IDA: FedAvg whose server weighs each model by its inverse distance to the mean of
the round's models (Yeganeh et al. 2020; :mod:`fedgsp_flwr.core.ida`).
"""

from __future__ import annotations

from logging import INFO
from typing import cast

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.logger import log

from ..core.arrays import as_dtype
from ..core.ida import inverse_distance_weights
from .decoding import values as array_values
from .fedavg import FedAvg
from .metrics import reply_metrics
from .params import setting

WEIGHTINGS = ("inverse-distance", "inverse-distance-examples")
class IDA(FedAvg):
    """Inverse distance aggregation over the validated replies.

    The clients train as in FedAvg (plain ``train``); only the server's weights change.
    Unsound replies are rejected before the distances are computed (a NaN model would
    otherwise make every distance NaN). The distances are over the model's floating-point
    arrays: integer arrays (BatchNorm's ``num_batches_tracked``, a count of local steps
    that differs with the clients' data sizes) are averaged with the weights but do not
    set them. Per round ``ida-weight-min`` and ``ida-weight-max`` report the spread of the
    weights.
    """

    weighting: str = setting(
        default="inverse-distance", help="server weights: inverse-distance (the paper's "
        "IDA) | inverse-distance-examples (combined with FedAvg's example counts)",
        choices=WEIGHTINGS, key="ida-weighting")

    def summary(self) -> None:
        """Log the weighting, then FedAvg's settings."""
        log(INFO, "\t├──> IDA: %s weights", self.weighting)
        super().summary()

    def combine_models(self, server_round: int, contents: list[RecordDict]) -> ArrayRecord:
        """The models' mean with IDA's weights (float64 sums, each array's dtype kept)."""
        records = [next(iter(c.array_records.values())) for c in contents]
        keys = list(records[0].keys())
        models = [[array_values(r[k]) for k in keys] for r in records]
        examples = None
        if self.weighting == "inverse-distance-examples":
            examples = [float(cast(float, reply_metrics(c)[self.weighted_by_key]))
                        for c in contents]
        measured = [i for i, k in enumerate(keys) if models[0][i].dtype.kind in "fc"]
        weights = inverse_distance_weights(
            [[model[i] for i in measured] for model in models] if measured else models,
            examples)
        self.history.setdefault(server_round, {}).update(
            {"ida-weight-min": float(weights.min()), "ida-weight-max": float(weights.max())})
        out = {}
        for i, k in enumerate(keys):
            values = [model[i] for model in models]
            mean = sum(w * v.astype(np.float64) for w, v in zip(weights, values, strict=True))
            out[k] = Array(as_dtype(mean, values[0].dtype))
        return ArrayRecord(out)


PARAMS = IDA.spec
