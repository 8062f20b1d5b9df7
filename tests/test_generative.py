"""lnbook.generative: MLPs with no, batch or layer norm stacked by lnbook.seeds, the WGAN-GP gradient
penalty (against finite differences), the VAE's ELBO (against torch.distributions), each member
training as it would alone, batch coupling, batch statistics on demand and on a batch of one, and
the sample scores."""

import numpy as np
import pytest
import scipy.linalg
import torch

from lnbook import generative as G
from lnbook import norms, seeds


def toy_images(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 64, generator=g) * 2 - 1


@pytest.mark.parametrize("norm", ["none", "layer"])
def test_gradient_penalty_matches_finite_differences_per_example(norm):
    crit = G.critic(norm, seeds=[3, 4], hidden=(16, 8)).double()
    g = torch.Generator().manual_seed(1)
    real, fake = torch.randn(2, 5, 64, generator=g, dtype=torch.float64), torch.randn(2, 5, 64, generator=g, dtype=torch.float64)
    alpha = torch.rand(2, 5, 1, generator=g, dtype=torch.float64)
    penalty = G.gradient_penalty(crit, real, fake, alpha, create_graph=False)
    x_hat = alpha * real + (1 - alpha) * fake
    h = 1e-6
    steps = h * torch.eye(64, dtype=torch.float64)
    for m in range(2):
        for i in range(5):  # each example alone (a per-example norm), by central differences
            scores = crit(torch.cat([x_hat[m, i] + steps, x_hat[m, i] - steps]))[m, :, 0]
            grad = (scores[:64] - scores[64:]) / (2 * h)
            expected = (grad.norm() - 1) ** 2
            torch.testing.assert_close(penalty[m, i], expected, rtol=1e-6, atol=1e-8)


def test_gradient_penalty_of_a_batch_norm_critic_depends_on_batch_mates():
    x = toy_images(16)
    for norm, coupled in (("none", False), ("layer", False), ("batch", True)):
        crit = G.critic(norm, seeds=[0], hidden=(32, 32)).double()
        real, fake = x[:8].double()[None], x[8:].double()[None]
        alpha = torch.full((1, 8, 1), 0.5, dtype=torch.float64)
        p = G.gradient_penalty(crit, real, fake, alpha)
        real2 = torch.cat([real[:, :1], real[:, 1:].flip(-1)], 1)  # same example 0, new batch-mates
        fake2 = torch.cat([fake[:, :1], fake[:, 1:] * 0.3], 1)
        p2 = G.gradient_penalty(crit, real2, fake2, alpha)
        assert (abs(p[0, 0] - p2[0, 0]) > 1e-6) == coupled, norm


@pytest.mark.parametrize("norm", G.NORMS)
def test_batch_jacobian_is_diagonal_exactly_when_the_norm_is_per_example(norm):
    crit = G.critic(norm, seeds=[0, 1], hidden=(16, 16))
    x = toy_images(6)
    jac = G.batch_jacobian(crit, x, member=1)
    assert jac.shape == (6, 6)
    off = jac - torch.diag(torch.diag(jac))
    assert torch.all(torch.diag(jac) > 0)
    if norm == "batch":
        assert off.max() > 1e-3
        crit.eval()  # running statistics: every example alone again
        off_eval = G.batch_jacobian(crit, x, member=1)
        assert torch.equal(off_eval - torch.diag(torch.diag(off_eval)), torch.zeros(6, 6))
    else:
        assert torch.equal(off, torch.zeros(6, 6))


def test_weights_are_drawn_from_the_seed_as_before_and_each_member_computes_its_plain_net():
    """A stacked critic is the plain Nets of its seeds (the same weights, drawn in the order the
    earlier hand-stacked ensemble drew them), and member s computes what plain Net s computes,
    batch statistics and running averages included."""
    x = toy_images(10)
    for norm, native in (("none", True), ("batch", True), ("layer", True), ("layer", False)):
        stacked = G.critic(norm, seeds=[5, 6], hidden=(16, 8), native=native)
        plain = [G.Net((64, 16, 8, 1), norm, seed=s, activation="leaky_relu", native=native) for s in (5, 6)]
        g = torch.Generator().manual_seed(6)
        expected = (torch.rand(64, 16, generator=g) * 2 - 1) / 8  # U(-1/sqrt(64), 1/sqrt(64)), drawn (in, out)
        assert torch.equal(plain[1].layers[0].weight, expected.T) and torch.equal(stacked.layers[0].weight[1], expected.T)
        with torch.no_grad():  # gains and shifts away from 1 and 0, the same in both
            for p in stacked.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        seeds.unstack(stacked, plain)
        out = stacked(x)
        for s, net in enumerate(plain):
            torch.testing.assert_close(out[s], net(x))
        for s, net in enumerate(seeds.unstack(stacked, [G.Net((64, 16, 8, 1), norm, seed=0, activation="leaky_relu",
                                                              native=native) for _ in range(2)])):
            for key, value in net.state_dict().items():  # running averages moved as the plain nets' did
                torch.testing.assert_close(value, plain[s].state_dict()[key])


def test_batch_norm_matches_torchs_batchnorm1d():
    x = toy_images(10)
    net = G.Net((64, 16, 3), "batch", seed=5)
    lin, bn = torch.nn.Linear(64, 16, bias=False), torch.nn.BatchNorm1d(16)
    with torch.no_grad():
        net.layers[1].weight.uniform_(0.5, 1.5), net.layers[1].bias.uniform_(-0.5, 0.5)
        lin.weight.copy_(net.layers[0].weight), bn.weight.copy_(net.layers[1].weight), bn.bias.copy_(net.layers[1].bias)
    out = torch.relu(bn(lin(x))) @ net.layers[3].weight.T + net.layers[3].bias
    torch.testing.assert_close(net(x), out)
    torch.testing.assert_close(net.layers[1].running_mean, bn.running_mean)
    torch.testing.assert_close(net.layers[1].running_var, bn.running_var)


def test_training_batch_norm_on_one_example_forgets_the_input_and_keeps_running_statistics():
    net = G.critic("batch", seeds=[0, 1], hidden=(16,))
    plain = G.Net((64, 16, 1), "batch", seed=1, activation="leaky_relu")
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = toy_images(2)
    a, b = net(x[:1]), net(x[1:])
    assert a.shape == (2, 1, 1)
    torch.testing.assert_close(a, b)  # every feature becomes its shift, whatever the input
    torch.testing.assert_close(plain(x[:1]), a[1])
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    net.eval()
    assert not torch.allclose(net(x[:1]), net(x[1:]))  # running statistics see the input
    torch.testing.assert_close(net(x[:1], batch_stats=True), a)  # batch statistics asked for in eval mode
    assert not net.training and all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())


def test_running_statistics_in_training_mode_leave_them_alone():
    net = G.generator("batch", seeds=[0, 1], hidden=(8, 16))
    net(torch.randn(2, 32, 16))  # some running statistics
    state = {k: v.clone() for k, v in net.state_dict().items()}
    z = torch.randn(5, 16)
    running = net(z, batch_stats=False)
    assert net.training and all(torch.equal(v, net.state_dict()[k]) for k, v in state.items())
    torch.testing.assert_close(running, net.eval()(z))


def test_each_member_trains_as_it_would_alone():
    x = toy_images(50)
    for norm in ("batch", "layer"):
        gen, crit = G.generator("batch", seeds=[3, 7], hidden=(8, 16)), G.critic(norm, seeds=[3, 7], hidden=(16, 16))
        gen1, crit1 = G.generator("batch", seeds=[7], hidden=(8, 16)), G.critic(norm, seeds=[7], hidden=(16, 16))
        for a, b in ((gen, gen1), (crit, crit1)):
            for key, value in b.state_dict().items():
                torch.testing.assert_close(value[0], a.state_dict()[key][1])  # same initial weights
        fit = dict(steps=3, n_critic=2, batch_size=8, lr=1e-3)
        both, alone = G.train_wgan_gp(gen, crit, x, **fit), G.train_wgan_gp(gen1, crit1, x, **fit)
        np.testing.assert_allclose(both.w_estimate[1], alone.w_estimate[0], rtol=1e-4, atol=1e-5)
        for a, b in ((gen, gen1), (crit, crit1)):
            for key, value in b.state_dict().items():
                torch.testing.assert_close(value[0], a.state_dict()[key][1], rtol=1e-4, atol=1e-5)
        assert not torch.allclose(gen.layers[0].weight[0], gen.layers[0].weight[1])
    binary = (x > 0).float()
    vae, vae1 = G.vae("batch", seeds=[2, 5], hidden=(16,)), G.vae("batch", seeds=[5], hidden=(16,))
    np.testing.assert_allclose(G.train_vae(vae, binary, steps=4, batch_size=8)[1],
                               G.train_vae(vae1, binary, steps=4, batch_size=8)[0], rtol=1e-5)
    for key, value in vae1.state_dict().items():
        torch.testing.assert_close(value[0], vae.state_dict()[key][1], rtol=1e-5, atol=1e-6)


def test_a_critic_standardized_by_lnbooks_layer_norm_trains_as_torchs():
    """WGAN-GP differentiates the critic's gradient: two generator steps (ten critic steps)
    through lnbook.functional.layer_norm's backward give torch's fused layer_norm's results."""
    x = toy_images(50)
    runs = []
    for native in (True, False):
        gen, crit = G.generator("none", seeds=[3, 7], hidden=(8, 16)), G.critic("layer", seeds=[3, 7], hidden=(16, 16), native=native)
        runs.append((G.train_wgan_gp(gen, crit, x, steps=2, n_critic=5, batch_size=8, lr=1e-3), crit))
    (torchs, crit_t), (ours, crit_o) = runs
    assert np.all(ours.penalty > 0)
    np.testing.assert_allclose(ours.w_estimate, torchs.w_estimate, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.penalty, torchs.penalty, rtol=1e-4, atol=1e-5)
    for key, value in crit_t.state_dict().items():
        torch.testing.assert_close(crit_o.state_dict()[key], value, rtol=1e-4, atol=1e-5)
    names, seen = set(), set()

    def walk(fn):  # the backward graph of one critic step
        if fn is not None and fn not in seen:
            seen.add(fn), names.add(type(fn).__name__)
            for child, _ in fn.next_functions:
                walk(child)

    walk(crit_o(x[:8]).sum().grad_fn)
    ours = {"_LayerNormBackward", "_DualLayerNormBackward"}  # lnbook.functional's autograd functions
    assert names & ours and "NativeLayerNormBackward0" not in names  # lnbook's function, in the stack


def test_wgan_gp_history_and_evaluations():
    x = toy_images(30)
    gen, crit = G.generator("none", seeds=[0, 1, 2], hidden=(8,)), G.critic("layer", seeds=[0, 1, 2], hidden=(8,))
    calls = []

    def evaluate(g):
        calls.append(g.training)
        return {"mean": G.sample(g, 5).mean((1, 2)).numpy()}

    h = G.train_wgan_gp(gen, crit, x, steps=5, n_critic=1, batch_size=4, eval_every=2, evaluate=evaluate)
    assert h.w_estimate.shape == h.penalty.shape == (3, 5)
    assert h.eval_steps == [2, 4, 5] and h.evals["mean"].shape == (3, 3) and calls == [False] * 3
    assert np.all(h.penalty >= 0) and gen.training


def test_elbo_matches_torch_distributions():
    vae = G.vae("layer", seeds=[0, 1], latent=3, hidden=(16,)).double()
    x = (toy_images(6) > 0).double()
    noise = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    value = G.elbo(vae, x, noise)
    mu, logvar = vae.encode(x)
    z = mu + (0.5 * logvar).exp() * noise
    log_lik = torch.distributions.Bernoulli(logits=vae.decoder(z)).log_prob(x.expand(2, 6, 64)).sum(-1)
    q = torch.distributions.Normal(mu, (0.5 * logvar).exp())
    kl = torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 1.0)).sum(-1)
    torch.testing.assert_close(value, log_lik - kl)


def test_vae_training_raises_the_elbo_and_batch_norm_couples_encodings():
    protos = (toy_images(2) > 0).float()  # two prototypes, 5% of the pixels flipped
    flips = (torch.rand(60, 64, generator=torch.Generator().manual_seed(1)) < 0.05).float()
    x = (protos.repeat(30, 1) - flips).abs()
    vae = G.vae("batch", seeds=[0, 1])
    start = G.heldout_elbo(vae, x)
    G.train_vae(vae, x, steps=60, batch_size=16, lr=3e-3)
    vae.eval()
    assert torch.all(G.heldout_elbo(vae, x) > start + 10)
    vae.train()
    mu_a, _ = vae.encode(x[:8], batch_stats=True)
    mu_b, _ = vae.encode(torch.cat([x[:1], x[30:37]]), batch_stats=True)
    assert (mu_a[:, 0] - mu_b[:, 0]).abs().max() > 1e-3
    vae.eval()
    torch.testing.assert_close(vae.encode(x[:8])[0][:, 0], vae.encode(torch.cat([x[:1], x[30:37]]))[0][:, 0])


def test_frechet_distance_against_closed_forms():
    g = np.random.default_rng(0)
    a, b = g.normal(1.0, 2.0, (500, 1)), g.normal(-1.0, 0.5, (400, 1))
    expected = (a.mean() - b.mean()) ** 2 + (a.std(ddof=1) - b.std(ddof=1)) ** 2
    assert G.frechet_distance(a, b) == pytest.approx(expected, rel=1e-9)
    a, b = g.normal(size=(300, 5)) @ g.normal(size=(5, 5)), g.normal(size=(200, 5)) + 0.3
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = scipy.linalg.sqrtm(ca @ cb).real
    expected = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(ca + cb - 2 * root)
    assert G.frechet_distance(torch.from_numpy(a), b) == pytest.approx(expected, rel=1e-7)
    assert G.frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9)


def test_class_coverage():
    uniform = torch.eye(10).repeat(3, 1) * 20
    conf, classes = G.class_coverage(uniform)
    assert classes == pytest.approx(10.0) and conf > 0.99
    conf, classes = G.class_coverage(torch.zeros(7, 10))  # all ties: class 0, probability 0.1
    assert classes == pytest.approx(1.0) and conf == pytest.approx(0.1)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="norm"):
        G.Net((64, 8, 1), "group", seed=0)
    with pytest.raises(TypeError, match="seeds"):
        G.critic("none", seeds=3)
    with pytest.raises(ValueError, match="seed"):
        G.vae("none", seeds=[-1])
    with pytest.raises(ValueError, match="sizes"):
        G.Net((64,), "none", seed=0)
    net = G.critic("none", seeds=[0, 1], hidden=(8,))
    with pytest.raises(ValueError, match="x must have shape"):
        net(torch.zeros(3, 4, 64))
    with pytest.raises(TypeError, match="x"):
        net(torch.zeros(4, 64, dtype=torch.int64))
    with pytest.raises(ValueError, match="alpha"):
        G.gradient_penalty(net, torch.zeros(2, 4, 64), torch.zeros(2, 4, 64), torch.zeros(2, 4))
    gen = G.generator("none", seeds=[0, 1], hidden=(8,))
    with pytest.raises(ValueError, match="data"):
        G.train_wgan_gp(gen, net, torch.zeros(10, 32), steps=1)
    with pytest.raises(ValueError, match="steps"):
        G.train_wgan_gp(gen, net, torch.zeros(10, 64), steps=0)
    with pytest.raises(TypeError, match="joint"):
        G.train_wgan_gp(gen, net, torch.zeros(10, 64), steps=1, joint=1)
    with pytest.raises(ValueError, match="a and b"):
        G.frechet_distance(np.zeros((5, 3)), np.zeros((5, 4)))
    with pytest.raises(TypeError, match="vae"):
        G.train_vae(net, torch.zeros(10, 64), steps=1)
    plain = G.Net((16, 8, 64), seed=0)
    with pytest.raises(TypeError, match="stack"):  # training needs the members' seeds
        G.train_wgan_gp(plain, G.Net((64, 8, 1), seed=0), torch.zeros(10, 64), steps=1)
    with pytest.raises(TypeError, match="stack"):
        G.train_wgan_gp(seeds.stack([plain]), net, torch.zeros(10, 64), steps=1)
    with pytest.raises(ValueError, match="x must have shape"):
        plain(torch.zeros(1, 4, 16))


def test_batch_norm_penalty_is_that_of_the_summed_scores_gradient():
    crit = G.critic("batch", seeds=[0], hidden=(16, 16)).double()
    g = torch.Generator().manual_seed(4)
    real, fake = torch.randn(1, 6, 64, generator=g, dtype=torch.float64), torch.randn(1, 6, 64, generator=g, dtype=torch.float64)
    alpha = torch.rand(1, 6, 1, generator=g, dtype=torch.float64)
    x_hat = (alpha * real + (1 - alpha) * fake)[0]
    jac = torch.autograd.functional.jacobian(lambda x: crit(x)[0, :, 0], x_hat)  # (6 scores, 6 inputs, 64)
    expected = (jac.sum(0).norm(dim=-1) - 1) ** 2  # every score's gradient with respect to input i, summed
    own = (torch.einsum("iik->ik", jac).norm(dim=-1) - 1) ** 2  # each example's own score only
    penalty = G.gradient_penalty(crit, real, fake, alpha)[0]
    torch.testing.assert_close(penalty, expected)
    assert not torch.allclose(penalty, own)


def test_sample_leaves_running_statistics_alone():
    gen = G.generator("batch", seeds=[0, 1], hidden=(8, 16))
    gen.train()
    gen(torch.randn(2, 32, 16))  # some running statistics
    state = {k: v.clone() for k, v in gen.state_dict().items()}
    running, batch = G.sample(gen, 10, seed=2), G.sample(gen, 10, seed=2, batch_stats=True)
    assert running.shape == (2, 10, 64) and running.abs().max() <= 1 and not torch.allclose(running, batch)
    assert gen.training and all(torch.equal(v, gen.state_dict()[k]) for k, v in state.items())
    torch.testing.assert_close(G.sample(gen, 10, seed=2), running)


def test_a_dcgan_style_critic_has_no_norm_on_its_first_layer_and_still_couples():
    crit = G.critic("batch", seeds=[0, 1], hidden=(16, 16), first_norm=False)
    plain = G.Net((64, 16, 16, 1), "batch", seed=0, activation="leaky_relu", first_norm=False)
    kinds = [type(m) for m in plain.layers]
    assert kinds == [torch.nn.Linear, torch.nn.LeakyReLU, torch.nn.Linear, norms.MaskedBatchNorm1d, torch.nn.LeakyReLU,
                     torch.nn.Linear]
    assert plain.layers[0].bias is not None and plain.layers[2].bias is None  # only a Linear layer before a norm drops it
    assert crit.layers[0].bias.shape == (2, 16) and crit.layers[3].running_mean.shape == (2, 16)
    jac = G.batch_jacobian(crit, toy_images(6))
    assert (jac - torch.diag(torch.diag(jac))).max() > 1e-3
    with pytest.raises(TypeError, match="first_norm"):
        G.critic("batch", seeds=[0], first_norm="no")


def test_train_vae_evaluates_at_every_checkpoint_without_changing_the_training():
    x = (torch.rand(40, 64, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    seen: list[tuple[int, bool]] = []
    plain = G.train_vae(G.vae("batch", [0, 1]), x, steps=6, batch_size=8)
    watched = G.train_vae(G.vae("batch", [0, 1]), x, steps=6, batch_size=8, every=2,
                          evaluate=lambda step, v: seen.append((step, v.training)))
    np.testing.assert_array_equal(plain, watched)
    assert seen == [(2, False), (4, False), (6, False)]
    with pytest.raises(ValueError, match="every"):
        G.train_vae(G.vae("none", [0]), x, steps=2, every=-1)
    with pytest.raises(TypeError, match="evaluate"):
        G.train_vae(G.vae("none", [0]), x, steps=2, every=1, evaluate=3)


def test_input_gradient_norms_are_the_penalty_gradients_and_leave_the_buffers():
    crit = G.critic("batch", [0, 1])
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0))
    before = [b.clone() for b in crit.buffers()]
    coupled, own = G.input_gradient_norms(crit, x), G.input_gradient_norms(crit, x, frozen=True)
    assert all(torch.equal(a, b) for a, b in zip(before, crit.buffers()))
    assert coupled.shape == own.shape == (2, 16) and not torch.allclose(coupled, own)  # BN couples the examples
    # the paper's penalty is (||grad|| - 1)^2 of exactly these norms (alpha = 1: x_hat is x)
    ones = torch.ones(2, 16, 1)
    torch.testing.assert_close(G.gradient_penalty(crit, x, x, ones, create_graph=False), (coupled - 1) ** 2, rtol=1e-4, atol=1e-6)
    ln = G.critic("layer", [0, 1])
    torch.testing.assert_close(G.input_gradient_norms(ln, x), G.input_gradient_norms(ln, x, frozen=True))
    with pytest.raises(ValueError, match="x must"):
        G.input_gradient_norms(crit, x[0])
