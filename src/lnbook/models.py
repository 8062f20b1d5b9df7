"""Small models that Part I trains, each with its normalization as a setting.

Norm names: ``"none"``; ``"layer"`` (:class:`~lnbook.norms.LayerNorm`, per position);
``"batch"`` (:class:`~lnbook.norms.MaskedBatchNorm1d`, told which steps are padding);
``"batch_unmasked"`` (the same, counting padding as data); and, in the recurrent cell,
``"batch_per_step"`` (:class:`~lnbook.norms.TimeStepBatchNorm`). The MLP, and the cells of
:mod:`lnbook.rnn`, also take the norms that chapter 08 compares, each over one example's
features: ``"group4"`` (``torch.nn.GroupNorm`` with 4 groups of consecutive features; over
an LSTM cell's gate pre-activations, one group per gate), ``"rms"``
(:class:`~lnbook.norms.RMSNorm`), ``"dyt"`` (:class:`~lnbook.norms.DyT`), ``"detach"``
(:class:`~lnbook.norms.DetachNorm`), ``"adanorm"`` (:class:`~lnbook.norms.AdaNorm`) and
``"weight"`` (weight normalization of the layers that feed the norm, and no norm layer).
``"instance"`` is refused, with the reason.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from ._checks import describe
from .norms import AdaNorm, DetachNorm, DyT, LayerNorm, MaskedBatchNorm1d, RMSNorm, TimeStepBatchNorm

INSTANCE_REFUSED = (
    "norm='instance' has nothing to normalize over in a hidden vector (B, H): InstanceNorm "
    "normalizes each feature over the spatial positions of one example, and here each "
    "feature has a single value, so (x - mean) is 0 and the output is the bias for every "
    "input (torch.nn.InstanceNorm1d on (B, H, 1) raises; GroupNorm(H, H) returns the bias)"
)


def _check_choice(value: str, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {describe(value)}")
    return value


def _check_norm(norm: str, choices: tuple[str, ...]) -> str:
    """``_check_choice`` for a norm name, explaining why ``"instance"`` is not one."""
    if norm == "instance":
        raise ValueError(INSTANCE_REFUSED)
    return _check_choice(norm, choices, "norm")


def _norm_layer(kind: str, size: int, max_steps: int | None = None) -> nn.Module:
    """The module a norm name stands for (see the module docstring), over ``size`` features."""
    if kind == "layer":
        return LayerNorm(size)
    if kind in ("batch", "batch_unmasked"):
        return MaskedBatchNorm1d(size)
    if kind == "batch_per_step":
        return TimeStepBatchNorm(size, max_steps)
    if kind == "group4":
        return nn.GroupNorm(4, size)
    if kind == "rms":
        return RMSNorm(size)
    if kind == "dyt":
        return DyT(size)
    if kind == "detach":
        return DetachNorm(size)
    if kind == "adanorm":
        return AdaNorm(size)
    return nn.Identity()


def _rebuild(cls: type, args: tuple, kwargs: dict, state: dict, training: bool) -> nn.Module:
    """``cls(*args, **kwargs)`` with ``state`` loaded and the training flag set: an unpickled copy."""
    model = cls(*args, **kwargs)
    model.load_state_dict(state)
    return model.train(training)


class _PicklesWithParametrizations:
    """Mixin for a module that keeps its constructor arguments in ``self.init_args``
    (``(args, kwargs)``). Torch refuses to pickle a module with parametrizations (weight
    normalization), yet :func:`lnbook.train.fit_many` sends models to worker processes and
    back; such a module pickles as its class, constructor arguments and state dict instead.
    Modules without parametrizations pickle as usual."""

    init_args: tuple[tuple, dict[str, Any]]

    def __reduce_ex__(self, protocol: int) -> str | tuple:
        if not any(parametrize.is_parametrized(m) for m in self.modules()):
            return super().__reduce_ex__(protocol)
        cls = parametrize.type_before_parametrizations(self)
        return _rebuild, (cls, *self.init_args, self.state_dict(), self.training)


class MLP(_PicklesWithParametrizations, nn.Module):
    """Flatten, then ``[Linear -> norm -> ReLU] * len(hidden) -> Linear``.

    Input ``(B, ...)`` with ``in_features`` numbers per example; output logits ``(B, n_classes)``.
    ``norm``: ``"none"``, ``"batch"`` (BatchNorm over the batch), ``"layer"``, or one of the
    norms over an example's features in the module docstring (``"group4"``, ``"rms"``,
    ``"dyt"``, ``"detach"``, ``"adanorm"``); ``"weight"``: no norm layer, the hidden Linear
    layers weight-normalized (``torch.nn.utils.parametrizations.weight_norm``, one gain per
    output feature, initialized to leave the layer unchanged), the output layer not.
    """

    NORMS = ("none", "batch", "layer", "group4", "weight", "rms", "dyt", "detach", "adanorm")

    def __init__(self, in_features: int, hidden: tuple[int, ...], n_classes: int, norm: str = "none") -> None:
        super().__init__()
        self.norm = _check_norm(norm, self.NORMS)
        self.init_args = ((in_features, hidden, n_classes, norm), {})
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers.append(nn.Linear(width, h))
            if norm == "weight":
                nn.utils.parametrizations.weight_norm(layers[-1])
            elif norm != "none":
                layers.append(_norm_layer(norm, h))
            layers.append(nn.ReLU())
            width = h
        layers.append(nn.Linear(width, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class GRUClassifier(nn.Module):
    """A recurrent classifier for padded sequences, with a norm on every time step's input.

    ``x (B, T, F), lengths (B,) -> Linear(F, H) -> norm -> tanh -> GRU -> state at each
    sequence's true length -> Linear -> logits (B, n_classes)``. The GRU runs on packed
    sequences, so padding reaches the output only through the norm: ``"batch_unmasked"``
    counts the padded steps in its statistics, ``"batch"`` leaves them out, and ``"layer"``
    normalizes each step alone.
    """

    NORMS = ("none", "batch_unmasked", "batch", "layer")

    def __init__(self, input_size: int, hidden_size: int, n_classes: int, norm: str = "none") -> None:
        super().__init__()
        self.norm_kind = _check_choice(norm, self.NORMS, "norm")
        self.embed = nn.Linear(input_size, hidden_size)
        self.norm = _norm_layer(norm, hidden_size)
        self.rnn = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, n_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if lengths.shape != x.shape[:1] or int(lengths.min()) < 1 or int(lengths.max()) > x.shape[1]:
            raise ValueError(f"lengths must be (B,) = ({x.shape[0]},) with values in 1..{x.shape[1]}")
        x = x[:, : int(lengths.max())]  # drop steps that are padding for the whole batch
        mask = torch.arange(x.shape[1], device=x.device) < lengths[:, None].to(x.device)
        h = self.embed(x)
        if self.norm_kind == "batch":
            h = self.norm(h, mask)
        else:
            h = self.norm(h)
        packed = nn.utils.rnn.pack_padded_sequence(torch.tanh(h), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, last = self.rnn(packed)  # (1, B, H): each sequence's state after its last real step
        return self.head(last[0])


class NormRNNCell(nn.Module):
    """An Elman cell with the norm inside the recurrence: ``h' = tanh(norm(W_x x + W_h h + b))``.

    ``norm``: ``"none"``, ``"layer"``, ``"batch"`` (one set of batch statistics shared by all
    time steps) or ``"batch_per_step"`` (statistics of step t for step t, up to ``max_steps``).
    Shapes: ``x (B, F)``, ``h (B, H)`` and the step ``t`` -> ``(B, H)``.
    """

    NORMS = ("none", "layer", "batch", "batch_per_step")

    def __init__(self, input_size: int, hidden_size: int, norm: str = "none", max_steps: int | None = None) -> None:
        super().__init__()
        self.norm_kind = _check_choice(norm, self.NORMS, "norm")
        if norm == "batch_per_step" and max_steps is None:
            raise ValueError("norm='batch_per_step' needs max_steps, the longest training sequence")
        self.hidden_size = hidden_size
        self.wx = nn.Linear(input_size, hidden_size)
        self.wh = nn.Linear(hidden_size, hidden_size, bias=False)
        nn.init.orthogonal_(self.wh.weight)
        self.norm = _norm_layer(norm, hidden_size, max_steps)

    def forward(self, x: torch.Tensor, h: torch.Tensor, t: int) -> torch.Tensor:
        a = self.wx(x) + self.wh(h)
        return torch.tanh(self.norm(a, t) if self.norm_kind == "batch_per_step" else self.norm(a))


class RNNClassifier(nn.Module):
    """Run a :class:`NormRNNCell` over ``x (B, T, F)`` from ``h = 0``; classify the last state."""

    def __init__(
        self, input_size: int, hidden_size: int, n_classes: int, norm: str = "none", max_steps: int | None = None
    ) -> None:
        super().__init__()
        self.cell = NormRNNCell(input_size, hidden_size, norm, max_steps)
        self.head = nn.Linear(hidden_size, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 3:
            raise ValueError(f"x must have shape (B, T, F), got {tuple(x.shape)}")
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h, t)
        return self.head(h)
