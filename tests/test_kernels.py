"""lnbook.kernels: the Triton LayerNorm and RMSNorm kernels against a float64 reference.

On a machine without a GPU they run through Triton's interpreter (``lnbook.kernels`` turns
it on); tests marked ``gpu`` run only where CUDA is available.
"""

import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

from lnbook.kernels import layer_norm, rms_norm
from lnbook.kernels.norm import _rounded

import triton  # after lnbook.kernels, which turns the interpreter on without a GPU
import triton.language as tl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Tolerances against float64 on the same (rounded) inputs: the kernel's float32 arithmetic,
# then the rounding of each result to its dtype (8 significant bits for bfloat16, 11 for float16).
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}
MS = (1, 3, 37, 128)
NS = (1, 7, 64, 1000, 1151, 4096, 5000)


def inputs(m, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, dy = torch.randn(m, n, generator=g) * 2 + 0.5, torch.randn(m, n, generator=g)
    w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return [t.to(dtype).to(DEVICE) for t in (x, w, b, dy)]


def run(fn, x, w, b, dy, **kw):
    """Output and gradients (dx, dw, db) of fn on leaf copies of the inputs."""
    leaves = [t.clone().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    y = fn(*leaves, **kw)
    y.backward(dy)
    return [y] + [t.grad for t in leaves]


def reference(rms, x, w, b, dy):
    x, w, dy = (t.double().cpu() for t in (x, w, dy))
    n = x.shape[-1]
    if rms:
        return run(lambda x, w: torch.nn.functional.rms_norm(x, (n,), w, 1e-6), x, w, None, dy)
    return run(lambda x, w, b: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5), x, w, b.double().cpu(), dy)


def check(rms, m, n, dtype, **kw):
    x, w, b, dy = inputs(m, n, dtype)
    if rms:
        got = run(lambda x, w: rms_norm(x, w, **kw), x, w, None, dy)
    else:
        got = run(lambda x, w, b: layer_norm(x, w, b, **kw), x, w, b, dy)
    rtol, atol = TOL[dtype]
    for name, a, e in zip(("y", "dx", "dw", "db"), got, reference(rms, x, w, b, dy)):
        assert a.dtype == dtype and a.shape == e.shape, name
        torch.testing.assert_close(a.double().cpu(), e, rtol=rtol, atol=atol * max(1.0, m**0.5), msg=f"{name} M={m} N={n}")


@pytest.mark.parametrize("dtype", TOL, ids=str)
@pytest.mark.parametrize("m", MS)
def test_layer_norm_forward_and_gradients_match_float64(m, dtype):
    for n in NS:
        check(False, m, n, dtype)


@pytest.mark.parametrize("dtype", TOL, ids=str)
def test_rms_norm_forward_and_gradients_match_float64(dtype):
    for m, n in ((1, 1), (3, 7), (37, 1151), (3, 5000)):
        check(True, m, n, dtype)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_rows_longer_than_a_block_loop_over_blocks(rms):
    for m, n in ((3, 1000), (5, 1151), (2, 5000)):
        check(rms, m, n, torch.float32, max_block=256)
    check(rms, 4, 300, torch.bfloat16, max_block=64)
    check(rms, 2, 9000, torch.float32)  # an unaligned long row: blocks of 2048 forward, 1024 backward


@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter runs a grid's programs in a fixed order, so any kernel repeats there")
@pytest.mark.parametrize("max_block", [None, 256])
def test_backward_is_bitwise_repeatable(max_block):
    x, w, b, dy = inputs(37, 1151, torch.float32)
    first = run(lambda x, w, b: layer_norm(x, w, b, max_block=max_block), x, w, b, dy)
    second = run(lambda x, w, b: layer_norm(x, w, b, max_block=max_block), x, w, b, dy)
    assert all(torch.equal(p, q) for p, q in zip(first, second))


@pytest.mark.parametrize("max_block", [None, 256])
def test_poisoned_output_buffers_are_fully_overwritten(max_block):
    x, w, b, dy = inputs(5, 700, torch.float32)
    clean = run(lambda x, w, b: layer_norm(x, w, b, max_block=max_block), x, w, b, dy)

    def nan_empty(*size, **kw):
        return torch.full(size, float("nan"), **kw)

    def nan_empty_like(t, **kw):
        return torch.full_like(t, float("nan"), **kw)

    with mock.patch("lnbook.kernels.norm.torch.empty", nan_empty), mock.patch("lnbook.kernels.norm.torch.empty_like", nan_empty_like):
        poisoned = run(lambda x, w, b: layer_norm(x, w, b, max_block=max_block), x, w, b, dy)
    for p, q in zip(clean, poisoned):
        assert torch.isfinite(q).all() and torch.equal(p, q)


def test_rows_shorter_than_64_columns_take_4_elements_a_thread_in_tiles_of_at_least_512():
    """The tiling of short rows (lnbook.kernels.tiling's docstring): every program of rows of
    1-63 columns has 4 or 8 warps (a 1-warp program leaves a T4 with 16 resident warps), 4
    elements a thread, no register cap; from 64 columns on, the rule of longer rows."""
    from lnbook.kernels.tiling import DTYPES, Plan, plan

    for n in range(1, 64):
        for dtype in DTYPES:
            for backward in (False, True):
                p = plan(n, dtype, backward=backward)
                assert p.single and p.block == max(16, 1 << (n - 1).bit_length()) and p.maxnreg is None, (n, p)
                assert p.rows * p.block >= 512 and p.warps in (4, 8) and p.rows * p.block == 4 * 32 * p.warps, (n, p)
    bf16 = torch.bfloat16
    assert plan(7, bf16) == plan(16, bf16, backward=True) == Plan(16, 32, 4, True)
    assert plan(24, bf16) == plan(32, bf16, backward=True) == Plan(32, 16, 4, True)
    assert plan(63, bf16) == plan(48, bf16, backward=True) == Plan(64, 16, 8, True)
    assert plan(64, bf16) == plan(64, bf16, backward=True) == Plan(64, 16, 4, True)  # 8 elements a thread
    assert plan(65, bf16, backward=True) == Plan(128, 16, 16, True)  # unaligned backward: 4
    assert plan(24, bf16, max_block=16) == Plan(16, 1, 1, False)  # cut into blocks: the long-row path


@pytest.mark.parametrize("dtype", TOL, ids=str)
def test_short_rows_in_tiles_of_32_and_16_rows(dtype):
    # 150 rows: tiles of 32 rows of 16 columns (the last one partial), more tiles than the
    # interpreter's backward programs, so that a program loops over tiles
    for rms, m, n in ((False, 150, 16), (True, 150, 13), (False, 37, 24), (True, 37, 32), (False, 37, 48), (True, 5, 63)):
        check(rms, m, n, dtype)


def test_any_leading_shape_and_non_contiguous_input():
    x, w, b, _ = inputs(6, 40, torch.float32)
    x3 = x.reshape(2, 3, 40)
    torch.testing.assert_close(layer_norm(x3, w, b), layer_norm(x, w, b).reshape(2, 3, 40), rtol=0, atol=0)
    wide = torch.randn(40, 12, device=DEVICE)
    strided = wide.t()  # (12, 40) with the features 12 elements apart
    torch.testing.assert_close(layer_norm(strided, w, b), layer_norm(strided.contiguous(), w, b), rtol=0, atol=0)
    empty = torch.empty(0, 40, device=DEVICE, requires_grad=True)
    y = layer_norm(empty, w.clone().requires_grad_(), b)
    assert y.shape == (0, 40)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x, w, b: layer_norm(x.long(), w, b), TypeError, "floating-point"),
        (lambda x, w, b: layer_norm(x.double(), w, b), TypeError, "float16, bfloat16 or float32"),
        (lambda x, w, b: layer_norm(x, w[:-1], b), ValueError, r"weight must have shape \(8,\)"),
        (lambda x, w, b: layer_norm(x, w, b[:3]), ValueError, r"bias must have shape \(8,\)"),
        (lambda x, w, b: layer_norm(x, w, b, eps=0.0), ValueError, "eps must be a positive"),
        (lambda x, w, b: layer_norm(x, w, b, max_block=100), ValueError, "max_block must be a power of two"),
        (lambda x, w, b: rms_norm(x[:, :0], w[:0]), ValueError, "non-empty last dimension"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error, match):
    x, w, b, _ = inputs(2, 8, torch.float32)
    with pytest.raises(error, match=match):
        call(x, w, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter switch")
@pytest.mark.parametrize(
    "code, env, expect",
    [
        ("import triton; import lnbook.kernels as k", {}, "RESULT ok"),  # triton first: still interpreted
        ("import torch._dynamo; import lnbook.kernels as k", {}, "RESULT ok"),  # torch.compile's machinery imports triton
        ("import lnbook.kernels as k; import triton", {}, "RESULT ok"),
        ("import lnbook.kernels as k", {"TRITON_INTERPRET": "0"}, "set TRITON_INTERPRET=1"),
    ],
)
def test_the_interpreter_is_used_whatever_the_import_order(code, env, expect):
    script = code + "; import torch; x = torch.randn(3, 5); print('RESULT', 'ok' if k.layer_norm(x, torch.ones(5)).shape == (3, 5) else 'bad')"
    environ = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | env
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ, timeout=120)
    assert expect in result.stdout + result.stderr


@gpu
def test_compiled_kernels_on_the_gpu_match_float64():
    for m, n in ((1, 1), (37, 1151), (128, 5000), (4096, 16384)):
        for dtype in TOL:
            check(False, m, n, dtype)
            check(True, m, n, dtype)


def test_gpu_benchmark_script_runs_end_to_end_in_smoke_mode(tmp_path):
    import csv
    import importlib.util
    import json
    import re

    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "layernorm_gpu.py")
    result = subprocess.run([sys.executable, script, "--smoke", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    written = [line.removeprefix("wrote ") for line in result.stdout.splitlines() if line.startswith("wrote ")]
    csv_path, json_path, png_path = written
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(os.path.basename(p) for p in written) and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    header = open(csv_path).readline().strip()
    assert header == ("kind,norm,dtype,m,n,implementation,mode,reps,ms_median,ms_p25,ms_p75,ms_min,ms_max,bytes,gb_per_s,"
                      "copy_gb_per_s,liger,command,machine,device,torch,triton,date")
    rows = list(csv.DictReader(open(csv_path)))
    peers = {"liger"} if torch.cuda.is_available() and importlib.util.find_spec("liger_kernel") else set()  # Liger: GPU only
    if not peers:
        assert "skipping Liger" in result.stderr
    names = {kind: {r["implementation"] for r in rows if (r["kind"], r["norm"]) == kind} for kind in (("norm", "layer"), ("norm", "rms"), ("block", "layer"))}
    assert names[("norm", "layer")] == {"naive", "F.layer_norm", "triton (lnbook)"} | peers  # torch.compile: GPU runs only
    assert names[("norm", "rms")] == {"F.rms_norm", "triton (lnbook)"} | peers
    assert names[("block", "layer")] == {"nn.LayerNorm", "fuse_norms (lnbook)"} | peers
    norm_rows = [r for r in rows if r["kind"] == "norm"]
    assert len(norm_rows) == 2 * 2 * (len(names[("norm", "layer")]) + len(names[("norm", "rms")]))  # 2 sizes x 2 modes
    assert [r["kind"] for r in rows].count("copy") == 1
    for r in rows:  # a distribution of at least 5 calls, with provenance
        assert int(r["reps"]) >= 5 and r["date"] and r["torch"] == torch.__version__ and "--smoke" in r["command"]
        assert 0 < float(r["ms_min"]) <= float(r["ms_p25"]) <= float(r["ms_median"]) <= float(r["ms_p75"]) <= float(r["ms_max"])
    report = json.load(open(json_path))
    assert report["failures"] == [] and all(c["ok"] for c in report["float64_check"])
    assert {"machine", "device", "torch", "triton", "liger", "date", "command"} <= set(report["provenance"])
    det = {(r["implementation"], r["dtype"]): r for r in report["determinism"]}
    assert set(det) == {(name, dtype) for name in ("triton (lnbook)", "lock-based (tutorial style)") for dtype in ("float32", "bfloat16")}
    assert det["triton (lnbook)", "float32"]["distinct_dw"] == 1  # the interpreter cannot tell the lock-based one apart
    assert all(det[name, "float32"]["dw_max_rel_error_vs_float64"] < 1e-5 for name, _ in det)  # both kernels are right
    assert len(report["bf16_rounding"]) == 4 * 2 and all(0 <= r["frac_equal_float32_rounded"] <= 1 for r in report["bf16_rounding"])
    assert all(r["y_invariant"] and r["dx_invariant"] for r in report["batch_invariance"] if r["implementation"] == "triton (lnbook)")
    from lnbook.bench import gpu_results  # the reader chapter 08 uses for committed runs

    (run,) = gpu_results(tmp_path)
    assert run.rows == rows and run.checks == report
    assert os.path.getsize(png_path) > 0


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_fused_norms_in_tinygpt_give_the_same_loss_and_gradients(norm):
    from lnbook.kernels import fuse_norms
    from lnbook.transformer import GPTConfig, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(11, 16, n_layer=2, n_head=2, d_model=32, norm=norm)).to(DEVICE)
    fused = TinyGPT(model.cfg).to(DEVICE)
    fused.load_state_dict(model.state_dict())
    assert fuse_norms(fused) == 2 * 2 + 1 and fuse_norms(fused) == 0  # two per block and the final one; once
    assert_same_loss_and_gradients(model, fused)


def assert_same_loss_and_gradients(model, fused):
    """A TinyGPT (vocabulary 11, windows of 16) and its copy with fused norms give the same
    loss and parameter gradients on one random batch."""
    idx = torch.randint(11, (3, 16), device=DEVICE)
    losses = [m.loss(idx[:, :-1], idx[:, 1:]) for m in (model, fused)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_fused_modules_reject_multi_dimensional_shapes():
    from lnbook.kernels import FusedLayerNorm

    with pytest.raises(ValueError, match="last dimension only"):
        FusedLayerNorm((4, 5))


@triton.jit
def _round_to_bfloat16(X, Y, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    tl.store(Y + cols, _rounded(tl.load(X + cols, mask=cols < n), tl.bfloat16), mask=cols < n)


def test_rounding_to_bfloat16_by_bits_keeps_nan_and_matches_torch():
    """_rounded (the bfloat16 rounding the fused residual add runs on the GPU too) against
    torch's conversion, on special values: a NaN must stay a NaN whatever its payload (the
    rounding's carry once turned the GPU's canonical NaN 0x7FFFFFFF into -0.0)."""
    bits = torch.tensor([0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7FC00000, 0x7F800000, 0xFF800000, 0x3F800000,
                         0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00000001, 0x80000000], dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32).to(DEVICE)  # wraps the high ones to their int32 bit patterns
    y = torch.empty_like(x)
    _round_to_bfloat16[(1,)](x, y, x.numel(), BLOCK=16)
    want = x.to(torch.bfloat16).float()
    assert torch.equal(y.isnan(), want.isnan()), (y, want)
    assert torch.equal(y[~want.isnan()], want[~want.isnan()])
