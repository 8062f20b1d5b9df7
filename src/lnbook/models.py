"""Small models that Part I trains, each with its normalization as a setting.

Norm names: ``"none"``; ``"layer"`` (:class:`~lnbook.norms.LayerNorm`, per position);
``"batch"`` (:class:`~lnbook.norms.MaskedBatchNorm1d`, told which steps are padding);
``"batch_unmasked"`` (the same, counting padding as data); and, in the recurrent cell,
``"batch_per_step"`` (:class:`~lnbook.norms.TimeStepBatchNorm`).
"""

from __future__ import annotations

import torch
from torch import nn

from .norms import LayerNorm, MaskedBatchNorm1d, TimeStepBatchNorm


def _check_choice(value: str, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def _norm_layer(kind: str, size: int, max_steps: int | None = None) -> nn.Module:
    """The module a norm name stands for (see the module docstring), over ``size`` features."""
    if kind == "layer":
        return LayerNorm(size)
    if kind in ("batch", "batch_unmasked"):
        return MaskedBatchNorm1d(size)
    if kind == "batch_per_step":
        return TimeStepBatchNorm(size, max_steps)
    return nn.Identity()


class MLP(nn.Module):
    """Flatten, then ``[Linear -> norm -> ReLU] * len(hidden) -> Linear``.

    Input ``(B, ...)`` with ``in_features`` numbers per example; output logits ``(B, n_classes)``.
    ``norm``: ``"none"``, ``"batch"`` (BatchNorm over the batch) or ``"layer"``.
    """

    NORMS = ("none", "batch", "layer")

    def __init__(self, in_features: int, hidden: tuple[int, ...], n_classes: int, norm: str = "none") -> None:
        super().__init__()
        self.norm = _check_choice(norm, self.NORMS, "norm")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers.append(nn.Linear(width, h))
            if norm != "none":
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
