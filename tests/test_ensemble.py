"""lnbook.ensemble: many seeds as one model, each member exactly as if trained alone: EnsembleRNN and
fit. (Chapter 01's stacked MLPs are lnbook.seeds', tested in test_seeds.)"""

import copy

import numpy as np
import pytest
import torch

from lnbook import ensemble, utils


def toy(n=12, steps=5, features=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, steps, features, generator=g)
    lengths = torch.randint(2, steps + 1, (n,), generator=g)
    lengths[0] = steps
    x = torch.where(torch.arange(steps)[:, None] < lengths[:, None, None], x, 0.0)
    return x, lengths, torch.randint(0, 3, (n,), generator=g)


def member(model, e):
    """Member e of an ensemble as an ensemble of one."""
    alone = ensemble.EnsembleRNN(1, model.wx.shape[1], model.wx.shape[2], model.head_w.shape[2], model.norm,
                                 max_steps=model.max_steps if model.norm == "batch_per_step" else None)
    alone.load_state_dict({k: v[e : e + 1].clone() for k, v in model.state_dict().items()})
    return alone


@pytest.mark.parametrize("norm", ensemble.NORMS)
def test_each_member_trains_as_it_would_alone(norm):
    data = toy()
    utils.seed_everything(0)
    model = ensemble.EnsembleRNN(3, 3, 8, 3, norm, max_steps=5 if norm == "batch_per_step" else None)
    alone = [member(model, e) for e in range(3)]
    # full batches: every member sees the same examples, whatever its order; a small clip
    # norm makes the per-member clipping act
    fit = dict(epochs=3, lr=0.05, batch_size=len(data[-1]), seed=0, grad_clip=0.5)
    history = ensemble.fit(model, data, data, **fit)
    assert history.step_loss.shape == (3, 3) and history.test_acc.shape == (3, 3)
    for e in range(3):
        ensemble.fit(alone[e], data, data, **fit)
        for key, value in alone[e].state_dict().items():
            torch.testing.assert_close(value[0], model.state_dict()[key][e], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(model.wx[0], model.wx[1])  # the members are different networks


def test_masked_statistics_ignore_padding_and_unmasked_ones_do_not():
    x, lengths, _ = toy()
    garbage = torch.where(torch.arange(5)[:, None] < lengths[:, None, None], x, 10.0)
    for norm, changes in (("none", False), ("layer", False), ("batch", False), ("batch_per_step", False),
                          ("batch_unmasked", True)):
        utils.seed_everything(0)
        model = ensemble.EnsembleRNN(2, 3, 8, 3, norm, max_steps=5 if norm == "batch_per_step" else None)
        out, out_garbage = model(x, lengths), model(garbage, lengths)
        assert (not torch.allclose(out, out_garbage)) == changes, norm
        model.eval()  # running statistics: no norm looks at the padding
        torch.testing.assert_close(model(x, lengths), model(garbage, lengths))


def test_a_batch_of_one_gives_the_bias_or_falls_back_to_running_statistics():
    x = torch.randn(1, 4, 3)
    utils.seed_everything(0)
    formula = ensemble.EnsembleRNN(2, 3, 8, 3, "batch_per_step", max_steps=4, fallback=False)
    with torch.no_grad():
        formula.bias.uniform_()
    _, hs, _ = formula.states(x)
    for h in hs:  # a - mean(a) = 0 over a batch of one: every state is tanh(bias)
        torch.testing.assert_close(h, torch.tanh(formula.bias).expand_as(h))
    fallback = copy.deepcopy(formula)
    fallback.fallback = True
    _, hs, summed = fallback.states(x)
    # running statistics (0, 1): the state is tanh(gain * a / sqrt(1 + eps) + bias), and they never move
    torch.testing.assert_close(hs[2], torch.tanh(summed[2] / (1 + 1e-5) ** 0.5 + fallback.bias))
    assert fallback.batches_tracked.sum() == 0 and fallback.running_mean.abs().sum() == 0


def test_population_statistics_average_every_batch_and_each_step_has_its_own():
    x, lengths, y = toy(n=16)
    utils.seed_everything(0)
    model = ensemble.EnsembleRNN(2, 3, 8, 3, "batch_per_step", max_steps=5)
    ensemble.population_statistics(model, (x, lengths, y), batch_size=16)  # one batch: its statistics exactly
    with torch.no_grad():
        _, _, summed = copy.deepcopy(model).train().states(x, lengths)
    for t in (0, 3):
        real = lengths > t
        a = summed[t][:, real]  # (E, running sequences, H)
        torch.testing.assert_close(model.running_mean[:, t], a.mean(1))
        torch.testing.assert_close(model.running_var[:, t], a.var(1), rtol=1e-4, atol=1e-5)
    assert model.momentum == 0.1 and torch.equal(model.batches_tracked[:, :, 0], torch.ones(2, 5))
    assert not torch.allclose(model.running_mean[:, 0], model.running_mean[:, 3])
    model.eval()
    assert model(torch.randn(4, 9, 3)).shape == (2, 4, 3)  # beyond max_steps: the last step's statistics
    model.train()
    with pytest.raises(ValueError, match="beyond max_steps"):
        model(torch.randn(4, 9, 3))
    with pytest.raises(ValueError, match="need a batch norm"):
        ensemble.population_statistics(ensemble.EnsembleRNN(2, 3, 8, 3, "layer"), (x, lengths, y), 16)


def test_batch_orders():
    lengths = torch.tensor([8, 40, 8, 16, 8, 24, 8, 16, 32, 8, 8, 16, 8])
    g = torch.Generator().manual_seed(0)
    random = ensemble.batch_order(lengths, 3, 4, "random", g)
    assert random.shape == (3, 3, 4)
    assert all(len(set(random[e].flatten().tolist())) == 12 for e in range(3))  # no example twice in an epoch
    assert not torch.equal(random[0], random[1])  # each member has its own order
    bucketed = ensemble.batch_order(lengths, 2, 4, "bucketed", g)
    for e in range(2):
        spans = sorted((int(lengths[b].min()), int(lengths[b].max())) for b in bucketed[e])
        assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(spans, spans[1:]))  # batches of similar lengths


def test_trajectory_and_accuracy():
    x, lengths, y = toy()
    utils.seed_everything(0)
    model = ensemble.EnsembleRNN(3, 3, 8, 3, "batch")
    before = model.state_dict()
    traj = ensemble.trajectory(model, x, y)
    assert set(traj) == {"input_mean", "input_std", "state_mean", "state_rms", "grad_norm"}
    assert all(v.shape == (3, 5) for v in traj.values())
    assert (traj["grad_norm"] > 0).all() and (traj["state_rms"] <= 1).all()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # measured on a copy
    acc = ensemble.accuracy(model, (x, lengths, y))
    assert acc.shape == (3,) and ((acc >= 0) & (acc <= 1)).all() and model.training


def test_bad_input_is_refused_with_its_name():
    model = ensemble.EnsembleRNN(2, 3, 8, 3)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, 3\).*got \(4, 5, 2\)"):
        model(torch.randn(4, 5, 2))
    with pytest.raises(ValueError, match="lengths must be"):
        model(torch.randn(4, 5, 3), torch.tensor([6, 1, 1, 1]))
    with pytest.raises(ValueError, match="norm must be one of"):
        ensemble.EnsembleRNN(2, 3, 8, 3, "rms")
    with pytest.raises(ValueError, match="max_steps must be given"):
        ensemble.EnsembleRNN(2, 3, 8, 3, "batch_per_step")
    with pytest.raises(TypeError, match="model must be"):
        ensemble.fit(torch.nn.Linear(2, 2), toy(), toy(), epochs=1, lr=0.1, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        ensemble.fit(model, toy(), toy(), epochs=1, lr=0.1, batch_size=13, seed=0)


def test_eval_every_and_max_steps():
    data = toy()
    utils.seed_everything(0)
    h = ensemble.fit(ensemble.EnsembleRNN(2, 3, 8, 3, "layer"), data, data, epochs=100, lr=0.01, batch_size=4, seed=0,
                     max_steps=7, eval_every=3)
    assert h.eval_steps == [3, 6, 7] and h.test_acc.shape == (3, 2) and h.step_loss.shape == (7, 2)
    assert np.isfinite(h.step_loss).all()


def test_the_initial_gain_is_a_setting():
    model = ensemble.EnsembleRNN(2, 3, 8, 3, "batch_per_step", max_steps=5, gain=0.1)
    assert torch.equal(model.gain, torch.full((2, 1, 8), 0.1))
    with pytest.raises(ValueError, match="gain must be a positive number"):
        ensemble.EnsembleRNN(2, 3, 8, 3, "layer", gain=0.0)
