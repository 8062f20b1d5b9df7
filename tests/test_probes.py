import numpy as np
import pytest
import torch

from lnbook import ensemble, probes
from lnbook.models import MLP
from lnbook.utils import seed_everything


def test_with_blanks_pads_zero_steps_around_the_sequence():
    x = torch.rand(3, 4, 2) + 1
    y = probes.with_blanks(x, before=2, after=5)
    assert y.shape == (3, 11, 2)
    assert torch.equal(y[:, 2:6], x) and not y[:, :2].any() and not y[:, 6:].any()
    with pytest.raises(ValueError, match="before"):
        probes.with_blanks(x, before=-1)
    with pytest.raises(ValueError, match="x must"):
        probes.with_blanks(x[0])


def test_fresh_readout_reads_a_linear_code_and_not_noise():
    g = torch.Generator().manual_seed(0)
    y, yt = torch.randint(0, 3, (200,), generator=g), torch.randint(0, 3, (100,), generator=g)
    code = torch.randn(3, 5, generator=g) * 4
    informative = [code[y] + torch.randn(200, 5, generator=g), code[yt] + torch.randn(100, 5, generator=g)]
    noise = [torch.randn(200, 5, generator=g), torch.randn(100, 5, generator=g)]
    acc = probes.fresh_readout(torch.stack([informative[0], noise[0]]), y, torch.stack([informative[1], noise[1]]), yt)
    assert acc.shape == (2,)
    assert acc[0] > 0.9 and acc[1] < 0.6
    with pytest.raises(ValueError, match="train_y"):
        probes.fresh_readout(torch.stack([noise[0]]), y[:10], torch.stack([noise[1]]), yt)


def test_reestimated_takes_the_new_inputs_statistics_and_leaves_the_model():
    seed_everything(0)
    net = MLP(4, (6,), 3, "batch").eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(50, 4) * 3 + 2
    adapted = probes.reestimated(net, x)
    assert not adapted.training
    bn = [m for m in adapted.modules() if hasattr(m, "running_mean")][0]
    z = adapted.net[1](x)  # the first Linear's output, what the BatchNorm normalizes
    torch.testing.assert_close(bn.running_mean, z.mean(0).detach())
    torch.testing.assert_close(bn.running_var, z.var(0).detach())
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    with pytest.raises(ValueError, match="BatchNorm"):
        probes.reestimated(MLP(4, (6,), 3, "none"), x)


def test_accuracy_by_length_groups_the_test_set_by_length():
    seed_everything(0)
    model = ensemble.stacked_rnn(2, 3, 5, 2, "none")
    x, lengths = torch.randn(12, 6, 3), torch.tensor([2, 6] * 6)
    with torch.no_grad():
        pred = model(x.expand(2, -1, -1, -1), lengths.expand(2, -1)).argmax(-1)
    y = pred[0].clone()
    y[:2] = 1 - y[:2]  # member 0 gets the first two (one of each length) wrong
    acc = probes.accuracy_by_length(model, (x, lengths, y))
    assert sorted(acc) == [2, 6]
    np.testing.assert_allclose(acc[2][0], 5 / 6)
    np.testing.assert_allclose(acc[6][0], 5 / 6)
    with pytest.raises(TypeError, match="stacked"):
        probes.accuracy_by_length(torch.nn.Linear(2, 2), (x, lengths, y))


def test_add_noise_is_seeded_and_over_batches_formats():
    x = torch.zeros(1000)
    a, b = probes.add_noise(x, 0.5), probes.add_noise(x, 0.5)
    assert torch.equal(a, b) and abs(a.std().item() - 0.5) < 0.05
    assert torch.equal(probes.add_noise(x, 0.0), x)
    with pytest.raises(ValueError, match="sigma"):
        probes.add_noise(x, -1.0)
    assert probes.over_batches(np.array([0.5, 0.25, 0.75])) == "50% (25% to 75%)"


def test_training_mode_accuracy_uses_each_batchs_statistics_and_leaves_the_model():
    seed_everything(0)
    model = ensemble.stacked_rnn(2, 3, 5, 2, "batch_per_step", max_steps=4)
    x, y = torch.randn(9, 4, 3), torch.randint(0, 2, (9,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    acc = probes.training_mode_accuracy(model.eval(), (x, y), batch_size=9)
    assert not model.training and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with torch.no_grad():  # one batch of all nine: the batch statistics of the whole set
        expected = (model.train()(x.expand(2, -1, -1, -1)).argmax(-1) == y).double().mean(-1).numpy()
    np.testing.assert_allclose(acc, expected)
    # batches of one: a per-step BatchNorm's lone example falls back to the running statistics,
    # the same as evaluation mode
    model.eval()
    with torch.no_grad():
        eval_acc = (model(x.expand(2, -1, -1, -1)).argmax(-1) == y).double().mean(-1).numpy()
    np.testing.assert_allclose(probes.training_mode_accuracy(model, (x, y), batch_size=1), eval_acc)
    with pytest.raises(ValueError, match="batch_size"):
        probes.training_mode_accuracy(model, (x, y), batch_size=0)
    with pytest.raises(TypeError, match="stacked"):
        probes.training_mode_accuracy(torch.nn.Linear(2, 2), (x, y), batch_size=2)
