"""The NumPy reference against torch, finite differences, and BatchNorm on the real positions only."""

import numpy as np
import pytest
import torch

from lnbook import reference


def numeric_grad(f, x, eps=1e-6):
    """Central differences of the scalar f at x (float64)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        hi = f(x)
        x[i] = old - eps
        lo = f(x)
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 4), (2, 1, 3, 6), (4, 1)])
def test_layernorm_matches_torch(shape):
    rng = np.random.default_rng(1)
    x, dy = rng.normal(size=shape) * 3 + 1, rng.normal(size=shape)
    gamma, beta = rng.normal(size=shape[-1:]), rng.normal(size=shape[-1:])
    y, cache = reference.layernorm_forward(x, gamma, beta)
    dx, dg, db = reference.layernorm_backward(dy, cache)
    xt, gt, bt = (torch.tensor(a, requires_grad=True) for a in (x, gamma, beta))
    yt = torch.nn.functional.layer_norm(xt, shape[-1:], gt, bt, 1e-5)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, theirs in ((dx, xt), (dg, gt), (db, bt)):
        np.testing.assert_allclose(mine, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_layernorm_backward_matches_finite_differences():
    rng = np.random.default_rng(2)
    x, dy = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    gamma, beta = rng.normal(size=5), rng.normal(size=5)
    dx, dg, db = reference.layernorm_backward(dy, reference.layernorm_forward(x, gamma, beta)[1])
    loss = lambda x_, g_, b_: float((reference.layernorm_forward(x_, g_, b_)[0] * dy).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(lambda a: loss(a, gamma, beta), x.copy()), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dg, numeric_grad(lambda a: loss(x, a, beta), gamma.copy()), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(db, numeric_grad(lambda a: loss(x, gamma, a), beta.copy()), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("shape", [(8, 3), (4, 5, 3), (2, 3, 4, 5)])
def test_batchnorm_matches_torch_training_mode(shape):
    rng = np.random.default_rng(3)
    x, dy = rng.normal(size=shape) * 2 - 1, rng.normal(size=shape)
    c = shape[-1]
    gamma, beta = rng.normal(size=c), rng.normal(size=c)
    y, cache = reference.batchnorm_forward(x, gamma, beta)
    dx, dg, db = reference.batchnorm_backward(dy, cache)
    xt, gt, bt = (torch.tensor(a, requires_grad=True) for a in (x, gamma, beta))
    # torch's batch_norm wants channels second: move our last (feature) axis there.
    yt = torch.nn.functional.batch_norm(xt.movedim(-1, 1), None, None, gt, bt, training=True, eps=1e-5).movedim(1, -1)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, theirs in ((dx, xt), (dg, gt), (db, bt)):
        np.testing.assert_allclose(mine, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_masked_batchnorm_equals_batchnorm_on_real_positions_only():
    rng = np.random.default_rng(4)
    lengths = [5, 2, 4]
    b, t, c = len(lengths), max(lengths), 3
    x = rng.normal(size=(b, t, c))
    mask = np.arange(t)[None, :] < np.array(lengths)[:, None]
    x[~mask] = rng.normal(size=(int((~mask).sum()), c)) * 100  # garbage in the padding
    dy = rng.normal(size=(b, t, c))
    gamma, beta = rng.normal(size=c), rng.normal(size=c)
    y, cache = reference.batchnorm_forward(x, gamma, beta, mask=mask)
    dx, dg, db = reference.batchnorm_backward(dy, cache)
    # The same computation on the real positions alone, stacked into a (n_real, C) batch.
    y_real, cache_real = reference.batchnorm_forward(x[mask], gamma, beta)
    dx_real, dg_real, db_real = reference.batchnorm_backward(dy[mask], cache_real)
    np.testing.assert_allclose(y[mask], y_real, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx[mask], dx_real, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dg, dg_real, rtol=1e-12)
    np.testing.assert_allclose(db, db_real, rtol=1e-12)
    assert np.all(y[~mask] == 0) and np.all(dx[~mask] == 0)


def test_masked_batchnorm_ignores_nan_in_padding():
    x = np.array([[[1.0], [2.0], [np.nan]], [[3.0], [np.nan], [np.nan]]])
    mask = np.array([[True, True, False], [True, False, False]])
    y, _ = reference.batchnorm_forward(x, np.ones(1), np.zeros(1), mask=mask)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y[mask].mean(), 0.0, atol=1e-12)


def test_masked_batchnorm_backward_matches_finite_differences():
    rng = np.random.default_rng(5)
    x, dy = rng.normal(size=(3, 4, 2)), rng.normal(size=(3, 4, 2))
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=bool)
    gamma, beta = rng.normal(size=2), rng.normal(size=2)
    dx, _, _ = reference.batchnorm_backward(dy, reference.batchnorm_forward(x, gamma, beta, mask=mask)[1])
    loss = lambda a: float((reference.batchnorm_forward(a, gamma, beta, mask=mask)[0] * dy).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x.copy()), rtol=1e-6, atol=1e-8)


def test_layernorm_output_is_standardized_and_nan_stays_in_its_row():
    x = np.random.default_rng(6).normal(size=(4, 16)) * 5 + 3
    x[2, 7] = np.nan
    y, _ = reference.layernorm_forward(x, np.ones(16), np.zeros(16))
    assert np.isnan(y[2]).all()
    good = np.delete(y, 2, axis=0)
    np.testing.assert_allclose(good.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(good.std(-1), 1, rtol=1e-5)


def test_reference_computes_in_the_requested_dtype():
    y, cache = reference.layernorm_forward(np.ones((2, 3), np.float16), np.ones(3), np.zeros(3), dtype=np.float32)
    assert y.dtype == np.float32 and cache.xhat.dtype == np.float32
    y, _ = reference.batchnorm_forward(np.ones((2, 3), np.float32), np.ones(3), np.zeros(3))
    assert y.dtype == np.float64


@pytest.mark.parametrize("shape", [(6, 10), (2, 3, 5), (3, 1)])
def test_reference_matches_lnbook_functional(shape):
    from lnbook.functional import layer_norm

    rng = np.random.default_rng(7)
    x, dy = rng.normal(size=shape) * 2 + 3, rng.normal(size=shape)
    gamma, beta = rng.normal(size=shape[-1:]), rng.normal(size=shape[-1:])
    y, cache = reference.layernorm_forward(x, gamma, beta)
    grads = reference.layernorm_backward(dy, cache)
    xt, gt, bt = (torch.tensor(a, requires_grad=True) for a in (x, gamma, beta))
    yt = layer_norm(xt, shape[-1], gt, bt)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, t in zip(grads, (xt, gt, bt)):
        np.testing.assert_allclose(mine, t.grad.numpy(), rtol=1e-10, atol=1e-12)
