"""The multilayer perceptron that chapters 01, 02 and 09 train, with its normalization as a setting.

Norms are named as in :data:`lnbook.norms.NORMS`: ``"none"``; ``"batch"``
(:class:`~lnbook.norms.MaskedBatchNorm1d`); ``"weight"`` (weight normalization of the layers
that feed the norm, and no norm layer); and every norm over one example's features
(:data:`~lnbook.norms.EXAMPLE_NORMS`: ``"layer"``, ``"layer_simple"`` (without gain and bias),
``"group4"`` with 4 groups of consecutive features, ``"rms"``, ``"dyt"``, ``"detach"``,
``"adanorm"``). ``"instance"`` is refused, with the reason. Chapter 02's recurrent networks
are :class:`lnbook.rnn.ElmanClassifier`.

Many seeds of it train as one model with :mod:`lnbook.seeds` (``seeds.stack`` of one MLP per
seed, trained by ``seeds.fit``).

:func:`layer_stats` looks inside an MLP: per Linear layer, the statistics of its output and the
norm of its weight gradient, from one training-mode pass.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from . import seeds
from ._checks import describe
from .norms import EXAMPLE_NORMS, check_norm, norm_layer
from .pickling import PicklesWithParametrizations


class MLP(PicklesWithParametrizations, nn.Module):
    """Flatten, then ``[Linear -> norm -> ReLU] * len(hidden) -> Linear``.

    Input ``(B, ...)`` with ``in_features`` numbers per example; output logits ``(B, n_classes)``.
    ``norm``: ``"none"``, ``"batch"`` (BatchNorm over the batch), or a norm over an example's
    features (``"layer"``, ``"group4"``, ``"rms"``, ``"dyt"``, ``"detach"``, ``"adanorm"``, and
    any added to :data:`lnbook.norms.NORMS`); ``"weight"``: no norm layer, the hidden Linear
    layers weight-normalized (``torch.nn.utils.parametrizations.weight_norm``, one gain per
    output feature, initialized to leave the layer unchanged), the output layer not.
    """

    NORMS = ("none", "batch", "weight", *EXAMPLE_NORMS)

    def __init__(self, in_features: int, hidden: tuple[int, ...], n_classes: int, norm: str = "none") -> None:
        super().__init__()
        self.norm = check_norm(norm, self.NORMS)
        self.init_args = ((in_features, hidden, n_classes, norm), {})
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers.append(nn.Linear(width, h))
            if self.norm == "weight":
                nn.utils.parametrizations.weight_norm(layers[-1])
            elif self.norm != "none":
                layers.append(norm_layer(self.norm, h))
            layers.append(nn.ReLU())
            width = h
        layers.append(nn.Linear(width, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mlp_layers(model: MLP) -> tuple[list[nn.Module], list[nn.Module | None]]:
    """The Linear layers of an MLP and, for each hidden one, its norm module (None: no norm).
    For a stacked MLP (:func:`lnbook.seeds.stack`) they are its :class:`lnbook.seeds.Linear`
    layers (``weight (S, out, in)``) and :class:`lnbook.seeds.Norm` modules."""
    linears, norms = [], []
    for module in model.net:
        if isinstance(module, (nn.Linear, seeds.Linear)):
            linears.append(module)
            norms.append(None)
        elif not isinstance(module, (nn.ReLU, nn.Flatten)):
            norms[-1] = module
    return linears, norms[:-1]


def layer_stats(model: MLP, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """One training-mode forward and backward pass of ``model`` on ``x (B, in_features)`` with
    labels ``y (B,)`` and the cross-entropy loss, on a copy (the model's running statistics
    and gradients are left as they were).

    Returns arrays of shape ``(L,)``, one entry per Linear layer (the hidden ones, then the
    output layer): ``"mean"`` and ``"std"`` of that layer's output over the batch and its
    features (the pre-activations, before any norm), and ``"grad"``, the Frobenius norm of
    the gradient of the loss with respect to its weight matrix.
    """
    if not isinstance(model, MLP):
        raise TypeError(f"model must be an lnbook.models.MLP, got {type(model).__name__}")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or len(x) != len(y) or len(x) < 2:
        raise ValueError(f"x and y must be tensors with the same first dimension >= 2, got {describe(x)} and {describe(y)}")
    probe = copy.deepcopy(model).train()
    linears, _ = mlp_layers(probe)
    outputs = []
    hooks = [lin.register_forward_hook(lambda m, i, out: outputs.append(out.detach())) for lin in linears]
    try:
        nn.functional.cross_entropy(probe(x), y).backward()
    finally:
        for h in hooks:
            h.remove()
    return {
        "mean": np.array([o.mean().item() for o in outputs]),
        "std": np.array([o.std(unbiased=False).item() for o in outputs]),
        "grad": np.array([lin.weight.grad.norm().item() for lin in linears]),
    }
