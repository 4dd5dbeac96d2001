"""Divergence of a model from a reference model, per layer (Semi-FL's Fig. 5).

Relative Euclidean distance (RED) ``||w1 - w2|| / ||w2||`` and averaged cosine
similarity (ACS): the cosine of the two tensors along their last axis,
``w1 . w2 / max(||w1|| ||w2||, eps)``, averaged over the other axes (one cosine for a
vector). A larger ACS and a smaller RED mean a model closer to the reference.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

COSINE_EPS = 1e-8


def relative_euclidean_distance(w1: np.ndarray, w2: np.ndarray) -> float:
    """``||w1 - w2|| / ||w2||`` (inf when ``w2`` is zero and ``w1`` is not).

    Raises
    ------
    ValueError
        If the shapes differ.
    """
    a, b = _pair(w1, w2)
    norm = np.linalg.norm(b)
    distance = np.linalg.norm(a - b)
    if norm == 0:
        return 0.0 if distance == 0 else float("inf")
    return float(distance / norm)


def averaged_cosine_similarity(w1: np.ndarray, w2: np.ndarray) -> float:
    """Mean cosine similarity of ``w1`` and ``w2`` along their last axis.

    Raises
    ------
    ValueError
        If the shapes differ.
    """
    a, b = _pair(w1, w2)
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    dots = np.einsum("ij,ij->i", a, b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(np.mean(dots / np.maximum(norms, COSINE_EPS)))


def _pair(w1: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(w1, dtype=np.float64), np.asarray(w2, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"tensors differ in shape: {a.shape} vs {b.shape}")
    return np.atleast_1d(a), np.atleast_1d(b)


def layer_divergence(
    model: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> list[dict[str, float | str]]:
    """RED and ACS of every layer (array) of ``model`` against ``reference``.

    Returns
    -------
    list[dict[str, float | str]]
        One row per array, in ``reference``'s order: ``layer``, ``red``, ``acs``.

    Raises
    ------
    ValueError
        If the two models do not hold the same array names and shapes.
    """
    if set(model) != set(reference):
        raise ValueError(f"models differ in layers: {sorted(set(model) ^ set(reference))}")
    return [{"layer": name,
             "red": relative_euclidean_distance(model[name], reference[name]),
             "acs": averaged_cosine_similarity(model[name], reference[name])}
            for name in reference]
