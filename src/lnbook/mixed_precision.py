"""LayerNorm under bfloat16: its statistics computed in bfloat16, as a careless kernel would, and
a model trained under ``torch.autocast`` (chapter 07, section 5).

``layer_norm_bf16(x, weight, bias)`` normalizes ``(*, d)`` over its last dimension with every
step in bfloat16; ``accumulator`` says how the sums for the mean and the variance add up.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import check_choice, check_number, describe
from .transformer import Norm, TinyGPT

ACCUMULATORS = ("sequential", "tree", "fp32")


def _mean_bf16(z: torch.Tensor, accumulator: str) -> torch.Tensor:
    """The mean over the last dimension of a bfloat16 ``z (*, d)``, summed as ``accumulator`` says: ``(*, 1)``."""
    d = z.shape[-1]
    if accumulator == "fp32":
        return z.mean(-1, keepdim=True)  # torch adds in float32 and rounds the result
    if accumulator == "tree":
        while z.shape[-1] > 1:  # every pairwise sum rounded to bfloat16
            if z.shape[-1] % 2:
                z = torch.cat([z, torch.zeros_like(z[..., :1])], -1)
            z = z[..., 0::2] + z[..., 1::2]
        return z / d
    total = torch.zeros_like(z[..., :1])
    for i in range(d):
        total = total + z[..., i : i + 1]  # rounded to bfloat16 after every addition
    return total / d


def layer_norm_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
                    accumulator: str = "sequential") -> torch.Tensor:
    """LayerNorm of ``x (*, d)`` over its last dimension with every step in bfloat16; returns
    bfloat16 ``(*, d)``. ``accumulator``: how the sums for the mean and the variance add up:
    ``"sequential"``, feature by feature in a bfloat16 variable (each partial sum rounded, the
    worst order, up to ``d`` roundings); ``"tree"``, pairwise in bfloat16 (halving the features
    each time, as a simple GPU reduction does, about ``log2 d`` roundings); ``"fp32"``, torch's
    reductions, which add in float32 and round each statistic to bfloat16."""
    check_choice(accumulator, ACCUMULATORS, "accumulator")
    check_number(eps, "eps", "a positive number", lambda v: v > 0)
    if not isinstance(x, torch.Tensor) or x.ndim < 1 or weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(f"x must be a tensor (*, d) and weight and bias (d,), got {describe(x)}, {describe(weight)}, "
                         f"{describe(bias)}")
    x = x.bfloat16()
    centered = x - _mean_bf16(x, accumulator)
    y = centered * torch.rsqrt(_mean_bf16(centered * centered, accumulator) + eps)
    return y * weight.bfloat16() + bias.bfloat16()


class BF16StatsLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` with its statistics summed pairwise in bfloat16 (:func:`layer_norm_bf16`, ``"tree"``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_bf16(x, self.weight, self.bias, self.eps, accumulator="tree")


class Autocast(nn.Module):
    """A :class:`~lnbook.transformer.TinyGPT` run under ``torch.autocast`` to bfloat16 on its
    parameters' device, returning float32 logits; with ``bf16_stats``, each of its LayerNorms
    replaced (weights kept) by :class:`BF16StatsLayerNorm`. ``loss(idx, targets)`` as TinyGPT's."""

    def __init__(self, model: TinyGPT, bf16_stats: bool = False) -> None:
        super().__init__()
        if not isinstance(model, TinyGPT):
            raise TypeError(f"model must be a TinyGPT, got {describe(model)}")
        self.model = model
        for norm in model.modules():
            if bf16_stats and isinstance(norm, Norm) and isinstance(norm.norm, nn.LayerNorm):
                replacement = BF16StatsLayerNorm(norm.norm.normalized_shape, eps=norm.norm.eps).to(norm.norm.weight.device)
                replacement.load_state_dict(norm.norm.state_dict())
                norm.norm = replacement

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return self.model(idx).float()

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(idx).flatten(0, 1), targets.flatten())
