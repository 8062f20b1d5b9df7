"""lnbook.generative's controls for chapter 10: the penalty with frozen batch statistics (per
example again), joint batches, the DCGAN-style convolutional networks (against torch's
convolutions), Net.hidden and norm_statistics, and the chapter's arms."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from lnbook import generative as G


def toy_images(n=16, seed=0, members=None):
    g = torch.Generator().manual_seed(seed)
    shape = (n, 64) if members is None else (members, n, 64)
    return torch.rand(shape, generator=g) * 2 - 1


def test_frozen_forward_keeps_the_values_and_the_running_statistics_and_removes_the_coupling():
    x = toy_images(12, members=2).double()
    plain, frozen = G.critic("batch", [0, 1], (16, 16)).double(), G.critic("batch", [0, 1], (16, 16)).double()
    torch.testing.assert_close(frozen_forward_values := G.frozen_forward(frozen, x), plain(x))
    for a, b in zip(plain.buffers(), frozen.buffers()):
        torch.testing.assert_close(a, b)  # the running averages move as a training pass moves them
    assert frozen.training and frozen_forward_values.requires_grad
    jac = G.batch_jacobian(lambda inp: G.frozen_forward(frozen, inp), x[1], member=1)
    off = jac - torch.diag(torch.diag(jac))
    assert off.abs().max() == 0 and torch.all(torch.diag(jac) > 0)
    coupled = G.batch_jacobian(plain, x[1], member=1)
    assert (coupled - torch.diag(torch.diag(coupled))).max() > 1e-3


def test_frozen_penalty_is_each_examples_gradient_with_the_batch_statistics_as_constants():
    crit = G.critic("batch", [3], (16, 8)).double()
    g = torch.Generator().manual_seed(1)
    real, fake = (torch.randn(1, 6, 64, generator=g, dtype=torch.float64) for _ in range(2))
    alpha = torch.rand(1, 6, 1, generator=g, dtype=torch.float64)
    penalty = G.gradient_penalty(crit, real, fake, alpha, create_graph=False, frozen=True)
    x_hat = alpha * real + (1 - alpha) * fake
    # by hand: each layer's batch statistics computed once, then example i alone through fixed affine maps
    h, stats = x_hat[0], []
    for layer in crit.layers:
        if G._is_batch_norm(layer):
            stats.append(torch.var_mean(h, 0, correction=0))
        h = layer(h.unsqueeze(0))[0]
    for i in range(6):
        x = x_hat[0, i].clone().requires_grad_(True)
        h, k = x, 0
        for layer in crit.layers:
            if G._is_batch_norm(layer):
                var, mean = stats[k]
                h = (h - mean) / torch.sqrt(var + 1e-5) * layer.weight[0] + layer.bias[0]
                k += 1
            else:
                h = layer(h[None, None])[0, 0]
        (grad,) = torch.autograd.grad(h.sum(), x)
        torch.testing.assert_close(penalty[0, i], (grad.norm() - 1) ** 2)
    coupled = G.gradient_penalty(crit, real, fake, alpha, create_graph=False)
    assert (coupled - penalty).abs().max() > 1e-4


def _conv_critic_reference(net, x, m):
    c1, c2 = net.channels
    img = x.reshape(-1, 1, 8, 8)
    h = F.conv2d(img, net.w1[m].T.reshape(c1, 1, 4, 4), net.b1[m, 0], stride=2, padding=1)
    if net.norm == "batch":
        h = F.batch_norm(h, None, None, training=True, eps=1e-5)
    elif net.norm == "layer":
        h = F.layer_norm(h, h.shape[1:], eps=1e-5)
    h = F.leaky_relu(h, 0.2)
    h = F.conv2d(h, net.w2[m].T.reshape(c2, c1, 4, 4), net.b2[m, 0], stride=2, padding=1)
    if net.norm == "batch":
        h = F.batch_norm(h, None, None, training=True, eps=1e-5)
    elif net.norm == "layer":
        h = F.layer_norm(h, h.shape[1:], eps=1e-5)
    h = F.leaky_relu(h, 0.2)
    return h.permute(0, 2, 3, 1).reshape(len(x), -1) @ net.w3[m] + net.b3[m]


def _conv_generator_reference(net, z, m):
    c1, c2 = net.channels
    h = (z @ net.w1[m] + net.b1[m]).reshape(len(z), 4, c2).transpose(1, 2).reshape(len(z), c2, 2, 2)
    norm = (lambda t: F.batch_norm(t, None, None, training=True, eps=1e-5)) if net.norm == "batch" else \
        (lambda t: F.layer_norm(t, t.shape[1:], eps=1e-5)) if net.norm == "layer" else (lambda t: t)
    h = F.relu(norm(h))
    h = F.conv_transpose2d(h, net.w2[m].reshape(c2, c1, 4, 4), net.b2[m, :, 0], stride=2, padding=1)
    h = F.relu(norm(h))
    h = F.conv_transpose2d(h, net.w3[m].reshape(c1, 1, 4, 4), net.b3[m], stride=2, padding=1)
    return torch.tanh(h).reshape(len(z), 64)


@pytest.mark.parametrize("norm", G.NORMS)
def test_conv_networks_compute_torchs_convolutions_member_by_member(norm):
    crit = G.conv_critic(norm, [0, 7], channels=(4, 6)).double()
    gen = G.conv_generator(norm, [0, 7], channels=(4, 6), latent=5).double()
    x = toy_images(10, members=2).double()
    z = torch.randn(2, 10, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out, images = crit(x), gen(z)
    assert out.shape == (2, 10, 1) and images.shape == (2, 10, 64)
    for m in range(2):
        torch.testing.assert_close(out[m], _conv_critic_reference(crit, x[m], m))
        torch.testing.assert_close(images[m], _conv_generator_reference(gen, z[m], m))


def test_conv_members_are_independent_and_drawn_from_their_seeds():
    a, b = G.conv_critic("batch", [0, 7]), G.conv_critic("batch", [7])
    torch.testing.assert_close(a.w2[1], b.w2[0])
    x = toy_images(8, members=2)
    x2 = x.clone()
    x2[0] = toy_images(8, seed=5)  # change member 0's batch only
    torch.testing.assert_close(a(x)[1], a(x2)[1])
    torch.testing.assert_close(a(x)[1], b(x[1:])[0])


def test_conv_batch_norm_pools_over_space_so_a_nonconstant_shift_reaches_the_score():
    crit = G.conv_critic("batch", [0])
    x = toy_images(32, members=1)
    shift = torch.zeros(1, 1, 64, requires_grad=True)
    (grad,) = torch.autograd.grad(crit(x + shift).mean(), shift)
    assert grad.norm() > 1e-3  # the MLP's BatchNorm critic gives exactly 0 here
    mlp = G.critic("batch", [0], (16, 16))
    (grad_mlp,) = torch.autograd.grad(mlp(x + shift).mean(), shift)
    assert grad_mlp.norm() < 1e-6


def test_conv_batch_norm_running_statistics_and_batch_stats_switch():
    gen = G.conv_generator("batch", [0, 1])
    z = torch.randn(2, 20, 16)
    before = [b.clone() for b in gen.buffers()]
    gen.eval()
    with torch.no_grad():
        a, b = gen(z), gen(z, batch_stats=True)
    assert not torch.allclose(a, b)
    for x, y in zip(before, gen.buffers()):
        torch.testing.assert_close(x, y)
    gen.train()
    gen(z)
    assert not torch.allclose(before[0], gen.norms[0].running_mean)
    assert G.conv_critic("batch", [0], first_norm=False).norms[0].kind == "none" and G.conv_critic("batch", [0]).norms[0].kind == "batch"


def test_joint_and_frozen_training_run_and_differ_from_the_default():
    data = toy_images(40)
    runs = {}
    for name, kw in (("default", {}), ("joint", {"joint": True}), ("frozen", {"penalty": "frozen"})):
        gen, crit = G.generator("batch", [0, 1], hidden=(8, 8)), G.critic("batch", [0, 1], (8, 8))
        runs[name] = G.train_wgan_gp(gen, crit, data, steps=3, n_critic=2, batch_size=8, lr=1e-3, **kw)
        assert np.isfinite(runs[name].w_estimate).all()
    assert not np.allclose(runs["default"].w_estimate, runs["joint"].w_estimate)
    assert not np.allclose(runs["default"].penalty, runs["frozen"].penalty)
    with pytest.raises(ValueError, match="penalty"):
        G.train_wgan_gp(G.generator("batch", [0]), G.critic("batch", [0]), data, steps=1, penalty="per-example")
    with pytest.raises(ValueError, match="frozen"):
        G.train_wgan_gp(G.conv_generator("batch", [0]), G.conv_critic("batch", [0]), data, steps=1, penalty="frozen")


def test_conv_gan_trains_every_arm_builds():
    judge_free = {name: G.build_gan(arm, [0, 1]) for name, arm in G.GAN_ARMS.items()}
    for name, (gen, crit) in judge_free.items():
        assert isinstance(crit, G.ConvNet) == G.GAN_ARMS[name].conv
        assert gen(torch.randn(2, 4, 16)).shape == (2, 4, 64) and crit(toy_images(4, members=2)).shape == (2, 4, 1)
    with pytest.raises(TypeError, match="arm"):
        G.build_gan("LN critic", [0])


def test_hidden_and_norm_statistics():
    crit = G.critic("batch", [0, 1], (16, 8))
    x = toy_images(10)
    before = [b.clone() for b in crit.buffers()]
    h = crit.hidden(x, 0)
    torch.testing.assert_close(h, crit.layers[0](x.expand(2, 10, 64)))
    h1 = crit.hidden(x, 1)
    assert h1.shape == (2, 10, 8) and not h1.requires_grad
    for a, b in zip(before, crit.buffers()):
        torch.testing.assert_close(a, b)
    mean, var = crit.norm_statistics(1)
    assert mean.shape == var.shape == (2, 8)
    with pytest.raises(ValueError, match="layer"):
        crit.hidden(x, 2)
    with pytest.raises(ValueError, match="no batch norm"):
        G.critic("batch", [0], (16, 8), first_norm=False).norm_statistics(0)
    with pytest.raises(ValueError, match="no batch norm"):
        G.critic("layer", [0], (16, 8)).norm_statistics(0)


def test_bad_conv_input_names_the_argument():
    with pytest.raises(ValueError, match="kind"):
        G.ConvNet("discriminator", "none", [0])
    with pytest.raises(ValueError, match="channels"):
        G.conv_critic("none", [0], channels=(4,))
    with pytest.raises(ValueError, match="x must have shape"):
        G.conv_critic("none", [0, 1])(torch.zeros(3, 5, 64))
    with pytest.raises(TypeError, match="seeds"):
        G.conv_critic("none", 3)
