"""The Triton kernels behind :func:`layer_norm` and :func:`rms_norm`, and the custom ops around them.

One kernel set serves both norms: ``RMS`` (a compile-time flag) drops the mean. How a row is
tiled (block, rows per tile, warps, whole row or column blocks) comes from
:func:`lnbook.kernels.tiling.plan`, the function the compile check uses too.

The kernels are registered as PyTorch custom ops (``lnbook::norm_forward``,
``lnbook::norm_backward``) with fake implementations and an autograd formula, so that
``torch.compile(fullgraph=True)`` can trace a model that uses them without a graph break.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import torch.autograd.forward_ad as forward_ad
import triton
import triton.language as tl

from .._checks import check_eps, check_float_tensor
from .tiling import DTYPES, Plan, plan


# The kernels call only Triton's builtins and their own jit functions, never the jit functions of
# Triton's standard library (tl.zeros, tl.sum, tl.cdiv): those are compiled-only objects when
# triton was imported before TRITON_INTERPRET=1 was set (by torch._dynamo, torch_geometric, or
# the user), and Triton's interpreter then refuses to call them.
@triton.jit
def _sum(x, axis: tl.constexpr):
    """tl.sum for float32: the builtin reduction with the standard library's own combine
    function, which the interpreter recognizes (and runs as one NumPy sum) and never calls."""
    return tl.reduce(x, axis, tl.standard._sum_combine)


# Triton's interpreter rounds a conversion to bfloat16 toward zero, where a GPU rounds to nearest,
# ties to even (and keeps NaNs). Read once, when the kernels are defined, as Triton reads it.
_ROUND_BY_BITS = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


@triton.jit
def _rounded(v, DTYPE: tl.constexpr):
    """v (float32) rounded to DTYPE, to nearest, ties to even, and back to float32. Under the
    interpreter bfloat16 is rounded by its bits, a NaN kept a NaN (the rounding's carry would
    turn some NaNs into zero or infinity); compiled, by the GPU's own conversion."""
    if DTYPE == tl.bfloat16 and _ROUND_BY_BITS:
        bits = v.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    else:
        return v.to(DTYPE).to(tl.float32)


@triton.jit
def _load_row(X, R, S, offsets, inside, HAS_RESIDUAL: tl.constexpr, STORE_SUM: tl.constexpr):
    """x as float32; with a residual, x + r rounded to X's dtype (what ``x + r`` gives in torch),
    also stored to S when STORE_SUM."""
    x = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = _rounded(x + tl.load(R + offsets, mask=inside, other=0.0).to(tl.float32), X.dtype.element_ty)
        if STORE_SUM:
            tl.store(S + offsets, x.to(S.dtype.element_ty), mask=inside)
    return x


@triton.jit
def _forward(
    X, R, S, Y, W, B, Mean, Rstd, M, N, eps,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """Program t normalizes rows t*ROWS ... t*ROWS + ROWS - 1 of X (M, N) into Y and stores
    their mean and 1/sigma (float32, (M,)). HAS_RESIDUAL: normalizes s = X + R instead, and
    stores s in S (the fused residual add of a Pre-LN block)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # 64-bit: M * N may exceed 2**31
    row_ok = rows < M
    cols = tl.arange(0, BLOCK)
    mean = tl.full([ROWS], 0.0, tl.float32)
    if SINGLE:  # N <= BLOCK: the tile in registers, one read of x, one write of y
        inside = row_ok[:, None] & (cols < N)[None, :]
        offsets = rows[:, None] * N + cols[None, :]
        x = _load_row(X, R, S, offsets, inside, HAS_RESIDUAL, True)
        if not RMS:
            mean = _sum(x, axis=1) / N
        d = tl.where(inside, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(_sum(d * d, axis=1) / N + eps)
        y = d * rstd[:, None] * tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=inside)
    else:  # a long row (ROWS == 1): a pass for the mean, one for the variance, one to write y
        if not RMS:
            acc = tl.full([ROWS, BLOCK], 0.0, tl.float32)
            for start in range(0, N, BLOCK):
                inside = row_ok[:, None] & (start + cols < N)[None, :]
                acc += _load_row(X, R, S, rows[:, None] * N + start + cols[None, :], inside, HAS_RESIDUAL, False)
            mean = _sum(acc, axis=1) / N
        acc = tl.full([ROWS, BLOCK], 0.0, tl.float32)
        for start in range(0, N, BLOCK):
            inside = row_ok[:, None] & (start + cols < N)[None, :]
            x = _load_row(X, R, S, rows[:, None] * N + start + cols[None, :], inside, HAS_RESIDUAL, False)
            d = tl.where(inside, x - mean[:, None], 0.0)
            acc += d * d
        rstd = 1.0 / tl.sqrt(_sum(acc, axis=1) / N + eps)
        for start in range(0, N, BLOCK):
            inside = row_ok[:, None] & (start + cols < N)[None, :]
            offsets = rows[:, None] * N + start + cols[None, :]
            x = _load_row(X, R, S, offsets, inside, HAS_RESIDUAL, True)  # the sum is stored in the last pass
            y = (x - mean[:, None]) * rstd[:, None] * tl.load(W + start + cols, mask=start + cols < N, other=0.0).to(tl.float32)[None, :]
            if HAS_BIAS:
                y += tl.load(B + start + cols, mask=start + cols < N, other=0.0).to(tl.float32)[None, :]
            tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=inside)
    tl.store(Mean + rows, mean, mask=row_ok)
    tl.store(Rstd + rows, rstd, mask=row_ok)


@triton.jit
def _row_sums(X, DY, W, Mean, Rstd, C1, C2, N, BLOCK: tl.constexpr, RMS: tl.constexpr):
    """Long rows, before :func:`_backward`: program r stores row r's mean(g) and mean(g * xhat)
    with g = dy * w (float32, (M,)); RMS: mean(g) is 0."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    s1 = tl.full([BLOCK], 0.0, tl.float32)
    s2 = tl.full([BLOCK], 0.0, tl.float32)
    for start in range(0, N, BLOCK):
        inside = start + cols < N
        x = tl.load(X + row * N + start + cols, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(DY + row * N + start + cols, mask=inside, other=0.0).to(tl.float32) * tl.load(
            W + start + cols, mask=inside, other=0.0
        ).to(tl.float32)
        if not RMS:
            s1 += g
        s2 += g * tl.where(inside, (x - mean) * rstd, 0.0)
    tl.store(C1 + row, _sum(s1, axis=0) / N)
    tl.store(C2 + row, _sum(s2, axis=0) / N)


@triton.jit
def _backward(
    X, DY, DS, DX, W, Mean, Rstd, C1, C2, DW, DB, M, N,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_DSUM: tl.constexpr,
):
    """Program (p, c) of a (P, ceil(N / BLOCK)) grid computes dx in column block c for row tiles
    p, p + P, p + 2P, ... and those rows' sums of dy * xhat and dy in the same columns, which it
    keeps in registers and writes once, to row p of the float32 buffers DW and DB (P, N).

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w (RMS: no mean(g) term);
    the two means come from the tile itself (SINGLE) or from :func:`_row_sums` (C1, C2).
    HAS_DSUM (the fused residual add): X holds the sum s, and the gradient DS that reached s
    directly is added to dx, the gradient of both addends.
    Each buffer element belongs to one program: no atomics, no locks, the same bits every run.
    """
    p = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < N
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.full([BLOCK], 0.0, tl.float32)
    db = tl.full([BLOCK], 0.0, tl.float32)
    for tile in range(p, (M + ROWS - 1) // ROWS, programs):
        rows = tile * ROWS + tl.arange(0, ROWS).to(tl.int64)  # 64-bit offsets: M * N may exceed 2**31
        row_ok = rows < M
        inside = row_ok[:, None] & col_ok[None, :]
        offsets = rows[:, None] * N + cols[None, :]
        x = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=inside, other=0.0).to(tl.float32)
        mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
        xhat = tl.where(inside, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        if SINGLE:
            c2 = _sum(g * xhat, axis=1) / N
            c1 = tl.full([ROWS], 0.0, tl.float32)
            if not RMS:
                c1 = _sum(g, axis=1) / N
        else:
            c1 = tl.load(C1 + rows, mask=row_ok, other=0.0)
            c2 = tl.load(C2 + rows, mask=row_ok, other=0.0)
        dx = (g - c1[:, None] - xhat * c2[:, None]) * rstd[:, None]
        if HAS_DSUM:
            dx += tl.load(DS + offsets, mask=inside, other=0.0).to(tl.float32)
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=inside)
        dw += _sum(dy * xhat, axis=0)
        if HAS_BIAS:
            db += _sum(dy, axis=0)
    tl.store(DW + p * N + cols, dw, mask=col_ok)
    if HAS_BIAS:
        tl.store(DB + p * N + cols, db, mask=col_ok)


# The backward grid: P row groups x the column blocks. Each program writes one row of the
# float32 partial sums (4 bytes a column, 8 with a bias, read again by the final sum), so every
# program must cover enough rows for that to stay small next to the rows' own traffic (bfloat16:
# 6 bytes a column a row); and there must be enough programs to keep every multiprocessor busy.
MIN_ROWS_PER_PROGRAM = 16  # partial sums <= 16 / (6 * 16) = 1/6 of a bfloat16 pass's traffic
CPU_PROGRAMS = 4


def backward_waves(warps: int) -> int:
    """Backward programs per multiprocessor the grid aims at: as many as stay resident together
    on a T4, an A100 and an H100 (the compile check's occupancy, checked by the tests): three
    programs of up to 8 warps (at most 80 registers a thread), two of 16 (at most 64), one of 32
    (a whole 8192-column row, or a 4096-column float32 row)."""
    return 1 if warps > 16 else 2 if warps > 8 else 3


def backward_programs(m: int, n: int, the_plan: Plan, multiprocessors: int | None) -> int:
    """P, the row groups of the backward grid (P, ceil(n / block)) for ``m`` rows:
    :func:`backward_waves` programs per multiprocessor, but each covering at least
    ``MIN_ROWS_PER_PROGRAM`` rows; ``multiprocessors=None`` (the interpreter): at most 4."""
    tiles = -(-m // the_plan.rows)
    if multiprocessors is None:
        return max(1, min(tiles, CPU_PROGRAMS))
    column_blocks = -(-n // the_plan.block)
    want = max(1, -(-multiprocessors * backward_waves(the_plan.warps) // column_blocks))
    return max(1, min(want, -(-m // MIN_ROWS_PER_PROGRAM)))


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _on(device: torch.device):
    """Launch on ``device``'s GPU, whichever GPU is current (Triton launches on the current one)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _out_buffer(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's output buffer. The interpreter rounds float32 to bfloat16 toward zero, so
    there the kernel writes float32 and torch rounds (to nearest, ties to even)."""
    if _interpreting() and dtype == torch.bfloat16:
        dtype = torch.float32
    return torch.empty(*like.shape, dtype=dtype, device=like.device)


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _launch_forward(x, residual, weight, bias, eps, rms, max_block, out_dtype):
    m, n = x.shape
    y = _out_buffer(x, out_dtype)
    total = _out_buffer(x, x.dtype) if residual is not None else y
    mean = torch.empty(m, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        p = plan(n, x.dtype, max_block=max_block)
        with _on(x.device):
            _forward[(-(-m // p.rows),)](
                x, residual if residual is not None else x, total, y, weight, bias if bias is not None else weight, mean, rstd,
                m, n, eps, BLOCK=p.block, ROWS=p.rows, SINGLE=p.single, RMS=rms, HAS_BIAS=bias is not None,
                HAS_RESIDUAL=residual is not None, num_warps=p.warps, maxnreg=p.maxnreg,
            )
    return y.to(out_dtype), total.to(x.dtype), mean, rstd


@torch.library.custom_op("lnbook::norm_forward", mutates_args=())
def norm_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool, max_block: int | None,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (M, N) contiguous -> y (M, N) in ``out_dtype``, mean and rstd (M,) float32."""
    y, _, mean, rstd = _launch_forward(x, None, weight, bias, eps, rms, max_block, out_dtype)
    return y, mean, rstd


@norm_forward.register_fake
def _(x, weight, bias, eps, rms, max_block, out_dtype):
    m = x.shape[0]
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(m, dtype=torch.float32), x.new_empty(m, dtype=torch.float32)


@torch.library.custom_op("lnbook::add_norm_forward", mutates_args=())
def add_norm_forward(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
    max_block: int | None, out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, residual (M, N) contiguous, same dtype -> y = norm(x + residual) in ``out_dtype``,
    s = x + residual in x's dtype, mean and rstd of s (M,) float32; one pass."""
    return _launch_forward(x, residual, weight, bias, eps, rms, max_block, out_dtype)


@add_norm_forward.register_fake
def _(x, residual, weight, bias, eps, rms, max_block, out_dtype):
    m = x.shape[0]
    return (x.new_empty(x.shape, dtype=out_dtype), torch.empty_like(x), x.new_empty(m, dtype=torch.float32),
            x.new_empty(m, dtype=torch.float32))


@torch.library.custom_op("lnbook::norm_backward", mutates_args=())
def norm_backward(
    dy: torch.Tensor, dsum: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
    has_bias: bool, rms: bool, max_block: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, x (M, N) contiguous -> dx (M, N) in x's dtype, dweight (N,) and dbias (N,; empty
    without a bias) in weight's dtype. ``dsum`` (M, N) or None: a gradient that reached x
    directly (the sum output of the fused residual add), added to dx."""
    m, n = x.shape
    p = plan(n, x.dtype, backward=True, max_block=max_block)
    programs = backward_programs(m, n, p, None if x.device.type != "cuda" else _multiprocessors(x.device.index or 0))
    dx = _out_buffer(x, x.dtype)
    dw = torch.empty(programs, n, dtype=torch.float32, device=x.device)
    db = torch.empty(programs, n, dtype=torch.float32, device=x.device) if has_bias else dw
    if m:
        with _on(x.device):
            c1 = c2 = mean
            if not p.single:
                c1, c2 = torch.empty_like(mean), torch.empty_like(mean)
                _row_sums[(m,)](x, dy, weight, mean, rstd, c1, c2, n, BLOCK=p.block, RMS=rms, num_warps=p.warps, maxnreg=p.maxnreg)
            _backward[(programs, -(-n // p.block))](
                x, dy, dsum if dsum is not None else dy, dx, weight, mean, rstd, c1, c2, dw, db, m, n,
                BLOCK=p.block, ROWS=p.rows, SINGLE=p.single, RMS=rms, HAS_BIAS=has_bias, HAS_DSUM=dsum is not None,
                num_warps=p.warps, maxnreg=p.maxnreg,
            )
    else:
        dw.zero_()
        db.zero_()
    grad_w = dw.sum(0).to(weight.dtype)  # the final reduction, in a fixed order
    grad_b = db.sum(0).to(weight.dtype) if has_bias else weight.new_empty(0)
    return dx.to(x.dtype), grad_w, grad_b


@norm_backward.register_fake
def _(dy, dsum, x, weight, mean, rstd, has_bias, rms, max_block):
    return torch.empty_like(x), torch.empty_like(weight), weight.new_empty(weight.shape if has_bias else (0,))


def _setup_context(ctx, inputs, output):
    x, weight, bias, eps, rms, max_block, out_dtype = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.has_bias, ctx.rms, ctx.max_block = bias is not None, rms, max_block


def _backward_formula(ctx, dy, dmean, drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = norm_backward(dy.contiguous(), None, x, weight, mean, rstd, ctx.has_bias, ctx.rms, ctx.max_block)
    return dx, dw, db if ctx.has_bias else None, None, None, None, None


norm_forward.register_autograd(_backward_formula, setup_context=_setup_context)


def _add_setup_context(ctx, inputs, output):
    x, residual, weight, bias, eps, rms, max_block, out_dtype = inputs
    _, total, mean, rstd = output
    ctx.save_for_backward(total, weight, mean, rstd)
    ctx.has_bias, ctx.rms, ctx.max_block = bias is not None, rms, max_block
    ctx.set_materialize_grads(False)  # an unused sum gets no zero gradient to write and read back


def _add_backward_formula(ctx, dy, dsum, dmean, drstd):
    total, weight, mean, rstd = ctx.saved_tensors
    if dy is None:  # only the sum was used
        dy = torch.zeros_like(total)
    dx, dw, db = norm_backward(dy.contiguous(), dsum.contiguous() if dsum is not None else None, total, weight, mean, rstd,
                               ctx.has_bias, ctx.rms, ctx.max_block)
    return dx, dx, dw, db if ctx.has_bias else None, None, None, None, None


add_norm_forward.register_autograd(_add_backward_formula, setup_context=_add_setup_context)


NO_DOUBLE_BACKWARD = (
    "lnbook.kernels' fused norms have no double backward: their backward is a Triton kernel "
    "without a derivative of its own, and a gradient penalty (WGAN-GP) differentiates it. Use "
    "lnbook.norms.LayerNorm (or torch.nn.LayerNorm) where a second derivative passes through the norm"
)
NO_FORWARD_AD = (
    "lnbook.kernels' fused norms have no forward-mode AD (torch.func.jvp, jacfwd, "
    "torch.autograd.forward_ad): a torch.library custom op cannot carry a jvp formula, and "
    "without one torch would return a zero tangent. Use lnbook.norms.LayerNorm or "
    "torch.nn.LayerNorm there"
)
NO_FUNC_GRAD = (
    "lnbook.kernels' fused norms do not run under torch.func's gradient transforms (grad, vjp, "
    "jacrev, per-sample gradients): torch cannot apply them to a torch.library custom op's "
    "autograd formula. torch.func.vmap and torch.autograd.grad (is_grads_batched too) work; "
    "use lnbook.norms.LayerNorm or torch.nn.LayerNorm for torch.func.grad"
)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(NO_DOUBLE_BACKWARD)


norm_backward.register_autograd(_no_double_backward)


def _each_member(op, info, in_dims, *args):
    """vmap rule that calls ``op`` once per member of the vmapped dimension and stacks the
    results: exact for any inputs, one launch per member."""
    outputs = [
        op(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims))) for i in range(info.batch_size)
    ]
    return tuple(torch.stack(parts) for parts in zip(*outputs)), (0,) * len(outputs[0])


def _rows_batched(in_dims, rows: int) -> bool:
    """Whether only the first ``rows`` arguments (x, and the residual) are vmapped."""
    return all(d is None for d in in_dims[rows:])


@norm_forward.register_vmap
def _(info, in_dims, x, weight, bias, eps, rms, max_block, out_dtype):
    if not _rows_batched(in_dims, 1):  # one weight per member: one launch per member
        return _each_member(norm_forward, info, in_dims, x, weight, bias, eps, rms, max_block, out_dtype)
    x = x.movedim(in_dims[0], 0)
    b, m, n = x.shape
    y, mean, rstd = norm_forward(x.reshape(b * m, n), weight, bias, eps, rms, max_block, out_dtype)  # one matrix of rows
    return (y.reshape(b, m, n), mean.reshape(b, m), rstd.reshape(b, m)), (0, 0, 0)


@add_norm_forward.register_vmap
def _(info, in_dims, x, residual, weight, bias, eps, rms, max_block, out_dtype):
    if not _rows_batched(in_dims, 2):
        return _each_member(add_norm_forward, info, in_dims, x, residual, weight, bias, eps, rms, max_block, out_dtype)
    b = info.batch_size
    x, residual = (t.movedim(d, 0) if d is not None else t.expand(b, *t.shape) for t, d in zip((x, residual), in_dims))
    m, n = x.shape[1:]
    y, total, mean, rstd = add_norm_forward(x.reshape(b * m, n), residual.reshape(b * m, n), weight, bias, eps, rms,
                                            max_block, out_dtype)
    return (y.reshape(b, m, n), total.reshape(b, m, n), mean.reshape(b, m), rstd.reshape(b, m)), (0, 0, 0, 0)


@norm_backward.register_vmap
def _(info, in_dims, dy, dsum, x, weight, mean, rstd, has_bias, rms, max_block):
    # dweight sums over rows, so members cannot share a launch: each needs its own sum.
    return _each_member(norm_backward, info, in_dims, dy, dsum, x, weight, mean, rstd, has_bias, rms, max_block)


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
        if p.dtype not in DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {p.dtype}")
        if p.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), x's last dimension, got {tuple(p.shape)}")
        if p.device != x.device:
            raise ValueError(f"{name} is on {p.device} but x is on {x.device}")
    if x.is_cuda == _interpreting():
        where = "on a CUDA GPU" if x.is_cuda else "on the CPU"
        need = "without TRITON_INTERPRET=1" if x.is_cuda else "through the interpreter: set TRITON_INTERPRET=1 before importing triton"
        raise RuntimeError(f"x is {where}; Triton can run these kernels there only {need}")
    plan(n, x.dtype, max_block=max_block)  # raises on a bad max_block


@functools.lru_cache(maxsize=None)
def _autocast_layer_norm_dtype(device_type: str, autocast_dtype: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """The dtype torch.nn.LayerNorm returns under this autocast: asked of torch itself, once
    (CUDA's autocast runs layer_norm in float32, the CPU's does not)."""
    probe = torch.zeros(1, 2, dtype=dtype, device=device_type)
    with torch.autocast(device_type, dtype=autocast_dtype):
        return torch.nn.functional.layer_norm(probe, (2,)).dtype


def output_dtype(x: torch.Tensor, rms: bool) -> torch.dtype:
    """The dtype of the fused norm's output for ``x``: x's dtype, except that under
    ``torch.autocast`` the LayerNorm returns what ``torch.nn.LayerNorm`` returns there (float32
    on CUDA). RMSNorm matches :class:`lnbook.norms.RMSNorm`, which returns x's dtype."""
    if rms or not torch.is_autocast_enabled(x.device.type):
        return x.dtype
    return _autocast_layer_norm_dtype(x.device.type, torch.get_autocast_dtype(x.device.type), x.dtype)


def _call(op, *args):
    """``op(*args)``, with a clear error for the transforms the custom ops do not support."""
    if torch.compiler.is_compiling():
        return op(*args)
    if any(isinstance(a, torch.Tensor) and forward_ad.unpack_dual(a).tangent is not None for a in args):
        raise RuntimeError(NO_FORWARD_AD)
    try:
        return op(*args)
    except RuntimeError as error:  # torch's own: "... must override the setup_context staticmethod"
        if "setup_context" not in str(error):
            raise
        raise RuntimeError(NO_FUNC_GRAD) from error


def _apply(x, weight, bias, eps, rms, max_block):
    shape, n = x.shape, x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()  # any strides in, rows of N contiguous elements out
    out_dtype = output_dtype(x, rms)
    bias = bias.contiguous() if bias is not None else None
    y, _, _ = _call(norm_forward, x2, weight.contiguous(), bias, eps, rms, max_block, out_dtype)
    return y.reshape(shape)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *, max_block: int | None = None
) -> torch.Tensor:
    """Fused LayerNorm over the last dimension: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Args:
        x: ``(*, N)``, float16, bfloat16 or float32, on a CUDA GPU (compiled) or on the CPU
            (interpreted); any strides. Statistics are computed in float32.
        weight, bias: ``(N,)`` on x's device; ``bias`` may be None.
        eps: added to the biased variance, > 0.
        max_block: the largest column block a program loads at once (a power of two >= 16);
            longer rows are processed in blocks. By default :func:`lnbook.kernels.tiling.plan` decides.

    Returns ``y`` with x's shape and dtype (under ``torch.autocast``, the dtype
    ``torch.nn.LayerNorm`` would return). Differentiable in x, weight and bias; traceable by
    ``torch.compile`` (a custom op).
    """
    _check(x, weight, bias, max_block)
    return _apply(x, weight, bias, check_eps(eps), False, max_block)


def _check_residual(x: torch.Tensor, residual: torch.Tensor) -> None:
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a tensor, got {type(residual).__name__}")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            f"residual must have x's shape, dtype and device {tuple(x.shape)}, {x.dtype}, {x.device}; "
            f"got {tuple(residual.shape)}, {residual.dtype}, {residual.device}"
        )


def _apply_add(x, residual, weight, bias, eps, rms, max_block):
    shape, n = x.shape, x.shape[-1]
    x2, r2 = x.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    bias = bias.contiguous() if bias is not None else None
    y, total, _, _ = _call(add_norm_forward, x2, r2, weight.contiguous(), bias, eps, rms, max_block, output_dtype(x, rms))
    return y.reshape(shape), total.reshape(shape)


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5,
    *, max_block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the LayerNorm of a Pre-LN block in one pass:
    ``s = x + residual`` (rounded to x's dtype, as torch's ``+`` gives it) and
    ``layer_norm(s, weight, bias, eps)``.

    ``x`` and ``residual``: ``(*, N)``, the same shape, dtype and device; other arguments as
    :func:`layer_norm`. Returns ``(y, s)``, both with x's shape. Differentiable in x,
    residual, weight and bias (gradients reaching ``s`` directly are added in the same kernel).
    """
    _check(x, weight, bias, max_block)
    _check_residual(x, residual)
    return _apply_add(x, residual, weight, bias, check_eps(eps), False, max_block)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, max_block: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` and ``rms_norm(s, weight, eps)`` in one pass; returns ``(y, s)``.
    Same arguments as :func:`add_layer_norm`, without a bias."""
    _check(x, weight, None, max_block)
    _check_residual(x, residual)
    return _apply_add(x, residual, weight, None, check_eps(eps), True, max_block)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, max_block: int | None = None) -> torch.Tensor:
    """Fused RMSNorm over the last dimension: ``x / sqrt(mean(x**2) + eps) * weight``.

    Same arguments, dtypes and devices as :func:`layer_norm`, without a bias; returns x's dtype.
    """
    _check(x, weight, None, max_block)
    return _apply(x, weight, None, check_eps(eps), True, max_block)
