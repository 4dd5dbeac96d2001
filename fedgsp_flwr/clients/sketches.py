"""StoCFL's client-side distribution sketches and their random projection.

A sketch represents a client's data distribution by the direction in which its data
pulls a fixed anchor model: the normalised gradient of the loss at the anchor
(``gradient``, the paper's Psi), or the normalised update anchor - (anchor trained a few
local epochs) (``update``, the authors' code). Both have the model's size (6.4 MB for
the 1.6M-parameter MLP); :func:`project` shrinks them to ``dim`` numbers with a seeded
sparse Johnson-Lindenstrauss transform that preserves inner products, hence cosines, up
to O(1/sqrt(dim)), and costs O(model size) per sketch. Every client must use the same
seed, so that their projections are comparable.

torch is imported lazily (see :mod:`fedgsp_flwr.models`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.clustering import SKETCH_MODES

if TYPE_CHECKING:
    import torch

PROJECTION_NONZEROS = 4


@lru_cache(maxsize=4)
def _projection(size: int, dim: int, seed: int, nonzeros: int) -> Any:
    """The (dim, size) sparse projection matrix (CSC: one column per input coordinate)."""
    import scipy.sparse

    rng = np.random.default_rng([seed, size, dim, nonzeros])
    rows = rng.integers(0, dim, size=(nonzeros, size), dtype=np.int64).ravel()
    signs = (rng.integers(0, 2, size=(nonzeros, size)) * 2 - 1).ravel() / np.sqrt(nonzeros)
    cols = np.tile(np.arange(size), nonzeros)
    return scipy.sparse.csc_matrix((signs.astype(np.float32), (rows, cols)), shape=(dim, size))


def project(vector: np.ndarray, dim: int, seed: int,
            nonzeros: int = PROJECTION_NONZEROS) -> np.ndarray:
    """Seeded sparse Johnson-Lindenstrauss projection of a vector to ``dim`` numbers.

    Each input coordinate is added, with a random sign, to ``nonzeros`` random output
    coordinates, scaled by 1/sqrt(nonzeros) (Kane and Nelson's sparse JL transform;
    repeated buckets of a coordinate add up). The same (size, dim, seed) gives the same
    linear map on every client, so that ``project(a) . project(b)`` estimates
    ``a . b``. The map is built once per process (about 1 s for 1.6M inputs), then a
    projection takes about 10 ms.

    Parameters
    ----------
    vector : np.ndarray
        Flat input vector.
    dim : int
        Output dimension (> 0).
    seed : int
        Seed of the map; must be the same on every client.
    nonzeros : int (default: 4)
        Output coordinates per input coordinate.

    Returns
    -------
    np.ndarray
        float32 vector of length ``dim``.

    Raises
    ------
    ValueError
        If ``vector`` is not 1-D or ``dim``/``nonzeros`` < 1.
    """
    vector = np.asarray(vector)
    if vector.ndim != 1 or dim < 1 or nonzeros < 1:
        raise ValueError(f"need a vector, dim >= 1 and nonzeros >= 1, got shape "
                         f"{vector.shape}, dim={dim}, nonzeros={nonzeros}")
    matrix = _projection(len(vector), dim, seed, nonzeros)
    return np.asarray(matrix @ vector.astype(np.float32), dtype=np.float32)


def compute_sketch(
    model: torch.nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    mode: str = "gradient",
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 32,
    seed: int = 0,
    dim: int = 0,
    projection_seed: int = 0,
) -> np.ndarray:
    """A client's unit-norm sketch at the anchor ``model`` (left unchanged).

    Parameters
    ----------
    model : torch.nn.Module
        The anchor model psi.
    x, y : np.ndarray
        The client's training data.
    mode : str (default: "gradient")
        ``gradient``: normalize(d loss(psi; D) / d psi), the full-batch gradient.
        ``update``: normalize(psi - psi trained ``epochs`` local epochs of SGD).
    epochs, lr, batch_size, seed : int, float, int, int
        Local training of the ``update`` mode.
    dim : int (default: 0)
        Project to this many numbers (:func:`project`); 0 keeps the model's size.
    projection_seed : int (default: 0)
        Seed of the projection, the same on every client.

    Returns
    -------
    np.ndarray
        float32 unit vector.

    Raises
    ------
    ValueError
        On an unknown mode, no data, or a zero or non-finite sketch.
    """
    import copy

    import torch

    from ..training import normalized_gradient, train

    if mode not in SKETCH_MODES:
        raise ValueError(f"Unknown sketch mode '{mode}'. Choose one of {SKETCH_MODES}.")
    if mode == "gradient":
        flat = normalized_gradient(model, x, y).astype(np.float64)
    else:
        trained = copy.deepcopy(model)
        train(trained, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
        with torch.no_grad():
            flat = torch.cat([(p - q).reshape(-1) for p, q in zip(
                model.parameters(), trained.parameters(), strict=True)]).double().numpy()
    if dim:
        flat = project(flat, dim, projection_seed).astype(np.float64)
    norm = float(np.linalg.norm(flat))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError(f"sketch norm is {norm}; cannot normalise it")
    return (flat / norm).astype(np.float32)
