"""lnbook.models: the MLP with its norm as a setting, and layer_stats, which measures what it says
without touching the model."""

import numpy as np
import pytest
import torch

from lnbook import models, rnn, train, utils


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


def _members(make, seeds=(0, 1, 2)):
    out = []
    for seed in seeds:
        utils.seed_everything(seed)
        out.append(make())
    return out


@pytest.mark.parametrize("norm", models.MLP.NORMS)
def test_stacked_mlp_member_is_the_mlp_it_was_built_from(norm):
    mlps = _members(lambda: models.MLP(6, (8, 8), 3, norm))
    stacked = models.StackedMLP(mlps)
    x = torch.randn(3, 5, 6)
    for training in (True, False):  # BatchNorm: each member's own batch statistics, then its own running ones
        stacked.train(training)
        expected = torch.stack([m.train(training)(x[s]) for s, m in enumerate(mlps)])
        torch.testing.assert_close(stacked(x), expected, rtol=1e-5, atol=1e-5)
    assert stacked(x[0]).shape == (3, 5, 3)  # one batch for every member


@pytest.mark.parametrize("norm", rnn.NORMS)
def test_stacked_lstm_member_is_the_classifier_it_was_built_from(norm):
    classifiers = _members(lambda: rnn.SequenceClassifier(rnn.LSTMCell(4, 8, norm, max_steps=5), 3))
    stacked = models.StackedLSTM(classifiers)
    x = torch.randn(3, 6, 5, 4)
    for training in (True, False):
        stacked.train(training)
        expected = torch.stack([c.train(training)(x[s]) for s, c in enumerate(classifiers)])
        torch.testing.assert_close(stacked(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["layer", "batch", "weight"])
def test_fit_stacked_trains_each_member_as_fit_trains_it_alone(norm):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 6, generator=g), torch.randint(3, (100,), generator=g)
    data = (x, y)
    seeds = [0, 1]
    stacked = models.StackedMLP(_members(lambda: models.MLP(6, (8,), 3, norm), seeds))
    histories = models.fit_stacked(stacked, data, data, epochs=2, lr=0.05, batch_size=32, seeds=seeds, optimizer="sgd")
    for seed, h in zip(seeds, histories):
        utils.seed_everything(seed)
        alone = train.fit(models.MLP(6, (8,), 3, norm), data, data, epochs=2, lr=0.05, batch_size=32, seed=seed,
                          optimizer="sgd")
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(h.test_acc, alone.test_acc, atol=1e-9)
    assert histories[0].step_loss != histories[1].step_loss


def test_fit_stacked_clips_each_member_on_its_own():
    utils.seed_everything(0)
    x, y = torch.randn(40, 3, 2), torch.randint(2, (40,))
    seeds = [0, 1]
    make = lambda: rnn.SequenceClassifier(rnn.LSTMCell(2, 4, "layer"), 2)  # noqa: E731
    stacked = models.StackedLSTM(_members(make, seeds))
    histories = models.fit_stacked(stacked, (x, y), (x, y), epochs=1, lr=0.05, batch_size=20, seeds=seeds, grad_clip=0.01)
    for seed, h in zip(seeds, histories):
        utils.seed_everything(seed)
        alone = train.fit(make(), (x, y), (x, y), epochs=1, lr=0.05, batch_size=20, seed=seed, grad_clip=0.01)
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-4, atol=1e-5)


def test_stacked_models_refuse_what_they_cannot_stack():
    with pytest.raises(ValueError, match="same constructor"):
        models.StackedMLP([models.MLP(4, (3,), 2), models.MLP(4, (5,), 2)])
    with pytest.raises(TypeError, match="StackedMLP or a StackedLSTM"):
        models.fit_stacked(models.MLP(4, (3,), 2), (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)),
                           (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), epochs=1, lr=0.1, batch_size=2, seeds=[0])
    stacked = models.StackedMLP(_members(lambda: models.MLP(4, (3,), 2)))
    with pytest.raises(ValueError, match="one entry per member"):
        models.fit_stacked(stacked, (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)),
                           (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)), epochs=1, lr=0.1, batch_size=2, seeds=[0])
