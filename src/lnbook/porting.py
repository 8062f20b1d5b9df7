"""Porting a trained norm into torch's LayerNorm (chapter 04, section 4).

A batch of small digit classifiers, one per seed, is trained with the Annotated Transformer's
norm (unbiased standard deviation, eps added to it) and then evaluated with other norms in its
place: torch's LayerNorm as is, with the gains rescaled, or with another library's eps.
Every parameter tensor has the seeds first, so ``seeds`` networks train as one batched model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ._checks import check_float_tensor, check_int, check_number
from .progress import progress

Norm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def annotated_norm(h: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The Annotated Transformer's norm over the last axis: ``gain * (h - mean) / (std + eps) + bias``
    with the unbiased std. ``h``: (..., H); ``gain``, ``bias`` broadcast to it."""
    check_float_tensor(h, "h")
    check_number(eps, "eps", "a number >= 0", lambda v: v >= 0)
    return gain * (h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + eps) + bias


def torch_norm(h: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """torch's LayerNorm over the last axis with the given gain, bias and eps. ``h``: (..., H)."""
    check_float_tensor(h, "h")
    check_number(eps, "eps", "a number >= 0", lambda v: v >= 0)
    return gain * torch.nn.functional.layer_norm(h, h.shape[-1:], eps=eps) + bias


def forward(params: list[torch.Tensor], X: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Logits ``(seeds, N, classes)`` of the networks ``params`` (from :func:`train`) on ``X`` ``(N, D)``:
    linear, ``norm``, ReLU, linear."""
    W1, b1, gain, bias, W2, b2 = params
    h = norm(torch.baddbmm(b1, X.expand(W1.shape[0], -1, -1), W1), gain, bias)
    return torch.baddbmm(b2, torch.relu(h), W2)


def train(X: torch.Tensor, y: torch.Tensor, seeds: int, hidden: int, steps: int = 400, lr: float = 1e-2,
          init_seed: int = 0, norm: Norm = annotated_norm) -> tuple[list[torch.Tensor], np.ndarray]:
    """Train ``seeds`` networks at once with full-batch Adam on ``X`` ``(N, D)``, labels ``y`` ``(N,)``.

    Returns the parameters (each ``(seeds, ...)``, no gradients) and the training loss of each
    step, ``(steps, seeds)``."""
    check_float_tensor(X, "X")
    if X.ndim != 2 or y.shape != X.shape[:1]:
        raise ValueError(f"X must be (N, D) and y (N,), got {tuple(X.shape)} and {tuple(y.shape)}")
    seeds, hidden = check_int(seeds, "seeds", 1), check_int(hidden, "hidden", 2)
    steps = check_int(steps, "steps", 1)
    classes = int(y.max()) + 1
    gen = torch.Generator().manual_seed(init_seed)
    params = [torch.randn(seeds, X.shape[1], hidden, generator=gen) / X.shape[1] ** 0.5,
              torch.zeros(seeds, 1, hidden), torch.ones(seeds, 1, hidden), torch.zeros(seeds, 1, hidden),
              torch.randn(seeds, hidden, classes, generator=gen) / hidden**0.5, torch.zeros(seeds, 1, classes)]
    for p in params:
        p.requires_grad_()
    opt = torch.optim.Adam(params, lr=lr)
    curve = np.empty((steps, seeds))
    for step in progress(range(steps), "steps"):
        logits = forward(params, X, norm)
        per_seed = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y.expand(seeds, -1), reduction="none").mean(1)
        opt.zero_grad()
        per_seed.sum().backward()  # each network's gradient is its own loss's
        opt.step()
        curve[step] = per_seed.detach().numpy()
    return [p.detach() for p in params], curve


def evaluate(params: list[torch.Tensor], X: torch.Tensor, y: torch.Tensor, norm: Norm) -> tuple[np.ndarray, np.ndarray]:
    """Each network's mean cross-entropy and accuracy on ``(X, y)`` with ``norm`` in place: two ``(seeds,)`` arrays."""
    with torch.no_grad():
        logits = forward(params, X, norm)
        seeds = logits.shape[0]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y.expand(seeds, -1), reduction="none").mean(1)
        acc = (logits.argmax(-1) == y).float().mean(1)
    return loss.numpy(), acc.numpy()
