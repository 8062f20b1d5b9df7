"""Torch functions with hand-written backward passes.

``layer_norm`` is a :class:`torch.autograd.Function`: its forward saves only the input, the
per-row mean and 1/σ (``rstd``), and its backward applies the closed-form gradient derived in
chapter 03, so a first derivative records no graph through the statistics. The backward is
made of differentiable torch operations, so a second derivative (a gradient penalty) is exact; the
function also has a forward-mode formula and works under ``torch.func`` (``vmap``,
``grad``, ``jacrev``, ``jacfwd``, ``functional_call``).

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

from ._checks import check_eps, check_float_tensor, check_normalized_shape, check_shape, check_trailing

# Low-precision inputs are normalized in float32, as torch.nn.functional.layer_norm does.
_LOW_PRECISION = (torch.float16, torch.bfloat16)


class _LayerNorm(torch.autograd.Function):
    """y = xhat * w + b over rows of D features: x is (M, D), weight and bias (D,) or None.

    The forward returns y and also the row statistics mean and rstd (M, 1), which it saves
    for the backward. Because they are outputs, autograd knows they depend on x: a second
    derivative (a gradient penalty) differentiates the backward's torch operations and
    reaches x through the saved statistics too, so it is exact. ``torch.func.vmap`` batches
    the function op by op. Forward-mode AD is :class:`_DualLayerNorm`'s.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x, weight, bias, eps):
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
        return y.to(x.dtype), mean, rstd

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, _ = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.save_for_forward(x, weight, mean, rstd)
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.set_materialize_grads(False)  # gradients of unused outputs arrive as None

    @staticmethod
    def backward(ctx, dy, dmean, drstd):
        x, weight, mean, rstd = ctx.saved_tensors
        compute = mean.dtype
        xhat = (x.to(compute) - mean) * rstd
        dx = dw = db = None
        if dy is not None:
            dy = dy.to(compute)
            g = dy * weight.to(compute) if weight is not None else dy
            if ctx.needs_input_grad[0]:
                dx = rstd * (g - g.mean(dim=-1, keepdim=True) - xhat * (g * xhat).mean(dim=-1, keepdim=True))
            if ctx.needs_input_grad[1]:
                dw = (dy * xhat).sum(dim=0).to(weight.dtype)
            if ctx.needs_input_grad[2]:
                db = dy.sum(dim=0).to(ctx.bias_dtype)
        if ctx.needs_input_grad[0] and (dmean is not None or drstd is not None):
            # Only in a second derivative: the first backward used mean and rstd, which depend
            # on x through d mean / dx = 1/D and d rstd / dx = -rstd**2 * xhat / D.
            through = xhat.new_zeros(())
            if dmean is not None:
                through = through + dmean
            if drstd is not None:
                through = through - drstd * rstd * rstd * xhat
            through = (through / x.shape[-1]).expand_as(xhat)
            dx = through if dx is None else dx + through
        return (None if dx is None else dx.to(x.dtype)), dw, db, None


class _DualLayerNorm(_LayerNorm):
    """:class:`_LayerNorm` with a forward-mode formula (``jvp``: torch.func.jvp, jacfwd,
    forward_ad). ``torch.compile`` cannot trace a custom jvp, so compiled code uses the parent."""

    @staticmethod
    def jvp(ctx, dx, dw, db, _):
        x, weight, mean, rstd = ctx.saved_tensors
        compute = mean.dtype
        xhat = (x.to(compute) - mean) * rstd
        dx = torch.zeros_like(xhat) if dx is None else dx.to(compute)
        dmean = dx.mean(dim=-1, keepdim=True)
        drstd = -rstd * rstd * (xhat * dx).mean(dim=-1, keepdim=True)
        dxhat = rstd * (dx - dmean) + xhat * drstd / rstd
        dy = dxhat * weight.to(compute) if weight is not None else dxhat
        if dw is not None:
            dy = dy + xhat * dw.to(compute)
        if db is not None:
            dy = dy + db.to(compute)
        return dy.to(x.dtype), dmean, drstd


LayerNormFunction = _LayerNorm
"""The ``torch.autograd.Function`` behind :func:`layer_norm` (forward returns ``y, mean, rstd``), for
variants that reuse its forward and backward, such as the planted bugs of ``lnbook.testing``."""


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
    function = _LayerNorm if torch.compiler.is_compiling() else _DualLayerNorm
    return function.apply(x2, w2, b2, eps)[0].reshape(x.shape)


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
