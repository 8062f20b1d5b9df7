"""Probes of trained networks (chapter 02): what is in a state, what batch statistics do at test time.

- :func:`with_blanks`: digit row sequences with all-zero steps before and after them;
- :func:`fresh_readout`: a linear read-out fitted per seed by ridge regression, to ask
  whether a state still holds the label when the trained classifier no longer reads it;
- :func:`reestimated`: a copy of a network whose BatchNorm running statistics are those of
  new inputs (AdaBN, Li et al.);
- :func:`accuracy_by_length`: a stacked classifier's accuracy on each sequence length of a
  padded test set;
- :func:`training_mode_accuracy`: a stacked classifier scored in training mode, its norms
  using the statistics of random test batches of a given size, as the network trained;
- :func:`add_noise`: test inputs with Gaussian pixel noise, a shift no per-unit affine map undoes;
- :func:`over_batches`: ``mean (min to max)`` of a quantity measured on every batch.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from ._checks import check_number, describe
from .data import Dataset


def with_blanks(x: torch.Tensor, before: int = 0, after: int = 8) -> torch.Tensor:
    """Sequences ``x (N, T, F)`` with ``before`` all-zero steps in front and ``after`` behind:
    ``(N, before + T + after, F)``."""
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        raise ValueError(f"x must be a tensor (N, T, F), got {describe(x)}")
    for name, v in (("before", before), ("after", after)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {describe(v)}")
    n, _, f = x.shape
    return torch.cat([x.new_zeros(n, before, f), x, x.new_zeros(n, after, f)], dim=1)


def fresh_readout(train_h: torch.Tensor, train_y: torch.Tensor, test_h: torch.Tensor, test_y: torch.Tensor,
                  ridge: float = 1e-2) -> np.ndarray:
    """Fit a linear read-out (with a bias) per seed on states ``train_h (E, N, H)`` by ridge
    regression on one-hot labels ``train_y (N,)``, and return its accuracy on
    ``test_h (E, M, H)``, ``test_y (M,)``: ``(E,)``."""
    if not (isinstance(train_h, torch.Tensor) and isinstance(test_h, torch.Tensor) and train_h.ndim == test_h.ndim == 3
            and train_h.shape[0] == test_h.shape[0] and train_h.shape[-1] == test_h.shape[-1]):
        raise ValueError(f"train_h and test_h must be states (E, N, H) and (E, M, H), got {describe(train_h)} and {describe(test_h)}")
    if train_y.shape != train_h.shape[1:2] or test_y.shape != test_h.shape[1:2]:
        raise ValueError(f"train_y and test_y must hold one label per state, got {tuple(train_y.shape)} and {tuple(test_y.shape)}")
    check_number(ridge, "ridge", "a non-negative number", lambda v: v >= 0)
    x, xt = (torch.cat([h, torch.ones_like(h[..., :1])], -1) for h in (train_h, test_h))  # (E, N, H + 1)
    classes = int(max(train_y.max(), test_y.max())) + 1
    y = nn.functional.one_hot(train_y, classes).to(x.dtype).expand(len(x), -1, -1)
    w = torch.linalg.solve(x.mT @ x + ridge * torch.eye(x.shape[-1], dtype=x.dtype), x.mT @ y)
    return ((xt @ w).argmax(-1) == test_y).double().mean(-1).numpy()


def reestimated(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """A copy of ``model`` in eval mode whose BatchNorms' running statistics are those of the
    inputs ``x`` (one batch, no labels, no weight change): AdaBN. The model is not changed."""
    net = copy.deepcopy(model).train()
    norms = [m for m in net.modules() if hasattr(m, "running_mean") and hasattr(m, "momentum")]
    if not norms:
        raise ValueError(f"model must hold a BatchNorm with running statistics, got {type(model).__name__}")
    for m in norms:
        m.momentum = 1.0  # running statistics := this batch's
    with torch.no_grad():
        net(x)
    return net.eval()


def accuracy_by_length(model: nn.Module, data: Dataset) -> dict[int, np.ndarray]:
    """Each member's accuracy on the sequences of each length of ``data = (x (N, T, F),
    lengths (N,), y (N,))``, in eval mode: ``{length: (E,)}``, lengths ascending. ``model``
    is stacked by :func:`lnbook.seeds.stack` (``E`` members), each read at its own last step."""
    s = getattr(model, "members", None)
    if s is None:
        raise TypeError(f"model must be stacked by lnbook.seeds.stack, got {type(model).__name__}")
    if not isinstance(data, tuple) or len(data) != 3:
        raise ValueError(f"data must be (x, lengths, y), got {describe(data)}")
    x, lengths, y = data
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        right = model(x.expand(s, *x.shape).to(device), lengths.expand(s, -1).to(device)).argmax(-1).cpu() == y
    model.train(was_training)
    return {int(n): right[:, lengths == n].double().mean(1).numpy() for n in torch.unique(lengths)}


def training_mode_accuracy(model: nn.Module, data: Dataset, batch_size: int, seed: int = 0) -> np.ndarray:
    """Each member's accuracy on ``data = (inputs..., y)`` in training mode: the examples in
    random batches of ``batch_size`` (one permutation from a generator seeded with ``seed``,
    the same batches for every member; a last, smaller batch is kept), each batch's norms
    using that batch's statistics. ``model`` is stacked by :func:`lnbook.seeds.stack`
    (``E`` members); it runs on a copy, so its running statistics are not changed: ``(E,)``."""
    s = getattr(model, "members", None)
    if s is None:
        raise TypeError(f"model must be stacked by lnbook.seeds.stack, got {type(model).__name__}")
    if not isinstance(data, tuple) or len(data) < 2:
        raise ValueError(f"data must be (inputs..., y), got {describe(data)}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {describe(batch_size)}")
    net = copy.deepcopy(model).train()
    device = next(net.parameters()).device
    *inputs, y = data
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    right = torch.zeros(s)
    with torch.no_grad():
        for idx in order.split(batch_size):
            logits = net(*(t[idx].expand(s, *t[idx].shape).to(device) for t in inputs))
            right += (logits.argmax(-1).cpu() == y[idx]).sum(-1)
    return (right / len(y)).double().numpy()


def add_noise(x: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    """``x`` plus Gaussian noise of standard deviation ``sigma`` drawn from a generator seeded
    with ``seed`` (the same noise for every network)."""
    check_number(sigma, "sigma", "a non-negative number", lambda v: v >= 0)
    g = torch.Generator().manual_seed(seed)
    return x + sigma * torch.randn(x.shape, generator=g).to(x.device, x.dtype)


def over_batches(v: np.ndarray) -> str:
    """``mean (min to max)`` of fractions measured on each batch, as percentages."""
    v = np.asarray(v)
    if v.size == 0:
        raise ValueError("v must hold at least one value")
    return f"{v.mean():.0%} ({v.min():.0%} to {v.max():.0%})"
