"""lnbook.porting: the batched digits networks train, and the gain fix makes a port exact."""

import numpy as np
import pytest
import torch

from lnbook import porting, reference


def _data(n=200, d=12, classes=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=gen)
    X = torch.randn(n, d, generator=gen) + torch.nn.functional.one_hot(y, d).float() * 2
    return X, y


def test_annotated_norm_is_the_reference_variant():
    h = torch.randn(3, 5, 8, dtype=torch.float64)
    np.testing.assert_allclose(porting.annotated_norm(h, 1.0, 0.0).numpy(),
                               reference.layernorm_variant(h.numpy(), 1e-6, unbiased=True, eps_outside_sqrt=True))


def test_training_lowers_each_networks_loss_and_seeds_differ():
    X, y = _data()
    params, curve = porting.train(X, y, seeds=3, hidden=6, steps=60)
    assert curve.shape == (60, 3) and (curve[-1] < 0.5 * curve[0]).all()
    assert params[0].shape == (3, 12, 6) and not torch.equal(params[0][0], params[0][1])
    loss, acc = porting.evaluate(params, X, y, porting.annotated_norm)
    assert loss.shape == acc.shape == (3,) and (acc > 0.8).all()


def test_gain_fix_makes_torch_layernorm_equal_the_annotated_norm():
    X, y = _data(seed=1)
    params, _ = porting.train(X, y, seeds=2, hidden=4, steps=20)
    scale = (3 / 4) ** 0.5
    trained, _ = porting.evaluate(params, X, y, porting.annotated_norm)
    fixed, _ = porting.evaluate(params, X, y, lambda h, g, b: porting.torch_norm(h, g * scale, b, eps=1e-12))
    as_is, _ = porting.evaluate(params, X, y, porting.torch_norm)
    assert np.abs(fixed - trained).max() < 1e-4 < np.abs(as_is - trained).max()


def test_bad_input_raises():
    X, y = _data()
    with pytest.raises(ValueError, match="seeds"):
        porting.train(X, y, seeds=0, hidden=4)
    with pytest.raises(ValueError, match="X must be"):
        porting.train(X[:, None], y, seeds=1, hidden=4)
    with pytest.raises(TypeError, match="h must be"):
        porting.torch_norm(torch.zeros(2, 3, dtype=torch.long), 1.0, 0.0)
