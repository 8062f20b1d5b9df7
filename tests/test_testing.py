"""lnbook.testing: the swap test passes lnbook's LayerNorm and fails the planted bug."""

import pytest
import torch

from lnbook import testing
from lnbook.norms import LayerNorm


def test_swap_test_passes_lnbook_layernorm_and_fails_the_mutant():
    testing.swap_test(LayerNorm)
    with pytest.raises(AssertionError, match="off by"):
        testing.swap_test(testing.NoMeanTermLayerNorm)


def test_mutant_forward_is_layernorm_and_only_its_backward_differs():
    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    ours, mutant = LayerNorm(8).double(), testing.NoMeanTermLayerNorm(8).double()
    torch.testing.assert_close(mutant(x), ours(x))
    R = torch.randn(3, 8, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((ours(x) * R).sum(), x)
    (g_mut,) = torch.autograd.grad((mutant(x) * R).sum(), x)
    assert (g_ours - g_mut).abs().max() > 1e-3
    # the missing term is exactly rstd * mean(g): adding it back gives the right gradient
    assert g_ours.sum(-1).abs().max() < 1e-12 and g_mut.sum(-1).abs().max() > 1e-3


def test_mean_square_loss_hides_the_bug_in_absolute_terms():
    _, abs_gap, _ = testing.swap_gaps(testing.NoMeanTermLayerNorm, testing.mean_square_loss)
    _, abs_gap_r, rel_gap_r = testing.swap_gaps(testing.NoMeanTermLayerNorm, testing.random_direction_loss)
    assert abs_gap < 1e-6 < 1e-1 < rel_gap_r
    assert abs_gap_r > 1e-1
    assert max(testing.swap_gaps(LayerNorm, testing.random_direction_loss, random_affine=True)) < 1e-10


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="norm_class"):
        testing.swap_gaps(lambda n, e: None, testing.random_direction_loss)
    with pytest.raises(TypeError, match="loss_fn"):
        testing.swap_gaps(LayerNorm, 3)
    with pytest.raises(TypeError, match="random_affine"):
        testing.swap_gaps(LayerNorm, testing.random_direction_loss, random_affine=1)
    with pytest.raises(ValueError, match="tol"):
        testing.swap_test(LayerNorm, tol=-1.0)
    with pytest.raises(ValueError, match="one trailing"):
        testing.NoMeanTermLayerNorm((2, 4))(torch.randn(3, 2, 4))


def test_constant_statistics_mutant_has_right_first_but_wrong_second_derivative():
    torch.manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    f = lambda a, c, d: testing.constant_statistics_layer_norm(a, c, d, 1e-5)
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert not torch.autograd.gradgradcheck(f, (x, w, b), raise_exception=False)


def test_penalty_gradients_pass_lnbook_and_fail_the_constant_statistics_mutant():
    penalty, gap = testing.penalty_gradient_gap(LayerNorm)
    bad_penalty, bad_gap = testing.penalty_gradient_gap(testing.ConstantStatisticsLayerNorm)
    torch_penalty = testing.penalty_and_gradients(torch.nn.LayerNorm)[0].item()
    assert abs(penalty - torch_penalty) < 1e-12 and abs(bad_penalty - torch_penalty) < 1e-12
    assert gap < 1e-10 and bad_gap > 1e-2


def test_penalty_and_gradients_rejects_a_non_module():
    with pytest.raises(TypeError, match="norm_class"):
        testing.penalty_and_gradients("LayerNorm")
    with pytest.raises(ValueError, match="eps"):
        testing.constant_statistics_layer_norm(torch.zeros(2, 3), torch.ones(3), torch.zeros(3), eps=0.0)


def test_sixteen_bit_errors_separates_rounding_from_a_float16_computation():
    from lnbook.functional import layer_norm

    ours = testing.sixteen_bit_errors(layer_norm, torch.bfloat16)
    assert len(ours) == 4 and max(ours) < 1
    # computing in the input's own 16 bits, statistics included, is far outside one unit
    naive = lambda x, n, w, b: ((x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()) * w + b
    assert max(testing.sixteen_bit_errors(naive, torch.bfloat16)) > 1
    with pytest.raises(ValueError, match="dtype"):
        testing.sixteen_bit_errors(layer_norm, torch.float32)
    with pytest.raises(ValueError, match="param_dtype"):
        testing.sixteen_bit_errors(layer_norm, torch.bfloat16, param_dtype=torch.float16)


def test_sixteen_bit_errors_with_float32_parameters_finds_a_16_bit_accumulation():
    from lnbook.functional import layer_norm

    assert max(testing.sixteen_bit_errors(layer_norm, torch.bfloat16, rows=1024, param_dtype=torch.float32)) < 1

    def bf16_sums(x, n, w, b):  # right in float32, but dweight and dbias summed over rows in bfloat16
        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w, b):
                xhat = torch.nn.functional.layer_norm(x.float(), (n,))
                ctx.save_for_backward(xhat, w, x)
                return (xhat * w + b).to(x.dtype)

            @staticmethod
            def backward(ctx, dy):
                xhat, w, x = ctx.saved_tensors
                dx = torch.autograd.functional.vjp(lambda v: torch.nn.functional.layer_norm(v, (n,)) * w, x.float(), dy.float())[1]
                dw, db = torch.zeros_like(w, dtype=dy.dtype), torch.zeros_like(w, dtype=dy.dtype)
                for row in range(len(dy)):
                    dw, db = dw + (dy[row].float() * xhat[row]).to(dy.dtype), db + dy[row]
                return dx.to(x.dtype), dw.float(), db.float()

        return F.apply(x, w, b)

    assert max(testing.sixteen_bit_errors(bf16_sums, torch.bfloat16, rows=1024, param_dtype=torch.float32)[2:]) > 3
