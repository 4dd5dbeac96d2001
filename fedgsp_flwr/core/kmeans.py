"""k-means++ seeding and squared Euclidean distances, shared by ICG (FedGSP's grouping)
and FeSEM's centre initialisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def squared_distances(x: np.ndarray, centres: np.ndarray,
                      columns: Sequence[slice] | None = None) -> np.ndarray:
    """``(n, K)`` squared L2 distances between rows of ``x`` and of ``centres``.

    Parameters
    ----------
    x : np.ndarray
        ``(n, d)`` stacked models.
    centres : np.ndarray
        ``(K, d)`` centres.
    columns : Sequence[slice] | None (default: None)
        Column ranges the distance runs over (all for ``None``).

    Raises
    ------
    ValueError
        If the widths differ.
    """
    if x.ndim != 2 or centres.ndim != 2 or x.shape[1] != centres.shape[1]:
        raise ValueError(f"need (n, d) models and (K, d) centres, got {x.shape} and "
                         f"{centres.shape}")
    out = np.zeros((len(x), len(centres)), dtype=np.float64)
    for cols in columns or [slice(0, x.shape[1])]:
        xs, cs = x[:, cols], centres[:, cols]  # views
        out += np.einsum("ij,ij->i", xs, xs).astype(np.float64)[:, None]
        out += np.einsum("ij,ij->i", cs, cs).astype(np.float64)[None, :]
        out -= 2.0 * (xs @ cs.T).astype(np.float64)
    return np.maximum(out, 0.0)


def kmeans_plus_plus(x: np.ndarray, k: int, rng: np.random.Generator,
                     columns: Sequence[slice] | None = None) -> list[int]:
    """Pick ``k`` rows of ``x`` as initial centres by k-means++ (D^2 sampling).

    Returns
    -------
    list[int]
        The chosen rows, in the order chosen.

    Raises
    ------
    ValueError
        If ``k`` is not in ``[1, n]``.
    """
    if not 1 <= k <= len(x):
        raise ValueError(f"k must be in [1, {len(x)}] (the number of models), got {k}")
    chosen = [int(rng.integers(len(x)))]
    nearest = squared_distances(x, x[chosen], columns)[:, 0]
    while len(chosen) < k:
        total = nearest.sum()
        if total > 0:
            pick = int(rng.choice(len(x), p=nearest / total))
        else:  # every model equals a chosen one: draw among the others uniformly
            pick = int(rng.choice(np.setdiff1d(np.arange(len(x)), chosen)))
        chosen.append(pick)
        nearest = np.minimum(nearest, squared_distances(x, x[[pick]], columns)[:, 0])
    return chosen
