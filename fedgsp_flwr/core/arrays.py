"""Model arrays computed in float64 and handed back in the model's own dtypes."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike


def as_dtype(values: ArrayLike, dtype: DTypeLike) -> np.ndarray:
    """``values`` (a mean, a step: usually float64) cast to ``dtype``, keeping their
    shape (0-d too).

    Integer and boolean dtypes are rounded to the nearest value first, not truncated:
    a mean of two counts of 3 summed in float64 as 2.9999... stays 3, and a model's
    ``num_batches_tracked`` keeps counting. Models keep their dtypes so that the next
    round's replies, in the clients' dtypes, match the model sent.
    """
    dtype = np.dtype(dtype)
    out = np.asarray(values)
    if dtype.kind in "iub" and out.dtype.kind in "fc":
        out = np.rint(out.real)
    return np.asarray(out.astype(dtype, copy=False))  # ufuncs make 0-d arrays scalars
