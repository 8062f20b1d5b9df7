"""Modules that run the fused kernels, and a function that swaps them into a model."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import describe
from ..norms import RMSNorm, swap_modules
from .norm import layer_norm, rms_norm


class FusedLayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` (same parameters and state dict) computed by :func:`layer_norm`.

    Normalizes over the last dimension only: ``normalized_shape`` must have one entry.
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True, **factory) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, **factory)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"FusedLayerNorm normalizes the last dimension only, got normalized_shape {describe(self.normalized_shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.weight is not None else x.new_ones(self.normalized_shape, dtype=torch.float32)
        return layer_norm(x, weight, self.bias, self.eps)


class FusedRMSNorm(RMSNorm):
    """:class:`lnbook.norms.RMSNorm` (same parameters) computed by :func:`rms_norm`, over the last dimension."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"FusedRMSNorm normalizes the last dimension only, got normalized_shape {describe(self.normalized_shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.weight is not None else x.new_ones(self.normalized_shape, dtype=torch.float32)
        return rms_norm(x, weight, self.eps)


def fuse_norms(model: nn.Module) -> int:
    """Swap every ``torch.nn.LayerNorm`` and :class:`lnbook.norms.RMSNorm` over one dimension
    inside ``model`` for its fused version, in place, keeping parameters, device and dtype.
    Returns how many modules were swapped."""

    def fused(child: nn.Module) -> nn.Module | None:
        if isinstance(child, (FusedLayerNorm, FusedRMSNorm)) or len(getattr(child, "normalized_shape", ())) != 1:
            return None
        if isinstance(child, nn.LayerNorm):
            return FusedLayerNorm(child.normalized_shape[0], child.eps, child.elementwise_affine, child.bias is not None)
        if isinstance(child, RMSNorm):
            return FusedRMSNorm(child.normalized_shape[0], child.eps, child.weight is not None)
        return None

    return swap_modules(model, fused)
