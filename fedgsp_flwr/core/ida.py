"""Inverse distance aggregation (IDA; Yeganeh, Farshad, Navab, Albarqouni 2020, "Inverse
Distance Aggregation for Federated Learning with Non-IID Data").

Each client model w_k weighs in inversely to its distance from the plain mean of the
received models, w_bar = (1/K) sum_k w_k:

    alpha_k = ||w_bar - w_k||^-1 / sum_j ||w_bar - w_j||^-1

so models far from the others (the outliers non-IID data produce) count less. The
paper also combines IDA with FedAvg's sample weights; ``examples`` does so by the
normalised product alpha_k n_k / sum_j alpha_j n_j. The norm is the L2 norm of all
parameters flattened into one vector.

A model at distance zero from the mean would get an infinite weight; this module gives
the models at distance zero the whole weight, shared by their examples if given (the
limit of the formula), and every model the same weight when all of them are equal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def inverse_distance_weights(models: Sequence[np.ndarray | Sequence[np.ndarray]],
                             examples: Sequence[float] | None = None) -> np.ndarray:
    """IDA's aggregation weights.

    Parameters
    ----------
    models : Sequence[np.ndarray | Sequence[np.ndarray]]
        The client models: each one vector, or its arrays (layers) in one order and
        shapes; the distance is over all of them, as if flattened into one vector,
        computed a layer at a time in float64 (no stacked copy of every model).
    examples : Sequence[float] | None
        Each client's example count, to combine IDA with FedAvg's weights; ``None``:
        IDA alone.

    Returns
    -------
    np.ndarray
        Non-negative weights, one per model, summing to 1.

    Raises
    ------
    ValueError
        With no model, models of different lengths, non-finite values, or example
        counts that are not positive or do not match the models.
    """
    if not models:
        raise ValueError("inverse_distance_weights needs at least one model")
    layers = [[np.asarray(m)] if isinstance(m, np.ndarray) else [np.asarray(a) for a in m]
              for m in models]
    sizes = {tuple(a.size for a in model) for model in layers}
    if len(sizes) != 1:
        raise ValueError("models must have one length (the same sizes layer by layer), "
                         f"got {sorted(sizes)}")
    counts = np.ones(len(models)) if examples is None else np.asarray(examples, np.float64)
    if counts.shape != (len(models),) or not (counts > 0).all():
        raise ValueError(f"examples must be {len(models)} positive counts, got {examples!r}")
    squared = np.zeros(len(models))
    for layer in range(len(layers[0])):
        mean = np.zeros(layers[0][layer].size)
        for model in layers:
            mean += model[layer].ravel()
        mean /= len(layers)
        if not np.isfinite(mean).all():  # a NaN or inf in any model reaches the mean
            raise ValueError("models contain NaN or infinite values")
        for k, model in enumerate(layers):
            diff = model[layer].ravel() - mean
            squared[k] += np.dot(diff, diff)
    distances = np.sqrt(squared)
    at_mean = distances <= 1e-12 * max(float(distances.max()), 1.0)
    if at_mean.any():
        weights = np.where(at_mean, counts, 0.0)
    else:
        weights = counts / distances
    return weights / weights.sum()
