"""Compile the kernels for GPUs that are not here, and read what ptxas made of them.

Triton compiles for any NVIDIA target without a GPU: ``triton.compile`` with a
``GPUTarget("cuda", 75 | 80 | 90, 32)`` runs the whole pipeline down to a cubin, and
``cuobjdump -res-usage`` (shipped inside the Triton wheel, next to ptxas) reads the registers,
the spill stack and the shared memory per program out of it. From those and each GPU's limits,
:func:`occupancy` gives the warps an SM can keep resident.

The kernels compiled are exactly those the package launches: the block, rows per tile, warps
and path come from :func:`lnbook.kernels.tiling.plan`, and N's divisibility by 16 (which Triton
specializes on) from N itself, as does N = 1 (which Triton compiles as the constant 1). Many N
share one compiled kernel, so :func:`configs` collapses a grid of N to its distinct kernels
before anything is compiled. Every compile-time variant the
package can launch is in the default grid (:func:`variants`): LayerNorm with and without a bias,
RMSNorm, each with the fused residual add or without, x in each dtype, and, for float16 and
bfloat16 x, the float32 weights and float32 y of mixed precision (``torch.autocast``, a norm
without affine weights). What the grid leaves out, and why, is in :func:`variants`.

A spill is read twice: from ptxas's own report (``-v``: "bytes spill stores", "bytes spill
loads") and from the stack and local memory that ``cuobjdump`` finds in the cubin; a kernel
spills when either is non-zero.

Triton decides at import whether kernels are interpreted, so compiling needs a process with
``TRITON_INTERPRET=0``: :func:`compile_usage` starts one (``python -m
lnbook.kernels.compile_check``) and talks JSON to it. On the command line::

    python -m lnbook.kernels.compile_check            # the table for the default grid; exit 1 on a spill
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .._checks import describe
from .tiling import DTYPES, plan


@dataclass(frozen=True)
class Gpu:
    """An SM's limits (CUDA programming guide, compute capabilities table)."""

    name: str
    arch: int  # compute capability, 75 = sm_75
    max_warps: int  # resident warps per SM
    max_blocks: int  # resident programs per SM
    shared_per_sm: int  # bytes of shared memory an SM can give programs
    reserved_shared: int  # bytes the driver reserves per program (sm_80 and later: 1 KiB)
    registers: int = 65536  # 32-bit registers per SM
    register_unit: int = 256  # registers are allocated per warp in units of this many


GPUS = (
    Gpu("T4", 75, max_warps=32, max_blocks=16, shared_per_sm=64 * 1024, reserved_shared=0),
    Gpu("A100", 80, max_warps=64, max_blocks=32, shared_per_sm=164 * 1024, reserved_shared=1024),
    Gpu("H100", 90, max_warps=64, max_blocks=32, shared_per_sm=228 * 1024, reserved_shared=1024),
)
# Row lengths with every tiling of rows shorter than 64 columns, of aligned rows (N a multiple
# of 16) and of unaligned rows from 512 up, whole or in blocks (not in it: unaligned rows of
# 65-511 columns). Below 64 columns one N per kernel (tiling's rule for short rows): 1 (a
# constant to Triton), 7, 24 and 63 (blocks of 16, 32 and 64), and 16, 32 and 48 (aligned).
SHORT_NS = (1, 7, 16, 24, 32, 48, 63)
DEFAULT_NS = SHORT_NS + (64, 128, 256, 512, 768, 1000, 1024, 1151, 2048, 3000, 4096, 5000, 8192, 12288, 16384, 32768, 65536)
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Kernel:
    """One compiled kernel: which function, its compile-time constants and its warps.
    ``divisible``: N (and the row length in the offsets) is a multiple of 16; ``unit``: N is 1,
    which Triton compiles as a constant (as it does any integer argument equal to 1)."""

    kernel: str  # "forward", "row_sums" or "backward"
    dtype: str  # "fp16", "bf16" or "fp32": x (and the residual, the sum s, dx)
    rms: bool
    block: int
    rows: int
    single: bool
    warps: int
    divisible: bool
    residual: bool = False  # the fused residual add (add_layer_norm, add_rms_norm)
    bias: bool = True  # LayerNorm's bias (HAS_BIAS); RMSNorm and the row sums have none
    weights: str = ""  # the dtype of the weight and bias; "" = dtype
    out: str = ""  # the dtype of y (forward) and of dy (backward); "" = dtype
    maxnreg: int | None = None  # the launch's register cap (Plan.maxnreg)
    unit: bool = False  # N == 1, a constant

    def __post_init__(self) -> None:
        # one spelling per compiled kernel, so that equal kernels compare equal
        if self.rms or self.kernel == "row_sums":
            object.__setattr__(self, "bias", False)
        if self.kernel == "row_sums":
            object.__setattr__(self, "residual", False)
        for name in ("weights", "out"):
            if getattr(self, name) == self.dtype:
                object.__setattr__(self, name, "")


@dataclass(frozen=True)
class Usage:
    """What ptxas allocated for one kernel on one GPU."""

    registers: int  # per thread
    stack: int  # bytes a thread spills: the most of ptxas's spill stores and loads and cuobjdump's stack and local memory
    shared: int  # bytes of shared memory per program
    spill_stores: int = 0  # bytes, as ptxas -v reports them
    spill_loads: int = 0


@dataclass(frozen=True)
class Variant:
    """One way the package calls the kernels: the norm, the fused residual add or not, and the
    dtypes of x, of the weights (and bias) and of y."""

    rms: bool
    bias: bool  # LayerNorm only
    residual: bool
    dtype: torch.dtype  # x, the residual, the sum s and dx
    weights: torch.dtype
    out: torch.dtype  # y, and so dy

    @property
    def norm(self) -> str:
        name = "RMSNorm" if self.rms else "LayerNorm" if self.bias else "LayerNorm no bias"
        return ("add+" if self.residual else "") + name


def variants(
    dtypes: Iterable[torch.dtype] = DTYPES, residual_dtypes: Iterable[torch.dtype] = DTYPES, mixed: bool = True,
) -> list[Variant]:
    """Every compile-time variant of the kernels the package launches for x in ``dtypes`` (the
    fused residual add for x in ``residual_dtypes``): LayerNorm with a bias and without one
    (``nn.LayerNorm(bias=False)``, ``layer_norm(x, w)``), RMSNorm. ``mixed``: also, for float16
    and bfloat16 x, float32 weights (a model kept in float32 under ``torch.autocast``; a norm
    without affine weights, whose weight is float32 ones) and, for LayerNorm, float32 y (what
    ``torch.nn.LayerNorm`` returns under CUDA's autocast, and so the dtype of dy).

    Left out: weights of another half dtype than x's, float32 x with half weights, a weight and a
    bias of different dtypes (only a direct call with such tensors launches them); one-row
    inputs, for which Triton compiles M as the constant 1 (one program runs: neither a spill nor
    the occupancy can slow it measurably); pointers not 16-byte aligned (views at an odd offset
    into a larger buffer). M's divisibility by 16, which Triton also specializes on, leaves the
    kernels' code unchanged. (N = 1, which Triton compiles as a constant too, is a kernel of its
    own: :func:`configs` gives it.)
    """
    dtypes, residual_dtypes = tuple(dtypes), tuple(residual_dtypes)
    out = []
    for residual in (False, True):
        for rms, bias in ((False, True), (False, False), (True, False)):
            for dtype in dtypes:
                if residual and dtype not in residual_dtypes:
                    continue
                wides = (dtype, torch.float32) if mixed and dtype != torch.float32 else (dtype,)
                for weights in wides:
                    for y in (wides if not rms else (dtype,)):
                        out.append(Variant(rms, bias, residual, dtype, weights, y))
    return out


def configs(
    n: int, dtype: torch.dtype, rms: bool, max_block: int | None = None, residual: bool = False, bias: bool = True,
    weights: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
) -> dict[str, list[Kernel]]:
    """The kernels the package launches for rows of ``n`` elements of ``dtype``: LayerNorm
    (``rms=False``, with a bias unless ``bias=False``) or RMSNorm, with the fused residual add or
    without, weights in ``weights`` and y in ``out_dtype`` (None: ``dtype``), keyed
    ``"forward"`` and ``"backward"`` (the backward of a long row is two kernels)."""
    name = _TRITON_TYPES[dtype]
    extra = {"bias": bias, "weights": _TRITON_TYPES[weights or dtype], "out": _TRITON_TYPES[out_dtype or dtype]}
    out: dict[str, list[Kernel]] = {}
    for backward in (False, True):
        p = plan(n, dtype, backward=backward, max_block=max_block)
        kernels = ["backward"] if backward else ["forward"]
        if backward and not p.single:
            kernels.insert(0, "row_sums")
        out["backward" if backward else "forward"] = [
            Kernel(k, name, rms, p.block, 1 if k == "row_sums" else p.rows, p.single, p.warps, n % 16 == 0, residual, **extra,
                   maxnreg=p.maxnreg, unit=n == 1)
            for k in kernels
        ]
    return out


def occupancy(usage: Usage, warps: int, gpu: Gpu) -> int:
    """Warps one SM keeps resident for a kernel of ``warps`` warps per program using ``usage``:
    the least of what the registers, the shared memory, the warp and the program limits allow."""
    per_warp = -(-usage.registers * 32 // gpu.register_unit) * gpu.register_unit
    blocks = min(gpu.max_blocks, gpu.max_warps // warps, (gpu.registers // per_warp) // warps if per_warp else gpu.max_blocks)
    shared = usage.shared + gpu.reserved_shared
    if shared:
        blocks = min(blocks, gpu.shared_per_sm // shared)
    return blocks * warps


def tools() -> tuple[Path, Path] | str:
    """ptxas and cuobjdump from the Triton wheel (or ``TRITON_PTXAS_PATH``), or why they are missing."""
    try:
        import triton
    except ImportError:
        return "Triton is not installed"
    folder = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = Path(os.environ.get("TRITON_PTXAS_PATH", folder / "ptxas"))
    cuobjdump = folder / "cuobjdump" if (folder / "cuobjdump").exists() else Path(shutil.which("cuobjdump") or folder / "cuobjdump")
    for tool in (ptxas, cuobjdump):
        if not tool.exists():
            return f"{tool.name} not found (looked at {tool}): Triton's NVIDIA backend is missing, nothing can be compiled"
    return ptxas, cuobjdump


def _signature(k: Kernel) -> tuple[dict, dict, dict]:
    """Triton's signature, constexprs and attributes for ``k``, as the launcher specializes
    them: every pointer 16-byte aligned (torch allocations are), N with ``tt.divisibility``
    when a multiple of 16, N the constant 1 when 1. The pointers a kernel does not use get the
    tensors the launcher passes in their place: x for R and y for S without a residual, dy for
    DS without one, w for B."""
    t, w, y = f"*{k.dtype}", f"*{k.weights or k.dtype}", f"*{k.out or k.dtype}"
    f32 = "*fp32"
    if k.kernel == "forward":
        names = ["X", "R", "S", "Y", "W", "B", "Mean", "Rstd", "M", "N", "eps"]
        types = [t, t, t if k.residual else y, y, w, w, f32, f32, "i32", "i32", "fp32"]
        const = {"BLOCK": k.block, "ROWS": k.rows, "SINGLE": k.single, "RMS": k.rms, "HAS_BIAS": k.bias, "HAS_RESIDUAL": k.residual}
    elif k.kernel == "row_sums":
        names = ["X", "DY", "W", "Mean", "Rstd", "C1", "C2", "N"]
        types = [t, y, w, f32, f32, f32, f32, "i32"]
        const = {"BLOCK": k.block, "RMS": k.rms}
    else:
        names = ["X", "DY", "DS", "DX", "W", "Mean", "Rstd", "C1", "C2", "DW", "DB", "M", "N"]
        types = [t, y, t if k.residual else y, t, w, f32, f32, f32, f32, f32, f32, "i32", "i32"]
        const = {"BLOCK": k.block, "ROWS": k.rows, "SINGLE": k.single, "RMS": k.rms, "HAS_BIAS": k.bias, "HAS_DSUM": k.residual}
    if k.unit:
        const["N"] = 1
    signature = dict(zip(names, types)) | {name: "constexpr" for name in const}
    attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(types) if ty.startswith("*")}
    if k.divisible:
        attrs[(names.index("N"),)] = [["tt.divisibility", 16]]
    return signature, const, attrs


_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_REPORT = "lnbook-ptxas-v.log"  # ptxas's report, kept in Triton's cache next to the kernel


def _options(k: Kernel) -> dict:
    """The launch options the launcher passes for ``k``."""
    return {"num_warps": k.warps} | ({"maxnreg": k.maxnreg} if k.maxnreg is not None else {})


def _ptxas_report(k: Kernel, gpu: Gpu, compile_source) -> tuple[str, object]:
    """Compile with ``compile_source()`` (a call of ``triton.compile``) and return ptxas's own
    ``-v`` report with the compiled kernel. Triton runs ptxas with ``-v`` and prints the report
    when asked (``knobs.nvidia.dump_ptxas_log``); it is kept next to the kernel in Triton's
    cache. A kernel from the cache whose report is not there is assembled again by Triton's own
    ``make_cubin`` (the same ptxas, the same flags)."""
    import contextlib
    import io

    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_manager

    knobs.nvidia.dump_ptxas_log = True
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        compiled = compile_source()
    cache = get_cache_manager(compiled.hash)
    report, stored = printed.getvalue(), cache.get_file(_REPORT)
    if not _PTXAS_REGISTERS.search(report):  # from Triton's cache: no ptxas ran
        if stored is not None:
            return Path(stored).read_text(), compiled
        backend = make_backend(GPUTarget("cuda", gpu.arch, 32))
        with contextlib.redirect_stdout(printed):
            backend.make_cubin(compiled.asm["ptx"], {}, backend.parse_options(_options(k)), gpu.arch)
        report = printed.getvalue()
    if _PTXAS_REGISTERS.search(report):
        cache.put(report, _REPORT, binary=False)
    return report, compiled


def _usage(resources: str, report: str, shared: int) -> Usage:
    """A kernel's :class:`Usage` from ``cuobjdump -res-usage`` (``resources``) and ptxas's
    ``-v`` report: it spills when either shows a spill (ptxas's spill stores or loads, a stack
    frame or local memory), by the most bytes any of them shows."""
    match = _RESOURCES.search(resources)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{resources}")
    regs, stack, static_shared, local = map(int, match.groups())
    used, spills = _PTXAS_REGISTERS.findall(report), _PTXAS_SPILLS.findall(report)
    if not used or not spills:
        raise RuntimeError(f"ptxas printed no register and spill report:\n{report[-2000:]}")
    if int(used[-1]) != regs:
        raise RuntimeError(f"ptxas reported {used[-1]} registers, the cubin has {regs}: not the same kernel")
    stores, loads = map(int, spills[-1])
    return Usage(regs, max(stack, local, stores, loads), max(static_shared, shared), stores, loads)


def _compile_here(k: Kernel, gpu: Gpu, cuobjdump: Path, scratch: Path) -> Usage:
    """Compile ``k`` for ``gpu`` in this process (which must not be interpreting)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from . import norm

    fn = {"forward": norm._forward, "row_sums": norm._row_sums, "backward": norm._backward}[k.kernel]
    signature, const, attrs = _signature(k)
    report, compiled = _ptxas_report(k, gpu, lambda: triton.compile(
        triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=const, attrs=attrs),
        target=GPUTarget("cuda", gpu.arch, 32),
        options=_options(k),
    ))
    path = scratch / f"{k.kernel}-{gpu.arch}-{abs(hash(k))}.cubin"
    path.write_bytes(compiled.asm["cubin"])
    text = subprocess.run([str(cuobjdump), "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    try:
        return _usage(text, report, int(compiled.metadata.shared))
    except RuntimeError as error:
        raise RuntimeError(f"{k} on {gpu.name}: {error}") from None


def _serve() -> None:
    """The child process: read [[kernel fields, gpu fields], ...] as JSON on stdin, compile
    each, write [usage fields, ...] as JSON on stdout."""
    import tempfile

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("compiling needs TRITON_INTERPRET=0 in this process")
    found = tools()
    if isinstance(found, str):
        raise SystemExit(found)
    jobs = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as scratch:
        out = [asdict(_compile_here(Kernel(**k), Gpu(**g), found[1], Path(scratch))) for k, g in jobs]
    json.dump(out, sys.stdout)


def compile_usage(jobs: Sequence[tuple[Kernel, Gpu]], processes: int = 2, timeout: float | None = None) -> list[Usage]:
    """Compile each (kernel, GPU) pair in ``processes`` child processes with
    ``TRITON_INTERPRET=0`` and return what ptxas allocated, in order. ``timeout``: seconds a
    child may take; None: 300 plus 1 a kernel of its share (a kernel takes about 0.2 s of one
    core cold, a few ms from Triton's cache; the default grid gives each of 2 children about
    2700). Raises RuntimeError naming the tool when ptxas or cuobjdump is missing (see
    :func:`tools`)."""
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive int, got {describe(processes)}")
    found = tools()
    if isinstance(found, str):
        raise RuntimeError(found)
    env = {key: value for key, value in os.environ.items()} | {"TRITON_INTERPRET": "0"}
    jobs = list(jobs)
    shares = [share for share in (jobs[i::processes] for i in range(processes)) if share]

    def run(share: list[tuple[Kernel, Gpu]]) -> list[Usage]:
        child = subprocess.run(
            [sys.executable, "-m", "lnbook.kernels.compile_check", "--serve"],
            input=json.dumps([[asdict(k), asdict(g)] for k, g in share]), capture_output=True, text=True, env=env,
            timeout=timeout if timeout is not None else 300 + len(share),
        )
        if child.returncode:
            raise RuntimeError(f"compiling failed:\n{child.stderr[-3000:]}")
        return [Usage(**usage) for usage in json.loads(child.stdout)]

    # the children compile at the same time: each waits for its whole share on stdin
    with ThreadPoolExecutor(max_workers=len(shares) or 1) as pool:
        done = list(pool.map(run, shares))
    results = {index + j * processes: usage for index, usages in enumerate(done) for j, usage in enumerate(usages)}
    return [results[i] for i in range(len(jobs))]


@dataclass(frozen=True)
class Row:
    """One line of the report: a norm, dtypes and pass at one N on one GPU."""

    gpu: str
    norm: str
    dtype: str  # x's
    n: int
    step: str  # "forward", "backward" or "backward (row sums)"
    block: int
    rows: int
    warps: int
    registers: int
    stack: int  # bytes a thread spills (Usage.stack); 0: no spill
    shared: int
    warps_per_sm: int
    occupancy: float  # warps_per_sm / the GPU's maximum
    weights: str = ""  # the weights' dtype, y's (and dy's): x's unless mixed precision
    out: str = ""


def check(
    ns: Iterable[int] = DEFAULT_NS, dtypes: Iterable[torch.dtype] = DTYPES, gpus: Iterable[Gpu] = GPUS,
    processes: int = 2, max_block: int | None = None, residual_dtypes: Iterable[torch.dtype] = DTYPES, mixed: bool = True,
) -> list[Row]:
    """Compile every kernel the package launches for rows of each N in ``ns``, for each GPU:
    each of :func:`variants` (``dtypes``: x's dtypes; the fused residual add, norms
    ``"add+LayerNorm"`` and the like, for x in ``residual_dtypes``; ``mixed``: float32 weights
    and y with half x), forward and backward; each distinct kernel once. Returns one :class:`Row`
    per (GPU, variant, N, kernel); a spill is a row with stack > 0."""
    gpus, ns = tuple(gpus), tuple(ns)
    wanted: list[tuple] = []
    for gpu in gpus:
        for v in variants(dtypes, residual_dtypes, mixed):
            for n in ns:
                for kernels in configs(n, v.dtype, v.rms, max_block, v.residual, v.bias, v.weights, v.out).values():
                    wanted += [(gpu, v, n, k) for k in kernels]
    distinct = list(dict.fromkeys((k, gpu) for gpu, _, _, k in wanted))
    usage = dict(zip(distinct, compile_usage(distinct, processes)))
    rows = []
    for gpu, v, n, k in wanted:
        u = usage[(k, gpu)]
        resident = occupancy(u, k.warps, gpu)
        step = {"forward": "forward", "backward": "backward", "row_sums": "backward (row sums)"}[k.kernel]
        rows.append(Row(gpu.name, v.norm, _TRITON_TYPES[v.dtype], n, step, k.block, k.rows, k.warps, u.registers, u.stack, u.shared,
                        resident, round(resident / gpu.max_warps, 3), _TRITON_TYPES[v.weights], _TRITON_TYPES[v.out]))
    return rows


def table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width text table; the weights' and y's dtypes in their own columns
    when some row has them differ from x's."""
    mixed = any(r.weights not in ("", r.dtype) or r.out not in ("", r.dtype) for r in rows)
    width = max([13] + [len(r.norm) for r in rows])
    dtypes = f"{'dtype':5} {'w':4} {'y':4}" if mixed else f"{'dtype':5}"
    head = (f"{'GPU':5} {'norm':{width}} {dtypes} {'N':>6} {'step':19} {'block':>5} {'rows':>4} {'warps':>5} {'regs':>4} "
            f"{'spill B':>7} {'smem B':>7} {'warps/SM':>8} {'occ.':>5}")
    lines = [head]
    for r in rows:
        kinds = f"{r.dtype:5} {r.weights or r.dtype:4} {r.out or r.dtype:4}" if mixed else f"{r.dtype:5}"
        lines.append(f"{r.gpu:5} {r.norm:{width}} {kinds} {r.n:>6} {r.step:19} {r.block:>5} {r.rows:>4} {r.warps:>5} {r.registers:>4} "
                     f"{r.stack:>7} {r.shared:>7} {r.warps_per_sm:>8} {r.occupancy:>5.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Compile lnbook's kernels for T4, A100 and H100 and report registers, spills, occupancy.")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, nargs="*", default=list(DEFAULT_NS), help="row lengths")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.serve:
        _serve()
        return 0
    rows = check(args.n)
    print(json.dumps([asdict(r) for r in rows]) if args.json else table(rows))
    spills = [r for r in rows if r.stack]
    if spills:
        print(f"{len(spills)} kernels spill", file=sys.stderr)
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
