"""lnbook.rl: DQN on CartPole with stacked agents, and the plasticity test."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from lnbook import models, rl, seeds, utils


pytestmark = pytest.mark.usefixtures("one_thread")


def agents(norm, seed_list=(0, 1), hidden=(16,)):
    members = []
    for seed in seed_list:
        utils.seed_everything(seed)
        members.append(models.MLP(4, hidden, 2, norm))
    return seeds.stack(members)


def test_greedy_return_is_the_length_of_a_greedy_episode():
    """A policy that always pushes left: each agent's return is the number of steps the pole
    stays up, which we count again by stepping gymnasium ourselves."""
    model = agents("none")
    with torch.no_grad():
        model.net[-1].bias.copy_(torch.tensor([10.0, -10.0]))  # every member: action 0 wins everywhere
        model.net[-1].weight.zero_()
    returns = rl.greedy_return(model, episodes=2, seed=5)
    for s in range(2):
        lengths = []
        for e in range(2):
            env = gym.make(rl.ENV)
            env.reset(seed=5 + 1000 * e + s)
            steps, done = 0, False
            while not done:
                _, _, terminated, truncated, _ = env.step(0)
                steps, done = steps + 1, terminated or truncated
            lengths.append(steps)
        assert returns[s] == pytest.approx(np.mean(lengths))
    assert returns.max() < 20  # pushing one way drops the pole fast


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
def test_dqn_runs_every_agent_and_repeats(norm):
    runs = []
    for _ in range(2):
        model = agents(norm)
        runs.append((model, rl.dqn(model, steps=300, seeds=[0, 1], learning_starts=100, batch_size=16, target_every=50,
                                   explore_steps=200, eval_every=300, eval_episodes=1)))
    (m0, h0), (m1, h1) = runs
    assert h0.episodes == h1.episodes and np.array_equal(h0.greedy, h1.greedy)
    assert all(torch.equal(a, b) for a, b in zip(m0.state_dict().values(), m1.state_dict().values()))
    assert len(h0.episodes) == 2 and h0.episodes[0] != h0.episodes[1]  # each agent its own environment
    assert all(len(e) >= 5 for e in h0.episodes)  # random play drops the pole within tens of steps
    assert sum(r for e in h0.episodes for _, r in e) <= 2 * 300  # a return is a count of steps
    assert h0.greedy.shape == (2, 1) and h0.eval_steps == [300]
    returns = rl.mean_return(h0, last=300)
    assert returns.shape == (2,) and np.all(returns >= 8)


def test_dqn_learns_cartpole_better_than_chance():
    """The update is right: 4,000 steps lift the greedy return far above random play (about 20)."""
    model = agents("none", seed_list=(0, 1, 2), hidden=(64, 64))
    history = rl.dqn(model, steps=4000, seeds=[0, 1, 2], train_every=2, eval_every=4000, eval_episodes=2)
    assert history.greedy[:, -1].mean() > 60


def test_dqn_refuses_bad_settings():
    with pytest.raises(TypeError, match="stacked by lnbook.seeds.stack"):
        rl.dqn(models.MLP(4, (8,), 2), steps=10, seeds=[0])
    with pytest.raises(TypeError, match="stacked by lnbook.seeds.stack"):
        rl.refit(torch.nn.Linear(4, 1), torch.randn(4, 4), torch.randn(1, 4), steps=1, lr=0.1, batch_size=2, seeds=[0])
    with pytest.raises(ValueError, match="one entry per agent"):
        rl.dqn(agents("none"), steps=10, seeds=[0])
    with pytest.raises(ValueError, match="learning_starts"):
        rl.dqn(agents("none"), steps=10, seeds=[0, 1], learning_starts=10, batch_size=64)


def test_shifted_targets_are_fresh_and_move_by_the_shift():
    y = rl.shifted_targets(2000, 4, 1.5, seed=0)
    assert y.shape == (4, 2000)
    np.testing.assert_allclose(y.mean(1).numpy(), [0.0, 1.5, 3.0, 4.5], atol=0.1)
    assert abs(np.corrcoef(y[0].numpy(), y[1].numpy())[0, 1]) < 0.1  # nothing to do with the last
    assert torch.equal(y, rl.shifted_targets(2000, 4, 1.5, seed=0))


@pytest.mark.parametrize("norm", ["none", "layer", "weight"])
def test_refit_measures_fit_dead_units_and_weights(norm):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    members = []
    for seed in (0, 1):
        utils.seed_everything(seed)
        members.append(models.MLP(8, (32,), 1, norm))
    model = seeds.stack(members)
    targets = rl.shifted_targets(64, 3, 0.0, seed=1)
    history = rl.refit(model, x, targets, steps=200, lr=1e-2, batch_size=16, seeds=[0, 1])
    assert history.fit.shape == history.dead.shape == history.weight_norm.shape == (2, 3)
    assert (history.fit < 0.8).all()  # 32 units memorize 64 values well in 200 steps
    assert ((history.dead >= 0) & (history.dead <= 1)).all()
    with torch.no_grad():  # the last column is the fit to the last target, measured again here
        mse = ((model.eval()(x.expand(2, *x.shape))[..., 0] - targets[-1]) ** 2).mean(1) / targets[-1].var(correction=0)
    np.testing.assert_allclose(history.fit[:, -1], mse.numpy(), rtol=1e-5)
    plain = seeds.unstack(model, [models.MLP(8, (32,), 1, norm) for _ in range(2)])  # the members, measured alone
    for s, net in enumerate(plain):
        linears, _ = models.mlp_layers(net)
        weights = sum(lin.weight.detach().pow(2).sum() for lin in linears).sqrt()
        assert history.weight_norm[s, -1] == pytest.approx(weights.item(), rel=1e-5)
        with torch.no_grad():
            units = net.net[:-1](x)  # the hidden ReLU's output
        assert history.dead[s, -1] == pytest.approx((units == 0).all(0).float().mean().item())


def test_refit_counts_a_unit_dead_only_when_it_is_zero_everywhere():
    utils.seed_everything(0)
    model = seeds.stack([models.MLP(2, (4,), 1, "none")])
    with torch.no_grad():
        model.net[1].weight.zero_()
        model.net[1].bias.copy_(torch.tensor([[-1.0, -1.0, 1.0, 1.0]]))  # two units off for every input
    history = rl.refit(model, torch.randn(10, 2), torch.randn(1, 10), steps=1, lr=1e-9, batch_size=2, seeds=[0])
    assert history.dead[0, 0] == pytest.approx(0.5)
