"""lnbook.functional.layer_norm against torch's: gradients, random shapes, low precision, NaN and what it saves."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lnbook.functional import layer_norm


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_gradcheck_float64(affine):
    x = torch.randn(3, 2, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 6, dtype=torch.float64, requires_grad=True) if affine[0] else None
    b = torch.randn(2, 6, dtype=torch.float64, requires_grad=True) if affine[1] else None
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm(x, (2, 6), w, b), (x, w, b))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 5),
    h=st.integers(1, 40),
    scale=st.floats(1e-3, 1e3),
    shift=st.floats(-1e3, 1e3),
)
def test_matches_torch_on_random_shapes_and_scales(rows, h, scale, shift):
    x = torch.randn(rows, h, dtype=torch.float64) * scale + shift
    torch.testing.assert_close(layer_norm(x, h), torch.nn.functional.layer_norm(x, (h,)), rtol=1e-9, atol=1e-9)


# Tolerances per dtype, against the float64 result: float32 keeps ~7 digits, float16 ~3,
# bfloat16 ~2 (its 8-bit mantissa); the outputs are O(1), so these are absolute too.
TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_low_precision_against_float64(dtype):
    x64 = torch.randn(8, 256, dtype=torch.float64) * 4 + 2
    w64, b64 = torch.randn(256, dtype=torch.float64), torch.randn(256, dtype=torch.float64)
    x, w, b = (t.to(dtype).requires_grad_() for t in (x64, w64, b64))
    y = layer_norm(x, 256, w, b)
    assert y.dtype == dtype
    xr, wr, br = (t.to(dtype).double().requires_grad_() for t in (x64, w64, b64))  # same rounded inputs
    yr = torch.nn.functional.layer_norm(xr, (256,), wr, br)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(y.double(), yr, rtol=tol, atol=tol * 4)
    dy = torch.randn(8, 256, dtype=torch.float64)
    y.backward(dy.to(dtype))
    yr.backward(dy.to(dtype).double())
    for mine, ref in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        assert mine.dtype == dtype
        err = (mine.double() - ref).abs().max() / ref.abs().max()
        assert err < tol * 4, f"{dtype}: relative gradient error {err:.2e}"


def test_nan_row_gives_nan_in_that_row_only():
    x = torch.randn(4, 10)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    y = layer_norm(x, 10)
    assert y[1].isnan().all() and y[2].isnan().all()
    assert torch.isfinite(y[[0, 3]]).all()


def test_saves_only_input_and_statistics():
    x = torch.randn(5, 12, requires_grad=True)
    w = torch.randn(12, requires_grad=True)
    y = layer_norm(x, 12, w, torch.zeros(12, requires_grad=True))
    saved = y.grad_fn.next_functions[0][0].saved_tensors  # the reshape's input is our Function
    assert [tuple(t.shape) for t in saved] == [(5, 12), (12,), (5, 1), (5, 1)]


def test_layer_norm_function_is_the_function_behind_layer_norm():
    from lnbook.functional import LayerNormFunction, layer_norm

    x = torch.randn(2, 5, dtype=torch.float64)
    w, b = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    y, mean, rstd = LayerNormFunction.apply(x, w, b, 1e-5)
    torch.testing.assert_close(y, layer_norm(x, 5, w, b, 1e-5))
    torch.testing.assert_close(rstd.reshape(-1), (x.var(-1, unbiased=False) + 1e-5).rsqrt())
