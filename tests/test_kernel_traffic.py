"""lnbook.kernels.traffic: the bytes the kernels move against the minimum, from the launch plan."""

import pytest
import torch

from lnbook.bench import layernorm_traffic
from lnbook.kernels.norm import MIN_ROWS_PER_PROGRAM, backward_programs
from lnbook.kernels.tiling import plan
from lnbook.kernels.traffic import kernel_traffic


def test_a_row_that_fits_one_block_moves_the_minimum_forward():
    t = kernel_traffic(4096, 1024, torch.bfloat16)
    assert t.total == t.minimum == layernorm_traffic(4096, 1024, 2)["bytes"]
    assert t.ratio == 1.0


def test_long_rows_are_read_once_per_forward_pass():
    n = 4 * plan(4096, torch.float32).block  # longer than the forward's whole-row limit
    assert not plan(n, torch.float32).single
    rows = 64 * n * 4
    assert kernel_traffic(64, n, torch.float32).repeat_reads == 2 * rows  # mean, variance, output
    assert kernel_traffic(64, n, torch.float32, rms=True).repeat_reads == rows  # no mean pass
    assert kernel_traffic(64, n, torch.float32, residual=True).repeat_reads == 2 * 2 * rows  # x and r each pass


def test_backward_partial_sums_follow_the_grid():
    m, n = 4096, 1024
    p = backward_programs(m, n, plan(n, torch.bfloat16, backward=True), 132)
    t = kernel_traffic(m, n, torch.bfloat16, backward=True)
    assert t.partial_sums == 2 * p * n * 4 * 2  # dW and dB, float32, written and read by the sum
    assert t.repeat_reads == 0


@pytest.mark.parametrize("n", [64, 768, 1024, 1151, 4096, 5000, 8192, 16384])
@pytest.mark.parametrize("m", [512, 4096, 8192])
def test_partial_sums_stay_within_the_bound_of_the_row_minimum(m, n):
    t = kernel_traffic(m, n, torch.bfloat16, backward=True)
    rows = 3 * m * n * 2
    assert t.partial_sums <= rows * 16 / (6 * MIN_ROWS_PER_PROGRAM)
    assert (t.repeat_reads == 0) == plan(n, torch.bfloat16, backward=True).single
    if t.repeat_reads:  # the second read of x and dy
        assert t.repeat_reads == 2 * m * n * 2


def test_residual_adds_its_tensors_to_the_minimum():
    plain, fused = (kernel_traffic(256, 768, torch.float16, residual=r) for r in (False, True))
    assert fused.minimum - plain.minimum == 2 * 256 * 768 * 2  # r read, the sum written
    plain, fused = (kernel_traffic(256, 768, torch.float16, backward=True, residual=r) for r in (False, True))
    assert fused.minimum - plain.minimum == 256 * 768 * 2  # the sum's own gradient read


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="m"):
        kernel_traffic(0, 8, torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        kernel_traffic(8, 8, torch.float64)
    with pytest.raises(ValueError, match="multiprocessors"):
        kernel_traffic(8, 8, torch.float32, multiprocessors=0)
