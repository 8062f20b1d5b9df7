"""Swap and mutation tests for a LayerNorm implementation (chapter 04).

A *swap test* puts a norm in place of the LayerNorms of a float64 Transformer encoder layer and
requires the loss and every gradient to stay the same. A test is only worth something if it can
fail, so the module also holds a *mutant*, :class:`NoMeanTermLayerNorm`, whose backward pass
forgets the mean term, and which the test must reject.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from ._checks import check_bool, check_number
from .functional import LayerNormFunction
from .norms import LayerNorm, replace_layer_norms, swap_modules

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _NoMeanTerm(torch.autograd.Function):
    """LayerNorm over the last axis whose backward pass leaves out ``-mean(g)``: a planted bug."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        centered = x - x.mean(-1, keepdim=True)
        rstd = torch.rsqrt((centered * centered).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(centered * rstd, rstd, weight)
        return centered * rstd * weight + bias

    @staticmethod
    def backward(ctx, dy):
        xhat, rstd, weight = ctx.saved_tensors
        g = dy * weight
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))  # the bug: no "- g.mean(-1)"
        lead = tuple(range(dy.ndim - 1))
        return dx, (dy * xhat).sum(lead), dy.sum(lead), None


class NoMeanTermLayerNorm(LayerNorm):
    """:class:`lnbook.norms.LayerNorm` with the mutant backward pass (forward unchanged), over
    one trailing dimension: ``x (..., H)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            raise ValueError(f"NoMeanTermLayerNorm normalizes one trailing dimension, got {self.normalized_shape}")
        return _NoMeanTerm.apply(x, self.weight, self.bias, self.eps)


def mean_square_loss(out: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """``mean(out**2)``: natural, but its gradient at a LayerNorm's output is proportional to
    x̂ when the gain is 1 and the bias 0, which LayerNorm's backward maps to almost nothing."""
    return out.pow(2).mean()


def random_direction_loss(out: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """``sum(out * R)`` for a fixed random ``R`` of ``out``'s shape: its gradient at ``out`` is
    ``R``, a random direction."""
    return (out * R).sum()


def swap_gaps(norm_class: type[torch.nn.Module], loss_fn: LossFn, random_affine: bool = False) -> tuple[float, float, float]:
    """Swap ``norm_class`` in for the two LayerNorms of a float64 Transformer encoder layer
    (width 32, 4 heads, tokens ``(2, 7, 32)``) and compare with torch's.

    ``random_affine``: draw the norms' gains and biases from N(1, 0.5) and N(0, 0.5) first, so
    that a swap that lost or rounded them would show. Returns the loss's relative gap, the
    gradients' largest absolute gap (over the input and every parameter), and their largest gap
    relative to each gradient's largest entry.
    """
    if not (isinstance(norm_class, type) and issubclass(norm_class, torch.nn.Module)):
        raise TypeError(f"norm_class must be a torch.nn.Module subclass, got {norm_class!r}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable (out, R) -> loss, got {loss_fn!r}")
    check_bool(random_affine, "random_affine")
    torch.manual_seed(0)
    reference_layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True).double()
    if random_affine:
        with torch.no_grad():
            for norm in (reference_layer.norm1, reference_layer.norm2):
                norm.weight.normal_(1.0, 0.5), norm.bias.normal_(0.0, 0.5)
    swapped = copy.deepcopy(reference_layer)
    if norm_class is LayerNorm:
        replaced = replace_layer_norms(swapped)
    else:
        replaced = swap_modules(
            swapped, lambda m: norm_class(m.normalized_shape, m.eps) if isinstance(m, torch.nn.LayerNorm) else None
        )
    if replaced != 2:
        raise RuntimeError(f"expected to swap the layer's 2 LayerNorms, swapped {replaced}")
    tokens = torch.randn(2, 7, 32, dtype=torch.float64, requires_grad=True)
    R = torch.randn(2, 7, 32, dtype=torch.float64)
    losses, grads = [], []
    for layer in (reference_layer, swapped):
        losses.append(loss_fn(layer(tokens), R))
        grads.append(torch.autograd.grad(losses[-1], [tokens, *layer.parameters()]))
    return (
        abs(losses[0] - losses[1]).item() / abs(losses[0]).item(),
        max((a - b).abs().max().item() for a, b in zip(*grads)),
        max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(*grads)),
    )


def swap_test(norm_class: type[torch.nn.Module], tol: float = 1e-10) -> None:
    """The swap test: random gains and biases, loss :func:`random_direction_loss`; raises
    ``AssertionError`` unless the loss and every gradient equal torch's within ``tol``, relative
    to the loss and to each gradient's largest entry."""
    tol = check_number(tol, "tol", "a positive number", lambda v: v > 0)
    loss_gap, _, grad_gap = swap_gaps(norm_class, random_direction_loss, random_affine=True)
    if not (loss_gap < tol and grad_gap < tol):
        raise AssertionError(f"a gradient is off by {grad_gap:.1e} of its largest entry")


class _ConstantStatistics(torch.autograd.Function):
    """lnbook's LayerNorm forward and backward, with mean and rstd saved as constants instead of
    returned as outputs: first derivatives are right, second derivatives are not (a planted bug)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):  # type: ignore[override]
        y, mean, rstd = LayerNormFunction.forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)  # computed inside forward: constants to autograd
        ctx.bias_dtype = bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        return LayerNormFunction.backward(ctx, dy, None, None)


def constant_statistics_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last axis of ``x`` ``(..., H)`` with ``weight``, ``bias`` ``(H,)``, through
    the planted bug :class:`_ConstantStatistics`."""
    eps = check_number(eps, "eps", "a positive number", lambda v: v > 0)
    return _ConstantStatistics.apply(x, weight, bias, eps)


class ConstantStatisticsLayerNorm(LayerNorm):
    """lnbook's LayerNorm module whose second derivative is wrong: its statistics are saved as
    constants (:class:`_ConstantStatistics`). Forward and first derivative are ours."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return constant_statistics_layer_norm(x, self.weight, self.bias, self.eps)


def penalty_and_gradients(norm_class: type[torch.nn.Module], seed: int = 0) -> list[torch.Tensor]:
    """A WGAN-GP gradient penalty through a small float64 critic that normalizes with
    ``norm_class(16)``, and the penalty's gradients with respect to the critic's parameters (all
    but the last bias, on which the input gradient does not depend): ``[penalty, *grads]``."""
    if not (isinstance(norm_class, type) and issubclass(norm_class, torch.nn.Module)):
        raise TypeError(f"norm_class must be a torch.nn.Module subclass, got {norm_class!r}")
    torch.manual_seed(seed)
    critic = torch.nn.Sequential(torch.nn.Linear(12, 16), norm_class(16), torch.nn.LeakyReLU(0.2),
                                 torch.nn.Linear(16, 1)).double()
    with torch.no_grad():  # gain and bias away from 1 and 0
        critic[1].weight.normal_(1.0, 0.5), critic[1].bias.normal_(0.0, 0.5)
    x = torch.randn(8, 12, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
    penalty = ((g.norm(dim=1) - 1) ** 2).mean()
    return [penalty, *torch.autograd.grad(penalty, list(critic.parameters())[:-1])]


def penalty_gradient_gap(norm_class: type[torch.nn.Module], seed: int = 0) -> tuple[float, float]:
    """The penalty of :func:`penalty_and_gradients` with ``norm_class`` and the largest gap of its
    gradients from torch's LayerNorm's, relative to each gradient's largest entry."""
    ours, torchs = penalty_and_gradients(norm_class, seed), penalty_and_gradients(torch.nn.LayerNorm, seed)
    gap = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(ours[1:], torchs[1:]))
    return ours[0].item(), gap


def sixteen_bit_errors(fn: Callable[..., torch.Tensor], dtype: torch.dtype, rows: int = 64, H: int = 256,
                       seed: int = 0, param_dtype: torch.dtype | None = None) -> list[float]:
    """The largest error of ``fn(x, H, weight, bias)`` and of its gradients with respect to x,
    weight and bias, in ``dtype`` (float16 or bfloat16), against torch's LayerNorm in float64 on
    the same rounded inputs ``x`` ``(rows, H)``: each relative to the result's largest entry, in
    units of ``dtype``'s rounding unit u. ``param_dtype``: the weight and bias's type (default
    ``dtype``; ``torch.float32`` is autocast's case of 16-bit activations with float32
    parameters, whose gradients come back in float32). Returns ``[y, dx, dweight, dbias]``."""
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    param_dtype = dtype if param_dtype is None else param_dtype
    if param_dtype not in (dtype, torch.float32):
        raise ValueError(f"param_dtype must be dtype ({dtype}) or torch.float32, got {param_dtype!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    g = torch.Generator().manual_seed(seed)
    x, dy = (torch.randn(rows, H, generator=g) * 2 + 1).to(dtype), torch.randn(rows, H, generator=g).to(dtype)
    w, b = (1 + 0.5 * torch.randn(H, generator=g)).to(param_dtype), (0.5 * torch.randn(H, generator=g)).to(param_dtype)

    def outputs(x, w, b, dy, f):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        y = f(x, H, w, b)
        return [y, *torch.autograd.grad(y, (x, w, b), dy)]

    torch_ln = lambda x, n, w, b: torch.nn.functional.layer_norm(x, (n,), w, b)  # noqa: E731
    truth = outputs(*(t.double() for t in (x, w, b, dy)), torch_ln)
    got = outputs(x, w, b, dy, fn)
    expected = [dtype, dtype, param_dtype, param_dtype]
    if [t.dtype for t in got] != expected:
        raise AssertionError(f"fn returned {[t.dtype for t in got]}, expected {expected}")
    u = torch.finfo(dtype).eps / 2
    return [((t.double() - r).abs().max() / r.abs().max()).item() / u for t, r in zip(got, truth)]
