"""Compile the kernels for GPUs that are not here, and read what ptxas made of them.

Triton compiles for any NVIDIA target without a GPU: ``triton.compile`` with a
``GPUTarget("cuda", 75 | 80 | 90, 32)`` runs the whole pipeline down to a cubin, and
``cuobjdump -res-usage`` (shipped inside the Triton wheel, next to ptxas) reads the registers,
the spill stack and the shared memory per program out of it. From those and each GPU's limits,
:func:`occupancy` gives the warps an SM can keep resident.

The kernels compiled are exactly those the package launches: the block, rows per tile, warps
and path come from :func:`lnbook.kernels.tiling.plan`, and N's divisibility by 16 (which Triton
specializes on) from N itself. Many N share one compiled kernel, so :func:`configs` collapses
a grid of N to its distinct kernels before anything is compiled.

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
DEFAULT_NS = (64, 128, 256, 512, 768, 1000, 1024, 1151, 2048, 3000, 4096, 5000, 8192, 12288, 16384, 32768, 65536)
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Kernel:
    """One compiled kernel: which function, its compile-time constants and its warps.
    ``divisible``: N (and the row length in the offsets) is a multiple of 16."""

    kernel: str  # "forward", "row_sums" or "backward"
    dtype: str  # "fp16", "bf16" or "fp32": x, y, dy, dx and the weights
    rms: bool
    block: int
    rows: int
    single: bool
    warps: int
    divisible: bool
    residual: bool = False  # the fused residual add (add_layer_norm, add_rms_norm)


@dataclass(frozen=True)
class Usage:
    """What ptxas allocated for one kernel on one GPU."""

    registers: int  # per thread
    stack: int  # bytes of spill stack per thread (0: no spill)
    shared: int  # bytes of shared memory per program


def configs(n: int, dtype: torch.dtype, rms: bool, max_block: int | None = None, residual: bool = False) -> dict[str, list[Kernel]]:
    """The kernels the package launches for rows of ``n`` elements of ``dtype``: LayerNorm
    (``rms=False``, with a bias) or RMSNorm, with the fused residual add or without, keyed
    ``"forward"`` and ``"backward"`` (the backward of a long row is two kernels)."""
    name = _TRITON_TYPES[dtype]
    out: dict[str, list[Kernel]] = {}
    for backward in (False, True):
        p = plan(n, dtype, backward=backward, max_block=max_block)
        kernels = ["backward"] if backward else ["forward"]
        if backward and not p.single:
            kernels.insert(0, "row_sums")
        out["backward" if backward else "forward"] = [
            Kernel(k, name, rms, p.block, 1 if k == "row_sums" else p.rows, p.single, p.warps, n % 16 == 0, residual and k != "row_sums")
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
    when a multiple of 16."""
    t = f"*{k.dtype}"
    f32 = "*fp32"
    if k.kernel == "forward":
        names = ["X", "R", "S", "Y", "W", "B", "Mean", "Rstd", "M", "N", "eps"]
        types = [t, t, t, t, t, t, f32, f32, "i32", "i32", "fp32"]
        const = {"BLOCK": k.block, "ROWS": k.rows, "SINGLE": k.single, "RMS": k.rms, "HAS_BIAS": not k.rms, "HAS_RESIDUAL": k.residual}
    elif k.kernel == "row_sums":
        names = ["X", "DY", "W", "Mean", "Rstd", "C1", "C2", "N"]
        types = [t, t, t, f32, f32, f32, f32, "i32"]
        const = {"BLOCK": k.block, "RMS": k.rms}
    else:
        names = ["X", "DY", "DS", "DX", "W", "Mean", "Rstd", "C1", "C2", "DW", "DB", "M", "N"]
        types = [t, t, t, t, t, f32, f32, f32, f32, f32, f32, "i32", "i32"]
        const = {"BLOCK": k.block, "ROWS": k.rows, "SINGLE": k.single, "RMS": k.rms, "HAS_BIAS": not k.rms, "HAS_DSUM": k.residual}
    signature = dict(zip(names, types)) | {name: "constexpr" for name in const}
    attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(types) if ty.startswith("*")}
    if k.divisible:
        attrs[(names.index("N"),)] = [["tt.divisibility", 16]]
    return signature, const, attrs


_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _compile_here(k: Kernel, gpu: Gpu, cuobjdump: Path, scratch: Path) -> Usage:
    """Compile ``k`` for ``gpu`` in this process (which must not be interpreting)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from . import norm

    fn = {"forward": norm._forward, "row_sums": norm._row_sums, "backward": norm._backward}[k.kernel]
    signature, const, attrs = _signature(k)
    compiled = triton.compile(
        triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=const, attrs=attrs),
        target=GPUTarget("cuda", gpu.arch, 32),
        options={"num_warps": k.warps},
    )
    path = scratch / f"{k.kernel}-{gpu.arch}-{abs(hash(k))}.cubin"
    path.write_bytes(compiled.asm["cubin"])
    text = subprocess.run([str(cuobjdump), "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    match = _RESOURCES.search(text)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage for {k}:\n{text}")
    regs, stack, static_shared, local = map(int, match.groups())
    return Usage(regs, max(stack, local), max(static_shared, int(compiled.metadata.shared)))


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


def compile_usage(jobs: Sequence[tuple[Kernel, Gpu]], processes: int = 2, timeout: float = 900) -> list[Usage]:
    """Compile each (kernel, GPU) pair in ``processes`` child processes with
    ``TRITON_INTERPRET=0`` and return what ptxas allocated, in order. Raises RuntimeError
    naming the tool when ptxas or cuobjdump is missing (see :func:`tools`)."""
    if not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive int, got {describe(processes)}")
    found = tools()
    if isinstance(found, str):
        raise RuntimeError(found)
    env = {key: value for key, value in os.environ.items()} | {"TRITON_INTERPRET": "0"}
    jobs = list(jobs)
    shares = [jobs[i::processes] for i in range(processes)]
    children = []
    for share in shares:
        if not share:
            continue
        child = subprocess.Popen(
            [sys.executable, "-m", "lnbook.kernels.compile_check", "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        children.append((share, child, json.dumps([[asdict(k), asdict(g)] for k, g in share])))
    results: dict[int, Usage] = {}
    for index, (share, child, payload) in enumerate(children):
        out, err = child.communicate(payload, timeout=timeout)
        if child.returncode:
            raise RuntimeError(f"compiling failed:\n{err[-3000:]}")
        for j, usage in enumerate(json.loads(out)):
            results[index + j * processes] = Usage(**usage)
    return [results[i] for i in range(len(jobs))]


@dataclass(frozen=True)
class Row:
    """One line of the report: a norm, dtype and pass at one N on one GPU."""

    gpu: str
    norm: str
    dtype: str
    n: int
    step: str  # "forward", "backward" or "backward (row sums)"
    block: int
    rows: int
    warps: int
    registers: int
    stack: int
    shared: int
    warps_per_sm: int
    occupancy: float  # warps_per_sm / the GPU's maximum


def check(
    ns: Iterable[int] = DEFAULT_NS, dtypes: Iterable[torch.dtype] = DTYPES, gpus: Iterable[Gpu] = GPUS,
    processes: int = 2, max_block: int | None = None, residual_dtypes: Iterable[torch.dtype] = (torch.bfloat16,),
) -> list[Row]:
    """Compile every kernel the package launches for rows of each N in ``ns``, LayerNorm and
    RMSNorm, each dtype, forward and backward, for each GPU; each distinct kernel once. The
    fused residual add (norm ``"add+LayerNorm"``, ``"add+RMSNorm"``) is compiled for the dtypes
    in ``residual_dtypes`` (by default bfloat16, the dtype of training; each one adds half
    again to the compile time). Returns one :class:`Row` per (GPU, norm, dtype, N, kernel);
    a spill is a row with stack > 0."""
    gpus, ns, dtypes, residual_dtypes = tuple(gpus), tuple(ns), tuple(dtypes), tuple(residual_dtypes)
    wanted: list[tuple] = []
    for gpu in gpus:
        for residual in (False, True):
            for rms in (False, True):
                for dtype in dtypes:
                    if residual and dtype not in residual_dtypes:
                        continue
                    label = ("add+" if residual else "") + ("RMSNorm" if rms else "LayerNorm")
                    for n in ns:
                        for kernels in configs(n, dtype, rms, max_block, residual).values():
                            wanted += [(gpu, label, dtype, n, k) for k in kernels]
    distinct = list(dict.fromkeys((k, gpu) for gpu, _, _, _, k in wanted))
    usage = dict(zip(distinct, compile_usage(distinct, processes)))
    rows = []
    for gpu, norm, dtype, n, k in wanted:
        u = usage[(k, gpu)]
        resident = occupancy(u, k.warps, gpu)
        step = {"forward": "forward", "backward": "backward", "row_sums": "backward (row sums)"}[k.kernel]
        rows.append(Row(gpu.name, norm, _TRITON_TYPES[dtype], n, step, k.block, k.rows, k.warps, u.registers, u.stack, u.shared,
                        resident, round(resident / gpu.max_warps, 3)))
    return rows


def table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width text table."""
    head = f"{'GPU':5} {'norm':13} {'dtype':5} {'N':>6} {'step':19} {'block':>5} {'rows':>4} {'warps':>5} {'regs':>4} {'spill B':>7} {'smem B':>7} {'warps/SM':>8} {'occ.':>5}"
    lines = [head]
    for r in rows:
        lines.append(f"{r.gpu:5} {r.norm:13} {r.dtype:5} {r.n:>6} {r.step:19} {r.block:>5} {r.rows:>4} {r.warps:>5} {r.registers:>4} "
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
