"""lnbook.kernels.compile_check: the kernels compiled for T4, A100 and H100 without a GPU.

Triton compiles for a GPU that is not here, and ptxas reports the registers and the spills of
each kernel. The grid: every N the package is tested at, every variant the package launches
(LayerNorm with and without a bias, RMSNorm, each with the fused residual add or without,
three dtypes, float32 weights and y with half x), forward and backward, with the block and
warps the launcher picks (lnbook.kernels.tiling.plan). Compiling runs in child processes with
TRITON_INTERPRET=0; the grid is compiled once, by one test, as pytest-xdist would otherwise
compile it again in each worker that runs a test needing it.
"""

import pytest
import torch

from lnbook.kernels import compile_check as cc
from lnbook.kernels import tiling as plan_module

TOOLS = cc.tools()
needs_ptxas = pytest.mark.skipif(isinstance(TOOLS, str), reason=f"cannot compile for a GPU here: {TOOLS}")
H100 = next(g for g in cc.GPUS if g.name == "H100")


@pytest.fixture(scope="module")
def grid():
    return cc.check()


@needs_ptxas
def test_no_kernel_spills_every_sm_keeps_24_warps_and_the_backward_grid_fits(grid):
    from lnbook.kernels.norm import backward_waves

    assert {r.gpu for r in grid} == {"T4", "A100", "H100"}
    assert {r.n for r in grid} == set(cc.DEFAULT_NS)
    assert {r.norm for r in grid} == {"LayerNorm", "LayerNorm no bias", "RMSNorm", "add+LayerNorm", "add+LayerNorm no bias", "add+RMSNorm"}
    # every norm in every dtype, and mixed precision: float32 weights and y with half x
    assert {(r.norm, r.dtype) for r in grid} == {(norm, t) for norm in {r.norm for r in grid} for t in ("fp16", "bf16", "fp32")}
    assert {(r.norm, r.dtype, r.weights, r.out) for r in grid} >= {
        ("add+LayerNorm", "bf16", "fp32", "fp32"), ("LayerNorm no bias", "fp16", "fp32", "fp16"), ("add+RMSNorm", "bf16", "fp32", "bf16")}
    spills = [r for r in grid if r.stack]
    assert not spills, "\n" + cc.table(spills)
    # the occupancy follows from the registers: no kernel leaves an SM with fewer than 24 warps
    assert min(r.warps_per_sm for r in grid) >= 24, "\n" + cc.table(sorted(grid, key=lambda r: r.warps_per_sm)[:5])
    assert all(0 < r.registers <= 255 and r.warps_per_sm <= next(g.max_warps for g in cc.GPUS if g.name == r.gpu) for r in grid)
    # backward_programs aims at backward_waves(warps) programs per multiprocessor: the compiled
    # kernels' registers and shared memory must let that many stay resident, on every GPU
    crowded = [r for r in grid if r.step == "backward" and r.warps_per_sm // r.warps < backward_waves(r.warps)]
    assert not crowded, "\n" + cc.table(crowded[:5])


def test_the_backward_grid_fills_the_gpu_and_bounds_the_partial_sums():
    from lnbook.kernels.norm import MIN_ROWS_PER_PROGRAM, backward_programs

    for n in (64, 1024, 4096, 8192, 16384):
        p = plan_module.plan(n, torch.bfloat16, backward=True)
        for m in (4096, 16384, 65536):
            programs = backward_programs(m, n, p, multiprocessors=132)
            assert programs * MIN_ROWS_PER_PROGRAM <= m  # the partial sums: <= 1/6 of the rows' traffic
            if m >= 16384:  # enough rows: at least one program per multiprocessor
                assert programs * -(-n // p.block) >= 132
    assert backward_programs(3, 64, plan_module.plan(64, torch.float32, backward=True), None) == 1


@needs_ptxas
def test_a_planted_spill_is_caught(monkeypatch):
    # force the forward pass to keep a 32768-column bfloat16 row whole: 64 elements a thread
    monkeypatch.setattr(plan_module, "FORWARD_SINGLE_MAX", 65536)
    rows = cc.check(ns=(32768,), dtypes=(torch.bfloat16,), gpus=(H100,), processes=1, residual_dtypes=(), mixed=False)
    forward = [r for r in rows if r.step == "forward" and r.norm == "LayerNorm"]
    assert forward and forward[0].block == 32768 and forward[0].stack > 0, cc.table(rows)


RESOURCES = "Function _forward:\n REG:{} STACK:{} SHARED:0 LOCAL:{} CONSTANT[0]:448 TEXTURE:0 SURFACE:0 SAMPLER:0"
REPORT = ("ptxas info    : Compiling entry function '_forward' for 'sm_90a'\n"
          "ptxas info    : Function properties for _forward\n"
          "    {} bytes stack frame, {} bytes spill stores, {} bytes spill loads\n"
          "ptxas info    : Used {} registers, used 1 barriers")


@pytest.mark.parametrize(
    "stack, local, stores, loads, expect",
    [
        (0, 0, 0, 0, 0),
        (8, 0, 8, 8, 8),  # what ptxas made of the fused add at 16 warps (sm_90, float32, N = 4096)
        (0, 0, 4, 4, 4),  # ptxas reports a spill that the stack does not show: still a spill
        (0, 0, 4, 0, 4),
        (16, 0, 0, 0, 16),  # a stack frame without a reported spill: counted, to be safe
        (0, 32, 0, 0, 32),  # local memory
    ],
)
def test_a_spill_counts_whichever_report_shows_it(stack, local, stores, loads, expect):
    usage = cc._usage(RESOURCES.format(32, stack, local), REPORT.format(stack, stores, loads, 32), 1024)
    assert (usage.stack, usage.spill_stores, usage.spill_loads, usage.registers, usage.shared) == (expect, stores, loads, 32, 1024)


def test_reports_that_disagree_or_say_nothing_are_refused():
    with pytest.raises(RuntimeError, match="not the same kernel"):
        cc._usage(RESOURCES.format(40, 0, 0), REPORT.format(0, 0, 0, 32), 0)
    with pytest.raises(RuntimeError, match="no register and spill report"):
        cc._usage(RESOURCES.format(32, 0, 0), "ptxas info    : Used 32 registers", 0)
    with pytest.raises(RuntimeError, match="no resource usage"):
        cc._usage("", REPORT.format(0, 0, 0, 32), 0)


def test_the_check_compiles_what_the_launcher_launches():
    for n in cc.DEFAULT_NS + (1, 7, 1151, 9000):
        for dtype in plan_module.DTYPES:
            kernels = cc.configs(n, dtype, rms=False)
            fwd, bwd = plan_module.plan(n, dtype), plan_module.plan(n, dtype, backward=True)
            assert [(k.block, k.rows, k.warps, k.single, k.maxnreg) for k in kernels["forward"]] == [
                (fwd.block, fwd.rows, fwd.warps, fwd.single, fwd.maxnreg)]
            last = kernels["backward"][-1]
            assert (last.block, last.warps, last.maxnreg) == (bwd.block, bwd.warps, bwd.maxnreg)
            assert len(kernels["backward"]) == (1 if bwd.single else 2)  # a long row's backward adds the row-sums kernel
            assert fwd.single == (n <= fwd.block) and bwd.single == (n <= bwd.block)
    # many N share a kernel: the grid compiles far fewer kernels than it reports rows
    distinct = {k for n in cc.DEFAULT_NS for ks in cc.configs(n, torch.float32, False).values() for k in ks}
    assert len(distinct) < 2 * len(cc.DEFAULT_NS)


def test_the_grid_compiles_every_kernel_of_rows_shorter_than_64_columns_once():
    """Below 64 columns, one N per distinct kernel: every N from 1 to 63 launches only kernels
    that SHORT_NS compiles, and each N of SHORT_NS adds kernels of its own."""
    def kernels(n):
        return {k for v in cc.variants() for ks in cc.configs(n, v.dtype, v.rms, None, v.residual, v.bias, v.weights, v.out).values()
                for k in ks}

    assert set(cc.SHORT_NS) <= set(cc.DEFAULT_NS) and max(cc.SHORT_NS) < plan_module.SHORT_ROW
    short = {n: kernels(n) for n in cc.SHORT_NS}
    covered = set().union(*short.values())
    for n in range(1, plan_module.SHORT_ROW):
        assert kernels(n) <= covered, n
    for n, own in short.items():
        assert own - set().union(*(ks for m, ks in short.items() if m != n)), n
    assert {k.unit for k in short[1]} == {True} and not any(k.unit for n in cc.SHORT_NS[1:] for k in short[n])


SPECIALIZATION = """
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from lnbook.kernels import compile_check as cc, norm

backend = make_backend(GPUTarget("cuda", 90, 32))
checked = 0
for fn, name in ((norm._forward, "forward"), (norm._backward, "backward")):
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    names = [p.name for p in fn.params]
    for n in (1, 7, 16, 1151):
        for v in cc.variants():
            k = cc.configs(n, v.dtype, v.rms, None, v.residual, v.bias, v.weights, v.out)[name][-1]
            m = 37
            x, y, w = torch.zeros(m, n, dtype=v.dtype), torch.zeros(m, n, dtype=v.out), torch.zeros(n, dtype=v.weights)
            stats, partial = torch.zeros(m), torch.zeros(4, n)
            const = dict(BLOCK=k.block, ROWS=k.rows, SINGLE=k.single, RMS=k.rms, HAS_BIAS=k.bias)
            if name == "forward":  # the arguments _launch_forward passes
                args = (x, x, x if v.residual else y, y, w, w, stats, stats, m, n, 1e-5)
                const["HAS_RESIDUAL"] = k.residual
            else:  # and norm_backward
                args = (x, y, x if v.residual else y, x, w, stats, stats, stats, stats, partial, partial, m, n)
                const["HAS_DSUM"] = k.residual
            options = dict(num_warps=k.warps) | ({"maxnreg": k.maxnreg} if k.maxnreg else {})
            bound, specialization, parsed = binder(*args, **const, **options)
            _, signature, constexprs, attrs = fn._pack_args(backend, const | options, bound, specialization, parsed)
            ours, our_const, our_attrs = cc._signature(k)
            assert signature == ours, (k, signature, ours)
            assert constexprs == {(names.index(key),): value for key, value in our_const.items()}, (k, constexprs, our_const)
            assert {key: [tuple(a) for a in value] for key, value in attrs.items() if value} == {
                key: [tuple(a) for a in value] for key, value in our_attrs.items()}, (k, attrs, our_attrs)
            checked += 1
print(checked)
"""


@needs_ptxas
def test_the_signature_the_check_compiles_is_tritons_own_specialization_of_the_launch():
    """Triton's launcher specializes the arguments (pointer alignment, N divisible by 16, N = 1
    a constant); its own binder, given the launcher's arguments, must give the signature,
    constants and attributes that the check compiles (in a process that does not interpret)."""
    import os
    import subprocess
    import sys

    env = os.environ | {"TRITON_INTERPRET": "0"}
    child = subprocess.run([sys.executable, "-c", SPECIALIZATION], capture_output=True, text=True, env=env, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    assert int(child.stdout) == 2 * 4 * len(cc.variants())


def test_the_variants_are_every_norm_residual_and_dtype_the_package_launches():
    found = cc.variants()
    assert len(found) == len(set(found)) == 46
    half = (torch.float16, torch.bfloat16)
    for v in found:
        # float32 x comes with float32 weights and y; RMSNorm's y always has x's dtype
        assert v.weights in (v.dtype, torch.float32) and v.out in (v.dtype, torch.float32)
        assert v.dtype in half or (v.weights, v.out) == (torch.float32, torch.float32)
        assert not (v.rms and v.out != v.dtype) and not (v.rms and v.bias)
    assert {(v.residual, v.dtype) for v in found} == {(r, t) for r in (False, True) for t in plan_module.DTYPES}
    assert len(cc.variants(mixed=False)) == 18 and len(cc.variants(residual_dtypes=(), mixed=False)) == 9


NS_LAUNCHED = (1, 24, 64, 1151)


def test_every_launch_the_package_makes_is_a_kernel_the_check_compiles(monkeypatch):
    """Record the kernels that the functions and modules launch, for each norm, with and without
    a bias and the residual add, in each dtype, with float32 weights and (as CUDA's autocast
    gives LayerNorm) float32 y: each must be one that the grid compiles, with the pointer
    dtypes that the check's signature gives it."""
    from lnbook.kernels import FusedLayerNorm, FusedRMSNorm, add_layer_norm, add_rms_norm, layer_norm, norm, rms_norm

    launched = []

    class Recorder:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((self.name, args, kwargs))
                return self.fn[grid](*args, **kwargs)
            return launch

    for name in ("_forward", "_row_sums", "_backward"):
        monkeypatch.setattr(norm, name, Recorder(name[1:], getattr(norm, name)))
    # the interpreter writes bfloat16 outputs through float32 buffers; the values do not matter here
    monkeypatch.setattr(norm, "_out_buffer", lambda like, dtype: torch.empty(*like.shape, dtype=dtype, device=like.device))

    def calls(x, r, w, b):
        yield layer_norm(x, w, b)
        yield layer_norm(x, w)
        yield rms_norm(x, w)
        yield sum(add_layer_norm(x, r, w, b), 0)  # dy and the sum's own gradient
        yield add_layer_norm(x, r, w)[0]  # the sum unused: no gradient of its own
        yield sum(add_rms_norm(x, r, w), 0)
        yield FusedLayerNorm(x.shape[-1], elementwise_affine=False)(x)  # float32 ones as the weight
        yield FusedRMSNorm(x.shape[-1], elementwise_affine=False).add_forward(x, r)[1]

    def run_all(dtypes, weights):
        # N = 1 (a constant to Triton), rows shorter than 64 columns and 64, short rows packed in
        # tiles, and an unaligned row cut into blocks backward
        for n in NS_LAUNCHED:
            for dtype in dtypes:
                g = torch.Generator().manual_seed(0)
                x, r = (torch.randn(3, n, generator=g).to(dtype).requires_grad_() for _ in range(2))
                w, b = (torch.randn(n, generator=g).to(weights or dtype).requires_grad_() for _ in range(2))
                for y in calls(x, r, w, b):
                    y.float().sum().backward()

    run_all(plan_module.DTYPES, None)
    run_all((torch.bfloat16,), torch.float32)  # float32 weights with half x
    monkeypatch.setattr(norm, "output_dtype", lambda x, rms: x.dtype if rms else torch.float32)  # CUDA's autocast
    run_all((torch.float16,), torch.float32)
    run_all((torch.bfloat16,), None)

    names = {"forward": ["X", "R", "S", "Y", "W", "B", "Mean", "Rstd", "M", "N", "eps"],
             "row_sums": ["X", "DY", "W", "Mean", "Rstd", "C1", "C2", "N"],
             "backward": ["X", "DY", "DS", "DX", "W", "Mean", "Rstd", "C1", "C2", "DW", "DB", "M", "N"]}
    types = {dtype: f"*{name}" for dtype, name in cc._TRITON_TYPES.items()}
    compiled = {n: {k for v in cc.variants() for ks in cc.configs(n, v.dtype, v.rms, None, v.residual, v.bias, v.weights, v.out).values()
                    for k in ks} for n in NS_LAUNCHED}
    seen = set()
    for name, args, kw in launched:
        a = dict(zip(names[name], args))
        t = {key: cc._TRITON_TYPES[value.dtype] for key, value in a.items() if isinstance(value, torch.Tensor)}
        y = t["Y"] if name == "forward" else t["DY"]
        k = cc.Kernel(name, t["X"], kw["RMS"], kw["BLOCK"], kw.get("ROWS", 1), kw.get("SINGLE", False), kw["num_warps"], a["N"] % 16 == 0,
                      kw.get("HAS_RESIDUAL", kw.get("HAS_DSUM", False)), kw.get("HAS_BIAS", False), t["W"], y, kw["maxnreg"], a["N"] == 1)
        assert k in compiled[a["N"]], k
        signature = cc._signature(k)[0]
        assert {key: signature[key] for key in t} == {key: types[a[key].dtype] for key in t}, k
        seen.add(k)
    assert len({k.kernel for k in seen}) == 3 and len(seen) > 100 and any(k.unit for k in seen)


@pytest.mark.parametrize(
    "registers, shared, warps, gpu, expect",
    [
        (32, 0, 4, "A100", 64),  # the warp limit
        (128, 0, 16, "A100", 16),  # 128 registers x 512 threads = the whole register file
        (64, 0, 16, "T4", 32),  # T4 keeps at most 32 warps
        (40, 0, 1, "T4", 16),  # and at most 16 programs
        (32, 100 * 1024, 4, "H100", 8),  # shared memory: two programs of 100 KiB (+1 KiB each)
        (255, 0, 4, "H100", 8),  # 255 registers round up to 8192 a warp: 8 warps
        (64, 0, 32, "H100", 32),  # a 32-warp program at its 64 registers fills the register file
        (32, 0, 32, "A100", 64),  # two of them fit at 32
    ],
)
def test_occupancy_from_registers_shared_memory_and_limits(registers, shared, warps, gpu, expect):
    gpu = next(g for g in cc.GPUS if g.name == gpu)
    assert cc.occupancy(cc.Usage(registers, 0, shared), warps, gpu) == expect


def test_the_wide_programs_are_capped_at_64_registers_so_that_32_warps_stay_resident():
    cap = plan_module.WIDE_REGISTERS
    for n in [16 * k for k in range(1, 600)] + [12288, 65536]:
        for dtype in plan_module.DTYPES:
            for backward in (False, True):
                p = plan_module.plan(n, dtype, backward=backward)
                # a 32-warp program, and a 16-warp forward program of an aligned row, carry the cap
                if p.warps == 32 or (p.warps == 16 and not backward):
                    assert p.maxnreg == cap, (n, dtype, backward, p)
                if p.maxnreg is not None:  # the registers let one program of 32 warps or two of 16 stay resident
                    assert p.maxnreg == cap and 65536 // (cap * 32 * p.warps) * p.warps >= 32, (n, p)
    bf16, fp32 = torch.bfloat16, torch.float32
    # the backward pass keeps aligned rows whole up to 8192 columns, unaligned ones up to 1024
    assert plan_module.plan(8192, bf16, backward=True) == plan_module.Plan(8192, 1, 32, True, cap)
    assert plan_module.plan(4096, bf16, backward=True) == plan_module.Plan(4096, 1, 16, True, cap)
    assert plan_module.plan(4096, fp32, backward=True) == plan_module.Plan(4096, 1, 32, True, cap)
    assert not plan_module.plan(8208, bf16, backward=True).single
    assert plan_module.plan(1023, bf16, backward=True).single and not plan_module.plan(1025, bf16, backward=True).single
    # the forward pass: 8 warps for a 4096-element tile, 16 (capped) for a whole 8192-column row
    assert plan_module.plan(4096, bf16) == plan_module.Plan(4096, 1, 8, True)
    assert plan_module.plan(16384, bf16) == plan_module.Plan(4096, 1, 8, False)
    assert plan_module.plan(8192, bf16) == plan_module.Plan(8192, 1, 16, True, cap)


def test_bad_arguments_get_a_clear_error():
    with pytest.raises(ValueError, match="processes must be a positive int"):
        cc.compile_usage([], processes=0)
    with pytest.raises(ValueError, match="n must be a positive int"):
        plan_module.plan(0, torch.float32)
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16 or float32"):
        plan_module.plan(8, torch.float64)
