"""Chapter 08's other norms: DetachNorm and AdaNorm against float64 references, and every
norm choice of the digits MLP and of the LSTM cell."""

import pickle

import numpy as np
import pytest
import torch
from torch.func import functional_call

from lnbook import models, reference, rnn, train
from lnbook.norms import AdaNorm, DetachNorm, DyT, RMSNorm
from lnbook.utils import seed_everything


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
    group = models._norm_layer("group4", 4 * 8).double()
    torch.testing.assert_close(group(gates), per_gate, rtol=1e-12, atol=1e-12)


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
    for build in (lambda: models.MLP(64, (16,), 10, "groupnorm"), lambda: rnn.LSTMCell(4, 8, "rmsnorm")):
        with pytest.raises(ValueError, match="norm must be one of"):
            build()
