"""Torch functions with hand-written backward passes.

``layer_norm`` is a :class:`torch.autograd.Function`: its forward saves only the input, the
per-row mean and 1/σ (``rstd``), and its backward applies the closed-form gradient derived in
chapter 03, so autograd never records a graph through the statistics.

``all_reduce_sum`` is the one collective the book uses (synchronized BatchNorm): a sum over
data-parallel processes whose backward is again a sum. It counts its calls in
``COLLECTIVES``, so that chapters report measured collective counts rather than counting by hand.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ._checks import check_eps, check_float_tensor, check_normalized_shape, check_shape, check_trailing

# Low-precision inputs are normalized in float32, as torch.nn.functional.layer_norm does.
_LOW_PRECISION = (torch.float16, torch.bfloat16)


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


COLLECTIVES: Counter = Counter()  # all-reduce calls made in this process: "forward" and "backward"


class _AllReduceSum(torch.autograd.Function):
    """Sum a tensor over all processes; the gradient of a sum is the sum of the gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        COLLECTIVES["forward"] += 1
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        COLLECTIVES["backward"] += 1
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_sum(x: torch.Tensor, group: object | None = None) -> torch.Tensor:
    """Differentiable sum of ``x`` (any shape) over every process in ``group`` (default: all)."""
    return _AllReduceSum.apply(x, group)
