import numpy as np
import pytest
import torch

from lnbook import data, seeds
from lnbook.sequence_study import grid_fit


@pytest.fixture(scope="module")
def digits():
    (rows, labels), _ = data.digits_sequences("row")  # (N, 8, 8) digit rows
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # for this module's tests only: the worker's other tests keep their count
    yield (rows[:192], labels[:192]), (rows[192:256], labels[192:256]), (rows[256:320], labels[256:320])
    torch.set_num_threads(threads)


def test_each_rate_trains_as_it_would_alone(digits):
    fit, val, test = digits
    options = dict(members=2, epochs=2, hidden_size=16, batch_size=32, gain=0.1)
    both_val, both_test, pick = grid_fit("batch_per_step", fit, val, test, lrs=(1e-3, 1e-2), horizon=8, **options)
    assert both_val.shape == (2, 2, 2) and both_test.shape == (2, 2)
    alone_val, alone_test, _ = grid_fit("batch_per_step", fit, val, test, lrs=(1e-2,), horizon=8, **options)
    # the members trained at 1e-2 in the two-rate stack are the networks trained at 1e-2 alone
    np.testing.assert_allclose(both_val[1], alone_val[0], atol=1 / 64)
    np.testing.assert_allclose(both_test[1], alone_test[0], atol=1 / 64)
    assert not np.array_equal(both_val[0], both_val[1])  # the two rates did train differently
    # pick(lr) is the stack at that rate: it scores what the grid scored there
    np.testing.assert_array_equal(seeds.accuracy(pick(1e-3), test), both_test[0])


@pytest.mark.parametrize("lrs", [(), (1e-3, 1e-3), (1e-3, -1.0)])
def test_grid_fit_rejects_a_bad_grid(digits, lrs):
    fit, val, test = digits
    with pytest.raises((ValueError, TypeError), match="lrs"):
        grid_fit("none", fit, val, test, members=1, lrs=lrs, epochs=1)
