"""Laplace noise for the class histograms clients report (label distributions are
sensitive).

Adding or removing one training example changes one count by one, so a histogram has
L1 sensitivity 1. Adding Laplace(1/epsilon) noise to every count makes the released
histogram epsilon-differentially private for the examples of one client. Rounding to
integers and clipping at zero are post-processing and keep the guarantee. The reported
total (``num-examples``) is the sum of the noisy counts, so it leaks nothing more.
"""

from __future__ import annotations

import numpy as np


def laplace_histogram(counts: np.ndarray, epsilon: float,
                      rng: np.random.Generator) -> np.ndarray:
    """Return ``counts`` with Laplace(1/epsilon) noise, rounded and clipped at 0.

    Parameters
    ----------
    counts : np.ndarray
        Label counts, one per class.
    epsilon : float
        Privacy budget (> 0); smaller is noisier.
    rng : np.random.Generator
        Source of the noise.

    Returns
    -------
    np.ndarray
        int64 counts >= 0.

    Raises
    ------
    ValueError
        If ``epsilon`` is not a finite number > 0 or ``counts`` is not a vector.
    """
    if not np.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon}")
    counts = np.asarray(counts)
    if counts.ndim != 1:
        raise ValueError(f"counts must be a vector, got shape {counts.shape}")
    noisy = counts.astype(np.float64) + rng.laplace(0.0, 1.0 / epsilon, size=counts.shape)
    return np.clip(np.rint(noisy), 0, None).astype(np.int64)
