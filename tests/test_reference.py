"""lnbook.reference: the NumPy reference against torch, finite differences, and BatchNorm on the real positions only."""

import numpy as np
import pytest
import torch

from lnbook import reference


def assert_matches_torch(forward, backward, torch_forward, x, dy, gamma, beta):
    """Our float64 forward and its backward for ``dy`` against torch's autograd of the same."""
    y, cache = forward(x, gamma, beta)
    grads = backward(dy, cache)
    tensors = [torch.tensor(a, requires_grad=True) for a in (x, gamma, beta)]
    yt = torch_forward(*tensors)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(grads, tensors):
        np.testing.assert_allclose(mine, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 4), (2, 1, 3, 6), (4, 1)])
def test_layernorm_matches_torch(shape):
    rng = np.random.default_rng(1)
    x, dy = rng.normal(size=shape) * 3 + 1, rng.normal(size=shape)
    gamma, beta = rng.normal(size=shape[-1:]), rng.normal(size=shape[-1:])
    assert_matches_torch(reference.layernorm_forward, reference.layernorm_backward,
                         lambda x, g, b: torch.nn.functional.layer_norm(x, shape[-1:], g, b, 1e-5), x, dy, gamma, beta)


def test_layernorm_backward_matches_finite_differences():
    rng = np.random.default_rng(2)
    x, dy = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    gamma, beta = rng.normal(size=5), rng.normal(size=5)
    dx, dg, db = reference.layernorm_backward(dy, reference.layernorm_forward(x, gamma, beta)[1])
    loss = lambda x_, g_, b_: float((reference.layernorm_forward(x_, g_, b_)[0] * dy).sum())  # noqa: E731
    np.testing.assert_allclose(dx, reference.finite_difference_grad(lambda a: loss(a, gamma, beta), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dg, reference.finite_difference_grad(lambda a: loss(x, a, beta), gamma), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(db, reference.finite_difference_grad(lambda a: loss(x, gamma, a), beta), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("shape", [(8, 3), (4, 5, 3), (2, 3, 4, 5)])
def test_batchnorm_matches_torch_training_mode(shape):
    rng = np.random.default_rng(3)
    x, dy = rng.normal(size=shape) * 2 - 1, rng.normal(size=shape)
    c = shape[-1]
    gamma, beta = rng.normal(size=c), rng.normal(size=c)
    # torch's batch_norm wants channels second: move our last (feature) axis there.
    batch_norm = lambda x, g, b: torch.nn.functional.batch_norm(x.movedim(-1, 1), None, None, g, b, training=True, eps=1e-5).movedim(1, -1)  # noqa: E731
    assert_matches_torch(reference.batchnorm_forward, reference.batchnorm_backward, batch_norm, x, dy, gamma, beta)


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
    np.testing.assert_allclose(dx, reference.finite_difference_grad(loss, x), rtol=1e-6, atol=1e-8)


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


def test_finite_difference_grad_of_a_known_function():
    x = np.array([[0.5, -1.0], [2.0, 3.0]])
    np.testing.assert_allclose(reference.finite_difference_grad(lambda a: float((a**3).sum()), x), 3 * x**2, rtol=1e-8)
    assert x[0, 0] == 0.5  # the input is left as it was


@pytest.mark.parametrize("where", ["input", "output"])
def test_backward_from_recomputed_or_recovered_xhat(where):
    rng = np.random.default_rng(8)
    x, dy = rng.normal(size=(4, 6)) * 3 + 2, rng.normal(size=(4, 6))
    gamma, beta = rng.normal(size=6) + 2, rng.normal(size=6)
    y, cache = reference.layernorm_forward(x, gamma, beta)
    mean, rstd = x.mean(-1, keepdims=True), cache.rstd
    xhat = reference.xhat_from_input(x, mean, rstd) if where == "input" else reference.xhat_from_output(y, gamma, beta)
    for mine, ref in zip(reference.layernorm_backward_xhat(dy, xhat, rstd, gamma), reference.layernorm_backward(dy, cache)):
        np.testing.assert_allclose(mine, ref, rtol=1e-9, atol=1e-12)


def test_xhat_from_output_fails_where_a_gain_is_zero():
    y, cache = reference.layernorm_forward(np.ones((2, 3)) * [1.0, 2.0, 4.0], np.array([1.0, 0.0, 1.0]), np.zeros(3))
    xhat = reference.xhat_from_output(y, np.array([1.0, 0.0, 1.0]), np.zeros(3))
    assert np.isnan(xhat[:, 1]).all() and np.isfinite(xhat[:, [0, 2]]).all()


def test_layernorm_variants():
    x = np.random.default_rng(9).normal(size=(5, 8)) * 2 + 1
    torch_ln = torch.nn.functional.layer_norm(torch.tensor(x), (8,)).numpy()
    np.testing.assert_allclose(reference.layernorm_variant(x), torch_ln, rtol=1e-12, atol=1e-12)
    unbiased = reference.layernorm_variant(x, unbiased=True, eps=1e-12)
    np.testing.assert_allclose(unbiased, torch_ln * np.sqrt(7 / 8), rtol=1e-5)  # std grows by sqrt(8/7)
    outside = reference.layernorm_variant(x, eps=0.5, eps_outside_sqrt=True)
    np.testing.assert_allclose(outside, (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 0.5))
    with pytest.raises(ValueError, match="at least 2 features"):
        reference.layernorm_variant(np.ones((2, 1)), unbiased=True)


def test_round_to_bfloat16_keeps_8_significant_bits_ties_to_even():
    r = reference.round_to(np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7, np.inf, -2.0**-130]), "bfloat16")
    np.testing.assert_array_equal(r[:5], [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, np.inf])
    assert r.dtype == np.float32 and r[5] < 0
    assert reference.round_to(np.array([1 + 2**-12]), "float16")[0] == 1.0
    with pytest.raises(ValueError, match="precision must be one of"):
        reference.round_to(np.ones(2), "float8")


@pytest.mark.parametrize("method", ["one_pass", "two_pass", "welford", "welford_merge"])
def test_every_variance_method_is_exact_enough_in_float64(method):
    x = np.random.default_rng(10).normal(size=(3, 101)) * 2 + 5
    np.testing.assert_allclose(reference.variance(x, method), x.var(-1), rtol=1e-12)


def test_welford_merge_equals_welford_on_the_whole():
    x = np.random.default_rng(11).normal(size=(4, 30)) + 3
    a, b = reference.welford(x[:, :11]), reference.welford(x[:, 11:])
    merged, whole = reference.welford_merge(a, b), reference.welford(x)
    np.testing.assert_allclose(merged.mean, whole.mean, rtol=1e-13)
    np.testing.assert_allclose(merged.m2, whole.m2, rtol=1e-12)
    assert (merged.count == 30).all()


def test_one_pass_variance_cancels_catastrophically_in_float32_and_the_others_do_not():
    x = 1e4 + np.random.default_rng(12).normal(size=(8, 256))
    stored = reference.round_to(x, "float32").astype(np.float64).var(-1)
    err = {m: np.abs(reference.variance(x, m, "float32") - stored).max() / stored.min()
           for m in ("one_pass", "two_pass", "welford")}
    assert err["one_pass"] > 1.0  # no correct digit left
    assert err["two_pass"] < 1e-3 and err["welford"] < 1e-2


def test_float16_accumulation_overflows_and_float32_accumulation_does_not():
    x = 100 + np.random.default_rng(13).normal(size=(2, 256))
    with np.errstate(over="ignore", invalid="ignore"):
        assert not np.isfinite(reference.variance(x, "one_pass", "float16")).all()
    assert np.isfinite(reference.variance(x, "two_pass", "float16", accumulate="float32")).all()
    with pytest.raises(ValueError, match="method must be"):
        reference.variance(x, "three_pass")


def test_welford_parts_matches_welford_and_the_merge_and_the_variance():
    rng = np.random.default_rng(0)
    x = 100 + rng.normal(size=(4, 64))
    assert np.array_equal(reference.welford_parts(x, 1, "float32"), reference.variance(x, "welford", "float32"))
    assert np.array_equal(reference.welford_parts(x, 2, "float32"), reference.variance(x, "welford_merge", "float32"))
    np.testing.assert_allclose(reference.welford_parts(x, 8), x.var(axis=-1), rtol=1e-12)
    for bad in (3, 0, 128):
        with pytest.raises(ValueError, match="parts"):
            reference.welford_parts(x, bad)


def test_welford_lanes_is_one_welford_with_one_lane_and_one_chunk_and_matches_the_variance():
    x = np.random.default_rng(3).normal(size=(5, 32)) + 100
    assert np.array_equal(reference.welford_lanes(x, 1, 32, "float32"), reference.variance(x, "welford", "float32"))
    np.testing.assert_allclose(reference.welford_lanes(x, 8, 2), x.var(axis=-1), rtol=1e-12)
    assert not np.array_equal(reference.welford_lanes(x, 8, 2, "float32"), reference.variance(x, "welford", "float32"))
    with pytest.raises(ValueError, match="lanes"):
        reference.welford_lanes(x, 3, 2)
    with pytest.raises(ValueError, match="divide"):
        reference.welford_lanes(x, 8, 3)


def test_variance_error_measures_the_algorithm_and_skips_coarse_storage():
    rows = np.random.default_rng(0).normal(size=(8, 64))
    assert reference.variance_error(rows, 0, "two_pass", "float64") < 1e-14
    assert reference.variance_error(rows, 1000, "one_pass", "float32") > 100 * reference.variance_error(rows, 1000, "two_pass", "float32")
    assert np.isnan(reference.variance_error(rows, 10_000, "two_pass", "bfloat16"))  # step 64 > spread 1
    assert reference.storage_step(1000, "float16") == 0.5
    with pytest.raises(ValueError, match="rows"):
        reference.variance_error(rows[0], 0, "two_pass", "float64")


def test_max_relative_error_scales_by_the_reference_largest_entry():
    assert reference.max_relative_error([1.0, 2.1], [1.0, 2.0]) == pytest.approx(0.05)
    assert reference.max_relative_error([0.0, -4.0], [0.0, -4.0]) == 0.0
    with pytest.raises(ValueError, match="same"):
        reference.max_relative_error([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="all zeros"):
        reference.max_relative_error([1.0], [0.0])
