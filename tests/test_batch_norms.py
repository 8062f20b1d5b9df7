"""MaskedBatchNorm1d and TimeStepBatchNorm against torch's BatchNorm and the NumPy reference."""

import numpy as np
import pytest
import torch

from lnbook.norms import MaskedBatchNorm1d, TimeStepBatchNorm
from lnbook.reference import batchnorm_forward


def padded(lengths, f=3, garbage=100.0):
    b, t = len(lengths), max(lengths)
    x = torch.randn(b, t, f, dtype=torch.float64) * 2 + 1
    mask = torch.arange(t) < torch.tensor(lengths)[:, None]
    x[~mask] = torch.randn(int((~mask).sum()), f, dtype=torch.float64) * garbage
    return x, mask


def test_unmasked_matches_nn_batchnorm1d_in_train_and_eval_with_running_stats():
    ours = MaskedBatchNorm1d(5, momentum=0.3).double()
    theirs = torch.nn.BatchNorm1d(5, momentum=0.3).double()
    with torch.no_grad():
        theirs.weight.normal_(), theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    for _ in range(3):  # three training steps on (B, T, F) batches; torch wants (B, F, T)
        x = torch.randn(4, 7, 5, dtype=torch.float64) * 3 - 2
        torch.testing.assert_close(ours(x), theirs(x.transpose(1, 2)).transpose(1, 2))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name))
    ours.eval(), theirs.eval()
    x = torch.randn(2, 5, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x))


def test_masked_statistics_equal_batchnorm_on_real_positions_only():
    x, mask = padded([6, 2, 4, 1])
    bn = MaskedBatchNorm1d(3).double()
    ref = torch.nn.BatchNorm1d(3).double()
    y = bn(x, mask)
    y_real = ref(x[mask])  # (n_real, F): only the real positions
    torch.testing.assert_close(y[mask], y_real)
    assert (y[~mask] == 0).all()
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    ref_np, _ = batchnorm_forward(x.numpy(), np.ones(3), np.zeros(3), mask=mask.numpy())
    np.testing.assert_allclose(y.detach().numpy(), ref_np, rtol=1e-12, atol=1e-12)


def test_padding_changes_neither_real_outputs_nor_running_stats_nor_gradients():
    x, mask = padded([5, 3, 4])
    x2 = x.clone()
    x2[~mask] = float("nan")  # whatever the padding holds
    outs, bns, grads = [], [], []
    for inp in (x, x2):
        bn = MaskedBatchNorm1d(3).double()
        inp = inp.clone().requires_grad_()
        y = bn(inp, mask)
        (y * torch.arange(3.0, dtype=torch.float64)).sum().backward()
        outs.append(y), bns.append(bn), grads.append(inp.grad)
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(bns[0].running_var, bns[1].running_var)
    torch.testing.assert_close(grads[0][mask], grads[1][mask])
    assert (grads[1][~mask] == 0).all()


def test_unmasked_padding_pollutes_the_statistics():
    x, mask = padded([6, 2, 2], garbage=0.0)  # zero padding, as pad_batch makes it
    polluted, clean = MaskedBatchNorm1d(3).double(), MaskedBatchNorm1d(3).double()
    polluted(x), clean(x, mask)
    assert (polluted.running_mean - clean.running_mean).abs().max() > 0.01


def test_one_real_position_raises_in_training_but_not_in_eval():
    bn = MaskedBatchNorm1d(3)
    with pytest.raises(ValueError, match="more than one real position"):
        bn(torch.randn(1, 3))
    x, mask = padded([1, 0 + 1])
    mask[1] = False
    with pytest.raises(ValueError, match="got 1"):
        bn(x.float(), mask)
    bn.eval()
    assert bn(torch.randn(1, 3)).shape == (1, 3)


def test_time_step_statistics_are_independent_across_steps():
    bn = TimeStepBatchNorm(2, max_steps=4, momentum=1.0).double()
    x = torch.randn(16, 4, 2, dtype=torch.float64)
    x[:, 2] = x[:, 2] * 10 + 5  # step 2 on its own scale
    y = bn(x)
    for t in range(4):  # each step is standardized by its own batch statistics
        torch.testing.assert_close(y[:, t].mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(bn.running_mean[2], x[:, 2].mean(0))
    x2 = x.clone()
    x2[:, 1] += 100  # changing step 1 changes nothing at the other steps
    bn2 = TimeStepBatchNorm(2, max_steps=4, momentum=1.0).double()
    y2 = bn2(x2)
    torch.testing.assert_close(y2[:, [0, 2, 3]], y[:, [0, 2, 3]])
    torch.testing.assert_close(bn2.running_mean[[0, 2, 3]], bn.running_mean[[0, 2, 3]])


def test_step_by_step_equals_whole_sequence():
    x, mask = padded([5, 5, 3, 4], f=2)
    a, b = TimeStepBatchNorm(2, 5).double(), TimeStepBatchNorm(2, 5).double()
    whole = a(x, mask=mask)
    steps = torch.stack([b(x[:, t], t, mask[:, t]) for t in range(5)], dim=1)
    torch.testing.assert_close(whole, steps)
    torch.testing.assert_close(a.running_var, b.running_var)


def test_steps_beyond_max_steps_reuse_the_last_steps_statistics():
    bn = TimeStepBatchNorm(3, max_steps=3).double()
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(3, 3)), bn.running_var.copy_(torch.rand(3, 3) + 0.5)
    bn.eval()
    x = torch.randn(4, 3, dtype=torch.float64)
    expected = (x - bn.running_mean[2]) / torch.sqrt(bn.running_var[2] + bn.eps)
    for t in (2, 3, 10, 1000):
        torch.testing.assert_close(bn(x, t), expected)
    assert not torch.allclose(bn(x, 1), expected)
    bn.train()
    with pytest.raises(ValueError, match="beyond max_steps"):
        bn(x, 3)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: MaskedBatchNorm1d(3)(torch.randn(4, 5)), ValueError, r"x must have shape \(\*lead, F\) with F = 3"),
        (lambda: MaskedBatchNorm1d(3)(torch.randn(3)), ValueError, "x must have shape"),
        (lambda: MaskedBatchNorm1d(3)(torch.ones(4, 3, dtype=torch.long)), TypeError, "floating-point"),
        (lambda: MaskedBatchNorm1d(3)(torch.randn(2, 4, 3), torch.ones(4, 2, dtype=torch.bool)), ValueError, "mask must have x's shape"),
        (lambda: MaskedBatchNorm1d(3)(torch.randn(2, 4, 3), torch.ones(2, 4)), TypeError, "mask must be a boolean tensor"),
        (lambda: MaskedBatchNorm1d(3)(torch.randn(2, 4, 3), torch.zeros(2, 4, dtype=torch.bool)), ValueError, "got 0"),
        (lambda: MaskedBatchNorm1d(0), ValueError, "positive sizes"),
        (lambda: MaskedBatchNorm1d(3, momentum=1.5), ValueError, "momentum must be"),
        (lambda: MaskedBatchNorm1d(3, eps=0), ValueError, "eps must be"),
        (lambda: TimeStepBatchNorm(3, max_steps=0), ValueError, "max_steps must be a positive int"),
        (lambda: TimeStepBatchNorm(3, 4)(torch.randn(2, 3), t=-1), ValueError, "t must be a non-negative int"),
        (lambda: TimeStepBatchNorm(3, 4)(torch.randn(2, 5, 3, 1)), ValueError, r"\(B, T, F\)"),
        (lambda: TimeStepBatchNorm(3, 4)(torch.randn(2, 4, 3), t=1), ValueError, r"\(B, F\) for one step"),
        (lambda: TimeStepBatchNorm(3, 4)(torch.randn(2, 4, 3), mask=torch.ones(2, 3, dtype=torch.bool)), ValueError, "mask must have"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_time_step_tail_with_one_real_sequence_uses_running_statistics():
    bn = TimeStepBatchNorm(2, max_steps=3).double()
    with torch.no_grad():
        bn.running_mean[2] = torch.tensor([1.0, -1.0], dtype=torch.float64)
    x = torch.randn(3, 2, dtype=torch.float64)
    mask = torch.tensor([True, False, False])
    y = bn(x, 2, mask)
    expected = (x[0] - bn.running_mean[2]) / torch.sqrt(bn.running_var[2] + bn.eps)
    torch.testing.assert_close(y[0], expected)
    assert (y[1:] == 0).all()
    torch.testing.assert_close(bn.running_mean[2], torch.tensor([1.0, -1.0], dtype=torch.float64))


def test_unpadded_steps_take_the_fused_path_with_the_same_results():
    """Steps without padding use torch's fused batch_norm; it must agree with the masked
    path (an all-True mask), and mixing both paths in one sequence must still backpropagate
    (the fused kernel must not save views of the running buffers that later steps update)."""
    torch.manual_seed(0)
    x = (torch.randn(5, 4, 6) * 2 + 1).requires_grad_()
    some = torch.tensor([True, True, True, False, False])
    fused, masked = TimeStepBatchNorm(6, 4), TimeStepBatchNorm(6, 4)
    outs = []
    for bn, first_mask in ((fused, None), (masked, torch.ones(5, dtype=torch.bool))):
        outs.append(torch.stack([bn(x[:, t], t, first_mask if t < 2 else some) for t in range(4)], 1))
    grads = [torch.autograd.grad((y**2).sum(), x)[0] for y in outs]
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(fused.running_mean, masked.running_mean)
    torch.testing.assert_close(fused.running_var, masked.running_var)
    assert fused.num_batches_tracked == masked.num_batches_tracked == 1
