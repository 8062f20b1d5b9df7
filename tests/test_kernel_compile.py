"""lnbook.kernels.compile_check: the kernels compiled for T4, A100 and H100 without a GPU.

Triton compiles for a GPU that is not here, and ptxas reports the registers and the spill
stack of each kernel. The grid is the one the chapter prints: every N the package is tested
at, both norms, three dtypes, forward and backward, with the block and warps the launcher
picks (lnbook.kernels.tiling.plan). Compiling runs in a child process with TRITON_INTERPRET=0.
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
def test_no_kernel_spills_on_t4_a100_or_h100(grid):
    assert {r.gpu for r in grid} == {"T4", "A100", "H100"}
    assert {r.dtype for r in grid} == {"fp16", "bf16", "fp32"}
    assert {r.norm for r in grid} == {"LayerNorm", "RMSNorm", "add+LayerNorm", "add+RMSNorm"}
    assert {r.n for r in grid} == set(cc.DEFAULT_NS)
    spills = [r for r in grid if r.stack]
    assert not spills, "\n" + cc.table(spills)
    # the occupancy follows from the registers: no kernel leaves an SM with fewer than 24 warps
    assert min(r.warps_per_sm for r in grid) >= 24, "\n" + cc.table(sorted(grid, key=lambda r: r.warps_per_sm)[:5])
    assert all(0 < r.registers <= 255 and r.warps_per_sm <= next(g.max_warps for g in cc.GPUS if g.name == r.gpu) for r in grid)


@needs_ptxas
def test_the_backward_grid_asks_for_no_more_programs_per_sm_than_fit(grid):
    """backward_programs aims at backward_waves(warps) programs per multiprocessor; the compiled
    kernels' registers and shared memory must let that many stay resident, on every GPU."""
    from lnbook.kernels.norm import backward_waves

    for r in grid:
        if r.step == "backward":
            assert r.warps_per_sm // r.warps >= backward_waves(r.warps), r


def test_the_backward_grid_fills_the_gpu_and_bounds_the_partial_sums():
    from lnbook.kernels.norm import MIN_ROWS_PER_PROGRAM, backward_programs

    for n in (64, 1024, 4096, 16384):
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
    rows = cc.check(ns=(32768,), dtypes=(torch.bfloat16,), gpus=(H100,), processes=1)
    forward = [r for r in rows if r.step == "forward" and r.norm == "LayerNorm"]
    assert forward and forward[0].block == 32768 and forward[0].stack > 0, cc.table(rows)


def test_the_check_compiles_what_the_launcher_launches():
    for n in cc.DEFAULT_NS + (1, 7, 1151, 9000):
        for dtype in plan_module.DTYPES:
            kernels = cc.configs(n, dtype, rms=False)
            fwd, bwd = plan_module.plan(n, dtype), plan_module.plan(n, dtype, backward=True)
            assert [(k.block, k.rows, k.warps, k.single) for k in kernels["forward"]] == [(fwd.block, fwd.rows, fwd.warps, fwd.single)]
            assert kernels["backward"][-1].block == bwd.block and kernels["backward"][-1].warps == bwd.warps
            assert len(kernels["backward"]) == (1 if bwd.single else 2)  # a long row's backward adds the row-sums kernel
            assert fwd.single == (n <= fwd.block) and bwd.single == (n <= bwd.block)
    # many N share a kernel: the grid compiles far fewer kernels than it reports rows
    distinct = {k for n in cc.DEFAULT_NS for ks in cc.configs(n, torch.float32, False).values() for k in ks}
    assert len(distinct) < 2 * len(cc.DEFAULT_NS)


@pytest.mark.parametrize(
    "registers, shared, warps, gpu, expect",
    [
        (32, 0, 4, "A100", 64),  # the warp limit
        (128, 0, 16, "A100", 16),  # 128 registers x 512 threads = the whole register file
        (64, 0, 16, "T4", 32),  # T4 keeps at most 32 warps
        (40, 0, 1, "T4", 16),  # and at most 16 programs
        (32, 100 * 1024, 4, "H100", 8),  # shared memory: two programs of 100 KiB (+1 KiB each)
        (255, 0, 4, "H100", 8),  # 255 registers round up to 8192 a warp: 8 warps
    ],
)
def test_occupancy_from_registers_shared_memory_and_limits(registers, shared, warps, gpu, expect):
    gpu = next(g for g in cc.GPUS if g.name == gpu)
    assert cc.occupancy(cc.Usage(registers, 0, shared), warps, gpu) == expect


def test_bad_arguments_get_a_clear_error():
    with pytest.raises(ValueError, match="processes must be a positive int"):
        cc.compile_usage([], processes=0)
    with pytest.raises(ValueError, match="n must be a positive int"):
        plan_module.plan(0, torch.float32)
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16 or float32"):
        plan_module.plan(8, torch.float64)
