"""lnbook.models: the MLP with its norm as a setting, layer_stats, which measures what it says
without touching the model, and mlp_layers, also on MLPs stacked by lnbook.seeds."""

import copy

import numpy as np
import pytest
import torch

from lnbook import models, seeds, train, utils


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


def _members(make, seed_list=(0, 1, 2)):
    out = []
    for seed in seed_list:
        utils.seed_everything(seed)
        out.append(make())
    return out


@pytest.mark.parametrize("norm", ["none", "batch", "weight"])
def test_mlp_layers_finds_the_layers_of_a_stacked_mlp(norm):
    """lnbook.rl reads a stacked MLP's layers: member s's weights are those of the MLP it was built from."""
    mlps = _members(lambda: models.MLP(6, (8, 8), 3, norm))
    stacked = seeds.stack(mlps)
    (linears, norms), plain = models.mlp_layers(stacked), [models.mlp_layers(m) for m in mlps]
    assert len(linears) == 3 and len(norms) == 2
    assert all(isinstance(n, seeds.Norm) for n in norms) if norm == "batch" else norms == [None, None]
    for i, lin in enumerate(linears):
        assert isinstance(lin, seeds.Linear) and lin.weight.shape == (3, *plain[0][0][i].weight.shape)
        for s, (member_linears, _) in enumerate(plain):
            torch.testing.assert_close(lin.weight[s], member_linears[i].weight)


@pytest.mark.parametrize("norm", ["layer", "batch", "weight"])
def test_stacked_mlp_trains_each_member_as_fit_trains_it_alone_over_whole_epochs(norm):
    """seeds.fit on stacked MLPs over two whole epochs, the last mini-batch of each smaller (100 = 3 * 32 + 4)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 6, generator=g), torch.randint(3, (100,), generator=g)
    data = (x, y)
    seed_list = [0, 1]
    stacked = seeds.stack(_members(lambda: models.MLP(6, (8,), 3, norm), seed_list))
    histories = seeds.fit(stacked, data, data, epochs=2, lr=0.05, batch_size=32, seeds=seed_list, optimizer="sgd")
    for seed, h in zip(seed_list, histories):
        utils.seed_everything(seed)
        alone = train.fit(models.MLP(6, (8,), 3, norm), data, data, epochs=2, lr=0.05, batch_size=32, seed=seed,
                          optimizer="sgd")
        assert h.steps_per_epoch == alone.steps_per_epoch == 4
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(h.test_acc, alone.test_acc, atol=1e-9)
    assert histories[0].step_loss != histories[1].step_loss


def test_weight_norm_init_standardizes_each_layer_on_the_batch():
    from lnbook import seeds

    torch.manual_seed(0)
    x = torch.randn(256, 12) * 3 + 2
    model = models.MLP(12, (16, 8), 3, "weight")
    before = model(x).detach()
    assert models.weight_norm_init(model, x) is model
    linears, _ = models.mlp_layers(model)
    outs = []
    hooks = [lin.register_forward_hook(lambda m, i, o: outs.append(o.detach())) for lin in linears]
    after = model(x).detach()
    for h in hooks:
        h.remove()
    for out in outs[:-1]:  # the hidden (weight-normalized) layers: mean 0, std 1 per feature on x
        torch.testing.assert_close(out.mean(0), torch.zeros(out.shape[1]), atol=1e-4, rtol=0)
        torch.testing.assert_close(out.std(0, correction=0), torch.ones(out.shape[1]), atol=1e-3, rtol=0)
    assert outs[-1].std(0).min() > 0 and not torch.allclose(before, after)  # the plain output layer is not set
    p = linears[0].parametrizations.weight
    torch.testing.assert_close(p.original1, linears[0].weight)  # v has length g: w = v
    stacked = seeds.stack([model, copy.deepcopy(model)])  # what a stacked member keeps
    torch.testing.assert_close(stacked.net[1].parametrizations.weight.original0[0], p.original0)
    torch.testing.assert_close(stacked.net[1].parametrizations.weight.original1[0], p.original1)
    models.weight_norm_init(model, x, scale=0.5)
    torch.testing.assert_close(linears[0](x).std(0, correction=0), torch.full((16,), 0.5), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="weight-normalized"):
        models.weight_norm_init(models.MLP(12, (16,), 3, "layer"), x)
    with pytest.raises(ValueError, match="x must"):
        models.weight_norm_init(model, x[:1])
    with pytest.raises(ValueError, match="scale"):
        models.weight_norm_init(model, x, scale=0)


def test_weight_norm_init_without_keeping_weight_norm_is_the_same_function_with_plain_weights():
    import pickle

    from torch.nn.utils import parametrize

    torch.manual_seed(0)
    x = torch.randn(64, 12)
    utils.seed_everything(1)
    kept = models.weight_norm_init(models.MLP(12, (16, 8), 3, "weight"), x)
    utils.seed_everything(1)
    plain = models.weight_norm_init(models.MLP(12, (16, 8), 3, "weight"), x, keep_weight_norm=False)
    assert not any(parametrize.is_parametrized(m) for m in plain.modules())
    torch.testing.assert_close(plain(x), kept(x))
    again = pickle.loads(pickle.dumps(plain))  # stays plain: no weight norm comes back
    assert not any(parametrize.is_parametrized(m) for m in again.modules())
    torch.testing.assert_close(again(x), plain(x))
    stacked = seeds.stack([plain, plain])
    torch.testing.assert_close(stacked(x.expand(2, 64, 12))[0], plain(x))
    with pytest.raises(TypeError, match="keep_weight_norm"):
        models.weight_norm_init(models.MLP(12, (16,), 3, "weight"), x, keep_weight_norm=1)
