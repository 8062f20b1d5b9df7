"""lnbook.norms: each norm against torch or a float64 reference, the norm choices of the models, and the norm table."""

import pickle

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from lnbook import models, norms, reference, rnn, train, transformer
from lnbook.norms import AdaNorm, DetachNorm, DyT, LayerNorm, MaskedBatchNorm1d, RMSNorm, TimeStepBatchNorm
from lnbook.reference import batchnorm_forward
from lnbook.utils import seed_everything


# ---------------------------------------------------------------- LayerNorm
# (input shape, normalized_shape, non-contiguous, elementwise_affine, bias): 24 cases.
CASES = [
    ((4, 1), (1,), False, True, True),  # 1-element rows: output is exactly the bias
    ((1, 1), 1, False, True, True),
    ((3, 1, 1), (1, 1), False, True, False),
    ((7,), 7, False, True, True),
    ((5, 8), 8, False, True, True),
    ((5, 8), 8, True, True, True),
    ((2, 3, 16), 16, False, True, True),
    ((2, 3, 16), (3, 16), False, True, True),
    ((2, 3, 16), 16, True, True, True),
    ((2, 3, 4, 5), 5, False, True, True),
    ((2, 3, 4, 5), (4, 5), False, False, True),
    ((2, 3, 4, 5), (3, 4, 5), True, True, True),
    ((6, 33), 33, False, False, True),
    ((6, 33), 33, True, False, True),
    ((6, 33), 33, False, True, False),
    ((6, 33), 33, True, True, False),
    ((1, 2, 1, 3), 3, False, True, True),
    ((9, 2, 127), 127, False, True, True),
    ((9, 2, 127), 127, True, True, False),
    ((3, 1000), 1000, False, True, True),
    ((2, 5, 7), (5, 7), True, False, True),
    ((10, 2), 2, False, True, True),
    ((0, 4), 4, False, True, True),  # an empty batch is fine; empty rows are not
    ((4, 2, 3, 3), (2, 3, 3), False, True, True),
]


def make_input(shape, non_contiguous):
    if not non_contiguous:
        return torch.randn(shape, dtype=torch.float64) * 3 + 1
    # Same shape, but a transposed view of a tensor laid out the other way round.
    base = torch.randn(tuple(reversed(shape)), dtype=torch.float64) * 3 + 1
    x = base.permute(*reversed(range(len(shape))))
    assert not x.is_contiguous() or x.numel() <= 1
    return x


@pytest.mark.parametrize("shape, normalized_shape, non_contiguous, affine, bias", CASES)
def test_module_matches_torch_forward_and_all_gradients(shape, normalized_shape, non_contiguous, affine, bias):
    ours = LayerNorm(normalized_shape, elementwise_affine=affine, bias=bias, dtype=torch.float64)
    theirs = torch.nn.LayerNorm(normalized_shape, elementwise_affine=affine, bias=bias, dtype=torch.float64)
    with torch.no_grad():  # random gain and bias, the same in both
        for p in theirs.parameters():
            p.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = make_input(shape, non_contiguous)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ours(x1), theirs(x2)
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y1)
    y1.backward(dy)
    y2.backward(dy)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-10, atol=1e-12)
    for p1, p2 in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-10, atol=1e-12)


def test_module_is_a_drop_in_for_nn_layernorm():
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    ours = torch.nn.Sequential(torch.nn.Linear(6, 8), LayerNorm(8), torch.nn.Linear(8, 2))
    ours.load_state_dict(net.state_dict())
    x = torch.randn(5, 6)
    torch.testing.assert_close(ours(x), net(x))
    assert repr(ours[1]) == "LayerNorm((8,), eps=1e-05, elementwise_affine=True)"


def test_replace_layer_norms_keeps_loss_and_gradients():
    from lnbook.norms import replace_layer_norms

    torch.manual_seed(0)
    ref = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).double()
    with torch.no_grad():
        ref.norm1.weight.normal_(), ref.norm2.bias.normal_()
    swapped = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).double()
    swapped.load_state_dict(ref.state_dict())
    assert replace_layer_norms(swapped) == 2
    assert isinstance(swapped.norm1, LayerNorm) and not any(type(m) is torch.nn.LayerNorm for m in swapped.modules())
    # float64 gains and biases arrive bit for bit (loaded after the move to float64, not rounded through float32)
    assert torch.equal(swapped.norm1.weight, ref.norm1.weight) and torch.equal(swapped.norm2.bias, ref.norm2.bias)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    weights = torch.randn(3, 5, 16, dtype=torch.float64)  # a loss whose gradient LayerNorm's Jacobian does not annihilate
    losses = [(m(x) * weights).sum() for m in (ref, swapped)]
    torch.testing.assert_close(losses[0], losses[1])
    for m, loss in zip((ref, swapped), losses):
        loss.backward()
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), swapped.named_parameters(), strict=True):
        assert n1 == n2
        torch.testing.assert_close(p1.grad, p2.grad)


# ---------------------------------------------------------------- RMSNorm and DyT
def test_rmsnorm_matches_the_float64_reference_and_torch():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8, dtype=torch.float64) * 3 + 1
    norm = RMSNorm(8).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    expected = reference.rmsnorm_forward(x.numpy(), norm.weight.detach().numpy(), 1e-6)
    np.testing.assert_allclose(norm(x).detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    theirs = torch.nn.RMSNorm(8, eps=1e-6).double()
    theirs.load_state_dict(norm.state_dict())
    torch.testing.assert_close(norm(x), theirs(x), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(norm, (x.clone().requires_grad_(),))
    norm(x).pow(2).sum().backward()
    theirs(x).pow(2).sum().backward()
    torch.testing.assert_close(norm.weight.grad, theirs.weight.grad, rtol=1e-12, atol=1e-12)


def test_rmsnorm_statistics_in_float32_for_half_inputs():
    x = torch.randn(4, 64) * 300
    y = RMSNorm(64)(x.half())
    assert y.dtype == torch.float16 and torch.isfinite(y).all()  # x**2 overflows float16 itself
    torch.testing.assert_close(y.float(), RMSNorm(64)(x), rtol=1e-2, atol=1e-2)


def test_dyt_matches_the_float64_reference_and_has_gradients():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, dtype=torch.float64) * 2
    dyt = DyT(6, alpha_init=0.7).double()
    with torch.no_grad():
        dyt.weight.uniform_(0.5, 1.5)
        dyt.bias.uniform_(-0.5, 0.5)
    expected = reference.dyt_forward(x.numpy(), dyt.alpha.item(), dyt.weight.detach().numpy(), dyt.bias.detach().numpy())
    np.testing.assert_allclose(dyt(x).detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(dyt, (x.clone().requires_grad_(),))
    dyt(x).sum().backward()
    assert dyt.alpha.grad is not None and dyt.alpha.grad.abs() > 0


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: RMSNorm(0), ValueError, "positive sizes"),
        (lambda: RMSNorm(4, eps=0), ValueError, "eps must be a positive"),
        (lambda: RMSNorm(4)(torch.randn(2, 5)), ValueError, "trailing dimensions"),
        (lambda: RMSNorm(4)(torch.ones(2, 4, dtype=torch.long)), TypeError, "floating-point"),
        (lambda: DyT(4, alpha_init=float("nan")), ValueError, "alpha_init must be a finite number"),
        (lambda: DyT(4)(torch.randn(2, 5)), ValueError, "trailing dimensions"),
    ],
)
def test_norms_reject_bad_input(make, error, match):
    with pytest.raises(error, match=match):
        make()


# ---------------------------------------------------------------- DetachNorm, AdaNorm and the other norm choices
def float64_case(shape, scale=3.0, shift=1.0):
    """x (shape), gamma and beta (H,) and an upstream gradient dy, all float64."""
    x = torch.randn(shape, dtype=torch.float64) * scale + shift
    h = shape[-1]
    gamma, beta = torch.randn(h, dtype=torch.float64), torch.randn(h, dtype=torch.float64)
    return x, gamma, beta, torch.randn(shape, dtype=torch.float64)


def grads(module, x, dy):
    """(y, dL/dx, [dL/dp for each parameter]) for L = sum(dy * module(x))."""
    x = x.clone().requires_grad_()
    y = module(x)
    y.backward(dy)
    return y.detach(), x.grad, [p.grad for p in module.parameters()]


@pytest.mark.parametrize("shape", [(6, 8), (2, 3, 33), (4, 1)])
def test_detachnorm_is_layernorm_forward_with_the_mu_and_sigma_constant_gradient(shape):
    x, gamma, beta, dy = float64_case(shape)
    norm = DetachNorm(shape[-1]).double()
    with torch.no_grad():
        norm.weight.copy_(gamma), norm.bias.copy_(beta)
    y, dx, (dgamma, dbeta) = grads(norm, x, dy)
    y_ref, cache = reference.layernorm_forward(x.numpy(), gamma.numpy(), beta.numpy())
    _, dgamma_ref, dbeta_ref = reference.layernorm_backward(dy.numpy(), cache)
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-12, atol=1e-12)
    # mu and sigma treated as constants: only the first term of LayerNorm's backward (chapter 03)
    np.testing.assert_allclose(dx.numpy(), cache.rstd * dy.numpy() * gamma.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dgamma.numpy(), dgamma_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dbeta.numpy(), dbeta_ref, rtol=1e-12, atol=1e-12)


def test_detachnorm_gradient_differs_from_layernorms_in_the_two_directions_it_drops():
    x, _, _, dy = float64_case((32, 8))
    _, dx, _ = grads(DetachNorm(8, elementwise_affine=False).double(), x, dy)
    _, cache = reference.layernorm_forward(x.numpy(), np.ones(8), np.zeros(8))
    true_dx, _, _ = reference.layernorm_backward(dy.numpy(), cache)
    dx = dx.numpy()
    assert np.linalg.norm(dx - true_dx) > 0.3 * np.linalg.norm(true_dx)  # chapter 03: about sqrt(2 / (H - 2))
    # LayerNorm's gradient has zero sum and (up to eps) zero projection on xhat in every row;
    # DetachNorm's keeps both components
    assert np.abs(true_dx.sum(-1)).max() < 1e-12 and np.abs((true_dx * cache.xhat).sum(-1)).max() < 1e-4
    assert np.abs(dx.sum(-1)).mean() > 0.1 and np.abs((dx * cache.xhat).sum(-1)).mean() > 0.1


@pytest.mark.parametrize("k, c", [(0.1, 1.0), (0.1, 2.0), (0.25, 0.5)])
def test_adanorm_against_float64_reference(k, c):
    x, _, _, dy = float64_case((5, 3, 16), scale=10.0, shift=-4.0)
    y, dx, params = grads(AdaNorm(16, k=k, C=c), x, dy)
    assert params == []
    yhat, cache = reference.layernorm_forward(x.numpy(), np.ones(16), np.zeros(16))
    phi = c * (1 - k * yhat)
    np.testing.assert_allclose(y.numpy(), phi * yhat, rtol=1e-12, atol=1e-12)
    # phi is a constant in the backward pass: LayerNorm's backward of phi * dy
    dx_ref, _, _ = reference.layernorm_backward(phi * dy.numpy(), cache)
    np.testing.assert_allclose(dx.numpy(), dx_ref, rtol=1e-10, atol=1e-12)


def test_gradcheck_float64():
    x = torch.randn(3, 2, 6, dtype=torch.float64, requires_grad=True)
    # where nothing is detached, the backward is the derivative of the forward
    for norm in (AdaNorm(6, k=0.0, C=1.5), RMSNorm(6).double(), DyT(6).double()):
        assert torch.autograd.gradcheck(norm, (x,))
    detach = DetachNorm(6).double()  # its gain and bias get their true gradients

    def with_parameters(weight, bias):
        return functional_call(detach, {"weight": weight, "bias": bias}, (x.detach(),))

    weight, bias = (torch.randn(6, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(with_parameters, (weight, bias))
    # by design, DetachNorm's and AdaNorm's input gradients are not the forward's derivative
    for norm in (detach, AdaNorm(6, k=0.1)):
        assert not torch.autograd.gradcheck(norm, (x,), raise_exception=False)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("make", [lambda: DetachNorm(256), lambda: AdaNorm(256, C=2.0)], ids=["detach", "adanorm"])
def test_low_precision_against_float64(make, dtype, tol):
    x = (torch.randn(8, 256, dtype=torch.float64) * 4 + 2).to(dtype)
    y = make()(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), make().double()(x.double()), rtol=tol, atol=4 * tol)


def test_group4_over_lstm_gates_normalizes_each_gate_separately():
    gates = torch.randn(5, 4 * 8, dtype=torch.float64) * 3
    per_gate = torch.cat([torch.nn.functional.layer_norm(g, (8,)) for g in gates.chunk(4, dim=1)], dim=1)
    group = norms.norm_layer("group4", 4 * 8).double()
    torch.testing.assert_close(group(gates), per_gate, rtol=1e-12, atol=1e-12)
    sequence = torch.randn(2, 5, 4 * 8, dtype=torch.float64)  # any leading shape: each position alone
    torch.testing.assert_close(group(sequence), group(sequence.reshape(10, -1)).reshape(2, 5, -1), rtol=0, atol=0)


def mlp(norm):
    return models.MLP(64, (16, 16), 10, norm)


def lstm(norm):
    return rnn.SequenceClassifier(rnn.LSTMCell(4, 8, norm, max_steps=3), 10)


TINY = {mlp: (torch.rand(24, 64), torch.arange(24) % 10), lstm: (torch.rand(24, 3, 4), torch.arange(24) % 10)}


@pytest.mark.parametrize("norm", [n for n in rnn.NORMS if n not in ("none", "layer", "batch")])
@pytest.mark.parametrize("make", [mlp, lstm], ids=["mlp", "lstm"])
def test_every_new_norm_builds_trains_a_step_and_pickles(make, norm):
    assert norm in models.MLP.NORMS
    seed_everything(0)
    model = make(norm)
    x, y = TINY[make]
    before = [p.detach().clone() for p in model.parameters()]
    history = train.fit(model, (x, y), (x, y), epochs=1, lr=1e-2, batch_size=12, seed=0, max_steps=2)
    assert len(history.step_loss) == 2 and np.isfinite(history.step_loss).all()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))  # every parameter learned
    copy = pickle.loads(pickle.dumps(model))  # as fit_many sends models to worker processes and back
    model.eval(), copy.eval()
    assert type(copy) is type(model) and torch.equal(copy(x), model(x))


@pytest.mark.parametrize("make", [mlp, lstm], ids=["mlp", "lstm"])
def test_weight_normalization_starts_as_the_plain_network(make):
    seed_everything(0)
    plain = make("none")
    seed_everything(0)
    normed = make("weight")
    x = TINY[make][0]
    torch.testing.assert_close(normed(x), plain(x), rtol=1e-5, atol=1e-6)
    layers = [normed.net[1], normed.net[3]] if make is mlp else [normed.cell] * 2
    names = ["weight"] * 2 if make is mlp else ["weight_ih", "weight_hh"]
    for layer, name in zip(layers, names):
        gain = layer.parametrizations[name].original0  # g, one per row
        torch.testing.assert_close(getattr(layer, name).norm(dim=1, keepdim=True), gain.abs())
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in normed.modules())


def test_instance_norm_is_refused_with_the_reason_that_holds():
    for build in (lambda: models.MLP(64, (16,), 10, "instance"), lambda: rnn.LSTMCell(4, 8, "instance")):
        with pytest.raises(ValueError, match=r"norm='instance' has nothing to normalize over"):
            build()
    h = torch.randn(5, 16)
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        torch.nn.InstanceNorm1d(16)(h[:, :, None])
    per_feature = torch.nn.GroupNorm(16, 16)
    torch.nn.init.normal_(per_feature.bias)
    torch.testing.assert_close(per_feature(h), per_feature.bias.expand(5, 16).detach(), rtol=0, atol=1e-3)


def test_bad_input():
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        DetachNorm(4)(torch.ones(2, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        AdaNorm(4)(np.ones((2, 4)))
    for norm in (DetachNorm(4), AdaNorm(4)):
        with pytest.raises(ValueError, match="normalized_shape .* does not match the trailing dimensions of x"):
            norm(torch.randn(4, 5))
    for bad in (-0.1, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="k must be a finite number >= 0"):
            AdaNorm(4, k=bad)
    for bad in (0, -1.0, float("inf"), None):
        with pytest.raises(ValueError, match="C must be a finite number > 0"):
            AdaNorm(4, C=bad)
    for make in (DetachNorm, AdaNorm):
        with pytest.raises(ValueError, match="eps must be a positive"):
            make(4, eps=0.0)
        with pytest.raises(TypeError, match="normalized_shape must be an int"):
            make("4")
    for build in (lambda: models.MLP(64, (16,), 10, "groupnorm"), lambda: rnn.LSTMCell(4, 8, "batch_unmasked")):
        with pytest.raises(ValueError, match="norm must be one of"):
            build()


# ---------------------------------------------------------------- MaskedBatchNorm1d and TimeStepBatchNorm
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
def test_batch_norms_reject_bad_input(call, error, match):
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


# ---------------------------------------------------------------- the norm table: norm_layer and apply_norm
def test_every_row_builds_a_module_that_keeps_the_shape():
    x, mask = torch.randn(3, 5, 8), torch.ones(3, 5, dtype=torch.bool)  # a batch of 3 sequences of 5 steps
    for name in norms.NORMS:
        assert norms.apply_norm(norms.norm_layer(name, 8, max_steps=5), x, mask).shape == x.shape, name
    assert isinstance(norms.norm_layer("layer", 8), norms.LayerNorm)
    assert type(norms.norm_layer("layer", 8, native=True)) is nn.LayerNorm
    assert isinstance(norms.norm_layer("batch_per_step", 8, max_steps=3), norms.TimeStepBatchNorm)
    with pytest.raises(ValueError, match="needs max_steps"):
        norms.norm_layer("batch_per_step", 8)


def test_aliases_name_the_same_norms_and_instance_is_refused_with_its_reason():
    assert [norms.check_norm(a, tuple(norms.NORMS)) for a in norms.ALIASES] == list(norms.ALIASES.values())
    assert type(norms.norm_layer("rmsnorm", 4)) is norms.RMSNorm and type(norms.norm_layer("batchnorm", 4)) is norms.MaskedBatchNorm1d
    with pytest.raises(ValueError, match="has nothing to normalize over"):
        norms.check_norm("instance", tuple(norms.NORMS))
    with pytest.raises(ValueError, match=r"norm must be one of \('none', 'batch'\), got 'layer'"):
        norms.check_norm("layer", ("none", "batch"))


def test_apply_norm_hands_the_mask_and_the_step_only_to_norms_that_take_them():
    x = torch.randn(4, 6)
    mask = torch.tensor([True, True, True, False])
    masked, unmasked = norms.MaskedBatchNorm1d(6), norms.UnmaskedBatchNorm1d(6)
    torch.testing.assert_close(norms.apply_norm(masked, x, mask), masked(x, mask))
    torch.testing.assert_close(norms.apply_norm(unmasked, x, mask), unmasked(x))  # padding counted as data
    assert not torch.allclose(masked(x, mask)[:3], unmasked(x)[:3])
    per_step = norms.TimeStepBatchNorm(6, 3)
    norms.apply_norm(per_step, x, mask, t=2)
    assert per_step.running_mean[2].abs().sum() > 0 and per_step.running_mean[:2].abs().sum() == 0

    class NeedsMask(nn.Module):  # a norm of the reader's own, as chapter 09's GraphNorm
        def forward(self, x, mask):
            return torch.where(mask[:, None], x, 0.0)

    assert norms.apply_norm(NeedsMask(), x, mask)[3].abs().sum() == 0
    assert torch.equal(norms.apply_norm(nn.LayerNorm(6), x, mask, t=1), nn.functional.layer_norm(x, (6,)))


def test_every_model_takes_every_norm_over_an_example():
    """A norm added to the table with over="example" needs no other change to reach the models."""
    for norm in norms.EXAMPLE_NORMS:
        assert models.MLP(8, (8,), 2, norm)(torch.randn(3, 8)).shape == (3, 2)
        cell = rnn.LSTMCell(2, 8, norm)
        assert cell(torch.randn(3, 2), (torch.zeros(3, 8), torch.zeros(3, 8)))[0].shape == (3, 8)
        gpt = transformer.TinyGPT(transformer.GPTConfig(10, 8, n_layer=1, n_head=2, d_model=8, norm=norm))
        assert gpt(torch.zeros(2, 8, dtype=torch.long)).shape == (2, 8, 10)
    assert set(norms.EXAMPLE_NORMS) == {"layer", "layer_simple", "group4", "rms", "dyt", "detach", "adanorm"}


@pytest.mark.parametrize("native", [False, True])
def test_layer_simple_only_standardizes(native):
    """Xu et al.'s LayerNorm-simple: LayerNorm's output at initialization, with no gain or bias to learn."""
    module = norms.norm_layer("layer_simple", 6, native=native)
    assert list(module.parameters()) == []
    x = torch.randn(4, 6, dtype=torch.float64) * 3 + 2
    expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(module.double()(x), expected)
    with_affine = norms.norm_layer("layer", 6, native=native).double()
    with torch.no_grad():
        with_affine.weight.fill_(2.0)
    assert not torch.allclose(with_affine(x), module(x))


def test_batch_statistics_finds_batch_norms_only():
    assert norms.batch_statistics(models.MLP(4, (4,), 2, "batch"))
    assert norms.batch_statistics(nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4)))
    assert not any(norms.batch_statistics(models.MLP(4, (4,), 2, n)) for n in ("none", "weight", *norms.EXAMPLE_NORMS))


def test_set_adanorm_sets_c_and_k_on_every_adanorm_and_stacking_keeps_them():
    from lnbook import models, rnn, seeds

    torch.manual_seed(0)
    x = torch.randn(5, 12)
    mlp = models.MLP(12, (8, 8), 3, "adanorm")
    assert {(m.C, m.k) for m in mlp.modules() if isinstance(m, AdaNorm)} == {(1.0, 0.1)}  # what "adanorm" builds
    before = mlp(x)
    assert norms.set_adanorm(mlp, C=2.0) is mlp
    assert {(m.C, m.k) for m in mlp.modules() if isinstance(m, AdaNorm)} == {(2.0, 0.1)}
    assert not torch.allclose(before, mlp(x))
    hidden = mlp.net[1](x)  # C scales AdaNorm's output: z = C (1 - k y) y
    torch.testing.assert_close(mlp.net[2](hidden), 2.0 * AdaNorm(8, k=0.1, C=1.0)(hidden))
    stacked = seeds.stack([mlp, mlp])
    torch.testing.assert_close(stacked(x.expand(2, 5, 12))[0], mlp(x))
    lstm = rnn.SequenceClassifier(rnn.LSTMCell(4, 8, "adanorm", max_steps=4), 3)
    norms.set_adanorm(lstm, C=2.0, k=0.2)
    assert {(m.C, m.k) for m in lstm.modules() if isinstance(m, AdaNorm)} == {(2.0, 0.2)}
    with pytest.raises(ValueError, match="no AdaNorm"):
        norms.set_adanorm(models.MLP(12, (8,), 3, "layer"), C=2.0)
    with pytest.raises(ValueError, match="C must"):
        norms.set_adanorm(mlp, C=0)
