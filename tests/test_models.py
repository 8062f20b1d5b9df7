"""lnbook.models: the MLP with its norm as a setting, and layer_stats, which measures what it says
without touching the model."""

import pytest
import torch

from lnbook import models, utils


@pytest.mark.parametrize("norm", models.MLP.NORMS)
def test_mlp_trains_with_every_norm_and_batchnorm_alone_couples_the_batch(norm):
    utils.seed_everything(0)
    model = models.MLP(6, (8, 8), 3, norm)
    x = torch.randn(5, 6)
    loss = model(x).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    others = torch.cat([x[:1], torch.randn(4, 6) * 3])  # the same first example, new batchmates
    coupled = not torch.allclose(model(x)[0], model(others)[0])
    assert coupled == (norm == "batch")  # training mode: only BatchNorm looks across the batch
    model.eval()
    torch.testing.assert_close(model(x)[:1], model(x[:1]))


def test_mlp_refuses_a_norm_it_has_no_place_for():
    with pytest.raises(ValueError, match="norm must be one of"):
        models.MLP(4, (3,), 2, "group")


def test_layer_stats_measures_the_linear_layers_and_leaves_the_model_alone():
    utils.seed_everything(0)
    net = models.MLP(12, (8, 8), 3, "batch")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 12, generator=g) * 2 + 1, torch.randint(3, (32,), generator=g)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    stats = models.layer_stats(net, x, y)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # it worked on a copy
    assert all(p.grad is None for p in net.parameters())
    assert set(stats) == {"mean", "std", "grad"} and all(v.shape == (3,) for v in stats.values())
    first = net.net[1](x)
    assert stats["mean"][0] == pytest.approx(first.mean().item(), rel=1e-5)
    assert stats["std"][0] == pytest.approx(first.std(unbiased=False).item(), rel=1e-5)
    torch.nn.functional.cross_entropy(net(x), y).backward()
    assert stats["grad"][-1] == pytest.approx(net.net[-1].weight.grad.norm().item(), rel=1e-5)
    with pytest.raises(TypeError, match="model"):
        models.layer_stats(torch.nn.Linear(2, 2), x, y)
