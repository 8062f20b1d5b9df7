"""How the kernels tile a row: the one place that picks block, rows per tile, warps and path.

The launcher (:mod:`lnbook.kernels.norm`) and the compile check
(:mod:`lnbook.kernels.compile_check`) both call :func:`plan`, so the check compiles exactly the
kernels that run. The rules come from compiling every choice for sm_75, sm_80 and sm_90, for
every variant the package launches, and reading the registers and spills (chapter 08, "What
the compiler makes of our kernel"):

* a thread keeps ``rows * block / (32 * warps)`` elements of each live tensor in registers. The
  forward pass keeps a row whole up to 8192 columns, the backward pass, which holds x, dy, w
  and the dW/dB partial sums at once, also up to 8192 (the backward kernel's first version
  spilled beyond 4096 columns at 16 warps; today's compiles a whole 8192-column row with 32
  warps, below);
* longer rows are cut into column blocks of 4096: the forward pass loops over them; the
  backward pass first computes each row's two sums (one small kernel), then a 2-D grid of
  (row group, column block) programs writes dx and keeps its dW/dB partial sums in registers;
* short rows are packed several to a tile (up to 16), so that a program has about 2048
  elements to work on rather than 64, with one warp per 256 elements (8 a thread);
* rows shorter than 64 columns (blocks of 16, 32 or 64) instead take 4 elements a thread, in
  tiles of at least 512 elements: 32 rows of 16 columns or 16 rows of 32 (4 warps), 16 rows of
  64 (8 warps). The rule above gave them 16 rows and 8 elements a thread (4 in the backward
  pass of unaligned rows), so programs of 1 or 2 warps up to 32 columns. A 1-warp program
  leaves a T4, which keeps at most 16 programs per SM, with 16 warps; and the 2-warp forward
  program of rows of 17-31 columns spilled on the A100 (float16 and bfloat16 LayerNorm: 63
  registers needed, 56 given, 8 bytes), squeezed onto the ``.reqntid`` step of the next rule
  for 64 threads (18 programs at 56 registers). Short rows carry per-row statistics next to few
  elements and need more registers per element: the old tiles took 24-74 registers forward and
  40-103 backward, and at 8 elements a thread even a 64-register cap spilled, in both passes;
  at 4 elements a thread they compile without a spill in 18-47 (forward) and 32-64 registers
  (backward), and leave 32 warps per SM on the T4, 32-64 on the A100 and the H100. N = 1,
  which Triton compiles as a constant, is a kernel of this rule too;
* on the widest aligned tiles (4096 and 8192 elements) the register budget that ptxas picks
  decides. Triton declares a program's exact size to ptxas (``.reqntid``), and ptxas then aims
  at a budget at which a whole number of programs fits the SM's 65536 registers: for 512
  threads, 4 programs at 32 registers, 3 at 40, 2 at 64. A kernel that needs a few registers
  more than such a step is squeezed onto it and spills. The forward pass with the fused
  residual add did so with 16 warps (sm_90, float32, 4096 columns: 34 registers needed, 32
  given, 8 bytes spilled; sm_80, float16, 8192 columns: 42 needed, 40 given, 4 bytes; sm_90,
  float16 without a bias, 4096-column blocks of longer rows: 12 bytes); the same PTX without
  ``.reqntid`` gets its 34 and 42 registers and no spill. A register cap (Triton's
  ``maxnreg``) replaces that aim: ptxas then fits the kernel under the cap. And some variants
  of the backward kernel of a whole 4096-column row need 71-75 registers with 16 warps
  (float32 x, dy or weights), which left one program, 16 warps, per SM. So:

  - the forward pass runs a 4096-element tile (a whole row, or a block of a longer one) with
    8 warps, 16 elements a thread (32-64 registers), and a whole 8192-column row with 16 warps
    capped at 64 registers (two programs per SM);
  - the backward pass runs a whole 4096-column row with 16 warps capped at 64 registers, or 32
    warps when x is float32 (whose kernel with the residual add spilled under the cap on the
    A100), and a whole 8192-column row with 32 warps, 8 elements a thread (56-64 registers).
    A 32-warp program (1024 threads) can have 64 registers a thread at most; the cap says so,
    and without it ptxas squeezed the 4096-column kernel to 32 registers, to fit two programs,
    and spilled.

  Every one of these programs leaves at least 32 warps resident per SM, and none spills for
  any variant the package launches, on any of the three GPUs;
* a row length that is not a multiple of 16 halves the forward limit and quarters the backward
  one (4096 and 1024 columns; the long-row blocks are 2048 and 1024): Triton cannot prove such
  rows aligned, loads element by element, and needs about 75-100 registers a thread where
  aligned rows need 35-65, which left one 16-warp program per SM. (A whole unaligned
  2048-column row backward spills at 16 warps on the A100 and at 8 on the T4 and the A100,
  and compiles without a spill at 32 warps, in 29-39 registers: not adopted yet.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import describe

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FORWARD_SINGLE_MAX = 8192  # the longest aligned row the forward pass keeps whole in registers
BACKWARD_SINGLE_MAX = 8192  # the same for the backward pass
UNALIGNED_FORWARD_SINGLE_MAX = 4096  # the same for rows whose length is not a multiple of 16
UNALIGNED_BACKWARD_SINGLE_MAX = 1024
LONG_BLOCK = 4096  # the column block for longer rows, in both passes (halved for unaligned rows)
TILE = 2048  # elements a tile of short rows aims at
MAX_ROWS = 16  # rows per tile at most (rows shorter than SHORT_ROW: SHORT_TILE // block, 32 for 16 columns)
SHORT_ROW = 64  # rows of fewer columns than this: tiles of at least SHORT_TILE elements, SHORT_ELEMENTS_PER_THREAD a thread
SHORT_TILE = 512
SHORT_ELEMENTS_PER_THREAD = 4
ELEMENTS_PER_THREAD = 8  # warps = tile elements / (32 * this), between 1 and MAX_WARPS (unaligned backward: 4)
MAX_WARPS = 16
WIDE_REGISTERS = 64  # the register cap (maxnreg) of the wide programs below: 32 warps stay resident per SM


@dataclass(frozen=True)
class Plan:
    """One kernel launch's shape: ``rows`` x ``block`` elements per tile, ``warps`` warps per
    program; ``single``: the whole row fits in one block (else the row is cut into blocks);
    ``maxnreg``: the registers a thread may use, passed to Triton (None: ptxas chooses)."""

    block: int
    rows: int
    warps: int
    single: bool
    maxnreg: int | None = None


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def plan(n: int, dtype: torch.dtype, backward: bool = False, max_block: int | None = None) -> Plan:
    """The tiling the kernels use for rows of ``n`` elements of ``dtype``, in the forward or the
    backward pass. ``max_block`` (a power of two >= 16) caps the column block, to exercise the
    long-row path on short rows.

    One rule depends on ``dtype`` (statistics are float32 whatever the input): the backward
    pass of a whole 4096-column float32 row takes 32 warps where half precision takes 16. The
    compile check compiles whatever the rules give, for every dtype.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {describe(n)}")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {describe(dtype)}")
    if max_block is not None and (isinstance(max_block, bool) or not isinstance(max_block, int) or max_block < 16 or max_block & (max_block - 1)):
        raise ValueError(f"max_block must be a power of two >= 16, got {describe(max_block)}")
    whole = max(16, _next_power_of_2(n))
    aligned = n % 16 == 0  # unaligned rows: more registers per element
    if backward:
        limit = BACKWARD_SINGLE_MAX if aligned else UNALIGNED_BACKWARD_SINGLE_MAX
    else:
        limit = FORWARD_SINGLE_MAX if aligned else UNALIGNED_FORWARD_SINGLE_MAX
    if max_block is not None:
        limit = min(limit, max_block)
    if whole <= limit:
        block, single = whole, True
    else:
        block, single = min(LONG_BLOCK if aligned else LONG_BLOCK // 2, limit), False
    if single and n < SHORT_ROW:  # rows of 1-63 columns (module docstring): 4 or 8 warps, no cap
        rows = max(MAX_ROWS, SHORT_TILE // block)
        return Plan(block, rows, rows * block // (32 * SHORT_ELEMENTS_PER_THREAD), True)
    rows = max(1, min(MAX_ROWS, TILE // block)) if single else 1
    tile = rows * block
    per_thread = ELEMENTS_PER_THREAD // 2 if backward and not aligned else ELEMENTS_PER_THREAD
    warps = max(1, min(MAX_WARPS, tile // (32 * per_thread)))
    maxnreg = None
    if aligned and not backward and tile > TILE:  # the widest forward tiles (module docstring)
        warps, maxnreg = (8, None) if tile <= LONG_BLOCK else (16, WIDE_REGISTERS)
    if aligned and backward and single and tile > TILE:  # whole rows of 4096 and 8192 columns, backward
        warps = 16 if tile <= LONG_BLOCK and dtype != torch.float32 else 32
        maxnreg = WIDE_REGISTERS
    return Plan(block, rows, warps, single, maxnreg)
