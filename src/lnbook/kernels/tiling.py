"""How the kernels tile a row: the one place that picks block, rows per tile, warps and path.

The launcher (:mod:`lnbook.kernels.norm`) and the compile check
(:mod:`lnbook.kernels.compile_check`) both call :func:`plan`, so the check compiles exactly the
kernels that run. The rules come from compiling every choice for sm_75, sm_80 and sm_90 and
reading the register use (chapter 08, "What the compiler makes of our kernel"):

* a thread keeps ``rows * block / (32 * warps)`` elements of each live tensor in registers; at
  16 warps (512 threads) ptxas may use at most 128 registers a thread, so the forward pass
  keeps a row whole only up to 8192 columns (16 elements a thread) and the backward pass, which
  holds x, dy, w and the dW/dB partial sums at once, up to 4096 columns (8 a thread; the first
  version of the backward kernel spilled beyond that, and the present one compiles at 8192
  columns without spilling, so this limit is conservative);
* longer rows are cut into column blocks: the forward pass loops over them; the backward pass
  first computes each row's two sums (one small kernel), then a 2-D grid of (row group, column
  block) programs writes dx and keeps its dW/dB partial sums in registers;
* short rows are packed several to a tile (up to 16), so that a program has about 2048
  elements to work on rather than 64;
* a row length that is not a multiple of 16 halves the forward limit and quarters the backward
  one (and halves the long-row block): Triton cannot prove such rows
  aligned, loads element by element, and needs about 75-100 registers a thread where aligned
  rows need 35-65, which left one 16-warp program per SM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import describe

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FORWARD_SINGLE_MAX = 8192  # the longest row the forward pass keeps whole in registers
BACKWARD_SINGLE_MAX = 4096  # the same for the backward pass
LONG_BLOCK = 4096  # the column block for longer rows, in both passes
TILE = 2048  # elements a tile of short rows aims at
MAX_ROWS = 16  # rows per tile at most
ELEMENTS_PER_THREAD = 8  # warps = tile elements / (32 * this), between 1 and 16
MAX_WARPS = 16


@dataclass(frozen=True)
class Plan:
    """One kernel launch's shape: ``rows`` x ``block`` elements per tile, ``warps`` warps per
    program; ``single``: the whole row fits in one block (else the row is cut into blocks)."""

    block: int
    rows: int
    warps: int
    single: bool


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def plan(n: int, dtype: torch.dtype, backward: bool = False, max_block: int | None = None) -> Plan:
    """The tiling the kernels use for rows of ``n`` elements of ``dtype``, in the forward or the
    backward pass. ``max_block`` (a power of two >= 16) caps the column block, to exercise the
    long-row path on short rows.

    The rules do not depend on ``dtype`` today (statistics are float32 whatever the input, and
    the compile check found no spill with one rule for all three); it is an argument so that
    a rule per dtype stays a one-line change that the check would compile.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {describe(n)}")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {describe(dtype)}")
    if max_block is not None and (isinstance(max_block, bool) or not isinstance(max_block, int) or max_block < 16 or max_block & (max_block - 1)):
        raise ValueError(f"max_block must be a power of two >= 16, got {describe(max_block)}")
    whole = max(16, _next_power_of_2(n))
    shrink = 1 if n % 16 == 0 else 2  # unaligned rows: more registers per element
    limit = (BACKWARD_SINGLE_MAX // shrink**2) if backward else (FORWARD_SINGLE_MAX // shrink)
    if max_block is not None:
        limit = min(limit, max_block)
    if whole <= limit:
        block, single = whole, True
    else:
        block, single = min(LONG_BLOCK // shrink, limit), False
    rows = max(1, min(MAX_ROWS, TILE // block)) if single else 1
    per_thread = ELEMENTS_PER_THREAD // shrink if backward else ELEMENTS_PER_THREAD
    warps = max(1, min(MAX_WARPS, rows * block // (32 * per_thread)))
    return Plan(block, rows, warps, single)
