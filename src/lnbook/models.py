"""The multilayer perceptron that chapters 01, 02 and 09 train, with its normalization as a setting.

Norms are named as in :data:`lnbook.norms.NORMS`: ``"none"``; ``"batch"``
(:class:`~lnbook.norms.MaskedBatchNorm1d`); ``"weight"`` (weight normalization of the layers
that feed the norm, and no norm layer); and every norm over one example's features
(:data:`~lnbook.norms.EXAMPLE_NORMS`: ``"layer"``, ``"layer_simple"`` (without gain and bias),
``"group4"`` with 4 groups of consecutive features, ``"rms"``, ``"dyt"``, ``"detach"``,
``"adanorm"``). ``"instance"`` is refused, with the reason. Chapter 02's recurrent networks
are :class:`lnbook.rnn.ElmanClassifier`.

:func:`weight_norm_init` gives the weight-normalized layers Salimans and Kingma's
data-dependent initialization.

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
from torch.nn.utils import parametrize

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


def weight_norm_init(model: nn.Module, x: torch.Tensor, scale: float = 1.0, eps: float = 1e-6,
                     keep_weight_norm: bool = True) -> nn.Module:
    """Salimans and Kingma's data-dependent initialization of every weight-normalized
    ``nn.Linear`` of ``model`` (torch's ``parametrizations.weight_norm``, ``w = g v / ||v||``
    per output row), in place; returns ``model``.

    Layer by layer, in the order of ``model.modules()`` (the order of the forward pass for
    :class:`MLP`): with ``g = 1`` and the bias 0, one forward pass of ``x (B, ...)`` (a batch
    of inputs, B >= 2) gives the layer's output ``t (B, out)``; then ``g = scale / std(t)`` and
    ``bias = -mean(t) * g`` (over the batch, per output feature), so that on ``x`` each of its
    outputs has mean 0 and standard deviation ``scale`` before the next layer is set. Layers
    that are not weight-normalized are left alone. ``v`` keeps its direction and gets the length
    ``g`` (so ``w = v``): :func:`lnbook.seeds.stack` re-derives ``g = ||w||`` and ``v = w``, so
    a stacked member keeps exactly these ``g`` and ``v`` and trains as it would alone.
    No gradient is recorded; dropout, if any, runs in the model's current mode.

    ``keep_weight_norm=False``: the control that separates the initialization from the
    reparametrization. After the initialization the weight norm is removed
    (``parametrize.remove_parametrizations``, leaving ``w``), so the model computes the same
    function at step 0 and then trains its weights directly, as a network without weight
    normalization would.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim < 2 or len(x) < 2:
        raise ValueError(f"x must be a float tensor (B, ...) with B >= 2 inputs, got {describe(x)}")
    if not isinstance(keep_weight_norm, bool):
        raise TypeError(f"keep_weight_norm must be a bool, got {describe(keep_weight_norm)}")
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale < float("inf")):
        raise ValueError(f"scale must be a positive finite number, got {describe(scale)}")
    layers = [m for m in model.modules() if isinstance(m, nn.Linear) and parametrize.is_parametrized(m, "weight")
              and type(m.parametrizations.weight[0]).__name__ == "_WeightNorm"]
    if not layers:
        raise ValueError("model has no weight-normalized nn.Linear layer (torch.nn.utils.parametrizations.weight_norm)")
    with torch.no_grad():
        for layer in layers:
            g, v = layer.parametrizations.weight.original0, layer.parametrizations.weight.original1
            g.fill_(1.0)
            if layer.bias is not None:
                layer.bias.zero_()
            seen: list[torch.Tensor] = []
            hook = layer.register_forward_hook(lambda m, i, out: seen.append(out.reshape(-1, out.shape[-1])))
            try:
                model(x)
            finally:
                hook.remove()
            t = torch.cat(seen)
            mean, std = t.mean(0), t.std(0, correction=0)
            gain = scale / (std + eps)
            g.copy_(gain.reshape(g.shape))
            v.mul_(gain.reshape(g.shape) / v.norm(dim=1, keepdim=True))
            if layer.bias is not None:
                layer.bias.copy_(-mean * gain)
    if not keep_weight_norm:
        for layer in layers:
            parametrize.remove_parametrizations(layer, "weight", leave_parametrized=True)
            for key, hook in list(layer._load_state_dict_pre_hooks.items()):  # weight_norm's loading hook, unpicklable
                if "_weight_norm_compat_hook" in getattr(getattr(hook, "hook", hook), "__qualname__", ""):
                    del layer._load_state_dict_pre_hooks[key]
    return model


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
