"""Bad input raises ValueError or TypeError with a message that names the argument."""

import numpy as np
import pytest
import torch

from lnbook import reference
from lnbook.functional import layer_norm
from lnbook.norms import LayerNorm
from lnbook.utils import seed_everything, show_source

X = torch.randn(2, 3, 4)
ONES, ZEROS = np.ones(4), np.zeros(4)


# normalized_shape that does not match the trailing dimensions
@pytest.mark.parametrize("shape", [3, (3,), (2, 4), (5, 2, 3, 4)])
def test_normalized_shape_mismatch(shape):
    with pytest.raises(ValueError, match=r"normalized_shape .* does not match the trailing dimensions of x"):
        layer_norm(X, shape)


def test_normalized_shape_mismatch_in_module():
    with pytest.raises(ValueError, match="normalized_shape"):
        LayerNorm(5)(X)


@pytest.mark.parametrize("shape", ["4", 4.0, (4.0,), (), None, (True,)])
def test_normalized_shape_not_ints(shape):
    with pytest.raises(TypeError, match="normalized_shape must be an int"):
        LayerNorm(shape)


# eps <= 0
@pytest.mark.parametrize("eps", [0, 0.0, -1e-5, float("nan"), float("inf")])
def test_eps_not_positive(eps):
    with pytest.raises(ValueError, match="eps must be a positive"):
        layer_norm(X, 4, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive"):
        LayerNorm(4, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive"):
        reference.layernorm_forward(np.ones((2, 4)), ONES, ZEROS, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive"):
        reference.batchnorm_forward(np.ones((2, 4)), ONES, ZEROS, eps=eps)


@pytest.mark.parametrize("eps", ["1e-5", None, True])
def test_eps_not_a_number(eps):
    with pytest.raises(TypeError, match="eps must be a positive real number"):
        layer_norm(X, 4, eps=eps)


# integer or boolean tensors
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_tensors(dtype):
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got dtype torch\."):
        layer_norm(torch.ones(2, 4, dtype=dtype), 4)
    with pytest.raises(TypeError, match="weight must be a floating-point tensor"):
        layer_norm(torch.ones(2, 4), 4, weight=torch.ones(4, dtype=dtype))


def test_not_a_tensor():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        layer_norm(np.ones((2, 4)), 4)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_integer_and_bool_arrays(dtype):
    with pytest.raises(TypeError, match="x must be an array of floating-point numbers"):
        reference.layernorm_forward(np.ones((2, 4), dtype=dtype), ONES, ZEROS)
    with pytest.raises(TypeError, match="x must be an array of floating-point numbers"):
        reference.batchnorm_forward(np.ones((2, 4), dtype=dtype), ONES, ZEROS)
    with pytest.raises(TypeError, match="gamma must be an array of floating-point numbers"):
        reference.layernorm_forward(np.ones((2, 4)), np.ones(4, dtype=dtype), ZEROS)


# zero-size normalized dimensions
def test_zero_size_normalized_dimension():
    with pytest.raises(ValueError, match="normalized_shape must contain only positive sizes"):
        layer_norm(torch.ones(2, 0), 0)
    with pytest.raises(ValueError, match="normalized_shape must contain only positive sizes"):
        LayerNorm((3, 0))
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        reference.layernorm_forward(np.ones((2, 0)), np.ones(0), np.zeros(0))
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        reference.batchnorm_forward(np.ones((2, 0)), np.ones(0), np.zeros(0))


# mismatched weight/bias shapes
def test_weight_and_bias_shapes():
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\) \(the normalized shape\), got \(3,\)"):
        layer_norm(X, 4, weight=torch.ones(3))
    with pytest.raises(ValueError, match=r"bias must have shape \(3, 4\)"):
        layer_norm(X, (3, 4), torch.ones(3, 4), torch.ones(4))
    with pytest.raises(ValueError, match=r"gamma must have shape \(4,\)"):
        reference.layernorm_forward(np.ones((2, 4)), np.ones(5), ZEROS)
    with pytest.raises(ValueError, match=r"beta must have shape \(4,\)"):
        reference.batchnorm_forward(np.ones((2, 4)), ONES, np.zeros((1, 4)))


def test_dy_shape():
    _, cache = reference.layernorm_forward(np.ones((2, 4)), ONES, ZEROS)
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 4\)"):
        reference.layernorm_backward(np.ones((4, 2)), cache)


# a mask of the wrong shape, or one that leaves a feature with no real positions
@pytest.mark.parametrize("mask_shape", [(2, 3, 4), (3, 2), (2,), (6,)])
def test_mask_wrong_shape(mask_shape):
    with pytest.raises(ValueError, match=r"mask must have x's shape without the feature axis, \(2, 3\)"):
        reference.batchnorm_forward(np.ones((2, 3, 4)), ONES, ZEROS, mask=np.ones(mask_shape, dtype=bool))


def test_mask_not_boolean():
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        reference.batchnorm_forward(np.ones((2, 3, 4)), ONES, ZEROS, mask=np.ones((2, 3)))


def test_mask_with_no_real_positions():
    with pytest.raises(ValueError, match="mask .* no real positions"):
        reference.batchnorm_forward(np.ones((2, 3, 4)), ONES, ZEROS, mask=np.zeros((2, 3), dtype=bool))


def test_seed_and_show_source():
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(1.5)
    with pytest.raises(ValueError, match="seed must be in"):
        seed_everything(-1)
    with pytest.raises(TypeError, match="show_source needs a Python function"):
        show_source(len)


@pytest.mark.parametrize("value", [0, -3, 2.0, True, "4", None])
def test_positive_int_check_is_shared(value):
    from lnbook._checks import check_positive_int
    from lnbook.data import adding_problem
    from lnbook.norms import TimeStepBatchNorm

    with pytest.raises(ValueError, match="steps must be a positive int"):
        check_positive_int(value, "steps")
    with pytest.raises(ValueError, match="max_steps must be a positive int"):
        TimeStepBatchNorm(3, value)
    with pytest.raises(ValueError, match="n must be a positive int"):
        adding_problem(value, 4)
