"""lnbook.functional.layer_norm and lnbook.norms.LayerNorm against torch's own LayerNorm."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lnbook.functional import layer_norm
from lnbook.norms import LayerNorm

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


def test_second_derivative_is_refused_not_wrong():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(layer_norm(x, 4).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()


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
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    losses = [m(x).pow(2).mean() for m in (ref, swapped)]
    torch.testing.assert_close(losses[0], losses[1])
    for m, loss in zip((ref, swapped), losses):
        loss.backward()
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), swapped.named_parameters(), strict=True):
        assert n1 == n2
        torch.testing.assert_close(p1.grad, p2.grad)
