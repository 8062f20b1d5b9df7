"""Tests for lnbook.digits_layer: the batched digits LayerNorm layer, its SGD loop and the error split."""

import pytest
import torch

from lnbook import digits_layer, norms

layer_norm = lambda a: torch.nn.functional.layer_norm(a, (a.shape[-1],))  # noqa: E731


def _data(n=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=gen, dtype=torch.float64), torch.randint(0, 10, (n,), generator=gen)


def test_init_layers_is_per_seed_and_repeatable():
    W, V = digits_layer.init_layers([1, 2], hidden=8)
    assert W.shape == (2, 8, 64) and V.shape == (2, 10, 8) and W.dtype == torch.float64
    assert not torch.equal(W[0], W[1])
    assert torch.equal(digits_layer.init_layers([2], hidden=8)[0][0], W[1])
    with pytest.raises(ValueError, match="seeds"):
        digits_layer.init_layers([])


def test_batch_indices_shared_and_in_range():
    a, b = digits_layer.batch_indices(3, 4, 50), digits_layer.batch_indices(3, 4, 50)
    assert a.shape == (4, 64) and torch.equal(a, b) and int(a.max()) < 50
    assert not torch.equal(a[0], a[1])  # every order its own batches
    assert torch.equal(digits_layer.batch_indices(3, 2, 50, offset=1)[0], a[1])
    with pytest.raises(ValueError, match="orders"):
        digits_layer.batch_indices(0, 0, 50)


def test_layer_loss_matches_a_single_model():
    X, y = _data()
    W, V = digits_layer.init_layers([0, 1], hidden=8)
    idx = torch.arange(10).expand(2, -1)
    loss = digits_layer.layer_loss(W, V, X, y, idx, layer_norm)
    one = torch.nn.functional.cross_entropy(layer_norm(X[:10] @ W[1].T) @ V[1].T, y[:10])
    assert loss.shape == (2,) and torch.allclose(loss[1], one)
    with pytest.raises(ValueError, match="V"):
        digits_layer.layer_loss(W, V[:1], X, y, idx, layer_norm)


def test_true_gradient_keeps_row_mean_and_the_detached_one_moves_it():
    X, y = _data()
    W0, V = digits_layer.init_layers([0, 1, 2], hidden=8)
    batches = lambda step: digits_layer.batch_indices(step, 3, len(y), batch=16)  # noqa: E731
    W_ln, rec = digits_layer.train_layer(W0, V, X, y, layer_norm, 1.0, 20, batches)
    assert (W_ln.mean(1) - W0.mean(1)).abs().max() < 1e-12
    assert rec["loss"].shape == (20, 3) and rec["cosine"].abs().max() < 1e-4
    detach = norms.DetachNorm(8, elementwise_affine=False)
    W_d, _ = digits_layer.train_layer(W0, V, X, y, detach, 1.0, 20, batches)
    assert (W_d.mean(1) - W0.mean(1)).abs().max() > 1e-3  # the detached gradient moves the row mean
    with pytest.raises(ValueError, match="lr"):
        digits_layer.train_layer(W0, V, X, y, detach, -1.0, 5, batches)


def test_error_split_shares():
    W, _ = digits_layer.init_layers([0], hidden=8)
    true = torch.zeros_like(W)
    shares = digits_layer.error_split(W, true, true + torch.ones(1, 1, 64))  # the same vector on every row
    assert shares["row mean"].item() == pytest.approx(1) and shares["visible"].item() == pytest.approx(0, abs=1e-12)
    shares = digits_layer.error_split(W, true, true + 2 * (W - W.mean(1, keepdim=True)))
    assert shares["along W"].item() == pytest.approx(1)
    noise = torch.randn(W.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    total = sum(digits_layer.error_split(W, true, noise).values())
    assert total.item() == pytest.approx(1)
    with pytest.raises(ValueError, match="shape"):
        digits_layer.error_split(W, true[:, :4], noise)


def test_turn_run_follows_the_first_order_law_and_the_control_keeps_the_norm():
    X, y = _data()
    W0, V = digits_layer.init_layers([0, 1], hidden=8)
    batches = lambda step: digits_layer.batch_indices(step, 2, len(y), batch=16)  # noqa: E731
    free = digits_layer.turn_run(W0 * 4, V, X, y, 0.1, 10, batches)
    assert free["norm"].shape == (10, 2) and bool((free["norm"][1:] >= free["norm"][:-1] - 1e-9).all())  # SGD only grows |W|
    implied = free["turn"] * free["norm"] ** 2 / 0.1  # first order: the gradient at unit norm
    assert torch.allclose(implied, free["unit gradient"], rtol=0.05)
    fixed = digits_layer.turn_run(W0, V, X, y, 1.0, 10, batches, fixed_norm=True)
    assert torch.allclose(fixed["norm"], W0.norm(dim=(1, 2)).expand(10, -1))
    with pytest.raises(ValueError, match="lr"):
        digits_layer.turn_run(W0, V, X, y, 0.0, 3, batches)
    assert free["loss"].shape == (10, 2) and bool((free["loss"] > 0).all())


def test_error_parts_add_up_to_the_detached_gradient_and_match_the_reference():
    gen = torch.Generator().manual_seed(1)
    a, g = torch.randn(5, 12, generator=gen, dtype=torch.float64) * 2 + 1, torch.randn(5, 12, generator=gen, dtype=torch.float64)
    true, along_1, along_x = digits_layer.error_parts(a, g)
    ar = a.clone().requires_grad_()
    torch.nn.functional.layer_norm(ar, (12,)).backward(g)
    assert torch.allclose(true, ar.grad, atol=1e-12)
    r = torch.rsqrt(a.var(-1, correction=0, keepdim=True) + 1e-5)
    assert torch.allclose(true + along_1 + along_x, r * g)
    assert along_1.std(-1).max() < 1e-12  # the same number on every unit
    with pytest.raises(ValueError, match="g_hat"):
        digits_layer.error_parts(a, g[:, :4])


def test_train_affine_frozen_matches_train_layer_and_trains_gain_and_readout():
    X, y = _data()
    W0, V = digits_layer.init_layers([0, 1], hidden=8)
    batches = lambda step: digits_layer.batch_indices(step, 2, len(y), batch=16)  # noqa: E731
    W_ref, rec_ref = digits_layer.train_layer(W0, V, X, y, layer_norm, 0.5, 15, batches)
    p, rec = digits_layer.train_affine(W0, V, X, y, layer_norm, 0.5, 15, batches, measure=True)
    assert torch.allclose(p["W"], W_ref) and torch.equal(p["V"], V) and bool((p["gain"] == 1).all())
    assert torch.allclose(rec["loss"], rec_ref["loss"])
    shares = rec["row mean"] + rec["along W"] + rec["visible"]
    assert torch.allclose(shares, torch.ones_like(shares)) and bool(((rec["along xhat"] >= 0) & (rec["along xhat"] <= 1)).all())
    p2, rec2 = digits_layer.train_affine(W0, V, X, y, layer_norm, 0.5, 15, batches, train_gain=True, train_readout=True)
    assert not torch.equal(p2["V"], V) and not bool((p2["gain"] == 1).all())
    assert rec2["loss"][-5:].mean() < rec["loss"][-5:].mean()  # the scale it can learn lowers the loss
    with pytest.raises(ValueError, match="lr"):
        digits_layer.train_affine(W0, V, X, y, layer_norm, 0.0, 3, batches)


def test_best_rate_picks_the_lowest_validation_loss():
    X, y = _data(60)
    W0, V = digits_layer.init_layers([0, 1], hidden=8)
    batches = lambda step: digits_layer.batch_indices(step, 2, 40, batch=16)  # noqa: E731
    out = digits_layer.best_rate(W0, V, (X[:40], y[:40]), (X[40:], y[40:]), layer_norm, (0.01, 1.0), 20, batches,
                                 train_gain=True, train_readout=True)
    assert out["val_loss"].shape == (2,) and out["rate"] == (0.01, 1.0)[int(out["val_loss"].argmin())]
    assert out["loss"].shape == (20, 2, 2) and out["params"]["W"].shape == W0.shape
    p = out["params"]
    assert torch.allclose(digits_layer.full_loss(p["W"], p["V"], X[40:], y[40:], out["model"]).mean(), out["val_loss"].min())
    with pytest.raises(ValueError, match="rates"):
        digits_layer.best_rate(W0, V, (X, y), (X, y), layer_norm, (), 3, batches)


def test_fixed_norm_holds_each_models_norm_and_only_the_rate_over_norm_squared_matters():
    X, y = _data()
    W0, V = digits_layer.init_layers([0, 1], hidden=8)
    W0 = W0 * torch.tensor([1.0, 3.0], dtype=torch.float64).view(2, 1, 1)  # two different initial norms
    batches = lambda step: digits_layer.batch_indices(step, 2, len(y), batch=16)  # noqa: E731
    fixed, _ = digits_layer.train_affine(W0, V, X, y, layer_norm, 2.0, 15, batches, train_gain=True, fixed_norm=True)
    free, _ = digits_layer.train_affine(W0, V, X, y, layer_norm, 2.0, 15, batches, train_gain=True)
    assert torch.allclose(fixed["W"].norm(dim=(1, 2)), W0.norm(dim=(1, 2)))
    assert bool((free["W"].norm(dim=(1, 2)) > W0.norm(dim=(1, 2)) + 1e-3).all())  # SGD alone grows |W|
    # scale invariance (eps 1e-12): from 2 W0 at rate 4 x 0.5 the held run is the run from W0 at rate 0.5, times 2
    exact = lambda a: torch.nn.functional.layer_norm(a, (a.shape[-1],), eps=1e-12)  # noqa: E731
    small, _ = digits_layer.train_affine(W0, V, X, y, exact, 0.5, 15, batches, fixed_norm=True)
    large, _ = digits_layer.train_affine(2 * W0, V, X, y, exact, 2.0, 15, batches, fixed_norm=True)
    assert (small["W"] - W0).abs().max() > 0.1 and torch.allclose(large["W"], 2 * small["W"], rtol=1e-9, atol=1e-12)
    out = digits_layer.best_rate(W0, V, (X[:30], y[:30]), (X[30:], y[30:]), layer_norm, (0.1, 1.0), 10,
                                 lambda step: digits_layer.batch_indices(step, 2, 30, batch=16), fixed_norm=True)
    assert torch.allclose(out["params"]["W"].norm(dim=(1, 2)), W0.norm(dim=(1, 2)))
