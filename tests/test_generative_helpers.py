"""Chapter 10's measurement helpers in lnbook.generative: each is 0 exactly where the norm works
example by example, non-zero for a training-mode batch norm, and refuses bad input by name."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from lnbook import generative as G
from lnbook.compare import compare

SEEDS = [0, 1]


def _digits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 64, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_off_diagonal_share_counts_the_mass_off_the_diagonal():
    assert G.off_diagonal_share(torch.eye(3)) == 0.0
    assert G.off_diagonal_share(torch.tensor([[1.0, 2.0], [0.5, 1.0]])) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="jac"):
        G.off_diagonal_share(torch.ones(2, 3))
    with pytest.raises(ValueError, match="jac"):
        G.off_diagonal_share(torch.zeros(2, 2))


@pytest.mark.parametrize("norm", G.NORMS)
def test_penalty_spread_is_zero_exactly_for_per_example_critics(norm):
    torch.manual_seed(0)
    crit = G.critic(norm, SEEDS, (16, 16))
    spread = G.penalty_spread(crit, _digits(40), _digits(40, 1), batch_size=8, draws=5)
    assert spread.shape == (2,)
    if norm == "batch":
        assert np.all(spread > 1e-3)
    else:
        np.testing.assert_allclose(spread, 0, atol=1e-5)


def test_shift_gradients_see_no_shift_through_a_first_layer_batch_norm():
    x, x_other = _digits(32), _digits(32, 1)
    crit_bn = G.critic("batch", SEEDS, (16, 16))
    before = {name: b.clone() for name, b in crit_bn.named_buffers()}
    alone_bn, joint_bn, each_bn = G.shift_gradients(crit_bn, x, x_other)
    for name, b in crit_bn.named_buffers():  # measured in training mode, the running averages are kept
        torch.testing.assert_close(b, before[name], rtol=0, atol=0)
    assert crit_bn.training
    alone_none, _, _ = G.shift_gradients(G.critic("none", SEEDS, (16, 16)), x, x_other)
    np.testing.assert_allclose(alone_bn, 0, atol=1e-5)  # the batch mean is removed exactly
    assert np.all(joint_bn > 1e-3) and np.all(each_bn > 1e-3) and np.all(alone_none > 1e-3)
    with pytest.raises(ValueError, match="x_other"):
        G.shift_gradients(G.critic("none", SEEDS, (16, 16)), x, x_other[:10])
    with pytest.raises(TypeError, match="crit"):
        G.shift_gradients(torch.nn.Linear(64, 1), x, x_other)


def test_own_slopes_are_the_input_gradients_for_a_per_example_critic_and_keep_the_mode():
    crit = G.critic("layer", SEEDS, (16, 16)).eval()
    real, fake = _digits(8), _digits(8, 1).expand(2, 8, 64).contiguous()
    joint = G.own_slopes(crit, real, fake, joint=True)
    alone = G.own_slopes(crit, real, fake, joint=False)
    np.testing.assert_allclose(joint, alone, rtol=1e-5)  # no batch coupling: how the batch is scored does not matter
    expected = G.input_gradient_norms(crit.train(), torch.cat([real.expand(2, 8, 64), fake], 1)).mean(1).numpy()
    np.testing.assert_allclose(joint, expected, rtol=1e-5)
    crit.eval()
    G.own_slopes(crit, real, fake, joint=True)
    assert not crit.training
    bn = G.critic("batch", SEEDS, (16, 16))
    assert not np.allclose(G.own_slopes(bn, real, fake, True), G.own_slopes(bn, real, fake, False))
    with pytest.raises(ValueError, match="fake"):
        G.own_slopes(crit, real, fake[:1], joint=True)


@pytest.mark.parametrize("norm", G.NORMS)
def test_vae_coupling_measures_are_zero_exactly_for_per_example_vaes(norm):
    vae = G.vae(norm, SEEDS)
    x = (torch.rand(30, 64, generator=torch.Generator().manual_seed(3)) > 0.5).float()
    spread = G.batchmate_spread(vae.train(), x[:1], x[1:], batch_size=8, draws=4)
    values, mu_range = G.one_at_a_time(vae, x[:6], batch_stats=True)
    assert spread.shape == values.shape == (2,) and np.all(values < 0)
    if norm == "batch":
        assert np.all(spread > 1e-4)
        assert mu_range < 1e-3  # one example normalized with its own statistics: every input looks the same
    else:
        np.testing.assert_allclose(spread, 0, atol=1e-4)
        assert mu_range > 1e-3
    with pytest.raises(ValueError, match="one digit"):
        G.batchmate_spread(vae, x[:2], x)
    with pytest.raises(TypeError, match="vae"):
        G.one_at_a_time(torch.nn.Linear(64, 64), x)


def test_normalized_means_are_zero_at_the_running_statistics():
    crit = G.critic("batch", SEEDS, (16, 16)).eval()
    batch = _digits(20)
    out = G.normalized_means(crit, batch)
    mean, var = crit.norm_statistics(0)
    np.testing.assert_allclose(out, (crit.hidden(batch, 0).mean(1) - mean) / var.sqrt(), rtol=1e-6)
    assert out.shape == (2, 16)
    with pytest.raises(TypeError, match="crit"):
        G.normalized_means(torch.nn.Linear(64, 1), batch)


def test_sample_grid_draws_one_row_per_entry():
    fig = G.sample_grid({"a": torch.rand(5, 64), "b": torch.rand(5, 64)}, "title")
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "title"
    with pytest.raises(ValueError, match="rows"):
        G.sample_grid({"a": torch.rand(5, 64), "b": torch.rand(4, 64)}, "t")
    with pytest.raises(ValueError, match="rows"):
        G.sample_grid({}, "t")


def test_claim_verdict_follows_the_comparison():
    better = np.array([1.0, 1.1, 1.2, 1.3, 1.4])
    table = compare({"x": better + 1, "y": better, "z": better + np.array([0.1, -0.1, 0.2, -0.2, 0.0])},
                    pairs=[("x", "y"), ("z", "y")])
    assert G.claim_verdict(table, "x", "y", "x") == "holds"
    assert G.claim_verdict(table, "x", "y", "y").startswith("contradicted")
    assert G.claim_verdict(table, "z", "y", "z") == "not shown (no difference measured)"
    assert G.claim_verdict(table, "z", "y", None) == "no difference measured"
    assert G.said(table, "x", "y") == "x − y = +1.000 [+1.000, +1.000]"
    with pytest.raises(ValueError, match="claimed"):
        G.claim_verdict(table, "x", "y", "w")
