"""Modules that run the fused kernels, and a function that swaps them into a model."""

from __future__ import annotations

import functools

import torch
from torch import nn

from .._checks import describe
from ..norms import NotScriptable, RMSNorm, swap_modules
from .norm import add_layer_norm, add_rms_norm, layer_norm, rms_norm


class FusedLayerNorm(NotScriptable, nn.LayerNorm):
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

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)`` in one pass (:func:`add_layer_norm`); x, residual ``(*, N)``."""
        weight = self.weight if self.weight is not None else x.new_ones(self.normalized_shape, dtype=torch.float32)
        return add_layer_norm(x, residual, weight, self.bias, self.eps)


class FusedRMSNorm(RMSNorm):
    """:class:`lnbook.norms.RMSNorm` (same parameters) computed by :func:`rms_norm`, over the last dimension."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"FusedRMSNorm normalizes the last dimension only, got normalized_shape {describe(self.normalized_shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.weight is not None else x.new_ones(self.normalized_shape, dtype=torch.float32)
        return rms_norm(x, weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)`` in one pass (:func:`add_rms_norm`); x, residual ``(*, N)``."""
        weight = self.weight if self.weight is not None else x.new_ones(self.normalized_shape, dtype=torch.float32)
        return add_rms_norm(x, residual, weight, self.eps)


def fuse_norms(model: nn.Module, residual: bool = True) -> int:
    """Swap every ``torch.nn.LayerNorm`` and :class:`lnbook.norms.RMSNorm` over one dimension
    inside ``model`` for its fused version, in place, keeping parameters, device and dtype.
    With ``residual`` (the default), every Pre-LN :class:`lnbook.transformer.Block` whose
    norms are now fused also computes its attention residual add and its second norm in one
    kernel (:func:`fuse_residual_adds`). Returns how many norm modules were swapped."""

    def fused(child: nn.Module) -> nn.Module | None:
        if isinstance(child, (FusedLayerNorm, FusedRMSNorm)) or len(getattr(child, "normalized_shape", ())) != 1:
            return None
        if isinstance(child, nn.LayerNorm):
            return FusedLayerNorm(child.normalized_shape[0], child.eps, child.elementwise_affine, child.bias is not None)
        if isinstance(child, RMSNorm):
            return FusedRMSNorm(child.normalized_shape[0], child.eps, child.weight is not None)
        return None

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    count = swap_modules(model, fused)
    if residual:
        fuse_residual_adds(model)
    return count


@functools.cache
def _fused_add_block_class() -> type:
    from ..transformer import Block

    class FusedAddBlock(Block):
        """A Pre-LN :class:`lnbook.transformer.Block` whose attention residual add and second
        norm run as one kernel: ``h, x = norm2.add_forward(x, attn(norm1(x)))``, then
        ``x + mlp(h)``; the same parameters and results as the block it replaces."""

        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            h, x = self.norm2.norm.add_forward(x, self.attn(self.norm1(x, mask), mask))
            return x + self.mlp(h)

    return FusedAddBlock


def fuse_residual_adds(model: nn.Module) -> int:
    """Make every Pre-LN :class:`lnbook.transformer.Block` in ``model`` whose second norm is a
    fused module add its attention output to the residual stream inside the norm's kernel
    (one pass instead of an add and a norm), in place; parameters and state dict unchanged.
    Returns how many blocks were changed."""
    cls = _fused_add_block_class()
    count = 0
    for module in model.modules():
        if (isinstance(module, cls.__mro__[1]) and not isinstance(module, cls) and module.pre
                and isinstance(module.norm2.norm, (FusedLayerNorm, FusedRMSNorm))):
            module.__class__ = cls
            count += 1
    return count
