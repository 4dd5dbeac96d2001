"""Plain torch train / evaluate / gradient loops, deterministic given a seed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TrainResult:
    """Summary of one local training call.

    Attributes
    ----------
    loss : float
        Mean training loss over the last epoch, or over all steps when training by
        steps (without the proximal term).
    num_examples : int
        Number of training examples (the aggregation weight).
    steps : int
        Number of optimiser steps taken.
    """

    loss: float
    num_examples: int
    steps: int


def train(
    model: torch.nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    momentum: float = 0.0,
    proximal_mu: float = 0.0,
    proximal_center: torch.nn.Module | None = None,
    steps: int = 0,
    penalty: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> TrainResult:
    """Train ``model`` in place with mini-batch SGD.

    Parameters
    ----------
    model : torch.nn.Module
        Model to train, modified in place.
    x, y : np.ndarray
        Training features and integer labels.
    epochs : int
        Number of passes over the data.
    lr : float
        Learning rate.
    batch_size : int
        Mini-batch size (``len(x)`` or more is full-batch gradient descent).
    seed : int
        Seed of the shuffling order.
    momentum : float
        SGD momentum.
    proximal_mu : float
        Weight mu of the proximal term mu/2 ||w - c||^2; 0 disables it.
    proximal_center : torch.nn.Module | None
        The center c of the proximal term: a model of the same architecture (StoCFL's
        global model), or ``None`` for the starting weights (FedProx).
    steps : int
        If > 0, take exactly this many mini-batch steps instead of ``epochs`` passes
        (batches drawn from successive shuffled passes over the data; HierFL's tau1).
    penalty : Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
        A term added to each mini-batch's loss, from the batch's inputs and the model's
        outputs (FedMMD's MMD to the global model's outputs); not in the reported loss.

    Returns
    -------
    TrainResult
        Last-epoch mean loss, number of examples and steps.

    Raises
    ------
    ValueError
        If there is no training data.
    """
    import torch
    from torch import nn

    if len(y) == 0:
        raise ValueError("cannot train on an empty dataset")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    x_t, y_t = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y)
    center = model if proximal_center is None else proximal_center
    anchor = [p.detach().clone() for p in center.parameters()] if proximal_mu > 0 else []
    buffers = [torch.empty_like(a) for a in anchor]
    optimizer = SGD(list(model.parameters()), lr=lr, momentum=momentum)
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(int(seed))
    model.train()
    taken, total, seen = 0, 0.0, 0
    per_pass = -(-len(y_t) // batch_size)
    with torch.random.fork_rng(devices=[]):  # dropout draws from the global generator
        # The CPU generator alone: torch.manual_seed also queues a seed for every
        # accelerator with a stack trace, 1.4 ms a call (benchmarks/message_overhead.py).
        torch.default_generator.manual_seed(int(seed))
        for _ in range(epochs if steps == 0 else -(-steps // per_pass)):
            order = torch.randperm(len(y_t), generator=generator)
            if steps == 0:
                total, seen = 0.0, 0
            for start in range(0, len(order), batch_size):
                if steps and taken == steps:
                    break
                batch = order[start : start + batch_size]
                optimizer.zero_grad()
                inputs = x_t[batch]
                outputs = model(inputs)
                loss = criterion(outputs, y_t[batch])
                total += loss.item() * len(batch)
                seen += len(batch)
                if penalty is not None:
                    loss = loss + penalty(inputs, outputs)
                loss.backward()
                if anchor:
                    add_proximal_gradient(model, anchor, proximal_mu, buffers)
                optimizer.step()
                taken += 1
    return TrainResult(loss=total / seen, num_examples=len(y_t), steps=taken)


class SGD:
    """``torch.optim.SGD``'s step on CPU (no weight decay, dampening or Nesterov), bit
    for bit, without building a torch optimizer.

    Building any ``torch.optim`` optimizer imports ``torch._dynamo``: 2.4 s of CPU in each
    new process here (``benchmarks/client_process.py``), and a deployment SuperNode starts
    a ClientApp process per message.

    Parameters
    ----------
    params : list[torch.Tensor]
        The parameters to update (those without a gradient at a step are skipped).
    lr, momentum : float
        Learning rate and momentum (the momentum buffer starts as the first gradient).
    """

    def __init__(self, params: list[torch.Tensor], *, lr: float, momentum: float = 0.0
                 ) -> None:
        self.params, self.lr, self.momentum = params, lr, momentum
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    def zero_grad(self) -> None:
        """Drop every gradient (``set_to_none``, torch's default)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """One update ``p -= lr * g``, with ``g`` the momentum buffer if momentum is set."""
        import torch

        with torch.no_grad():
            for i, p in enumerate(self.params):
                if p.grad is None:
                    continue
                grad = p.grad
                if self.momentum != 0:
                    buffer = self.buffers[i]
                    if buffer is None:
                        buffer = self.buffers[i] = grad.detach().clone()
                    else:
                        buffer.mul_(self.momentum).add_(grad, alpha=1)
                    grad = buffer
                p.add_(grad, alpha=-self.lr)


def add_proximal_gradient(
    model: torch.nn.Module, anchor: list[torch.Tensor], mu: float, buffers: list[torch.Tensor]
) -> None:
    """Add the gradient ``mu (w - c)`` of the proximal term mu/2 ||w - c||^2 in place.

    The same values as back-propagating the term (bit for bit: mu/2 * 2 is exact) without
    an autograd graph over every weight nor a fresh model-sized tensor per step
    (``buffers``: one per parameter, reused): ``benchmarks/proximal_term.py``.
    """
    import torch

    with torch.no_grad():
        for p, a, buffer in zip(model.parameters(), anchor, buffers, strict=True):
            torch.sub(p, a, out=buffer).mul_(mu)
            if p.grad is None:
                p.grad = buffer.clone()
            else:
                p.grad.add_(buffer)


def evaluate(
    model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 1024
) -> tuple[float, float]:
    """Return the mean cross-entropy loss and the accuracy of ``model`` on (x, y).

    Raises
    ------
    ValueError
        If there is no evaluation data.
    """
    import torch

    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for xb, yb in _batches(x, y, batch_size, "evaluate"):
            logits = model(xb)
            loss += torch.nn.functional.cross_entropy(logits, yb, reduction="sum").item()
            correct += int((logits.argmax(1) == yb).sum())
    return loss / len(y), correct / len(y)


def _batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, purpose: str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (features, labels) tensor batches; refuses empty data."""
    import torch

    if len(y) == 0:
        raise ValueError(f"cannot {purpose} on an empty dataset")
    for start in range(0, len(y), batch_size):
        yield (torch.from_numpy(np.ascontiguousarray(x[start : start + batch_size])),
               torch.from_numpy(y[start : start + batch_size]))


def normalized_gradient(
    model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 1024
) -> np.ndarray:
    """Unit-norm gradient of the mean loss over all of (x, y) w.r.t. the parameters.

    This is StoCFL's distribution sketch Psi(D) = normalize(d loss(psi; D) / d psi) for
    the anchor model ``psi``; batches only bound memory, the result is the full-batch
    gradient.

    Returns
    -------
    np.ndarray
        Flat float32 vector of unit L2 norm.

    Raises
    ------
    ValueError
        If there is no data, or the gradient is zero or not finite.
    """
    import torch

    model.eval()
    model.zero_grad()
    for xb, yb in _batches(x, y, batch_size, "compute a gradient"):
        (torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum") / len(y)).backward()
    flat = torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in model.parameters()
    ]).double().numpy()
    norm = float(np.linalg.norm(flat))
    if not np.isfinite(norm) or norm == 0.0:
        raise ValueError(f"gradient norm is {norm}; cannot normalise the sketch")
    return (flat / norm).astype(np.float32)
