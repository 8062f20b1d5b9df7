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


def test_dqn_agent_in_a_stack_is_the_agent_alone():
    """Each agent draws its own replay batches and runs at its own rate: agent 1 of a stack of two
    (rates 3e-3 and 1e-3) is the agent trained alone at 1e-3."""
    pair = agents("none", seed_list=(0, 1))
    both = rl.dqn(pair, steps=400, seeds=[0, 1], lr=[3e-3, 1e-3], learning_starts=100, batch_size=16,
                  target_every=50, explore_steps=200, own_draws=True)
    alone = agents("none", seed_list=(1,))
    one = rl.dqn(alone, steps=400, seeds=[1], learning_starts=100, batch_size=16, target_every=50, explore_steps=200,
                 own_draws=True)
    assert both.episodes[1] == one.episodes[0]
    for a, b in zip(pair.state_dict().values(), alone.state_dict().values()):
        torch.testing.assert_close(a[1], b[0], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="one per agent"):
        rl.dqn(pair, steps=10, seeds=[0, 1], lr=[1e-3])
    with pytest.raises(TypeError, match="own_draws"):
        rl.dqn(pair, steps=10, seeds=[0, 1], own_draws=1)


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_dqn_without_target_network_and_with_more_updates(norm, monkeypatch):
    calls = []
    step = torch.optim.Adam.step
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, *a, **k: (calls.append(1), step(self, *a, **k))[1])
    model = agents(norm)
    history = rl.dqn(model, steps=300, seeds=[0, 1], learning_starts=100, batch_size=16, target_every=None,
                     train_every=2, updates=3, explore_steps=200, eval_every=100, eval_episodes=1)
    assert len(calls) == 3 * len(range(100, 301, 2))  # 3 updates at every second step from step 100 on
    assert history.eval_steps == [100, 200, 300] and history.greedy.shape == (2, 3)
    np.testing.assert_allclose(rl.last_greedy(history, 2), history.greedy[:, 1:].mean(1))
    with pytest.raises(ValueError, match="at most the evaluations"):
        rl.last_greedy(history, 4)
    with pytest.raises(ValueError, match="updates"):
        rl.dqn(model, steps=10, seeds=[0, 1], updates=0)


def test_dqn_job_stacks_rates_times_seeds():
    rates, members, history = rl.dqn_job("layer", "no target network", [1e-3, 3e-3], [5, 6], steps=100, eval_every=100,
                                         eval_episodes=1)
    assert rates == [1e-3, 1e-3, 3e-3, 3e-3] and members == [5, 6, 5, 6]
    assert history.greedy.shape == (4, 1) and len(history.episodes) == 4
    with pytest.raises(ValueError, match="regime"):
        rl.dqn_job("layer", "no such regime", [1e-3], [0], steps=10, eval_every=10)


def _refit_model(norm, seed_list=(0, 1)):
    members = []
    for seed in seed_list:
        utils.seed_everything(seed)
        members.append(models.MLP(8, (32,), 1, norm))
    return seeds.stack(members)


def test_refit_fresh_restarts_every_task_from_the_initial_network():
    """The control: task k's fresh fit is what a new network reaches on task k alone."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    targets = rl.shifted_targets(64, 3, 1.0, seed=1)
    fresh = rl.refit(_refit_model("layer"), x, targets, steps=50, lr=1e-2, batch_size=16, seeds=[0, 1], fresh=True)
    for k in range(3):
        # a new network on task k alone, with the batches that task k drew in the fresh run (generators run on)
        model = _refit_model("layer")
        gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
        for _ in range(50 * k):
            for gen in gens:
                torch.randint(64, (16,), generator=gen)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(50):
            idx = torch.stack([torch.randint(64, (16,), generator=gen) for gen in gens])
            loss = ((model(x[idx])[..., 0] - targets[k][idx]) ** 2).mean(1).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            mse = ((model.eval()(x.expand(2, *x.shape))[..., 0] - targets[k]) ** 2).mean(1) / targets[k].var(correction=0)
        np.testing.assert_allclose(fresh.fit[:, k], mse.numpy(), rtol=1e-4)
    continual = rl.refit(_refit_model("layer"), x, targets, steps=50, lr=1e-2, batch_size=16, seeds=[0, 1])
    np.testing.assert_allclose(continual.fit[:, 0], fresh.fit[:, 0])  # the first task is the same run
    assert not np.allclose(continual.fit[:, 1:], fresh.fit[:, 1:])


def test_refit_weight_decay_is_adamw_and_shrinks_the_weights():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    targets = rl.shifted_targets(64, 2, 0.0, seed=1)
    norms = {wd: rl.refit(_refit_model("none"), x, targets, steps=100, lr=1e-2, batch_size=16, seeds=[0, 1],
                          weight_decay=wd).weight_norm for wd in (0.0, 1.0)}
    assert (norms[1.0] < norms[0.0]).all()
    # AdamW by hand: the same first step
    model, by_hand = _refit_model("none"), _refit_model("none")
    rl.refit(model, x, targets[:1], steps=1, lr=1e-2, batch_size=16, seeds=[0, 1], weight_decay=0.5)
    optimizer = torch.optim.AdamW(by_hand.parameters(), lr=1e-2, weight_decay=0.5)
    idx = torch.stack([torch.randint(64, (16,), generator=torch.Generator().manual_seed(s)) for s in (0, 1)])
    ((by_hand(x[idx])[..., 0] - targets[0][idx]) ** 2).mean(1).sum().backward()
    optimizer.step()
    for a, b in zip(model.parameters(), by_hand.parameters()):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="weight_decay"):
        rl.refit(model, x, targets, steps=1, lr=1e-2, batch_size=16, seeds=[0, 1], weight_decay=-1.0)
    with pytest.raises(TypeError, match="fresh"):
        rl.refit(model, x, targets, steps=1, lr=1e-2, batch_size=16, seeds=[0, 1], fresh=1)


def test_refit_job_builds_the_chapters_network_and_targets():
    history = rl.refit_job("layer", "moving mean", 0.1, False, [0, 1], steps=5, tasks=2, n=64)
    assert history.fit.shape == (2, 2) and (history.weight_norm > 0).all()
    with pytest.raises(ValueError, match="targets"):
        rl.refit_job("layer", "sideways", 0.0, False, [0], steps=1, tasks=1)
