"""lnbook.ensemble: chapter 02's recurrent networks, many seeds as one model by lnbook.seeds: the joint
initial draws, the fit with its batch orders and evaluations, population statistics and trajectories;
and lnbook.rnn.ElmanClassifier with its batch norms (RecurrentBatchNorm), stacked or plain."""

import copy
import math

import numpy as np
import pytest
import torch

from lnbook import ensemble, rnn, seeds, train, utils


def toy(n=12, steps=5, features=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, steps, features, generator=g)
    lengths = torch.randint(2, steps + 1, (n,), generator=g)
    lengths[0] = steps
    x = torch.where(torch.arange(steps)[:, None] < lengths[:, None, None], x, 0.0)
    return x, lengths, torch.randint(0, 3, (n,), generator=g)


def options(norm, steps=5):
    return dict(max_steps=steps) if norm == "batch_per_step" else {}


def test_the_initial_weights_are_drawn_together_and_the_generator_left_after_them():
    utils.seed_everything(3)
    plain = ensemble.plain_rnns(3, 4, 6, 2, "layer")
    after = torch.rand(1)
    utils.seed_everything(3)
    w_ih, b = torch.empty(3, 4, 6).uniform_(-0.5, 0.5), torch.empty(3, 1, 6).uniform_(-0.5, 0.5)
    w_hh = torch.stack([torch.nn.init.orthogonal_(torch.empty(6, 6)) for _ in range(3)])
    head_w, head_b = (torch.empty(shape).uniform_(-1 / math.sqrt(6), 1 / math.sqrt(6)) for shape in ((3, 6, 2), (3, 1, 2)))
    assert torch.equal(torch.rand(1), after)
    for i, m in enumerate(plain):
        for mine, theirs in ((m.weight_ih, w_ih[i].T), (m.bias, b[i, 0]), (m.weight_hh, w_hh[i].T),
                             (m.head.weight, head_w[i].T), (m.head.bias, head_b[i, 0])):
            assert torch.equal(mine, theirs)
    utils.seed_everything(3)
    batch = ensemble.plain_rnns(3, 4, 6, 2, "batch")  # no bias before a batch norm: the later draws shift
    assert batch[0].bias is None and torch.equal(batch[1].weight_ih, plain[1].weight_ih)
    assert not torch.equal(batch[1].weight_hh, plain[1].weight_hh)


@pytest.mark.parametrize("norm", ensemble.NORMS)
def test_each_member_trains_as_train_fit_trains_it_alone(norm):
    data = toy()
    utils.seed_everything(0)
    model = ensemble.stacked_rnn(3, 3, 8, 3, norm, **options(norm))
    alone = seeds.unstack(model, ensemble.plain_rnns(3, 3, 8, 3, norm, **options(norm)))
    # full batches: every member sees the same examples, whatever its order; a small clip
    # norm makes the per-member clipping act
    fit = dict(epochs=3, lr=0.05, batch_size=len(data[-1]), seed=0, grad_clip=0.5)
    history = ensemble.fit(model, data, data, **fit)
    assert history.step_loss.shape == (3, 3) and history.test_acc.shape == (3, 3) and history.eval_steps == [1, 2, 3]
    for e in range(3):
        h = train.fit(alone[e], data, data, **fit)
        np.testing.assert_allclose(history.step_loss[:, e], h.step_loss, rtol=1e-5, atol=1e-6)
        for key, value in alone[e].state_dict().items():
            torch.testing.assert_close(value, model.state_dict()[key][e], rtol=1e-5, atol=1e-6, msg=key)
    assert not torch.allclose(model.weight_ih[0], model.weight_ih[1])  # the members are different networks


def test_masked_statistics_ignore_padding_and_unmasked_ones_do_not():
    x, lengths, _ = toy()
    garbage = torch.where(torch.arange(5)[:, None] < lengths[:, None, None], x, 10.0)
    for norm, changes in (("none", False), ("layer", False), ("batch", False), ("batch_per_step", False),
                          ("batch_unmasked", True)):
        utils.seed_everything(0)
        model = ensemble.stacked_rnn(2, 3, 8, 3, norm, **options(norm))
        two = lambda t: t.expand(2, *t.shape)  # noqa: E731
        out, out_garbage = model(two(x), two(lengths)), model(two(garbage), two(lengths))
        assert (not torch.allclose(out, out_garbage)) == changes, norm
        model.eval()  # running statistics: no norm looks at the padding
        torch.testing.assert_close(model(two(x), two(lengths)), model(two(garbage), two(lengths)))


def test_a_batch_of_one_gives_the_bias_or_falls_back_to_running_statistics():
    x = torch.randn(1, 4, 3)
    utils.seed_everything(0)
    formula = rnn.ElmanClassifier(3, 8, 3, "batch_per_step", max_steps=4, fallback=False)
    with torch.no_grad():
        formula.norm_a.bias.uniform_()
    _, hs, _ = formula.states(x)
    for h in hs:  # a - mean(a) = 0 over a batch of one: every state is tanh(bias)
        torch.testing.assert_close(h, torch.tanh(formula.norm_a.bias).expand_as(h))
    fallback = copy.deepcopy(formula)
    fallback.norm_a.fallback = True
    _, hs, summed = fallback.states(x)
    # running statistics (0, 1): the state is tanh(gain * a / sqrt(1 + eps) + bias), and they never move
    torch.testing.assert_close(hs[2], torch.tanh(summed[2] / (1 + 1e-5) ** 0.5 + fallback.norm_a.bias))
    assert fallback.norm_a.batches_tracked.sum() == 0 and fallback.norm_a.running_mean.abs().sum() == 0


def test_shared_and_per_step_statistics_and_momentum_none():
    x, lengths, _ = toy(n=16)
    torch.manual_seed(0)
    norm = rnn.RecurrentBatchNorm(4, momentum=None)
    a = [torch.randn(16, 4) * (t + 1) + t for t in range(3)]
    for t, at in enumerate(a):
        norm(at, t, lengths > t)
    real = [lengths > t for t in range(3)]  # one set for every step: the plain average of the three
    torch.testing.assert_close(norm.running_mean[0], torch.stack([at[r].mean(0) for at, r in zip(a, real)]).mean(0))
    torch.testing.assert_close(norm.running_var[0], torch.stack([at[r].var(0) for at, r in zip(a, real)]).mean(0))
    assert norm.batches_tracked.tolist() == [3]
    per_step = rnn.RecurrentBatchNorm(4, 3, momentum=0.5)
    for t, at in enumerate(a):
        per_step(at, t, lengths > t)
    for t, (at, r) in enumerate(zip(a, real)):
        torch.testing.assert_close(per_step.running_mean[t], at[r].mean(0) / 2)
    per_step.eval()  # beyond max_steps: the last step's statistics
    torch.testing.assert_close(per_step(a[2], 7), per_step(a[2], 2))
    with pytest.raises(ValueError, match="beyond max_steps"):
        per_step.train()(a[0], 3)


def test_population_statistics_average_every_batch_and_each_step_has_its_own():
    x, lengths, y = toy(n=16)
    utils.seed_everything(0)
    model = ensemble.stacked_rnn(2, 3, 8, 3, "batch_per_step", max_steps=5)
    ensemble.population_statistics(model, (x, lengths, y), batch_size=16)  # one batch: its statistics exactly
    with torch.no_grad():
        _, _, summed = copy.deepcopy(model).train().states(x.expand(2, *x.shape), lengths.expand(2, 16))
    norm = model.norm_a
    for t in (0, 3):
        real = lengths > t
        a = summed[t][:, real]  # (E, running sequences, H)
        torch.testing.assert_close(norm.running_mean[:, t], a.mean(1))
        torch.testing.assert_close(norm.running_var[:, t], a.var(1), rtol=1e-4, atol=1e-5)
    assert norm.momentum == 0.1 and torch.equal(norm.batches_tracked, torch.ones(2, 5, dtype=torch.long))
    assert not torch.allclose(norm.running_mean[:, 0], norm.running_mean[:, 3])
    model.eval()
    assert model(torch.randn(2, 4, 9, 3)).shape == (2, 4, 3)  # beyond max_steps: the last step's statistics
    model.train()
    with pytest.raises(ValueError, match="beyond max_steps"):
        model(torch.randn(2, 4, 9, 3))
    with pytest.raises(ValueError, match="need a batch norm"):
        ensemble.population_statistics(ensemble.stacked_rnn(2, 3, 8, 3, "layer"), (x, lengths, y), 16)


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


def test_fit_draws_the_batch_orders_from_one_generator():
    data = toy()
    utils.seed_everything(0)
    model = ensemble.stacked_rnn(2, 3, 8, 3, "none")
    plain = seeds.unstack(model, ensemble.plain_rnns(2, 3, 8, 3))
    ensemble.fit(model, data, data, epochs=2, lr=0.01, batch_size=4, seed=5, order="bucketed")
    g = torch.Generator().manual_seed(5)
    batches = torch.cat([ensemble.batch_order(data[1], 2, 4, "bucketed", g) for _ in range(2)], 1)  # (E, 6, 4)
    for e in range(2):  # member e alone on its rows of the orders
        alone = seeds.stack([plain[e]])
        seeds.fit(alone, data, data, epochs=1, lr=0.01, batch_size=4, seeds=[0], grad_clip=1.0,
                  order=lambda e=e: batches[e : e + 1].unbind(1))
        torch.testing.assert_close(alone.weight_hh[0], model.weight_hh[e], rtol=1e-5, atol=1e-6)


def test_trajectory_and_accuracy():
    x, lengths, y = toy()
    utils.seed_everything(0)
    model = ensemble.stacked_rnn(3, 3, 8, 3, "batch")
    before = copy.deepcopy(model.state_dict())
    traj = ensemble.trajectory(model, x, y)
    assert set(traj) == {"input_mean", "input_std", "state_mean", "state_rms", "grad_norm"}
    assert all(v.shape == (3, 5) for v in traj.values())
    assert (traj["grad_norm"] > 0).all() and (traj["state_rms"] <= 1).all()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # measured on a copy
    acc = seeds.accuracy(model, (x, lengths, y))
    assert acc.shape == (3,) and ((acc >= 0) & (acc <= 1)).all() and model.training


def test_bad_input_is_refused_with_its_name():
    model = ensemble.stacked_rnn(2, 3, 8, 3)
    with pytest.raises(ValueError, match=r"x must be a float tensor \(S, B, T, F\) with F = 3"):
        model(torch.randn(4, 5, 3))
    with pytest.raises(ValueError, match="lengths must be"):
        model(torch.randn(2, 4, 5, 3), torch.tensor([[6, 1, 1, 1]] * 2))
    with pytest.raises(ValueError, match="norm must be one of"):
        ensemble.stacked_rnn(2, 3, 8, 3, "rms")
    with pytest.raises(ValueError, match="max_steps must be given"):
        ensemble.stacked_rnn(2, 3, 8, 3, "batch_per_step")
    with pytest.raises(TypeError, match="model must be"):
        ensemble.fit(torch.nn.Linear(2, 2), toy(), toy(), epochs=1, lr=0.1, batch_size=2, seed=0)
    with pytest.raises(TypeError, match="model must be"):
        ensemble.fit(rnn.ElmanClassifier(3, 8, 3), toy(), toy(), epochs=1, lr=0.1, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        ensemble.fit(model, toy(), toy(), epochs=1, lr=0.1, batch_size=13, seed=0)


def test_eval_every_and_max_steps():
    data = toy()
    utils.seed_everything(0)
    h = ensemble.fit(ensemble.stacked_rnn(2, 3, 8, 3, "layer"), data, data, epochs=100, lr=0.01, batch_size=4, seed=0,
                     max_steps=7, eval_every=3)
    assert h.eval_steps == [3, 6, 7] and h.test_acc.shape == (3, 2) and h.step_loss.shape == (7, 2)
    assert np.isfinite(h.step_loss).all()
    h = ensemble.fit(ensemble.stacked_rnn(2, 3, 8, 3, "layer"), data, data, epochs=3, lr=0.01, batch_size=4, seed=0,
                     max_steps=7)
    assert h.eval_steps == [3, 6, 7] and h.test_acc.shape == (3, 2)


def test_the_initial_gain_is_a_setting():
    model = ensemble.stacked_rnn(2, 3, 8, 3, "batch_per_step", max_steps=5, gain=0.1)
    assert torch.equal(model.norm_a.weight, torch.full((2, 8), 0.1))
    assert torch.equal(ensemble.stacked_rnn(2, 3, 8, 3, "layer", gain=0.5).norm_a.weight, torch.full((2, 8), 0.5))
    with pytest.raises(ValueError, match="gain must be a positive number"):
        ensemble.stacked_rnn(2, 3, 8, 3, "layer", gain=0.0)


def test_online_statistics_follow_the_stream_one_example_at_a_time():
    torch.manual_seed(0)
    m = 0.2
    norm = rnn.RecurrentBatchNorm(3, 2, momentum=m, online=True)
    stream = torch.randn(40, 1, 3) * 2 + 5
    mean, var = torch.zeros(3), torch.ones(3)
    for x in stream:  # one example per update: the exponentially weighted mean and variance of the stream
        out = norm(x, 1)
        d = x[0] - mean
        mean, var = mean + m * d, (1 - m) * (var + m * d**2)
        torch.testing.assert_close(out[0], (x[0] - mean) / torch.sqrt(var + 1e-5))
    torch.testing.assert_close(norm.running_mean[1], mean)
    assert norm.batches_tracked.tolist() == [0, 40]
    assert norm.running_mean[0].abs().sum() == 0  # step 0 saw nothing
    x = torch.randn(1, 3, requires_grad=True)
    norm(x, 0).sum().backward()  # statistics are constants: the gradient is the gain over the std
    torch.testing.assert_close(x.grad, (norm.weight / torch.sqrt(norm.running_var[0] + 1e-5)).expand(1, 3))
    with pytest.raises(ValueError, match="momentum"):
        rnn.RecurrentBatchNorm(3, online=True, momentum=None)
    # an online per-step network trains stacked on batches of one, every step's statistics moving
    utils.seed_everything(0)
    model = ensemble.stacked_rnn(2, 3, 6, 3, "batch_per_step", max_steps=5, online=True, momentum=0.1, gain=0.1)
    x, lengths, y = toy()
    ensemble.fit(model, (x, lengths, y), (x, lengths, y), epochs=1, lr=1e-3, batch_size=1, seed=0)
    assert (model.norm_a.batches_tracked[:, 0] == 12).all() and model.norm_a.running_mean.abs().sum() > 0
