"""lnbook.rl: the random-walk chain, its batches, and online TD learning."""

import pytest
import torch
from torch import nn

from lnbook import models, rl, train, utils

CHAIN = rl.RandomWalk()
TINY = rl.RandomWalk(n_states=10, gamma=0.8, features=5)


def bellman_by_iteration(chain, sweeps=400):
    """v <- r + gamma * E[v(next)], state by state, written out from the chain's description."""
    n, v = chain.n_states, [0.0] * chain.n_states
    reward = [(1 - chain.gamma) * (2 * s / (n - 1) - 1) for s in range(n)]
    for _ in range(sweeps):
        v = [reward[s] + chain.gamma * 0.5 * (v[max(s - 1, 0)] + v[min(s + 1, n - 1)]) for s in range(n)]
    return torch.tensor(v, dtype=torch.float64)


@pytest.mark.parametrize("chain", [CHAIN, TINY, rl.RandomWalk(n_states=2, gamma=0.0)])
def test_true_values_solve_the_bellman_equation(chain):
    v = chain.true_values()
    assert v.shape == (chain.n_states,) and v.dtype == torch.float64
    torch.testing.assert_close(v, bellman_by_iteration(chain), rtol=0, atol=1e-12)
    assert (v.diff() > 0).all() and v.abs().max() <= 1  # rises along the chain, inside [-1, 1]
    torch.testing.assert_close(v, -v.flip(0))  # the chain is symmetric about its middle


def test_true_values_match_discounted_returns_of_the_walk():
    """Monte Carlo: the discounted return from every visit of a long walk, averaged per state."""
    chain = rl.RandomWalk(n_states=8, gamma=0.8, features=4)
    states = chain.walk(30_000, seed=1)
    rewards = chain.reward(states).double().tolist()
    returns, g = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        g = rewards[t] + chain.gamma * g
        returns[t] = g
    keep = len(returns) - 200  # the last returns are cut short by the end of the walk (0.8**200 ~ 1e-20)
    returns, states = torch.tensor(returns[:keep]), states[:keep]
    estimate = torch.stack([returns[states == s].mean() for s in range(chain.n_states)])
    assert (estimate - chain.true_values()).abs().max() < 0.02


def test_walk_moves_one_state_at_a_time_and_is_fixed_by_the_seed():
    walk = CHAIN.walk(5000, seed=3)
    assert walk.shape == (5001,) and walk.dtype == torch.int64 and int(walk[0]) == 10
    assert int(walk.min()) == 0 and int(walk.max()) == CHAIN.n_states - 1  # it reaches both ends
    step = walk.diff()
    assert set(step.tolist()) <= {-1, 0, 1}
    stays = walk[1:][step == 0]
    assert ((stays == 0) | (stays == CHAIN.n_states - 1)).all()  # it stays put only at an end
    assert torch.equal(walk, CHAIN.walk(5000, seed=3)) and not torch.equal(walk, CHAIN.walk(5000, seed=4))


def test_encode_and_reward():
    x = CHAIN.encode(torch.arange(CHAIN.n_states))
    assert x.shape == (CHAIN.n_states, CHAIN.features) and x.dtype == torch.float32
    assert float(x.max()) == 1.0 and float(x[0, 0]) == 1.0 and float(x[-1, -1]) == 1.0  # bumps at both ends
    dist = torch.cdist(x, x)
    assert (dist.diagonal(1)[:-4] < dist.diagonal(5)).all()  # neighbours look more alike than states 5 apart
    assert CHAIN.encode(torch.tensor([[1, 2]])).shape == (1, 2, CHAIN.features)
    r = CHAIN.reward(torch.tensor([0, CHAIN.n_states - 1]))
    torch.testing.assert_close(r, torch.tensor([-0.1, 0.1]))


def test_recent_batches_are_consecutive_and_replayed_ones_are_drawn_from_the_past():
    recent = list(rl.training_batches(50, 4, "recent", seed=0))
    assert recent[0][0] == 3 and len(recent) == 47
    assert all(idx.tolist() == list(range(t - 3, t + 1)) for t, idx in recent)
    replay = list(rl.training_batches(50, 4, "replay", seed=0))
    assert [t for t, _ in replay] == [t for t, _ in recent]
    assert all(0 <= int(idx.min()) and int(idx.max()) <= t for t, idx in replay)
    assert len(torch.cat([idx for _, idx in replay]).unique()) > 30  # not stuck on a few transitions
    again = list(rl.training_batches(50, 4, "replay", seed=0))
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(replay, again))
    online = list(rl.training_batches(5, 1, "recent", seed=0))
    assert [(t, idx.tolist()) for t, idx in online] == [(t, [t]) for t in range(5)]


def test_recent_batches_cover_a_small_stretch_of_the_chain():
    recent = rl.batch_spread(CHAIN, 3000, 8, "recent", seed=0)
    replay = rl.batch_spread(CHAIN, 3000, 8, "replay", seed=0)
    everywhere = float(torch.arange(CHAIN.n_states).double().std(correction=0))  # 5.77 states
    assert recent.shape == replay.shape == (2993,)
    assert float(recent.mean()) < 1.5 and float(recent.max()) < 3  # a few neighbouring states
    assert float(replay[1000:].mean()) > 0.6 * everywhere  # a sample of the whole chain
    positions = CHAIN.walk(20, seed=0).double()
    first = torch.cat([positions[:8], positions[1:9]]).std(correction=0)
    assert float(recent[0]) == pytest.approx(float(first))  # the states [s; s'] of the first batch


@pytest.mark.parametrize("norm", ["none", "layer"])
def test_td_learning_from_single_transitions_reduces_the_value_error(norm):
    utils.seed_everything(0)
    model = models.MLP(TINY.features, (16,), 1, norm)
    before = rl.value_error(model, TINY)
    history = rl.td_learn(model, chain=TINY, steps=600, lr=3e-3, seed=0, eval_every=150)
    assert history.steps == [150, 300, 450, 600] and len(history.step_loss) == 600
    assert history.value_error[-1] < 0.5 * before


def test_td_learn_times_the_updates_and_not_the_evaluations(fake_clock, monkeypatch):
    """One clock reading before and one after each update (1 s on the fake clock); the 100 s
    that each evaluation "takes" are left out."""
    evaluate = rl.value_error
    monkeypatch.setattr(rl, "value_error", lambda *args: (fake_clock.advance(100.0), evaluate(*args))[1])
    model = models.MLP(TINY.features, (16,), 1, "none")
    history = rl.td_learn(model, chain=TINY, steps=12, lr=3e-3, seed=0, eval_every=4, batch_size=2)
    assert history.steps == [4, 8, 12] and history.wall_time == [3.0, 7.0, 11.0]  # updates from the 2nd transition on


def test_td_learn_is_fixed_by_the_seed():
    runs = []
    for seed in (0, 0, 1):
        utils.seed_everything(0)
        model = models.MLP(TINY.features, (16,), 1, "batch")
        runs.append(rl.td_learn(model, chain=TINY, steps=200, lr=1e-3, seed=seed, batch_size=4, batch="replay"))
    assert runs[0].step_loss == runs[1].step_loss and runs[0].value_error == runs[1].value_error
    assert runs[0].step_loss != runs[2].step_loss
    assert runs[0].steps == [100, 200] and len(runs[0].step_loss) == 197  # updates start at the 4th transition


def test_value_error_uses_eval_mode_and_restores_the_mode():
    utils.seed_everything(0)
    model = models.MLP(CHAIN.features, (16,), 1, "batch")
    x = CHAIN.encode(torch.arange(CHAIN.n_states))
    with torch.no_grad():
        model.eval()
        expected = float((model(x).reshape(-1).double() - CHAIN.true_values()).pow(2).mean().sqrt())
    model.train()
    assert rl.value_error(model, CHAIN) == pytest.approx(expected)
    assert model.training and int(model.net[2].num_batches_tracked) == 0  # no running statistics moved


def test_batch_norm_cannot_learn_from_one_transition_at_a_time():
    utils.seed_everything(0)
    for model in (models.MLP(TINY.features, (16,), 1, "batch"),
                  nn.Sequential(nn.Linear(TINY.features, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))):
        with pytest.raises(ValueError, match="batch_size must be at least 2 for a model with BatchNorm"):
            rl.td_learn(model, chain=TINY, steps=10, lr=1e-3, seed=0, batch_size=1)


def test_td_learn_runs_as_a_fit_many_job():
    jobs = []
    for _ in range(2):
        utils.seed_everything(0)
        jobs.append(dict(model=models.MLP(TINY.features, (8,), 1, "layer"), chain=TINY, steps=50, lr=1e-3, seed=0))
    model, history = train.fit_many([jobs[0] | {"fit": rl.td_learn}])[0].result()
    assert model is jobs[0]["model"] and isinstance(history, rl.TDHistory)
    assert history.step_loss == rl.td_learn(jobs[1].pop("model"), **jobs[1]).step_loss


def test_bad_input():
    model = models.MLP(TINY.features, (8,), 1, "none")
    kwargs = dict(chain=TINY, steps=10, lr=1e-3, seed=0)
    for bad, match in [
        (dict(n_states=1), "n_states must be an int >= 2"),
        (dict(n_states=2.0), "n_states must be an int >= 2"),
        (dict(gamma=1.0), r"gamma must be a number in \[0, 1\)"),
        (dict(gamma=True), "gamma must be a number"),
        (dict(features=1), r"features must be an int >= 2 \(one bump"),
    ]:
        with pytest.raises(ValueError, match=match):
            rl.RandomWalk(**bad)
    with pytest.raises(TypeError, match="positions must be an int64 tensor"):
        CHAIN.encode(torch.tensor([0.5]))
    with pytest.raises(ValueError, match=r"positions must lie in 0 \.\. 19"):
        CHAIN.reward(torch.tensor([20]))
    with pytest.raises(TypeError, match="chain must be a RandomWalk"):
        rl.td_learn(model, **kwargs | {"chain": "walk"})
    with pytest.raises(ValueError, match="batch must be one of"):
        rl.td_learn(model, **kwargs | {"batch": "random"})
    with pytest.raises(ValueError, match="lr must be a positive number"):
        rl.td_learn(model, **kwargs | {"lr": 0})
    for name in ("steps", "batch_size", "eval_every"):
        with pytest.raises(ValueError, match=f"{name} must be a positive int"):
            rl.td_learn(model, **kwargs | {name: 0})
    with pytest.raises(ValueError, match="steps must be at least batch_size = 8"):
        rl.td_learn(model, **kwargs | {"steps": 7, "batch_size": 8})
    with pytest.raises(ValueError, match=r"model must map \(B, 5\) states to \(B, 1\) values, got \(2, 3\)"):
        rl.td_learn(models.MLP(TINY.features, (8,), 3), **kwargs)
