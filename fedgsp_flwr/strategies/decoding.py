"""Decoding what a node sent: every array of a reply goes through :func:`decode_array`.

A Flower ``Array`` carries a declared ``dtype``, ``shape`` and ``stype`` beside its bytes,
and ``Array.numpy()`` decodes the bytes without comparing them with that declaration
(it raises on garbage and hands back whatever shape the bytes hold). A node can thus
declare the model's dtype and shape over anything. Here the bytes are checked against
the declaration, and the declaration against what the server expects, before any
value is used:

1. ``stype`` is numpy's (``numpy.ndarray``);
2. the declared shape and dtype are the expected ones (the model the server sent, or
   the length the server expects), and the dtype holds no Python objects;
3. the byte count fits the declared shape and dtype (a small shape over 64 MB of data
   is refused before anything is parsed);
4. the ``.npy`` header parses and states the declared dtype and shape, and the data
   after it is exactly the declared number of bytes;
5. float values are finite and within +-:data:`MAX_ABS_VALUE`.

The decoded values are kept with the ``Array`` (:func:`values`), so that a model is
decoded once on the server: its check and its aggregation read the same values, and
a relay hands the checked ``Array`` on unchanged. The values are read-only views of the
reply's bytes.
"""

from __future__ import annotations

import io
import math

import numpy as np
from flwr.app import Array, ArrayRecord

NUMPY_STYPE = "numpy.ndarray"
# An .npy header is at most 64 KiB (format 1.0) plus its magic string; numpy's own
# np.save writes 128 bytes for any model array. Longer preambles are refused unparsed.
MAX_HEADER_BYTES = 10_000
_VALUES = "_fedgsp_decoded"  # where the checked values sit in the Array's __dict__
# No trained weight, sketch or measurement comes near 2**62 (4.6e18). Below it, what the
# server computes from a reply stays finite: the value cast to float32 (FeSEM, FL+HC,
# CFL, StoCFL's sketches), the square of a difference of two values (FedAdam, FedYogi,
# FedAdagrad in float32), a weighted sum over any federation (weights <= 1e9).
MAX_ABS_VALUE = 2.0 ** 62


class ArrayRefused(ValueError):
    """An array a node sent cannot be used; the message says why."""


def decode_array(
    array: Array,
    *,
    name: str,
    shape: tuple[int, ...] | None = None,
    dtype: np.dtype | str | None = None,
    kinds: str | None = None,
    finite: bool = True,
) -> np.ndarray:
    """Decode an array a node sent and check it; the values stay with the ``Array``.

    Parameters
    ----------
    array : Array
        The array as received.
    name : str
        What it is, for the reason (e.g. ``"array 'fc.weight'"``).
    shape, dtype : optional
        What the server expects (``None``: whatever is declared).
    kinds : str | None
        Allowed dtype kinds (numpy's ``dtype.kind`` letters, e.g. ``"iuf"``).
    finite : bool (default: True)
        Refuse NaN, inf and values beyond +-:data:`MAX_ABS_VALUE` in float arrays.

    Returns
    -------
    np.ndarray
        The decoded values (read-only).

    Raises
    ------
    ArrayRefused
        With the reason, when the array is unusable.
    """
    cached = array.__dict__.get(_VALUES)
    if cached is not None and cached[0] is array.data:
        values, checked_finite = cached[1], cached[2]
        _check_expected(values.shape, values.dtype, name, shape, dtype, kinds)
        if finite and not checked_finite:
            _check_finite(values, name)
            array.__dict__[_VALUES] = (array.data, values, True)
        return values
    if array.stype != NUMPY_STYPE:
        raise ArrayRefused(f"{name} is serialised as {array.stype!r}, expected "
                           f"{NUMPY_STYPE!r}")
    try:
        declared_dtype = np.dtype(array.dtype)
        declared_shape = tuple(int(n) for n in array.shape)
    except (TypeError, ValueError) as err:
        raise ArrayRefused(f"{name} declares an unusable dtype {array.dtype!r} or shape "
                           f"{array.shape!r}") from err
    if any(n < 0 for n in declared_shape):
        raise ArrayRefused(f"{name} declares a negative shape {list(declared_shape)}")
    _check_expected(declared_shape, declared_dtype, name, shape, dtype, kinds)
    if declared_dtype.hasobject:
        raise ArrayRefused(f"{name} declares dtype {declared_dtype}, which holds objects")
    data = array.data
    size = math.prod(declared_shape) * declared_dtype.itemsize
    preamble = len(data) - size
    if not 0 < preamble <= MAX_HEADER_BYTES:
        raise ArrayRefused(f"{name} carries {len(data)} bytes, not what its declared "
                           f"{declared_dtype}{list(declared_shape)} takes "
                           f"({size} bytes and an .npy header)")
    values = _parse_npy(data, name, declared_shape, declared_dtype, size)
    if finite:
        _check_finite(values, name)
    array.__dict__[_VALUES] = (data, values, finite)
    return values


def _check_finite(values: np.ndarray, name: str) -> None:
    if values.dtype.kind not in "fc" or not values.size:
        return
    # min and max carry NaN through, so a sound float array is read twice, not three times.
    if (values.dtype.kind == "f"
            and -MAX_ABS_VALUE <= values.min() and values.max() <= MAX_ABS_VALUE):
        return
    if not np.isfinite(values).all():
        raise ArrayRefused(f"{name} has NaN or inf values")
    if values.dtype.kind == "f":
        raise ArrayRefused(f"{name} has values beyond +-{MAX_ABS_VALUE:.3g} (largest "
                           f"magnitude {float(np.abs(values).max()):.3g}): no model "
                           "holds such values")


def _check_expected(got_shape: tuple[int, ...], got_dtype: np.dtype, name: str,
                    shape: tuple[int, ...] | None, dtype: np.dtype | str | None,
                    kinds: str | None) -> None:
    if (shape is not None and tuple(got_shape) != tuple(shape)) or (
            dtype is not None and got_dtype != np.dtype(dtype)):
        want_dtype = got_dtype if dtype is None else np.dtype(dtype)
        want_shape = got_shape if shape is None else shape
        raise ArrayRefused(f"{name} is {got_dtype}{list(got_shape)}, expected "
                           f"{want_dtype}{list(want_shape)}")
    if kinds is not None and got_dtype.kind not in kinds:
        raise ArrayRefused(f"{name} has dtype {got_dtype}, not a numeric one")


def _parse_npy(data: bytes, name: str, shape: tuple[int, ...], dtype: np.dtype,
               size: int) -> np.ndarray:
    """The values of ``.npy`` bytes whose header must state ``shape`` and ``dtype``."""
    stream = io.BytesIO(data)
    fmt = np.lib.format
    try:
        version = fmt.read_magic(stream)
        if version == (1, 0):
            header = fmt.read_array_header_1_0(stream, max_header_size=MAX_HEADER_BYTES)
        elif version == (2, 0):
            header = fmt.read_array_header_2_0(stream, max_header_size=MAX_HEADER_BYTES)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except Exception as err:  # noqa: BLE001 - the header is the node's: any failure refuses
        raise ArrayRefused(f"{name}: its bytes are not an .npy array ({err})") from None
    header_shape, fortran_order, header_dtype = header
    if tuple(header_shape) != shape or header_dtype != dtype:
        raise ArrayRefused(f"{name} declares {dtype}{list(shape)} but its bytes hold "
                           f"{header_dtype}{list(header_shape)}")
    offset = stream.tell()
    if len(data) - offset != size:
        raise ArrayRefused(f"{name} holds {len(data) - offset} bytes of data, its "
                           f"{dtype}{list(shape)} takes {size}")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)


def values(array: Array) -> np.ndarray:
    """The values of an array: those :func:`decode_array` checked, or the array decoded
    now and checked against its own declaration (NaN and inf allowed: a reader's call,
    not a reply's check).

    Raises
    ------
    ArrayRefused
        When the array was never checked and its bytes do not match its declaration.
    """
    return decode_array(array, name="array", finite=False)


def record_values(record: ArrayRecord) -> dict[str, np.ndarray]:
    """:func:`values` of every array of a record, by key."""
    return {key: values(array) for key, array in record.items()}


def decode_like(arrays: ArrayRecord, reference: ArrayRecord | None,
                finite: bool = True) -> dict[str, np.ndarray]:
    """Decode every array of a reply's record and check it against ``reference`` (the
    arrays the server sent: the same keys in the same order, each the same shape and
    dtype); ``None`` checks the arrays against their own declarations only.

    Raises
    ------
    ArrayRefused
        Naming the first unusable array.
    """
    if reference is not None and list(arrays.keys()) != list(reference.keys()):
        raise ArrayRefused(f"array keys {list(arrays.keys())[:5]} differ from the "
                           f"model's {list(reference.keys())[:5]}")
    out = {}
    for key, array in arrays.items():
        ref = None if reference is None else reference[key]
        out[key] = decode_array(array, name=f"array '{key}'", finite=finite,
                                shape=None if ref is None else tuple(ref.shape),
                                dtype=None if ref is None else ref.dtype)
    return out
