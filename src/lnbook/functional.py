"""Torch functions with hand-written backward passes.

``layer_norm`` is a :class:`torch.autograd.Function`: its forward saves only the input, the
per-row mean and 1/σ (``rstd``), and its backward applies the closed-form gradient derived in
chapter 03, so autograd never records a graph through the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.autograd.function import once_differentiable

from ._checks import check_eps, check_normalized_shape, check_shape, check_trailing

# Low-precision inputs are normalized in float32, as torch.nn.functional.layer_norm does.
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def check_float_tensor(t: object, name: str) -> torch.Tensor:
    """Return ``t`` if it is a real floating-point tensor, else raise ``TypeError``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


class _LayerNorm(torch.autograd.Function):
    """y = xhat * w + b over rows of D features: x is (M, D), weight and bias (D,) or None.

    The backward is once-differentiable: mean and rstd are saved as constants, so a second
    derivative through them would be wrong, and torch raises instead of returning it.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        compute = torch.float32 if x.dtype in _LOW_PRECISION else x.dtype
        xc = x.to(compute)
        mean = xc.mean(dim=-1, keepdim=True)
        centered = xc - mean
        rstd = torch.rsqrt((centered * centered).mean(dim=-1, keepdim=True) + eps)
        y = centered * rstd
        if weight is not None:
            y = y * weight.to(compute)
        if bias is not None:
            y = y + bias.to(compute)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        compute = mean.dtype
        xhat = (x.to(compute) - mean) * rstd
        dy = dy.to(compute)
        g = dy * weight.to(compute) if weight is not None else dy
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = rstd * (g - g.mean(dim=-1, keepdim=True) - xhat * (g * xhat).mean(dim=-1, keepdim=True))
            dx = dx.to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = (dy * xhat).sum(dim=0).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            db = dy.sum(dim=0).to(ctx.bias_dtype)
        return dx, dw, db, None


def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm with a hand-written backward; a drop-in for ``torch.nn.functional.layer_norm``.

    Args:
        x: ``(*, *normalized_shape)``, float16, bfloat16, float32 or float64. Each leading
            position is normalized over all of its trailing ``normalized_shape`` elements.
        normalized_shape: the trailing dimensions to normalize over, e.g. ``H`` or ``(C, W)``.
        weight, bias: optional gain and bias of shape ``normalized_shape``.
        eps: added to the (biased) variance, > 0.

    Returns:
        ``y`` with ``x``'s shape and dtype. Statistics are computed in float32 for float16 and
        bfloat16 inputs. A row containing NaN or inf gives NaN in that row only.
    """
    check_float_tensor(x, "x")
    shape = check_normalized_shape(normalized_shape)
    check_trailing(tuple(x.shape), shape)
    eps = check_eps(eps)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            check_float_tensor(p, name)
            check_shape(tuple(p.shape), shape, name)
    d = math.prod(shape)
    x2 = x.reshape(-1, d)
    w2 = weight.reshape(d) if weight is not None else None
    b2 = bias.reshape(d) if bias is not None else None
    return _LayerNorm.apply(x2, w2, b2, eps).reshape(x.shape)
