"""Modules that run the fused kernels, and the functions that swap them into a model.

:func:`fuse_norms` swaps the norms; :func:`fuse_residual_adds` then makes every residual add of
a Pre-LN :class:`lnbook.transformer.TinyGPT` run inside the kernel of the norm that reads the
sum: a block's attention output is added in its own second norm's kernel, its MLP output in the
next block's first norm's (the last block's in the final norm's).
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import describe
from ..norms import NotScriptable, RMSNorm, swap_modules
from ..transformer import Block, Norm, TinyGPT
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


_FUSED_NORMS = (FusedLayerNorm, FusedRMSNorm)


def fuse_norms(model: nn.Module, residual: bool = True) -> int:
    """Swap every ``torch.nn.LayerNorm`` and :class:`lnbook.norms.RMSNorm` over one dimension
    inside ``model`` for its fused version, in place, keeping parameters, device and dtype.
    With ``residual`` (the default), the residual adds of Pre-LN Transformers whose norms are
    now fused also run inside the norms' kernels (:func:`fuse_residual_adds`). Returns how many
    norm modules were swapped."""

    def fused(child: nn.Module) -> nn.Module | None:
        if isinstance(child, _FUSED_NORMS) or len(getattr(child, "normalized_shape", ())) != 1:
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


def _is_fused(norm: nn.Module) -> bool:
    """Whether ``norm`` is a :class:`lnbook.transformer.Norm` that runs a fused kernel, which can add."""
    return isinstance(norm, Norm) and isinstance(norm.norm, _FUSED_NORMS)


def _add_norm(norm: Norm, x: torch.Tensor, residual: torch.Tensor | None,
              mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(s), s)`` for the residual stream ``s = x + residual`` (``x`` when ``residual`` is
    None), both ``(*, T, d)``: the add inside the norm's kernel where ``norm`` is fused and the
    two tensors share shape and dtype; otherwise (a norm that is not fused, a seed-stacked
    model's, or a residual of a lower dtype under autocast) an add and then the norm."""
    if residual is None:
        return norm(x, mask), x
    if _is_fused(norm) and residual.shape == x.shape and residual.dtype == x.dtype:
        return norm.norm.add_forward(x, residual)
    x = x + residual
    return norm(x, mask), x


class FusedAddBlock(Block):
    """A Pre-LN :class:`lnbook.transformer.Block` (also Sandwich-LN or NormFormer) whose
    residual adds run inside its norms' kernels; the same parameters and results as the block
    it replaces. Called as a block, ``forward(x, mask)``, it adds attention's output in norm2's
    kernel and the MLP's with a plain add; :meth:`add_forward` leaves the MLP's add to the
    caller's next norm."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x, residual = self.add_forward(x, None, mask)
        return x + residual

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The block on the residual stream ``x + residual`` (``x`` when ``residual`` is None),
        its output returned unsummed: ``(x', r')`` with ``x' + r' = Block.forward(x + residual)``.
        The pending add runs in norm1's kernel, attention's in norm2's; ``r'`` is the MLP's
        output (after ``norm2_out`` in Sandwich-LN). ``x, residual (*, T, d)``; ``mask (*, T)``."""
        h, x = _add_norm(self.norm1, x, residual, mask)
        y = self.attn(h, mask)
        if hasattr(self, "norm1_out"):  # Sandwich-LN and NormFormer normalize attention's output before it joins
            y = self.norm1_out(y, mask)
        h, x = _add_norm(self.norm2, x, y, mask)
        y = self.mlp(h)
        return x, (self.norm2_out(y, mask) if hasattr(self, "norm2_out") else y)


class FusedTinyGPT(TinyGPT):
    """A :class:`lnbook.transformer.TinyGPT` whose blocks hand the residual stream on unsummed
    (:meth:`FusedAddBlock.add_forward`), so that each MLP output is added inside the next
    norm's kernel: the next block's first norm, or the final norm after the last block. The
    same parameters and results as the model it replaces. The stream between blocks is never
    summed in memory, so the fused blocks and the final norm are not called as modules: hooks
    registered on them do not run."""

    def forward(self, idx: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x, residual = self.embed(idx, mask), None
        for block in self.blocks:
            if isinstance(block, FusedAddBlock):
                x, residual = block.add_forward(x, residual, mask)
            else:  # a block that takes the stream summed
                x, residual = block(x if residual is None else x + residual, mask), None
        h, _ = _add_norm(self.norm_f, x, residual, mask)
        return self.head(h)


def _fused_adds(model: nn.Module) -> int:
    """How many residual adds of ``model``'s blocks run inside a norm's kernel, as it is wired."""
    count = 0
    for module in model.modules():
        if isinstance(module, FusedAddBlock):
            count += _is_fused(module.norm2)  # attention's add
        if isinstance(module, FusedTinyGPT):  # each MLP's add, in the next block's norm1 or the final norm
            for block, after in zip(module.blocks, [*module.blocks[1:], None]):
                reader = module.norm_f if after is None else after.norm1 if isinstance(after, FusedAddBlock) else None
                count += isinstance(block, FusedAddBlock) and _is_fused(reader)
    return count


def fuse_residual_adds(model: nn.Module) -> int:
    """Make the residual adds of every Pre-LN Transformer in ``model`` run inside the kernel
    of the fused norm that reads the sum, in place; parameters and state dict unchanged.

    Each Pre-LN :class:`lnbook.transformer.Block` (Sandwich-LN and NormFormer included) whose
    second norm is fused becomes a :class:`FusedAddBlock`: attention's output is added in
    norm2's kernel. Each :class:`lnbook.transformer.TinyGPT` holding such blocks becomes a
    :class:`FusedTinyGPT`: a block's MLP output is added in the next block's norm1 kernel, the
    last block's in the final norm's (where those norms are fused: without a final norm, the
    last add stays a plain add). Post-LN and DeepNorm blocks, and the embedding norm, are left
    as they are. Each fused add saves one read of the sum (``B * T * d_model`` elements) in
    the forward pass. At run time an add whose two tensors differ in dtype (a sublayer's
    bfloat16 output under autocast) runs as torch's ``+``, which promotes.

    Returns how many residual adds of ``model`` now run inside a norm's kernel (calling it
    again changes nothing and returns the same number): ``2 * n_layer`` for a Pre-LN TinyGPT
    with fused norms and a final norm, ``n_layer`` for a TinyViT (its forward is its own)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for module in model.modules():
        if type(module) is Block and module.pre and _is_fused(module.norm2):
            module.__class__ = FusedAddBlock
    for module in model.modules():
        if type(module) is TinyGPT and any(isinstance(b, FusedAddBlock) for b in module.blocks):
            module.__class__ = FusedTinyGPT
    return _fused_adds(model)
