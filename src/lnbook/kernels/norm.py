"""The Triton kernels behind :func:`layer_norm` and :func:`rms_norm`, and their autograd wrapper.

One kernel pair serves both norms: ``RMS`` (a compile-time flag) drops the mean. Rows that fit
in one block (``N <= BLOCK``) are loaded once and kept in registers; longer rows are processed
in a loop over column blocks.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .._checks import check_eps, check_float_tensor, describe

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _forward(
    X, Y, W, B, Mean, Rstd, N, eps, BLOCK: tl.constexpr, SINGLE: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr
):
    """One program normalizes one row of X (M, N) into Y and stores its mean and 1/sigma."""
    row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: M * N may exceed 2**31
    X += row * N
    Y += row * N
    cols = tl.arange(0, BLOCK)
    mean = tl.zeros([], dtype=tl.float32)
    if SINGLE:  # N <= BLOCK: the whole row in registers, one read of x, one write of y
        inside = cols < N
        x = tl.load(X + cols, mask=inside, other=0.0).to(tl.float32)
        if not RMS:
            mean = tl.sum(x, axis=0) / N
        d = tl.where(inside, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / N + eps)
        y = d * rstd * tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=inside)
    else:  # a long row: a pass for the mean, one for the variance, one to write y
        if not RMS:
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                acc += tl.load(X + start + cols, mask=start + cols < N, other=0.0).to(tl.float32)
            mean = tl.sum(acc, axis=0) / N
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            inside = start + cols < N
            d = tl.where(inside, tl.load(X + start + cols, mask=inside, other=0.0).to(tl.float32) - mean, 0.0)
            acc += d * d
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
        for start in range(0, N, BLOCK):
            inside = start + cols < N
            x = tl.load(X + start + cols, mask=inside, other=0.0).to(tl.float32)
            y = (x - mean) * rstd * tl.load(W + start + cols, mask=inside, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y += tl.load(B + start + cols, mask=inside, other=0.0).to(tl.float32)
            tl.store(Y + start + cols, y.to(Y.dtype.element_ty), mask=inside)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@triton.jit
def _backward(
    X, DY, DX, W, Mean, Rstd, DW, DB, M, N,
    BLOCK: tl.constexpr, SINGLE: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Program p computes dx for rows p, p + P, p + 2P, ... (P programs), and accumulates
    those rows' contributions to dW and db in row p of the float32 buffers DW and DB (P, N).

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w (RMS: no mean(g) term).
    Each buffer row belongs to one program, so no two programs ever write the same address.
    """
    p = tl.program_id(0).to(tl.int64)  # 64-bit offsets: M * N may exceed 2**31
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    if SINGLE:  # N <= BLOCK: dW and db partial sums stay in registers across this program's rows
        inside = cols < N
        w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        db = tl.zeros([BLOCK], dtype=tl.float32)
        for row in range(p, M, programs):
            x = tl.load(X + row * N + cols, mask=inside, other=0.0).to(tl.float32)
            dy = tl.load(DY + row * N + cols, mask=inside, other=0.0).to(tl.float32)
            mean = tl.load(Mean + row)
            rstd = tl.load(Rstd + row)
            xhat = tl.where(inside, (x - mean) * rstd, 0.0)
            g = dy * w
            dx = g - xhat * (tl.sum(g * xhat, axis=0) / N)
            if not RMS:
                dx -= tl.sum(g, axis=0) / N
            dx *= rstd
            tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=inside)
            dw += dy * xhat
            db += dy
        tl.store(DW + p * N + cols, dw, mask=inside)
        if HAS_BIAS:
            tl.store(DB + p * N + cols, db, mask=inside)
    else:  # long rows: one pass for the two row sums, one for dx and the partial sums in DW, DB
        for start in range(0, N, BLOCK):  # this program's buffer rows start at zero
            tl.store(DW + p * N + start + cols, tl.zeros([BLOCK], dtype=tl.float32), mask=start + cols < N)
            if HAS_BIAS:
                tl.store(DB + p * N + start + cols, tl.zeros([BLOCK], dtype=tl.float32), mask=start + cols < N)
        for row in range(p, M, programs):
            mean = tl.load(Mean + row)
            rstd = tl.load(Rstd + row)
            s1 = tl.zeros([BLOCK], dtype=tl.float32)
            s2 = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                inside = start + cols < N
                x = tl.load(X + row * N + start + cols, mask=inside, other=0.0).to(tl.float32)
                g = tl.load(DY + row * N + start + cols, mask=inside, other=0.0).to(tl.float32) * tl.load(
                    W + start + cols, mask=inside, other=0.0
                ).to(tl.float32)
                s1 += g
                s2 += g * tl.where(inside, (x - mean) * rstd, 0.0)
            c1 = tl.zeros([], dtype=tl.float32)
            if not RMS:
                c1 = tl.sum(s1, axis=0) / N
            c2 = tl.sum(s2, axis=0) / N
            for start in range(0, N, BLOCK):
                inside = start + cols < N
                x = tl.load(X + row * N + start + cols, mask=inside, other=0.0).to(tl.float32)
                dy = tl.load(DY + row * N + start + cols, mask=inside, other=0.0).to(tl.float32)
                xhat = tl.where(inside, (x - mean) * rstd, 0.0)
                g = dy * tl.load(W + start + cols, mask=inside, other=0.0).to(tl.float32)
                tl.store(DX + row * N + start + cols, ((g - c1 - xhat * c2) * rstd).to(DX.dtype.element_ty), mask=inside)
                partial = DW + p * N + start + cols
                tl.store(partial, tl.load(partial, mask=inside, other=0.0) + dy * xhat, mask=inside)
                if HAS_BIAS:
                    partial = DB + p * N + start + cols
                    tl.store(partial, tl.load(partial, mask=inside, other=0.0) + dy, mask=inside)


BACKWARD_BLOCK = 8192  # the backward pass keeps w, dw and db live across rows: fewer registers per row


def _block(n: int, element_size: int, max_block: int | None, backward: bool = False) -> int:
    """The column block: the row's length rounded up to a power of two, at most 64 KiB of input
    in the forward pass and 8192 columns in the backward pass (or ``max_block``)."""
    limit = max_block if max_block is not None else 65536 // element_size
    if backward and max_block is None:
        limit = min(limit, BACKWARD_BLOCK)
    return min(triton.next_power_of_2(n), limit)


def _warps(block: int) -> int:
    """Warps per program on a GPU: one per 256 columns of the block, between 1 and 16."""
    return min(max(block // 256, 1), 16)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, max_block: int | None) -> None:
    check_float_tensor(x, "x")
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension to normalize over, got shape {tuple(x.shape)}")
    n = x.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        check_float_tensor(p, name)
        if p.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), x's last dimension, got {tuple(p.shape)}")
        if p.device != x.device:
            raise ValueError(f"{name} is on {p.device} but x is on {x.device}")
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if x.is_cuda == interpreting:
        where = "on a CUDA GPU" if x.is_cuda else "on the CPU"
        need = "without TRITON_INTERPRET=1" if x.is_cuda else "through the interpreter: set TRITON_INTERPRET=1 before importing triton"
        raise RuntimeError(f"x is {where}; Triton can run these kernels there only {need}")
    if max_block is not None and (max_block < 16 or max_block & (max_block - 1)):
        raise ValueError(f"max_block must be a power of two >= 16, got {describe(max_block)}")


def _programs(m: int, device: torch.device) -> int:
    """How many programs share the backward pass's rows: one per multiprocessor on a GPU (each
    writes a row of the float32 partial-sum buffers, so more programs mean more traffic), at
    most 4 on a CPU."""
    if device.type == "cuda":
        return max(1, min(m, torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(m, 4))


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms, max_block):
        shape, n = x.shape, x.shape[-1]
        x2 = x.reshape(-1, n).contiguous()  # any strides in, rows of N contiguous elements out
        weight = weight.contiguous()
        bias = bias.contiguous() if bias is not None else None
        m = x2.shape[0]
        y = torch.empty_like(x2)
        mean = torch.empty(m, dtype=torch.float32, device=x.device)
        rstd = torch.empty(m, dtype=torch.float32, device=x.device)
        block = _block(n, x2.element_size(), max_block)
        if m:
            _forward[(m,)](x2, y, weight, bias if bias is not None else weight, mean, rstd, n, eps,
                           BLOCK=block, SINGLE=n <= block, RMS=rms, HAS_BIAS=bias is not None,
                           num_warps=_warps(block))
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.shape, ctx.rms, ctx.has_bias = shape, rms, bias is not None
        ctx.block = _block(n, x2.element_size(), max_block, backward=True)
        return y.reshape(shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        m, n = x2.shape
        dy2 = dy.reshape(-1, n).contiguous()
        dx = torch.empty_like(x2)
        programs = _programs(m, x2.device)
        dw = torch.empty(programs, n, dtype=torch.float32, device=x2.device)
        db = torch.empty(programs, n, dtype=torch.float32, device=x2.device) if ctx.has_bias else dw
        if m:
            _backward[(programs,)](x2, dy2, dx, weight, mean, rstd, dw, db, m, n, BLOCK=ctx.block, SINGLE=n <= ctx.block,
                                   RMS=ctx.rms, HAS_BIAS=ctx.has_bias, num_warps=_warps(ctx.block))
        else:
            dw.zero_()
            db.zero_()
        grad_w = dw.sum(0).to(weight.dtype)  # the final reduction, in a fixed order
        grad_b = db.sum(0).to(weight.dtype) if ctx.has_bias else None
        return dx.reshape(ctx.shape), grad_w, grad_b, None, None, None


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *, max_block: int | None = None
) -> torch.Tensor:
    """Fused LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Args:
        x: ``(*, N)``, float16, bfloat16 or float32, on a CUDA GPU (compiled) or on the CPU
            (interpreted); any strides. Statistics are computed in float32.
        weight, bias: ``(N,)`` on x's device; ``bias`` may be None.
        eps: added to the biased variance, > 0.
        max_block: the largest column block a program loads at once (a power of two); longer
            rows are processed in a loop. By default 64 KiB of input.

    Returns ``y`` with x's shape and dtype. Differentiable once, in x, weight and bias.
    """
    _check(x, weight, bias, max_block)
    return _Norm.apply(x, weight, bias, check_eps(eps), False, max_block)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, max_block: int | None = None) -> torch.Tensor:
    """Fused RMSNorm over the last dimension: ``x / sqrt(mean(x**2) + eps) * weight``.

    Same arguments, dtypes and devices as :func:`layer_norm`, without a bias.
    """
    _check(x, weight, None, max_block)
    return _Norm.apply(x, weight, None, check_eps(eps), True, max_block)
