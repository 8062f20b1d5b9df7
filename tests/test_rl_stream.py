"""lnbook.rl's streaming Q(λ) (stream-x on CartPole) and benchmarks/stream_rl.py in a smoke size."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lnbook import models, rl, seeds

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def test_stream_agents_are_sparse_leaky_and_built_from_their_seeds():
    model = rl.stream_agents("layer_simple", [3, 4, 3])
    linears, _ = models.mlp_layers(model)
    assert [tuple(lin.weight.shape) for lin in linears] == [(3, 32, 4), (3, 32, 32), (3, 2, 32)]
    # each unit keeps ceil(0.1 * fan_in) inputs at least one: 1 of CartPole's 4, 3 of 32
    for lin, kept in zip(linears, (1, 3, 3)):
        assert ((lin.weight != 0).sum(-1) == kept).all()
        assert (lin.weight.abs() <= lin.in_features ** -0.5).all() and (lin.bias == 0).all()
    assert sum(isinstance(m, nn.LeakyReLU) for m in model.modules()) == 2 and not any(isinstance(m, nn.ReLU) for m in model.modules())
    w = linears[1].weight
    assert torch.equal(w[0], w[2]) and not torch.equal(w[0], w[1])  # member = its seed's network
    dense = rl.stream_agents("none", [0], sparsity=0.0)
    assert (models.mlp_layers(dense)[0][1].weight != 0).all()
    with pytest.raises(ValueError, match="sparsity"):
        rl.stream_agents("none", [0], sparsity=1.0)


def test_welford_matches_numpy_per_member_with_a_mask():
    rng = np.random.default_rng(0)
    stats, seen = rl._Welford(2, (3,)), [[], []]
    assert (stats.var == 1).all()  # nothing seen: variance 1, as stream-x's
    for _ in range(50):
        x, which = rng.normal(2.0, 3.0, (2, 3)), rng.random(2) < 0.7
        stats.update(x, which)
        for s in range(2):
            if which[s]:
                seen[s].append(x[s])
    for s in range(2):
        np.testing.assert_allclose(stats.mean[s], np.mean(seen[s], 0), rtol=1e-12)
        np.testing.assert_allclose(stats.var[s], np.var(seen[s], 0, ddof=1), rtol=1e-10)


def test_batch_norm_cannot_learn_from_one_transition_and_sees_only_signs_from_two():
    model = rl.stream_agents("batch", [0, 1])
    with pytest.raises(ValueError, match="batch_size must be at least 2"):
        rl.stream_q(model, steps=10, seeds=[0, 1], batch_size=1)
    norm = next(m for m in model.modules() if isinstance(m, seeds.Norm))
    norm.train()
    with pytest.raises(ValueError, match="more than one real position"):  # the layer itself refuses one example
        norm(torch.randn(2, 1, 32))
    scale = torch.tensor([0.1, 10.0, 1.0, 100.0] * 8)  # two states, features of any scale, apart by 0.5 to 1.5 of it
    first = torch.randn(2, 1, 32) * scale
    x = torch.cat([first, first + torch.sign(torch.randn(2, 1, 32)) * scale * (0.5 + torch.rand(2, 1, 32))], 1)
    y = norm(x)  # gain 1, bias 0 at init: each feature of two examples normalizes to -1 and +1 (up to eps)
    np.testing.assert_allclose(y.abs().detach().numpy(), 1.0, atol=0.02)
    assert torch.equal(torch.sign(y), torch.sign(x[:, 1:] - x[:, :1]).expand_as(y) * torch.tensor([-1.0, 1.0])[:, None])


def _obgd_by_hand(net, batch, lr, lam, gamma, kappa, trace):
    """stream-x's ObGD Q(λ) step for one plain network, written as its optim.py does it (the
    trace accumulates -dQ, the step is -α δ e), on each transition in turn at fixed weights."""
    s, a, r, s2, fell, reset = batch
    params = list(net.parameters())
    with torch.no_grad():
        after = net(s2).max(-1).values
    q = net(s).gather(-1, a[:, None])[:, 0]
    delta = r + gamma * (1 - fell) * after - q.detach()
    update = [torch.zeros_like(p) for p in params]
    for i in range(len(a)):
        grads = torch.autograd.grad(-q[i], params, retain_graph=True)
        for e, g in zip(trace, grads):
            e.mul_(gamma * lam).add_(g)
        z = sum(e.abs().sum() for e in trace)
        dot = max(abs(delta[i].item()), 1.0) * z * lr * kappa
        step = lr / dot if dot > 1 else lr
        for u, e in zip(update, trace):
            u.add_(-step * delta[i] * e)
            if reset[i]:
                e.zero_()
    return [p.detach() + u for p, u in zip(params, update)]


@pytest.mark.parametrize("k", [1, 3])
def test_stream_update_is_stream_x_obgd_for_each_member(k):
    plain = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        plain.append(models.MLP(4, (8,), 2, "layer"))
    model = seeds.stack(plain)
    g = torch.Generator().manual_seed(0)
    batch = [(torch.randn(2, 4, generator=g).numpy(), np.array([0, 1]), np.array([1.0, 0.5]),
              torch.randn(2, 4, generator=g).numpy(), np.array([i == 1, False]), np.array([i == 0, i == 1]))
             for i in range(k)]
    params = list(model.parameters())
    traces = [torch.randn_like(p) * 0.1 for p in params]
    before = [t.clone() for t in traces]
    rates = torch.tensor([0.5, 2.0])
    rl._stream_update(model, params, traces, batch, lr=rates, lam=0.8, gamma=0.99, kappa=2.0,
                      device=torch.device("cpu"), switch=False)
    for m in range(2):
        net = plain[m]
        member = [torch.from_numpy(np.stack([b[j][m] for b in batch])) for j in range(6)]
        member = [member[0].float(), member[1].long(), member[2].float(), member[3].float(), member[4].float(), member[5]]
        trace = [-t[m].clone() for t in before]  # stream-x keeps the trace of -dQ
        expected = _obgd_by_hand(net, member, float(rates[m]), 0.8, 0.99, 2.0, trace)
        for p, want in zip(params, expected):
            torch.testing.assert_close(p[m].detach(), want, rtol=1e-5, atol=1e-6)
        for t, want in zip(traces, trace):
            torch.testing.assert_close(t[m], -want, rtol=1e-5, atol=1e-6)


def test_stream_q_runs_every_agent_repeats_and_takes_a_rate_per_agent():
    runs = []
    for _ in range(2):
        model = rl.stream_agents("layer_simple", [0, 0, 1])
        runs.append((model, rl.stream_q(model, steps=300, seeds=[0, 0, 1], lr=[1.0, 0.01, 1.0], explore_steps=100,
                                        eval_every=300, eval_episodes=1)))
    (m0, h0), (m1, h1) = runs
    assert h0.episodes == h1.episodes and np.array_equal(h0.greedy, h1.greedy)
    assert all(torch.equal(a, b) for a, b in zip(m0.state_dict().values(), m1.state_dict().values()))
    assert h0.episodes[0] != h0.episodes[1]  # same seed, other rate: another agent
    assert all(len(e) >= 1 and sum(r for _, r in e) <= 300 for e in h0.episodes)  # a return counts steps
    assert h0.greedy.shape == (3, 1) and h0.eval_steps == [300]
    assert h0.obs_mean.shape == h0.obs_std.shape == (3, 4) and (h0.obs_std > 0).all()
    curve = rl.return_curve(h0, 100, 300)
    assert curve.shape == (3, 3)
    np.testing.assert_allclose(np.nanmean(curve[:, :]), np.nanmean(curve))
    with pytest.raises(ValueError, match="one per agent"):
        rl.stream_q(m0, steps=10, seeds=[0, 0, 1], lr=[1.0, 1.0])


def test_batch_norm_runs_on_two_consecutive_transitions():
    model = rl.stream_agents("batch", [0, 1])
    history = rl.stream_q(model, steps=200, seeds=[0, 1], batch_size=2, explore_steps=100)
    assert all(len(e) >= 2 for e in history.episodes)
    norm = next(m for m in model.modules() if isinstance(m, seeds.Norm))
    assert int(norm.num_batches_tracked[0]) == 100  # one training-mode batch per 2 steps


def test_layernorm_stream_q_learns_where_no_norm_diverges():
    """Stream-x's claim, small: 4,000 steps lift LayerNorm agents' returns well above random play
    (about 20), while the unnormalized Q-network's values run far past any return the scaled
    rewards allow (CartPole's scaled returns stay below about 10 here)."""
    found = {}
    for norm in ("layer_simple", "none"):
        model = rl.stream_agents(norm, [0, 1, 2])
        history = rl.stream_q(model, steps=4000, seeds=[0, 1, 2])
        with torch.no_grad():
            q = model(torch.randn(3, 16, 4)).abs().max().item()
        found[norm] = (rl.mean_return_window(history, 3000, 4000), q)
    assert np.nanmean(found["layer_simple"][0]) > 50 and found["layer_simple"][1] < 20
    assert found["none"][1] > 50


def test_return_windows_and_curves_by_hand():
    h = rl.DQNHistory(episodes=[[(10, 5.0), (30, 7.0), (45, 9.0)], [(50, 1.0)]])
    np.testing.assert_allclose(rl.mean_return_window(h, 20, 50), [8.0, 1.0])
    assert np.isnan(rl.mean_return_window(h, 0, 20)[1])
    np.testing.assert_allclose(rl.return_curve(h, 25, 50), [[5.0, 8.0], [np.nan, 1.0]])
    with pytest.raises(ValueError, match="multiple"):
        rl.return_curve(h, 20, 50)
    with pytest.raises(ValueError, match="stop"):
        rl.mean_return_window(h, 20, 20)


def test_greedy_return_with_identity_statistics_is_the_raw_one():
    model = rl.stream_agents("layer_simple", [0, 1])
    plain = rl.greedy_return(model, 1, seed=3)
    same = rl.greedy_return(model, 1, seed=3, obs_stats=(np.zeros((2, 4)), np.ones((2, 4))))
    np.testing.assert_array_equal(plain, same)
    with pytest.raises(ValueError, match="obs_stats"):
        rl.greedy_return(model, 1, seed=3, obs_stats=(np.zeros((2, 4)), np.zeros((2, 4))))


def test_the_benchmark_script_runs_small_and_its_reader_reads_it(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "stream_rl.py"), "--steps", "60", "--every", "30", "--last", "30",
           "--val-seeds", "2", "--test-seeds", "2", "--lrs", "0.1", "1", "--arms", "none:1", "batch:2",
           "--out", str(tmp_path)]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    run = rl.stored_stream_run(tmp_path)
    assert any("Stream Q(lambda)" in line for line in run.provenance)
    assert (run.steps, run.every, run.last, run.val_seeds, run.test_seeds) == (60, 30, 30, [100, 101], [0, 1])
    assert set(run.val) == {("none", 1), ("batch", 2)} and all(set(v) == {0.1, 1.0} for v in run.val.values())
    assert len(run.test) == 2 and all(v.shape == (2,) for v in run.test.values())
    assert all(c.shape == (2, 2) for c in run.curves.values())
    for (arm, lr), values in run.test.items():  # a test value is the mean of the curve's last bin here (--last = --every)
        np.testing.assert_allclose(values, run.curves["test", arm, lr][:, -1], rtol=1e-4)
    (tmp_path / "stream_rl-curves.csv").write_text("\n".join((tmp_path / "stream_rl-curves.csv").read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(ValueError, match="incomplete curve"):
        rl.stored_stream_run(tmp_path)
