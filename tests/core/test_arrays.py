"""Model arrays back in their own dtypes: integers rounded, shapes (0-d too) kept."""

from __future__ import annotations

import numpy as np

from fedgsp_flwr.core.arrays import as_dtype
from fedgsp_flwr.strategies.state import to_record


def test_integers_are_rounded_not_truncated_and_0d_arrays_stay_arrays() -> None:
    mean = np.float64(2.9999999) * np.ones(())  # a mean of counts 3, summed in float64
    out = as_dtype(mean, np.int64)
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.int64
    assert int(out) == 3
    assert as_dtype(np.array([0.4, 1.6, -2.5]), np.int32).tolist() == [0, 2, -2]
    assert as_dtype(np.array([0.2, 0.7]), bool).tolist() == [False, True]


def test_floats_are_cast_and_their_own_dtype_passes_unchanged() -> None:
    x = np.array([1.0 + 2**-30, 2.0])
    assert as_dtype(x, np.float32).dtype == np.float32
    same = np.arange(3, dtype=np.float32)
    assert as_dtype(same, np.float32) is same


def test_a_record_keeps_0d_arrays_0d() -> None:
    record = to_record({"count": np.array(7, dtype=np.int64), "w": np.ones((2, 3))[:, ::2]})
    assert record["count"].shape == () and int(record["count"].numpy()) == 7
    assert record["w"].shape == (2, 2)
