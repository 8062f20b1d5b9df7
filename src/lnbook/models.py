"""Small models that Part I trains, each with its normalization as a setting.

Norms are named as in :data:`lnbook.norms.NORMS`: ``"none"``; ``"batch"``
(:class:`~lnbook.norms.MaskedBatchNorm1d`, told which steps are padding); ``"batch_unmasked"``
(the same, counting padding as data); in the recurrent cell, ``"batch_per_step"``
(:class:`~lnbook.norms.TimeStepBatchNorm`); ``"weight"`` (weight normalization of the layers
that feed the norm, and no norm layer); and every norm over one example's features
(:data:`~lnbook.norms.EXAMPLE_NORMS`: ``"layer"``, ``"group4"`` with 4 groups of consecutive
features, ``"rms"``, ``"dyt"``, ``"detach"``, ``"adanorm"``). ``"instance"`` is refused, with
the reason.
"""

from __future__ import annotations

import torch
from torch import nn

from .norms import EXAMPLE_NORMS, PicklesWithParametrizations, apply_norm, check_norm, norm_layer


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


class GRUClassifier(nn.Module):
    """A recurrent classifier for padded sequences, with a norm on every time step's input.

    ``x (B, T, F), lengths (B,) -> Linear(F, H) -> norm -> tanh -> GRU -> state at each
    sequence's true length -> Linear -> logits (B, n_classes)``. The GRU runs on packed
    sequences, so padding reaches the output only through the norm: ``"batch_unmasked"``
    counts the padded steps in its statistics, ``"batch"`` leaves them out, and ``"layer"``
    (or another norm over an example's features) normalizes each step alone.
    """

    NORMS = ("none", "batch_unmasked", "batch", *EXAMPLE_NORMS)

    def __init__(self, input_size: int, hidden_size: int, n_classes: int, norm: str = "none") -> None:
        super().__init__()
        self.embed = nn.Linear(input_size, hidden_size)
        self.norm = norm_layer(check_norm(norm, self.NORMS), hidden_size)
        self.rnn = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, n_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if lengths.shape != x.shape[:1] or int(lengths.min()) < 1 or int(lengths.max()) > x.shape[1]:
            raise ValueError(f"lengths must be (B,) = ({x.shape[0]},) with values in 1..{x.shape[1]}")
        x = x[:, : int(lengths.max())]  # drop steps that are padding for the whole batch
        mask = torch.arange(x.shape[1], device=x.device) < lengths[:, None].to(x.device)
        h = apply_norm(self.norm, self.embed(x), mask)
        packed = nn.utils.rnn.pack_padded_sequence(torch.tanh(h), lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, last = self.rnn(packed)  # (1, B, H): each sequence's state after its last real step
        return self.head(last[0])


class NormRNNCell(nn.Module):
    """An Elman cell with the norm inside the recurrence: ``h' = tanh(norm(W_x x + W_h h + b))``.

    ``norm``: ``"none"``, ``"layer"`` (or another norm over an example's features), ``"batch"``
    (one set of batch statistics shared by all time steps) or ``"batch_per_step"`` (statistics
    of step t for step t, up to ``max_steps``).
    Shapes: ``x (B, F)``, ``h (B, H)`` and the step ``t`` -> ``(B, H)``.
    """

    NORMS = ("none", "batch", "batch_per_step", *EXAMPLE_NORMS)

    def __init__(self, input_size: int, hidden_size: int, norm: str = "none", max_steps: int | None = None) -> None:
        super().__init__()
        norm = check_norm(norm, self.NORMS)
        self.hidden_size = hidden_size
        self.wx = nn.Linear(input_size, hidden_size)
        self.wh = nn.Linear(hidden_size, hidden_size, bias=False)
        nn.init.orthogonal_(self.wh.weight)
        self.norm = norm_layer(norm, hidden_size, max_steps=max_steps)

    def forward(self, x: torch.Tensor, h: torch.Tensor, t: int) -> torch.Tensor:
        return torch.tanh(apply_norm(self.norm, self.wx(x) + self.wh(h), t=t))


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
