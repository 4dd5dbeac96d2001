"""IFCA's arithmetic (Ghosh et al., 2020): the cluster-identity choice, the checks of a
reported choice, per-choice model averaging with an optional shared feature extractor,
and the initialisation of k models from one. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._moved import moved
from .arrays import as_dtype

INITS = ("redraw", "seeds")
"""How the k models start: ``redraw`` (from the initial model) or ``seeds`` (a factory)."""
# Loss names a plain ClientApp's evaluate reply may use, most specific first; any other
# single metric whose name contains "loss" is taken too (see find_loss_key).
LOSS_NAMES = ("eval-loss", "eval_loss", "evaluate-loss", "evaluate_loss", "val-loss",
              "val_loss", "test-loss", "test_loss", "loss")
# Reported for a model whose loss is not finite on a node's data (a diverged model):
# a number, so that the reply stays sound, and never the minimum.
NON_FINITE_LOSS = float(np.finfo(np.float64).max)



def pick_model(losses: Sequence[float]) -> int:
    """The cluster identity estimate argmin_j F_i(theta_j): the index of the lowest
    finite loss; ties go to the lower index (``np.argmin``, as the authors' code).

    Raises
    ------
    ValueError
        If there is no loss, or none is finite.
    """
    values = np.asarray(losses, dtype=np.float64)
    finite = np.isfinite(values)
    if values.ndim != 1 or not finite.any():
        raise ValueError(f"no finite loss to choose a model from: {list(losses)!r}")
    return int(np.argmin(np.where(finite, values, np.inf)))


def reported_losses(losses: Sequence[float]) -> list[float]:
    """The losses as a node reports them: a non-finite one (a diverged model) becomes
    :data:`NON_FINITE_LOSS`, so that the reply stays sound and that model is not chosen.
    """
    return [float(v) if math.isfinite(v) else NON_FINITE_LOSS for v in losses]



def find_loss_key(metrics: Mapping[str, Any], preferred: str | None = None) -> str | None:
    """The metric of an evaluate reply that holds the loss, or ``None``.

    ``preferred`` if given (and present); else the first of :data:`LOSS_NAMES` present;
    else the one metric whose name contains ``loss`` (case-insensitive). Several such
    metrics and none of the known names, or a value that is not one number: ``None``.
    """
    def number(key: str) -> bool:
        value = metrics[key]
        return not isinstance(value, (bool, list)) and isinstance(value, (int, float))

    if preferred is not None:
        return preferred if preferred in metrics and number(preferred) else None
    for name in LOSS_NAMES:
        if name in metrics:
            return name if number(name) else None
    named = [key for key in metrics if "loss" in key.lower()]
    return named[0] if len(named) == 1 and number(named[0]) else None


def head_arrays(names: Sequence[str], head_layers: Sequence[str] | None) -> list[str] | None:
    """The model's arrays named by ``head_layers`` (each an array name, or a module
    prefix: ``fc2`` names ``fc2.weight`` and ``fc2.bias``), in model order; ``None`` for
    ``None`` (every array is cluster-specific).

    Raises
    ------
    ValueError
        If an entry names no array of the model.
    """
    if head_layers is None:
        return None
    unknown = [h for h in head_layers
               if not any(n == h or n.startswith(h + ".") for n in names)]
    if unknown:
        raise ValueError(f"head layers {unknown} name no array of the model; its arrays "
                         f"are {list(names)}")
    return [n for n in names if any(n == h or n.startswith(h + ".") for h in head_layers)]


def redraw_like(arrays: Mapping[str, np.ndarray], rng: np.random.Generator,
                names: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """A fresh random model like ``arrays``: each floating array (of ``names``; default
    all) redrawn i.i.d. from a normal with that array's own mean and standard deviation,
    in its dtype; the others copied.

    An array with one value or no spread (zero biases, normalisation gains and running
    statistics) and a non-float array (a batch counter) stay as they are: redrawing them
    would only perturb what the architecture fixes.
    """
    out: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        array = np.asarray(value)
        if (names is None or key in names) and array.dtype.kind == "f" and array.size > 1:
            as64 = array.astype(np.float64)
            std = float(as64.std())
            if std > 0 and math.isfinite(std):
                out[key] = rng.normal(float(as64.mean()), std, array.shape).astype(array.dtype)
                continue
        out[key] = array.copy()
    return out


def share_arrays(models: Sequence[Mapping[str, np.ndarray]], head: Collection[str] | None
                 ) -> list[dict[str, np.ndarray]]:
    """The models with every array outside ``head`` replaced by model 0's (one shared
    feature extractor); unchanged copies for ``head=None``.
    """
    return [{key: (value if head is None or key in head else models[0][key]).copy()
             for key, value in model.items()} for model in models]


@dataclass(frozen=True)
class ChoiceAverage:
    """What :func:`average_by_choice` returns.

    Attributes
    ----------
    models : list[dict[str, np.ndarray]]
        The k models after the round.
    counts : list[int]
        The updates that chose each model.
    empty : list[int]
        The models no update chose (their cluster-specific arrays are kept).
    """

    models: list[dict[str, np.ndarray]]
    counts: list[int]
    empty: list[int]


def weighted_mean(values: Sequence[np.ndarray], weights: Sequence[float],
                  dtype: np.dtype) -> np.ndarray:
    """sum_i w_i x_i / sum_i w_i, summed in float64 in the given order, cast to ``dtype``
    (integers rounded)."""
    total = np.zeros(np.shape(values[0]), dtype=np.float64)
    for weight, value in zip(weights, values, strict=True):
        total += float(weight) * np.asarray(value, dtype=np.float64)
    return as_dtype(total / float(sum(weights)), dtype)


def average_by_choice(
    models: Sequence[Mapping[str, np.ndarray]],
    updates: Sequence[tuple[int, Mapping[str, np.ndarray], float]],
    head: Collection[str] | None = None,
) -> ChoiceAverage:
    """IFCA's server step (model averaging): each model becomes the weighted mean of the
    updates that chose it; a model nobody chose keeps its weights.

    With a ``head`` (the cluster-specific arrays), only those are averaged per choice;
    every other array (the shared feature extractor) becomes the weighted mean of all
    updates, in every model.

    Parameters
    ----------
    models : Sequence[Mapping[str, np.ndarray]]
        The k current models (same names, shapes and dtypes).
    updates : Sequence[tuple[int, Mapping[str, np.ndarray], float]]
        (choice, trained model, weight > 0) per node, in a fixed order (the float sums
        follow it).
    head : Collection[str] | None (default: None)
        Cluster-specific array names; ``None``: all arrays.

    Returns
    -------
    ChoiceAverage
        The new models, the count of updates per model, the models nobody chose.

    Raises
    ------
    ValueError
        On a choice outside [0, k) or a weight that is not positive.
    """
    k = len(models)
    if any(not 0 <= c < k for c, _, _ in updates) or any(not w > 0 for _, _, w in updates):
        raise ValueError(f"choices must be in [0, {k}) and weights > 0, got "
                         f"{[(c, w) for c, _, w in updates]}")
    by_model: list[list[tuple[Mapping[str, np.ndarray], float]]] = [[] for _ in range(k)]
    for choice, arrays, weight in updates:
        by_model[choice].append((arrays, weight))
    shared: dict[str, np.ndarray] = {}
    if head is not None and updates:
        weights = [w for _, _, w in updates]
        shared = {key: weighted_mean([a[key] for _, a, _ in updates], weights,
                                   np.asarray(value).dtype)
                  for key, value in models[0].items() if key not in head}
    out = []
    for model, chosen in zip(models, by_model, strict=True):
        new = {}
        for key, value in model.items():
            if key in shared:
                new[key] = shared[key]
            elif chosen and (head is None or key in head):
                new[key] = weighted_mean([a[key] for a, _ in chosen], [w for _, w in chosen],
                                         np.asarray(value).dtype)
            else:
                new[key] = np.asarray(value).copy()
        out.append(new)
    counts = [len(c) for c in by_model]
    return ChoiceAverage(out, counts, [m for m, c in enumerate(counts) if c == 0])


# Names that moved in 0.7.0; they warn until 0.8.0.
_MOVED = {
    "MESSAGE_TYPE": "fedgsp_flwr.protocol:TRAIN_IFCA",
    "CHOICE_METRIC": "fedgsp_flwr.protocol:IFCA_CHOICE",
    "LOSSES_METRIC": "fedgsp_flwr.protocol:IFCA_LOSSES",
    "MODEL_PREFIX": "fedgsp_flwr.protocol:IFCA_MODEL_PREFIX",
    "model_record": "fedgsp_flwr.protocol:ifca_model_record",
    "choice_problem": "fedgsp_flwr.strategies.ifca_replies:choice_problem",
}
__getattr__ = moved(__name__, _MOVED)
