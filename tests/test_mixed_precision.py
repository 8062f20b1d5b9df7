"""lnbook.mixed_precision: LayerNorm with bfloat16 statistics, and a TinyGPT under autocast."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from lnbook.mixed_precision import Autocast, BF16StatsLayerNorm, layer_norm_bf16
from lnbook.transformer import GPTConfig, TinyGPT


def errors(x):
    """Largest error of each accumulator against float64 on the same bfloat16 input."""
    xb = x.bfloat16()
    ones, zeros = torch.ones(x.shape[-1]), torch.zeros(x.shape[-1])
    reference = F.layer_norm(xb.double(), xb.shape[-1:], eps=1e-5)
    return {a: (layer_norm_bf16(xb, ones, zeros, accumulator=a).double() - reference).abs().max().item()
            for a in ("fp32", "tree", "sequential")}


def test_bfloat16_sums_lose_more_the_longer_they_run_and_with_a_large_mean():
    torch.manual_seed(0)
    centred = errors(0.25 * torch.randn(64, 256))
    shifted = errors(0.25 * torch.randn(64, 256) + 8)  # a mean 32 standard deviations from 0
    assert centred["fp32"] < 0.05 and shifted["sequential"] > shifted["tree"] > shifted["fp32"]
    assert shifted["fp32"] > 3 * centred["fp32"]  # the offset is what cancels digits, even with float32 sums


def test_the_tree_adds_pairwise_and_handles_odd_widths():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])  # exact in bfloat16, and so are its pairwise sums
    y = layer_norm_bf16(x, torch.ones(5), torch.zeros(5), accumulator="tree")
    torch.testing.assert_close(y.float(), F.layer_norm(x, (5,)).bfloat16().float(), rtol=0, atol=2**-7)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="accumulator must be one of"):
        layer_norm_bf16(torch.ones(2, 4), torch.ones(4), torch.zeros(4), accumulator="fp16")
    with pytest.raises(ValueError, match=r"weight and bias \(d,\)"):
        layer_norm_bf16(torch.ones(2, 4), torch.ones(3), torch.zeros(4))
    with pytest.raises(TypeError, match="model must be a TinyGPT"):
        Autocast(nn.Linear(2, 2))


def test_autocast_swaps_every_layernorm_keeps_its_weights_and_trains():
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(11, 8, n_layer=2, n_head=2, d_model=16))
    with torch.no_grad():
        model.norm_f.norm.weight.fill_(1.5)
    plain = Autocast(model)
    idx = torch.randint(11, (3, 8))
    assert plain(idx).dtype == torch.float32
    swapped = Autocast(model, bf16_stats=True)
    norms = [m for m in swapped.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 5 and all(isinstance(m, BF16StatsLayerNorm) for m in norms)
    assert swapped.model.norm_f.norm.weight[0].item() == 1.5
    loss = swapped.loss(idx, torch.randint(11, (3, 8)))
    loss.backward()
    assert torch.isfinite(loss) and model.tok.weight.grad is not None
