"""The bytes lnbook's kernels move, launch by launch, against the least a norm must move.

:func:`lnbook.bench.layernorm_traffic` counts the minimum: every tensor read or written once.
The kernels move more in three places, all of which follow from :func:`~lnbook.kernels.tiling.plan`
and :func:`~lnbook.kernels.norm.backward_programs`:

* ``repeat_reads``: a row longer than one forward block is read once per pass (three passes
  for LayerNorm: mean, variance, output; two for RMSNorm), and a row longer than one backward
  block is read twice (:func:`~lnbook.kernels.norm._row_sums`, then the 2-D grid). The
  forward's later passes re-read a row of at most 64 KiB that the same program has just read,
  so on a GPU they may come from cache; the backward's second read follows a kernel that has
  streamed every row, so for large inputs it comes from memory.
* ``partial_sums``: the backward's ``(P, N)`` float32 buffers of dW (and dB), written once and
  read again by the final sum.
* ``statistics``: per-row float32 values beyond the minimum's: the mean that the RMSNorm kernels
  store and load although it is 0, and the two row sums that a long backward row writes and reads.

Not counted: the weights and biases, which every program reads (a vector that stays in cache).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._checks import check_positive_int, describe
from ..bench import layernorm_traffic
from .norm import backward_programs
from .tiling import DTYPES, plan


class Traffic(NamedTuple):
    """Bytes of one pass: ``minimum`` (every tensor once) and what the kernels add to it."""

    minimum: int
    repeat_reads: int
    partial_sums: int
    statistics: int

    @property
    def total(self) -> int:
        return self.minimum + self.repeat_reads + self.partial_sums + self.statistics

    @property
    def ratio(self) -> float:
        """Bytes moved per byte of the minimum."""
        return self.total / self.minimum


def kernel_traffic(
    m: int, n: int, dtype: torch.dtype, *, backward: bool = False, rms: bool = False, residual: bool = False,
    multiprocessors: int = 132,
) -> Traffic:
    """The bytes the kernels move for ``(m, n)`` rows of ``dtype`` in the forward or the backward
    pass, on a GPU with ``multiprocessors`` SMs (132: an H100 SXM). ``residual``: the fused
    residual add (forward: also reads r and writes the sum; backward: also reads the sum's own
    gradient). LayerNorm has a bias; RMSNorm has none."""
    check_positive_int(m, "m")
    check_positive_int(n, "n")
    check_positive_int(multiprocessors, "multiprocessors")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {describe(dtype)}")
    size = torch.empty(0, dtype=dtype).element_size()
    rows = m * n * size  # one (m, n) tensor
    minimum = layernorm_traffic(m, n, size, backward=backward, rms=rms)["bytes"] + (rows if backward else 2 * rows) * residual
    p = plan(n, dtype, backward=backward)
    statistics = 4 * m if rms else 0  # the RMSNorm kernels store (forward) or load (backward) a mean of 0
    if not backward:
        passes = 1 if p.single else 2 if rms else 3
        return Traffic(minimum, (passes - 1) * rows * (2 if residual else 1), 0, statistics)
    programs = backward_programs(m, n, p, multiprocessors)
    partial = (1 if rms else 2) * programs * n * 4 * 2  # dW (and dB): written by the grid, read by the sum
    if p.single:
        return Traffic(minimum, 0, partial, statistics)
    # _row_sums reads x, dy, mean and rstd, and writes the two row sums, which _backward reads
    return Traffic(minimum, 2 * rows, partial, statistics + 3 * 2 * 4 * m)
