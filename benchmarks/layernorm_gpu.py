"""LayerNorm and RMSNorm on a CUDA GPU: timings against PyTorch, torch.compile and Liger, and
three checks of lnbook's Triton kernels that only a GPU can decide.

    PYTHONPATH=src python3 benchmarks/layernorm_gpu.py --out DIR   # a CUDA GPU, about 4 minutes on an H200
    python benchmarks/layernorm_gpu.py --smoke                     # any machine, seconds: checks the script works

First every implementation is checked against a float64 reference (bfloat16, 33 x 1151). Then:

(a) determinism: 20 backward passes of ``lnbook.kernels.layer_norm`` and of a lock-based kernel
    in the style of Triton's LayerNorm tutorial (each row adds its dW and db terms into one of
    64 float32 buffer rows under a spin lock, then the buffer rows are summed), float32 and
    bfloat16, M = 16384, N = 1024: the number of distinct bit patterns of dW, db and dx;
(b) bfloat16 = float32 rounded: the kernels' bfloat16 output against their float32 output
    rounded to bfloat16 (and against float64 rounded), N in {768, 1024, 4096} and the
    unaligned 1151, M = 4096: the fraction of equal elements and the largest difference in ulps;
(c) batch invariance: y and dx of a row, bitwise, in batches of 1, 7, 64, 4096 and 16384 rows
    (and starting at different rows), bfloat16, N in {768, 4096, 16384}.

F.layer_norm and F.rms_norm go through (b) and (c) too, as the baseline. Then, in bfloat16 for
M in {4096, 16384} and N in {768, ..., 16384}, forward (no autograd graph) and forward+backward:

    LayerNorm: the naive composition, F.layer_norm, torch.compile of the composition,
               lnbook.kernels.layer_norm ("triton (lnbook)"), Liger's layer norm
    RMSNorm:   F.rms_norm, torch.compile of the composition, lnbook.kernels.rms_norm, Liger's rms norm

and one block shaped like GPT-2 small (d = 768, 12 heads, T = 1024, B = 8, bfloat16), forward
and backward, with nn.LayerNorm, after lnbook's fuse_norms, and with Liger's LayerNorm. Every
time is a distribution (Triton's do_bench, the L2 cache flushed before each call, at least 5
calls): the CSV gives its median, quartiles, minimum and maximum. torch.compile compiles once
per N with M marked dynamic (the row length, which a reduction kernel specializes on, stays
static; Dynamo's cache is reset between row lengths). Liger (``pip install liger-kernel``) is
used on a GPU when it imports and skipped with a message otherwise. Every implementation gets
the same tensors, weights in the input's dtype.

It writes into ``--out`` (default benchmarks/results), each file named after the GPU and the
date, with provenance (machine, GPU, torch, triton, CUDA and Liger versions, date, command):

    <gpu>-<date>.csv          one row per timing, provenance in every row
    <gpu>-<date>-checks.json  provenance, the float64 check, (a), (b), (c), seconds per section, failures
    <gpu>-<date>.png          GB/s against N with the measured copy ceiling; the block; (a)

The JSON is written after the checks and again at the end, the CSV after each timed section,
so a run cut short keeps what it measured. An implementation that fails the float64 check, or
raises, is recorded in the JSON, left out from then on, and makes the exit status 1.
GB/s counts each tensor read or written once (lnbook.bench.layernorm_traffic), comparable with
the copy bandwidth. ``--smoke`` runs tiny sizes on whatever device there is into a temporary
folder (or ``--out``): a check that the script works, not a measurement. On a CPU that means
no torch.compile, no Liger, and Triton's interpreter, which runs the programs one after another,
so that (a) cannot show a difference there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import platform
import re
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lnbook import bench
from lnbook.kernels import fuse_norms, layer_norm, rms_norm

# After lnbook.kernels, which turns Triton's interpreter on where there is no GPU: Triton reads
# that setting when it is imported and when a kernel is defined.
import triton
import triton.language as tl

RESULTS = Path(__file__).parent / "results"
FIELDS = ("kind", "norm", "dtype", "m", "n", "implementation", "mode", "reps", "ms_median", "ms_p25", "ms_p75",
          "ms_min", "ms_max", "bytes", "gb_per_s", "copy_gb_per_s", "liger", "command")
LN_EPS, RMS_EPS = 1e-5, 1e-6
LOCK_GROUPS = 64  # buffer rows of the lock-based kernel (the tutorial's GROUP_SIZE_M)
WARMUP_MS, REP_MS, MIN_REPS = 10, 40, 5  # do_bench per timing: warm-up and timed milliseconds, calls at least


@dataclasses.dataclass(frozen=True)
class Config:
    """The sizes of one run: the GPU measurement or the smoke check."""

    device: str
    dtypes: tuple[torch.dtype, ...]  # timed
    ms: tuple[int, ...]  # rows, timed
    ns: tuple[int, ...]  # row lengths, timed
    copy_bytes: int
    block: dict[str, int]  # the GPT-2 block: batch, t, d, heads
    compiled: bool  # time torch.compile
    determinism: tuple[int, int, int]  # (a): m, n, backward passes
    rounding: tuple[int, tuple[int, ...]]  # (b): m, row lengths
    invariance: tuple[int, tuple[int, ...], tuple[tuple[int, int], ...]]  # (c): reference rows, row lengths, (rows, first row)


GPU = Config(
    device="cuda", dtypes=(torch.bfloat16,), ms=(4096, 16384), ns=(768, 1024, 2048, 4096, 8192, 16384),
    copy_bytes=256 * 2**20, block=dict(batch=8, t=1024, d=768, heads=12), compiled=True,
    determinism=(16384, 1024, 20), rounding=(4096, (768, 1024, 1151, 4096)),
    invariance=(4096, (768, 4096, 16384), ((1, 0), (1, 3), (7, 0), (7, 3), (64, 5), (16384, 0))),
)
SMOKE = Config(
    device="cpu", dtypes=(torch.bfloat16,), ms=(8,), ns=(64, 256), copy_bytes=16 * 2**20,
    block=dict(batch=2, t=16, d=64, heads=2), compiled=False,
    determinism=(64, 128, 3), rounding=(8, (64, 100)), invariance=(16, (64, 300), ((1, 0), (1, 3), (7, 3), (40, 0))),
)


@functools.cache
def liger(device: str) -> tuple[Callable, Callable] | None:
    """Liger's functional layer_norm and rms_norm on a CUDA GPU, or None (with the reason printed)."""
    if device != "cuda":
        print("Liger runs on a GPU only; skipping Liger", file=sys.stderr)
        return None
    try:
        from liger_kernel.transformers.functional import liger_layer_norm, liger_rms_norm
    except Exception as error:  # noqa: BLE001 - any import failure means: skip it
        print(f"liger-kernel not importable ({type(error).__name__}: {error}); skipping Liger", file=sys.stderr)
        return None
    return liger_layer_norm, liger_rms_norm


def naive_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = LN_EPS) -> torch.Tensor:
    """LayerNorm as separate operators, each a pass over memory (statistics in float32)."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + eps) * w + b).to(x.dtype)


def naive_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """RMSNorm as separate operators (statistics in float32)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


Norm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def implementations(norm: str, device: str, compiled: bool) -> dict[str, Norm]:
    """name -> fn(x, w, b) (b is ignored by RMSNorm)."""
    found = liger(device)
    if norm == "layer":
        impls = {
            "naive": naive_layer_norm,
            "F.layer_norm": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, LN_EPS),
            "torch.compile": torch.compile(naive_layer_norm) if compiled else None,
            "triton (lnbook)": layer_norm,
            "liger": (lambda x, w, b: found[0](x, w, b, LN_EPS)) if found else None,
        }
    else:
        impls = {
            "F.rms_norm": lambda x, w, b: F.rms_norm(x, x.shape[-1:], w, RMS_EPS),
            "torch.compile": torch.compile(lambda x, w, b: naive_rms_norm(x, w)) if compiled else None,
            "triton (lnbook)": lambda x, w, b: rms_norm(x, w),
            # Liger's default in_place=True writes dx into dy's buffer: only its own later calls see that
            "liger": (lambda x, w, b: found[1](x, w, RMS_EPS)) if found else None,
        }
    return {k: v for k, v in impls.items() if v is not None}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as integers: equal exactly when the floats are the same bit pattern."""
    return t.detach().contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """A bfloat16 tensor as int32 in the order of its values, one step per ulp (+0 and -0 both 0)."""
    i = _bits(t).to(torch.int32)
    return torch.where(i < 0, -(i & 0x7FFF), i)


def _inputs(m: int, n: int, dtype: torch.dtype, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    """x, dy (m, n) standard normal; w near 1 and b near 0 (n,); drawn on device, rounded to dtype."""
    g = torch.Generator(device).manual_seed(seed)
    x, dy = torch.randn(m, n, generator=g, device=device), torch.randn(m, n, generator=g, device=device)
    w, b = 1 + 0.1 * torch.randn(n, generator=g, device=device), 0.1 * torch.randn(n, generator=g, device=device)
    return tuple(t.to(dtype) for t in (x, dy, w, b))


def check(
    norm: str, impls: dict[str, Norm], device: str, dtype: torch.dtype, failures: list[str]
) -> tuple[dict[str, Norm], list[dict]]:
    """Every implementation's output and gradients against float64 (33 x 1151), before anything
    is timed; returns the implementations that pass and one record each."""
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(33, 1151, generator=g), torch.randn(33, 1151, generator=g)
    w, b = torch.randn(1151, generator=g), torch.randn(1151, generator=g)
    xr, wr, br = (t.to(dtype).double().requires_grad_() for t in (x, w, b))
    if norm == "layer":
        want_y = F.layer_norm(xr, (1151,), wr, br, LN_EPS)
    else:
        want_y = F.rms_norm(xr, (1151,), wr, RMS_EPS)
    want_y.backward(dy.to(dtype).double())
    passed, records = {}, []
    for name, fn in impls.items():
        try:
            xs = x.to(dtype).to(device).requires_grad_()
            ws, bs = (t.to(dtype).to(device).requires_grad_() for t in (w, b))
            y = fn(xs, ws, bs)
            y.backward(dy.to(dtype).to(device))
            pairs = [("y", y, want_y.detach()), ("dx", xs.grad, xr.grad), ("dw", ws.grad, wr.grad)]
            if norm == "layer":
                pairs.append(("db", bs.grad, br.grad))
            for what, got, want in pairs:
                scale = float(want.abs().max())  # half-precision results: compare at the scale of the values
                torch.testing.assert_close(got.double().cpu(), want, rtol=5e-2, atol=2e-2 * scale, msg=f"{norm} {name} {what} {dtype}")
        except Exception as error:  # noqa: BLE001 - recorded, and the run goes on without it
            failures.append(f"float64 check, {norm} norm, {name}, {_name(dtype)}: {type(error).__name__}: {error}")
            print(failures[-1], file=sys.stderr)
            records.append(dict(norm=norm, implementation=name, dtype=_name(dtype), ok=False))
            continue
        passed[name] = fn
        records.append(dict(norm=norm, implementation=name, dtype=_name(dtype), ok=True))
    return passed, records


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- (a) determinism -------------------------------------------------------------------------

@triton.jit
def _lock_backward(X, DY, W, Mean, Rstd, DX, DW, DB, Locks, N, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    """Program r: dx of row r, and row r's terms of dW (dy * xhat) and db (dy) added into row
    r % GROUPS of the buffers DW and DB (GROUPS, N) while holding that row's spin lock. The rows
    sharing a buffer row are added in the order their programs take the lock. The scheme of
    Triton's tutorial, except that the buffers are float32 and zeroed before the launch (the
    tutorial keeps them in w's dtype and flags the first writer): the order of the additions is
    then the only difference from lnbook's kernel."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.load(Rstd + row)
    xhat = tl.where(ok, (x - tl.load(Mean + row)) * rstd, 0.0)
    g = dy * w
    dx = (g - tl.sum(g, axis=0) / N - xhat * (tl.sum(g * xhat, axis=0) / N)) * rstd
    tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=ok)
    group = row % GROUPS
    lock = Locks + group
    while tl.atomic_cas(lock, 0, 1) == 1:  # spin until this buffer row is free
        pass
    here = group * N + cols
    tl.store(DW + here, tl.load(DW + here, mask=ok, other=0.0) + dy * xhat, mask=ok)
    tl.store(DB + here, tl.load(DB + here, mask=ok, other=0.0) + dy, mask=ok)
    tl.debug_barrier()  # every thread's store is done before the lock is released
    tl.atomic_xchg(lock, 0)


def lock_backward(x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm's dx, dW and db by the lock-based kernel: mean and rstd from torch (float32),
    dW and db the sum of the LOCK_GROUPS buffer rows (in w's dtype)."""
    m, n = x.shape
    xf = x.float()
    mean, rstd = xf.mean(1), torch.rsqrt(xf.var(1, correction=0) + LN_EPS)
    dx = torch.empty_like(x)
    dw = torch.zeros(LOCK_GROUPS, n, dtype=torch.float32, device=x.device)
    db = torch.zeros_like(dw)
    locks = torch.zeros(LOCK_GROUPS, dtype=torch.int32, device=x.device)
    block = triton.next_power_of_2(n)
    _lock_backward[(m,)](x, dy, w, mean, rstd, dx, dw, db, locks, n, GROUPS=LOCK_GROUPS, BLOCK=block,
                         num_warps=min(max(block // 256, 1), 8))
    return dx, dw.sum(0).to(w.dtype), db.sum(0).to(w.dtype)


def determinism(device: str, m: int, n: int, runs: int, dtype: torch.dtype) -> list[dict]:
    """(a) ``runs`` backward passes of lnbook's layer_norm and of the lock-based kernel on the
    same tensors: the distinct bit patterns of dx, dW and db, the largest difference between
    two runs' dW, and dW's largest error against float64 relative to its largest element."""
    x, dy, w, b = _inputs(m, n, dtype, device, seed=1)
    xd, dyd = x.double().cpu(), dy.double().cpu()
    xhat = (xd - xd.mean(1, keepdim=True)) * torch.rsqrt(xd.var(1, keepdim=True, correction=0) + LN_EPS)
    want_dw = (dyd * xhat).sum(0)

    def lnbook_pass() -> tuple[torch.Tensor, ...]:
        leaves = tuple(t.clone().requires_grad_() for t in (x, w, b))
        return torch.autograd.grad(layer_norm(*leaves, eps=LN_EPS), leaves, dy)

    records = []
    for name, backward in (("triton (lnbook)", lnbook_pass), ("lock-based (tutorial style)", lambda: lock_backward(x, dy, w))):
        patterns: dict[str, list[torch.Tensor]] = {"dx": [], "dw": [], "db": []}
        first_dw, spread = None, 0.0
        for _ in range(runs):
            grads = dict(zip(patterns, backward()))
            for key, t in grads.items():
                if not any(torch.equal(_bits(t), p) for p in patterns[key]):
                    patterns[key].append(_bits(t))
            dw = grads["dw"].double().cpu()
            first_dw = dw if first_dw is None else first_dw
            spread = max(spread, float((dw - first_dw).abs().max()))
        error = float((first_dw - want_dw).abs().max() / want_dw.abs().max())
        records.append(dict(implementation=name, dtype=_name(dtype), m=m, n=n, runs=runs,
                            distinct_dx=len(patterns["dx"]), distinct_dw=len(patterns["dw"]), distinct_db=len(patterns["db"]),
                            dw_max_abs_diff_between_runs=spread, dw_max_rel_error_vs_float64=error))
        print(f"(a) {name}, {_name(dtype)}, M={m} N={n}: {len(patterns['dw'])} distinct dW in {runs} runs "
              f"(db {len(patterns['db'])}, dx {len(patterns['dx'])}), largest dW difference {spread:.3g}")
    return records


# ---- (b) bfloat16 = float32 rounded, (c) batch invariance ------------------------------------

def _normalizers() -> dict[tuple[str, str], Norm]:
    """(norm, implementation) -> fn(x, w, b): lnbook's kernels and torch's own, the baseline."""
    return {
        ("layer", "triton (lnbook)"): lambda x, w, b: layer_norm(x, w, b, LN_EPS),
        ("layer", "F.layer_norm"): lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, LN_EPS),
        ("rms", "triton (lnbook)"): lambda x, w, b: rms_norm(x, w, RMS_EPS),
        ("rms", "F.rms_norm"): lambda x, w, b: F.rms_norm(x, x.shape[-1:], w, RMS_EPS),
    }


def bf16_rounding(device: str, m: int, ns: tuple[int, ...]) -> list[dict]:
    """(b) y computed in bfloat16 against the same implementation's float32 y rounded to
    bfloat16, and against float64's y rounded (via float32), on the same bfloat16 inputs."""
    records = []
    normalizers = _normalizers()
    for n in ns:
        x, _, w, b = _inputs(m, n, torch.bfloat16, device, seed=2)
        for (norm, name), fn in normalizers.items():
            exact = normalizers[norm, "F.layer_norm" if norm == "layer" else "F.rms_norm"]  # lnbook has no float64 kernel
            got = fn(x, w, b)
            record = dict(norm=norm, implementation=name, m=m, n=n, elements=got.numel())
            for ref, want in (("float32", fn(x.float(), w.float(), b.float())), ("float64", exact(x.double(), w.double(), b.double()))):
                want = want.float().to(torch.bfloat16)
                differ = int((_bits(got) != _bits(want)).sum())
                record |= {f"differ_from_{ref}_rounded": differ, f"frac_equal_{ref}_rounded": 1 - differ / got.numel(),
                           f"max_ulp_vs_{ref}_rounded": int((_ordered(got) - _ordered(want)).abs().max())}
            records.append(record)
            print(f"(b) {norm} {name} N={n}: {record['frac_equal_float32_rounded']:.7f} of y equal to float32 rounded, "
                  f"at most {record['max_ulp_vs_float32_rounded']} ulp")
    return records


def batch_invariance(device: str, ref_rows: int, ns: tuple[int, ...], batches: tuple[tuple[int, int], ...]) -> list[dict]:
    """(c) y and dx of the rows of a reference batch of ``ref_rows`` rows, bitwise, against the
    same rows computed in other batches: ``(rows, first row)`` of the same data, each a new tensor."""
    records = []
    total = max(ref_rows, *(m + start for m, start in batches))
    for n in ns:
        x, dy, w, b = _inputs(total, n, torch.bfloat16, device, seed=3)
        for (norm, name), fn in _normalizers().items():

            def run(start: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
                xs = x[start:start + m].clone().requires_grad_()
                y = fn(xs, w, b)
                return y, torch.autograd.grad(y, xs, dy[start:start + m])[0]

            y_ref, dx_ref = run(0, ref_rows)
            results = []
            for m, start in batches:
                y, dx = run(start, m)
                k = min(m, ref_rows - start)
                results.append(dict(m=m, first_row=start, rows_compared=k,
                                    y_equal=torch.equal(_bits(y[:k]), _bits(y_ref[start:start + k])),
                                    dx_equal=torch.equal(_bits(dx[:k]), _bits(dx_ref[start:start + k]))))
            records.append(dict(norm=norm, implementation=name, dtype="bfloat16", n=n, reference_m=ref_rows,
                                y_invariant=all(r["y_equal"] for r in results), dx_invariant=all(r["dx_equal"] for r in results),
                                batches=results))
            print(f"(c) {norm} {name} N={n}: y bitwise the same in every batch: {records[-1]['y_invariant']}, "
                  f"dx: {records[-1]['dx_invariant']}")
    return records


# ---- timings ---------------------------------------------------------------------------------

def times_ms(fn: Callable[[], object], device: str, rep_ms: int = REP_MS) -> list[float]:
    """Milliseconds of each timed call of ``fn()``: on a GPU, do_bench's (L2 flushed before
    each call), at least MIN_REPS of them; on a CPU, MIN_REPS calls after one warm-up."""
    if device == "cuda":
        import triton.testing

        times: list[float] = []
        while len(times) < MIN_REPS:
            times += triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=rep_ms, return_mode="all")
        return times
    fn()
    times = []
    for _ in range(MIN_REPS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def timing_row(times: list[float], nbytes: int | None, copy: float | None, **labels: object) -> dict:
    """One timing: the labels, the distribution of ``times`` (ms), the bytes moved and the GB/s
    at the median (with ``nbytes``) next to the copy bandwidth ``copy`` (bytes/s)."""
    lo, q1, median, q3, hi = (float(v) for v in np.percentile(times, [0, 25, 50, 75, 100]))
    return dict(labels, reps=len(times), ms_median=round(median, 5), ms_p25=round(q1, 5), ms_p75=round(q3, 5),
                ms_min=round(lo, 5), ms_max=round(hi, 5), bytes=nbytes if nbytes is not None else "",
                gb_per_s=round(nbytes / median / 1e6, 1) if nbytes is not None else "",
                copy_gb_per_s=round(copy / 1e9, 1) if copy is not None else "")


def measure_copy(cfg: Config) -> dict:
    """The copy of a ``cfg.copy_bytes`` float32 tensor (read plus write): the bandwidth ceiling."""
    src = torch.empty(cfg.copy_bytes // 4, dtype=torch.float32, device=cfg.device).uniform_()
    dst = torch.empty_like(src)
    times = times_ms(lambda: dst.copy_(src), cfg.device)
    row = timing_row(times, 2 * cfg.copy_bytes, None, kind="copy", dtype="float32", n=src.numel(), implementation="copy", mode="copy")
    row["copy_gb_per_s"] = row["gb_per_s"]
    return row


def measure_norms(norm: str, dtype: torch.dtype, alive: set[str], cfg: Config, copy: float | None, failures: list[str]) -> list[dict]:
    """Forward and forward+backward times of the implementations in ``alive`` for every N and M
    of ``cfg``; one that raises is recorded in ``failures`` and dropped from ``alive``."""
    rows = []
    for n in cfg.ns:
        if cfg.compiled:  # Dynamo caches per function, not per torch.compile entry: without this, the next N
            torch._dynamo.reset()  # would recompile with N dynamic too, and the ninth entry fall back to eager
        impls = implementations(norm, cfg.device, cfg.compiled)
        w = torch.ones(n, device=cfg.device, dtype=dtype, requires_grad=True)  # in x's dtype: no cast when timed
        b = torch.zeros(n, device=cfg.device, dtype=dtype, requires_grad=True)
        for m in cfg.ms:
            x = torch.randn(m, n, device=cfg.device, dtype=dtype, requires_grad=True)
            if cfg.compiled:
                torch._dynamo.mark_dynamic(x, 0)  # M dynamic: the compiled kernels serve every M
            dy = torch.randn_like(x)
            inputs = (x, w, b) if norm == "layer" else (x, w)
            for name in [name for name in impls if name in alive]:
                fn = impls[name]
                for mode in ("forward", "forward+backward"):
                    try:
                        if mode == "forward":  # inference: no graph recorded for a backward pass
                            with torch.no_grad():
                                times = times_ms(lambda: fn(x, w, b), cfg.device)
                        else:
                            times = times_ms(lambda: torch.autograd.grad(fn(x, w, b), inputs, dy), cfg.device)
                    except Exception as error:  # noqa: BLE001 - recorded, and the run goes on without it
                        failures.append(f"timing, {norm} norm, {name}, {_name(dtype)}, M={m} N={n}, {mode}: {type(error).__name__}: {error}")
                        print(failures[-1], file=sys.stderr)
                        alive.discard(name)
                        break
                    nbytes = sum(bench.layernorm_traffic(m, n, x.element_size(), backward=backward, rms=norm == "rms")["bytes"]
                                 for backward in ((False,) if mode == "forward" else (False, True)))
                    rows.append(timing_row(times, nbytes, copy, kind="norm", norm=norm, dtype=_name(dtype), m=m, n=n,
                                           implementation=name, mode=mode))
    return rows


class _LigerLayerNorm(torch.nn.LayerNorm):
    """nn.LayerNorm (same parameters) computed by Liger's kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return liger("cuda")[0](x, self.weight, self.bias, self.eps)


def measure_block(cfg: Config, failures: list[str]) -> list[dict]:
    """Forward+backward of one Pre-LN block in bfloat16, with nn.LayerNorm, fuse_norms and Liger,
    each checked against nn.LayerNorm's input gradient first."""
    from lnbook.norms import swap_modules
    from lnbook.transformer import Block, GPTConfig

    batch, t, d, heads = (cfg.block[key] for key in ("batch", "t", "d", "heads"))
    device, dtype = cfg.device, torch.bfloat16
    config = GPTConfig(vocab_size=64, block_size=t, n_layer=1, n_head=heads, d_model=d, norm="layernorm", dropout=0.0)
    torch.manual_seed(0)
    reference = Block(config).to(device=device, dtype=dtype)

    def copy_of_reference(change: Callable[[torch.nn.Module], object]) -> torch.nn.Module:
        block = Block(config).to(device=device, dtype=dtype)
        block.load_state_dict(reference.state_dict())
        change(block)
        return block

    def liger_norm(child: torch.nn.Module) -> torch.nn.Module | None:
        if type(child) is torch.nn.LayerNorm:
            return _LigerLayerNorm(child.normalized_shape[0], child.eps, bias=child.bias is not None)
        return None

    variants = {"nn.LayerNorm": lambda: reference, "fuse_norms (lnbook)": lambda: copy_of_reference(fuse_norms)}
    if liger(device) is not None:
        variants["liger"] = lambda: copy_of_reference(lambda block: swap_modules(block, liger_norm))
    x = torch.randn(batch, t, d, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    want = torch.autograd.grad(reference(x), x, dy)[0]
    rows = []
    for name, make in variants.items():
        try:
            block = make()
            got = torch.autograd.grad(block(x), x, dy)[0]  # the same model: the same gradient, to rounding
            torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2 * float(want.abs().max()))
            params = tuple(block.parameters())
            times = times_ms(lambda: torch.autograd.grad(block(x), (x, *params), dy), device, rep_ms=4 * REP_MS)
        except Exception as error:  # noqa: BLE001 - recorded, and the run goes on without it
            failures.append(f"block, {name}: {type(error).__name__}: {error}")
            print(failures[-1], file=sys.stderr)
            continue
        rows.append(timing_row(times, None, None, kind="block", norm="layer", dtype=_name(dtype), m=batch * t, n=d,
                               implementation=name, mode="forward+backward"))
        print(f"block B*T={batch * t} d={d}: {name}: median {rows[-1]['ms_median']} ms "
              f"[{rows[-1]['ms_p25']}, {rows[-1]['ms_p75']}] over {rows[-1]['reps']} calls")
    return rows


# ---- output ----------------------------------------------------------------------------------

def plot(rows: list[dict], report: dict, path: Path) -> None:
    """GB/s against N per (norm, dtype, M) and mode (median, band: quartiles) with the copy
    ceiling; then the block's times and (a)'s distinct dW patterns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    norm_rows = [r for r in rows if r["kind"] == "norm"]
    copies = [r["gb_per_s"] for r in rows if r["kind"] == "copy"]
    panels = sorted({(r["norm"], r["dtype"], r["m"]) for r in norm_rows})
    modes = ("forward", "forward+backward")
    fig, axes = plt.subplots(len(panels) + 1, 2, figsize=(11, 3.6 * (len(panels) + 1)), squeeze=False)
    for row_axes, (norm, dtype, m) in zip(axes, panels):
        for ax, mode in zip(row_axes, modes):
            sel = [r for r in norm_rows if (r["norm"], r["dtype"], r["m"], r["mode"]) == (norm, dtype, m, mode)]
            for name in dict.fromkeys(r["implementation"] for r in sel):
                pts = [r for r in sel if r["implementation"] == name]
                ns = [r["n"] for r in pts]
                (line,) = ax.plot(ns, [r["gb_per_s"] for r in pts], "o-", ms=3, label=name)
                ax.fill_between(ns, [r["bytes"] / r["ms_p75"] / 1e6 for r in pts], [r["bytes"] / r["ms_p25"] / 1e6 for r in pts],
                                color=line.get_color(), alpha=0.2, lw=0)
            if copies:
                ax.axhline(copies[0], color="0.4", ls="--", label="copy (measured)")
            ax.set(xscale="log", xlabel="N (features per row)", ylabel="GB/s (median; band: quartiles)",
                   title=f"{norm} norm, {dtype}, {mode}, M = {m}")
            ticks = sorted({r["n"] for r in sel})
            ax.set_xticks(ticks, [str(n) for n in ticks], minor=False)
            ax.minorticks_off()
            ax.legend(fontsize=7)
    ax_block, ax_det = axes[-1]
    blocks = [r for r in rows if r["kind"] == "block"]
    ax_block.bar([r["implementation"] for r in blocks], [r["ms_median"] for r in blocks],
                 yerr=[[r["ms_median"] - r["ms_min"] for r in blocks], [r["ms_max"] - r["ms_median"] for r in blocks]], capsize=4)
    if blocks:
        ax_block.set(ylabel="ms (median; whiskers: min to max)",
                     title=f"GPT-2 block forward+backward, B*T = {blocks[0]['m']}, d = {blocks[0]['n']}, bfloat16")
    det = report["determinism"]
    ax_det.bar_label(ax_det.bar([f"{r['implementation']}\n{r['dtype']}" for r in det], [r["distinct_dw"] for r in det]))
    if det:
        ax_det.set(ylabel="distinct dW bit patterns",
                   title=f"(a) {det[0]['runs']} backward passes, M = {det[0]['m']}, N = {det[0]['n']}")
        ax_det.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def provenance(device: str) -> dict[str, object]:
    """bench.provenance's machine, device, torch and triton versions and date, with Liger's
    version, the command (and the environment variables that change what it runs), the start
    time (UTC), Python's and CUDA's versions and the GPU's multiprocessors."""
    try:
        liger_version = importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        liger_version = "not installed"
    env = [f"{key}={os.environ[key]}" for key in ("PYTHONPATH", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES") if key in os.environ]
    return {
        **bench.provenance(device),
        "liger": liger_version,
        "command": shlex.join([*env, Path(sys.executable).name, *sys.argv]),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "",
        "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else "",
    }


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=1) + "\n")


@contextlib.contextmanager
def section(report: dict, name: str, device: str) -> Iterator[None]:
    """Time the enclosed section (seconds, into ``report['seconds']``) and print it; an exception
    is printed, recorded in ``report['failures']`` and ends the section, not the run."""
    start = time.perf_counter()
    try:
        yield
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - recorded, and the run goes on without it
        traceback.print_exc()
        report["failures"].append(f"{name}: {type(error).__name__}: {error}")
    report["seconds"][name] = round(time.perf_counter() - start, 1)
    print(f"[{report['seconds'][name]:7.1f} s] {name}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the checks and the timings, write the files; 1 if anything failed or raised, else 0."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes into a temporary folder, on any device, in seconds")
    parser.add_argument("--out", type=Path, default=None, help="folder for the CSV, JSON and PNG (default benchmarks/results)")
    args = parser.parse_args(argv)
    if args.smoke:
        cfg = dataclasses.replace(SMOKE, device="cuda" if torch.cuda.is_available() else "cpu")
        out = args.out or Path(tempfile.mkdtemp())
    else:
        if not torch.cuda.is_available():
            raise SystemExit("layernorm_gpu.py measures a CUDA GPU and found none; use --smoke to check the script")
        cfg, out = GPU, args.out or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    stamp = provenance(cfg.device)
    report: dict = dict(provenance=stamp, seconds={}, failures=[], float64_check=[], determinism=[], bf16_rounding=[],
                        batch_invariance=[])
    failures = report["failures"]
    name = re.sub(r"[^A-Za-z0-9]+", "-", stamp["device"]).strip("-") + f"-{stamp['date']}"
    csv_path, json_path, png_path = out / f"{name}.csv", out / f"{name}-checks.json", out / f"{name}.png"

    alive: dict[tuple[str, torch.dtype], set[str]] = {}
    with section(report, "float64 check", cfg.device):
        for norm in ("layer", "rms"):
            for dtype in cfg.dtypes:
                passed, records = check(norm, implementations(norm, cfg.device, cfg.compiled), cfg.device, dtype, failures)
                report["float64_check"] += records
                alive[norm, dtype] = set(passed)
    with section(report, "(b) bfloat16 = float32 rounded", cfg.device):
        report["bf16_rounding"] = bf16_rounding(cfg.device, *cfg.rounding)
    with section(report, "(c) batch invariance", cfg.device):
        report["batch_invariance"] = batch_invariance(cfg.device, *cfg.invariance)
    write_json(report, json_path)
    with section(report, "(a) determinism", cfg.device):
        for dtype in (torch.float32, torch.bfloat16):
            report["determinism"] += determinism(cfg.device, *cfg.determinism, dtype)
    write_json(report, json_path)

    rows: list[dict] = []

    def save() -> None:
        if rows:
            labelled = [{key: {**r, "liger": stamp["liger"], "command": stamp["command"]}.get(key, "") for key in FIELDS} for r in rows]
            bench.write_csv(labelled, csv_path, cfg.device)

    with section(report, "copy", cfg.device):
        rows.append(measure_copy(cfg))
    copy = next((r["gb_per_s"] * 1e9 for r in rows if r["kind"] == "copy"), None)
    for norm in ("layer", "rms"):
        for dtype in cfg.dtypes:
            with section(report, f"timing {norm} norm {_name(dtype)}", cfg.device):
                rows += measure_norms(norm, dtype, alive.get((norm, dtype), set()), cfg, copy, failures)
            save()
    with section(report, "GPT-2 block", cfg.device):
        rows += measure_block(cfg, failures)
    save()
    with section(report, "plot", cfg.device):
        plot(rows, report, png_path)
    report["seconds"]["total"] = round(time.perf_counter() - started, 1)
    write_json(report, json_path)
    for path in (csv_path, json_path, png_path):
        print(f"wrote {path}")
    print(f"{report['seconds']['total']} s in all; {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
