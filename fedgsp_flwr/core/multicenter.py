"""FeSEM's stochastic EM over flattened models (pure numpy).

Models are rows of one stacked ``(n, d)`` matrix (:meth:`Layout.stack` copies each
model into it exactly once); centres are a ``(K, d)`` matrix. Distances are squared L2
over all columns or over the columns of chosen layers, accurate to float64
(:func:`~fedgsp_flwr.core.kmeans.squared_distances`: the Gram expansion on float64
column blocks, no per-centre copies of the models).

See docs/strategies/fesem.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .arrays import as_dtype
from .kmeans import kmeans_plus_plus, squared_distances

INITS = ("kmeans++", "seeds")


@dataclass(frozen=True)
class Layout:
    """Names, shapes and dtypes of a model's arrays, and their columns once flattened.

    Attributes
    ----------
    names : tuple[str, ...]
        Array names, in the model's order.
    shapes : tuple[tuple[int, ...], ...]
        Their shapes.
    dtypes : tuple[np.dtype, ...]
        Their dtypes.
    offsets : tuple[int, ...]
        Start column of each array; the last entry is the total width ``d``.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, model: Mapping[str, np.ndarray]) -> Layout:
        """The layout of ``model`` (name -> array)."""
        sizes = [int(np.prod(a.shape)) for a in model.values()]
        return cls(tuple(model), tuple(tuple(a.shape) for a in model.values()),
                   tuple(a.dtype for a in model.values()),
                   tuple(int(x) for x in np.cumsum([0, *sizes])))

    @property
    def width(self) -> int:
        """Number of parameters ``d``."""
        return self.offsets[-1]

    def stack(self, models: Sequence[Mapping[str, np.ndarray]],
              dtype: type[np.floating] = np.float32) -> np.ndarray:
        """Copy the models into one ``(n, d)`` matrix (each model once).

        Raises
        ------
        ValueError
            If a model's names or shapes differ from the layout's.
        """
        out = np.empty((len(models), self.width), dtype=dtype)
        for row, model in zip(out, models, strict=True):
            if tuple(model) != self.names:
                raise ValueError(f"model arrays {list(model)} differ from {list(self.names)}")
            for name, shape, a, b in zip(self.names, self.shapes, self.offsets[:-1],
                                         self.offsets[1:], strict=True):
                value = np.asarray(model[name])
                if value.shape != shape:
                    raise ValueError(f"array {name!r} has shape {value.shape}, expected {shape}")
                row[a:b] = value.reshape(-1)
        return out

    def unstack(self, row: np.ndarray) -> dict[str, np.ndarray]:
        """One flattened model back to name -> array (the layout's shapes and dtypes,
        integer arrays rounded)."""
        return {name: as_dtype(row[a:b].reshape(shape), dtype)
                for name, shape, dtype, a, b in zip(self.names, self.shapes, self.dtypes,
                                                    self.offsets[:-1], self.offsets[1:],
                                                    strict=True)}

    def columns(self, names: Sequence[str] | None = None) -> list[slice]:
        """Column slices of the named arrays (all columns for ``None``).

        Raises
        ------
        ValueError
            If a name is not one of the layout's arrays.
        """
        if names is None:
            return [slice(0, self.width)]
        if unknown := [n for n in names if n not in self.names]:
            raise ValueError(f"unknown layers {unknown}; the model has {list(self.names)}")
        index = {n: i for i, n in enumerate(self.names)}
        return [slice(self.offsets[index[n]], self.offsets[index[n] + 1]) for n in names]


def e_step(x: np.ndarray, centres: np.ndarray, columns: Sequence[slice] | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """Assign every model to its nearest centre (ties: the lower index).

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The ``(n,)`` assignment and the ``(n, K)`` squared distances.
    """
    distances = squared_distances(x, centres, columns)
    return distances.argmin(axis=1), distances


def m_step(x: np.ndarray, assignment: np.ndarray, weights: np.ndarray,
           centres: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Each centre becomes the weighted mean of the models assigned to it.

    Parameters
    ----------
    x : np.ndarray
        ``(n, d)`` stacked models.
    assignment : np.ndarray
        ``(n,)`` centre index of each model.
    weights : np.ndarray
        ``(n,)`` positive weights (examples).
    centres : np.ndarray
        ``(K, d)`` current centres; an empty centre keeps its row.

    Returns
    -------
    tuple[np.ndarray, list[int]]
        The new ``(K, d)`` centres (``centres``' dtype) and the empty centres.

    Raises
    ------
    ValueError
        On mismatched lengths, assignments outside ``[0, K)`` or weights <= 0.
    """
    k = len(centres)
    assignment = np.asarray(assignment)
    w = np.asarray(weights, dtype=np.float64)
    if not len(x) == len(assignment) == len(w) or (w <= 0).any() or (
            len(assignment) and (assignment.min() < 0 or assignment.max() >= k)):
        raise ValueError("need one assignment in [0, K) and one weight > 0 per model")
    mix = np.zeros((k, len(x)))
    mix[assignment, np.arange(len(x))] = w
    totals = mix.sum(axis=1)
    empty = [int(c) for c in np.flatnonzero(totals == 0)]
    filled = totals > 0
    mix[filled] /= totals[filled, None]
    new = centres.copy()
    if filled.any():
        new[filled] = (mix[filled].astype(x.dtype) @ x).astype(centres.dtype, copy=False)
    return new, empty


def multicenter_loss(distances: np.ndarray, assignment: np.ndarray) -> float:
    """FeSEM's objective: the mean squared distance of each model to its centre."""
    return float(distances[np.arange(len(assignment)), assignment].mean())


def kmeans_centres(x: np.ndarray, k: int, rng: np.random.Generator,
                   columns: Sequence[slice] | None, filler: np.ndarray) -> np.ndarray:
    """``k`` initial centres: k-means++ over the rows of ``x`` (FeSEM's ``kmeans++``
    initialisation); with fewer than ``k`` rows, ``filler`` (the initial model) fills
    the remaining centres.
    """
    chosen = kmeans_plus_plus(x, min(k, len(x)), rng, columns)
    return np.stack([x[i] for i in chosen] + [filler] * (k - len(chosen)))


def least_moved(x: np.ndarray, starts: np.ndarray,
                columns: Sequence[slice] | None = None) -> int:
    """Of models ``x[i]``, each fitted from centre ``starts[i]``, the one that moved
    least from its start: a new client's centre is the one its data pulls least.
    """
    moved = [squared_distances(x[i:i + 1], starts[i:i + 1], columns)[0, 0]
             for i in range(len(x))]
    return int(np.argmin(moved))


@dataclass(frozen=True)
class EMResult:
    """One stochastic EM step.

    Attributes
    ----------
    assignment : np.ndarray
        ``(n,)`` centre of each model (E-step).
    centres : np.ndarray
        ``(K, d)`` new centres (M-step).
    empty : list[int]
        Centres that received no model and kept their weights.
    loss : float
        :func:`multicenter_loss` against the new centres.
    """

    assignment: np.ndarray
    centres: np.ndarray
    empty: list[int]
    loss: float


def em_step(x: np.ndarray, weights: np.ndarray, centres: np.ndarray,
            columns: Sequence[slice] | None = None) -> EMResult:
    """FeSEM's round over the returned models ``x``: assign each to its nearest centre,
    then move each centre to the weighted mean of its models.
    """
    assignment, _ = e_step(x, centres, columns)
    new, empty = m_step(x, assignment, weights, centres)
    loss = multicenter_loss(squared_distances(x, new, columns), assignment)
    return EMResult(assignment, new, empty, loss)
