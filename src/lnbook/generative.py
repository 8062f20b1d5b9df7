"""Generative models on 8x8 digits with no, batch or layer normalization: WGAN-GP and a VAE.

Chapter 10 asks where batch normalization's coupling of the examples of a batch breaks a
generative model's objective. Every network here is written for one seed (:class:`Net`,
:class:`VAE`), and the chapter trains several seeds of it as one model, stacked by
:func:`lnbook.seeds.stack` (:func:`generator`, :func:`critic` and :func:`vae` build the
stacks): every weight, gain and running statistic gains a leading member axis, so that five
seeds train in little more time than one. Member ``s`` is initialized from its own seed and
draws its own mini-batches and noise, and the loss is the sum of the members' losses, so Adam
(which acts element by element) updates each member as it would be updated alone.

- :class:`Net`: ``[Linear -> norm -> activation] * hidden -> Linear`` with norm ``"none"``,
  ``"batch"`` (statistics over the member's batch) or ``"layer"`` (over each example's
  features); :func:`generator` and :func:`critic` stack one per seed into the two halves of a GAN.
- :func:`gradient_penalty` and :func:`train_wgan_gp`: Gulrajani et al.'s WGAN-GP.
- :class:`VAE` (stacked by :func:`vae`), :func:`elbo` and :func:`train_vae`: Kingma and
  Welling's VAE with a Bernoulli decoder.
- :func:`batch_jacobian`: how much each output of a batch depends on each input;
  :func:`frechet_distance` and :func:`class_coverage` score samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from . import seeds as seed_axis
from ._checks import check_bool, check_choice, check_float_tensor, check_number, check_positive_int, describe
from .functional import layer_norm
from .norms import MaskedBatchNorm1d

NORMS = ("none", "batch", "layer")
ACTIVATIONS = ("relu", "leaky_relu")
OUTPUTS = ("none", "tanh")


def _check_seed(seed: object, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**31:
        raise ValueError(f"{name} must be an int in [0, 2**31), got {describe(seed)}")
    return int(seed)


def _check_seeds(seeds: Sequence[int], name: str = "seeds") -> list[int]:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise TypeError(f"{name} must be a non-empty sequence of ints, one per member, got {describe(seeds)}")
    return [_check_seed(s, name) for s in seeds]


def _stream(seed: int) -> torch.Generator:
    """A member's training randomness: a generator derived from its seed, distinct from the
    one that initialized its weights."""
    return torch.Generator().manual_seed(1_000_003 * (seed + 1))


def _stacked(make: Callable[[int], nn.Module], seeds: Sequence[int]) -> nn.Module:
    """``make(seed)`` for every seed, stacked by :func:`lnbook.seeds.stack`; the stack keeps
    its members' seeds as ``seeds`` (the training functions derive each member's noise from them)."""
    seeds = _check_seeds(seeds)
    model = seed_axis.stack([make(s) for s in seeds])
    model.seeds = seeds
    return model


def _members(model: nn.Module) -> int:
    """How many members a stack made by :func:`generator`, :func:`critic` or :func:`vae` holds."""
    s = seed_axis.members(model)
    if s is None or not isinstance(getattr(model, "seeds", None), list):
        raise TypeError(f"expected a stack of seeds made by generator(), critic() or vae(), got a plain {type(model).__name__}")
    return s


class _BookLayerNorm(nn.Module):
    """Layer normalization standardized by :func:`lnbook.functional.layer_norm` (the book's
    hand-written backward, twice differentiable), then a gain and a shift per feature.

    :func:`lnbook.seeds.stack` swaps lnbook's norm layers for its own, which standardize with
    torch's fused kernel; this module is none of them, so the stack keeps it and gives its gain
    and shift a seed axis, ``(S, F)``: a stacked critic still differentiates through the book's
    function. Shapes: ``x (*, B, F)`` -> the same; ``weight``, ``bias`` ``(F,)``, or ``(S, F)``
    in a stack, where ``x`` is ``(S, B, F)``.
    """

    def __init__(self, features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = layer_norm(x, x.shape[-1:], eps=self.eps)
        return y * self.weight.unsqueeze(-2) + self.bias.unsqueeze(-2)


class Net(nn.Module):
    """One seed's MLP, ``[Linear -> norm -> activation] * (len(sizes) - 2) -> Linear`` (the
    layers in ``self.layers``, an ``nn.Sequential``); :func:`generator` and :func:`critic`
    stack one per seed with :func:`lnbook.seeds.stack`.

    Args:
        sizes: ``(in_features, hidden..., out_features)``.
        norm: ``"none"``; ``"batch"``: :class:`lnbook.norms.MaskedBatchNorm1d`, each feature
            normalized with the mean and biased variance of the batch in training (running
            averages of the mean and the unbiased variance, with ``momentum``, as
            ``torch.nn.BatchNorm1d`` keeps them) and with the running averages in eval mode;
            ``"layer"``: each example normalized over its features. Both with a gain and a
            shift per feature. A Linear layer that feeds a batch norm has no bias (the norm
            subtracts it).
        seed: the weights are drawn as ``torch.nn.Linear`` draws them,
            ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, from a generator seeded with ``seed``
            (each layer's ``(in, out)`` weight, then its bias, also where a batch norm drops it).
        activation: ``"relu"`` or ``"leaky_relu"`` (slope 0.2).
        output: ``"none"`` or ``"tanh"`` after the last Linear layer.
        first_norm: ``False`` leaves the first hidden layer without a norm (DCGAN's
            discriminator, whose input layer has no batch norm).
        native: for ``norm="layer"``, standardize with torch's fused ``layer_norm``
            (``torch.nn.LayerNorm``, fewer operators) or, ``False``, with
            :func:`lnbook.functional.layer_norm` (the book's hand-written backward, twice
            differentiable), in a stack too: the same numbers up to rounding.

    Shapes: ``x (B, in_features)`` -> ``(B, out_features)``. Stacked (``S`` members):
    ``x (S, B, in_features)`` (member ``s`` sees ``x[s]``) or ``(B, in_features)``, the same
    batch for every member, -> ``(S, B, out_features)``.

    A training-mode batch norm on a batch of one normalizes with that example's own statistics,
    so every feature becomes its shift whatever the input; it leaves the running averages as
    they are (an unbiased variance needs two examples).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        norm: str = "none",
        *,
        seed: int,
        activation: str = "relu",
        output: str = "none",
        first_norm: bool = True,
        momentum: float = 0.1,
        eps: float = 1e-5,
        native: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) < 2:
            raise ValueError(f"sizes must be a sequence (in_features, hidden..., out_features), got {describe(sizes)}")
        for size in sizes:
            check_positive_int(size, "sizes")
        self.norm = check_choice(norm, NORMS, "norm")
        self.activation = check_choice(activation, ACTIVATIONS, "activation")
        self.output = check_choice(output, OUTPUTS, "output")
        self.first_norm = check_bool(first_norm, "first_norm")
        self.native = check_bool(native, "native")
        self.momentum = check_number(momentum, "momentum", "a number in [0, 1]", lambda v: 0 <= v <= 1)
        self.eps = check_number(eps, "eps", "a positive number", lambda v: v > 0)
        self.sizes = tuple(int(s) for s in sizes)
        g = torch.Generator().manual_seed(_check_seed(seed))
        count, layers = len(self.sizes) - 1, []
        for i, (fan_in, fan_out) in enumerate(zip(self.sizes, self.sizes[1:])):
            hidden = i < count - 1
            normed = hidden and norm != "none" and (first_norm or i > 0)
            linear = nn.utils.skip_init(nn.Linear, fan_in, fan_out, bias=not (normed and norm == "batch"))
            bound = 1 / math.sqrt(fan_in)
            weight = torch.rand(fan_in, fan_out, generator=g) * 2 * bound - bound
            bias = torch.rand(1, fan_out, generator=g) * 2 * bound - bound
            with torch.no_grad():
                linear.weight.copy_(weight.T)
                if linear.bias is not None:
                    linear.bias.copy_(bias[0])
            layers.append(linear)
            if normed:
                layers.append(self._norm_layer(fan_out))
            if hidden:
                layers.append(nn.ReLU() if activation == "relu" else nn.LeakyReLU(0.2))
        if output == "tanh":
            layers.append(nn.Tanh())
        self.layers = nn.Sequential(*layers)

    def _norm_layer(self, features: int) -> nn.Module:
        if self.norm == "batch":
            return MaskedBatchNorm1d(features, eps=self.eps, momentum=self.momentum)
        return nn.LayerNorm(features, eps=self.eps) if self.native else _BookLayerNorm(features, self.eps)

    def forward(self, x: torch.Tensor, batch_stats: bool | None = None) -> torch.Tensor:
        """``x (B, in)``, or in a stack ``(S, B, in)`` or ``(B, in)``, -> ``(B, out)`` or
        ``(S, B, out)``. ``batch_stats`` (batch norm only): ``None`` follows the mode (batch
        statistics in training, running ones in eval); ``True`` uses the batch's statistics in
        either mode (updating the running averages only in training); ``False`` the running ones."""
        check_float_tensor(x, "x")
        s, f = seed_axis.members(self), self.sizes[0]
        if s is not None and x.ndim == 2:
            x = x.expand(s, *x.shape)
        lead = () if s is None else (s,)
        if x.ndim != len(lead) + 2 or tuple(x.shape[: len(lead)]) != lead or x.shape[-1] != f:
            expected = f"(B, {f})" + ("" if s is None else f" or ({s}, B, {f})")
            raise ValueError(f"x must have shape {expected}, got {tuple(x.shape)}")
        use_batch = self.training if batch_stats is None else bool(batch_stats)
        norms = [m for m in self.layers if isinstance(getattr(m, "running_mean", None), torch.Tensor)]
        one = use_batch and x.shape[-2] == 1
        if not norms or (use_batch == self.training and not one):
            return self.layers(x)
        return self._other_statistics(x, norms, use_batch, one)

    def _other_statistics(self, x: torch.Tensor, norms: list[nn.Module], use_batch: bool, one: bool) -> torch.Tensor:
        """The forward pass with the batch norms in another mode than the network's (batch
        statistics in eval mode, running ones in training), or with batch statistics on a batch
        of one. Batch statistics leave the running averages as they were, outside training and
        on a batch of one. One example's own statistics are its values and a variance of 0;
        a batch norm refuses a batch of one (as torch's does), so the example goes in twice,
        a batch with exactly those statistics, and its first copy comes out."""
        kept = [{k: b.clone() for k, b in m.named_buffers()} for m in norms] if use_batch else []
        modes = [m.training for m in norms]
        for m in norms:
            m.train(use_batch)
        try:
            out = self.layers(torch.cat([x, x], -2) if one else x)
        finally:
            for m, mode in zip(norms, modes):
                m.train(mode)
            with torch.no_grad():
                for m, state in zip(norms, kept):
                    for k, b in m.named_buffers():
                        b.copy_(state[k])
        return out[..., :1, :] if one else out


def generator(norm: str, seeds: Sequence[int], latent: int = 16, hidden: Sequence[int] = (128, 256)) -> Net:
    """A GAN generator for every seed, one :class:`Net` each, stacked by
    :func:`lnbook.seeds.stack`: noise ``(members, B, latent)`` -> images ``(members, B, 64)``
    in ``[-1, 1]`` (``tanh``), ReLU hidden layers; ``norm="batch"`` is the DCGAN arrangement
    (a batch norm after every hidden layer, none on the output)."""
    return _stacked(lambda s: Net((latent, *hidden, 64), norm, seed=s, activation="relu", output="tanh"), seeds)


def critic(
    norm: str, seeds: Sequence[int], hidden: Sequence[int] = (256, 256), first_norm: bool = True, native: bool = True
) -> Net:
    """A WGAN critic for every seed, one :class:`Net` each, stacked by
    :func:`lnbook.seeds.stack`: images ``(members, B, 64)`` -> scores ``(members, B, 1)``,
    leaky-ReLU hidden layers (slope 0.2), no output activation; ``first_norm=False``: no norm
    after the first hidden layer (DCGAN's discriminator); ``native`` as :class:`Net`'s (``False``
    keeps :func:`lnbook.functional.layer_norm` in the stack)."""
    return _stacked(lambda s: Net((64, *hidden, 1), norm, seed=s, activation="leaky_relu", first_norm=first_norm,
                                  native=native), seeds)


def gradient_penalty(
    critic_net: nn.Module, real: torch.Tensor, fake: torch.Tensor, alpha: torch.Tensor, create_graph: bool = True
) -> torch.Tensor:
    """Gulrajani et al.'s penalty ``(||grad_x D(x_hat)|| - 1)^2`` at ``x_hat = alpha real + (1 - alpha) fake``.

    ``real``, ``fake``: ``(members, B, F)``; ``alpha``: ``(members, B, 1)`` in ``[0, 1]``.
    Returns the per-example penalties ``(members, B)``. As in the paper's code, the gradient
    is that of the *sum* of the batch's scores with respect to each ``x_hat_i``: with a norm
    that works example by example this is the gradient of ``D(x_hat_i)`` alone; with a
    training-mode batch norm it also carries every batch-mate's score.
    """
    for name, t in (("real", real), ("fake", fake), ("alpha", alpha)):
        check_float_tensor(t, name)
    if real.ndim != 3 or fake.shape != real.shape:
        raise ValueError(f"real and fake must have the same shape (members, B, F), got {tuple(real.shape)} and {tuple(fake.shape)}")
    if alpha.shape != real.shape[:2] + (1,):
        raise ValueError(f"alpha must have shape {tuple(real.shape[:2]) + (1,)}, got {tuple(alpha.shape)}")
    x_hat = (alpha * real + (1 - alpha) * fake).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(critic_net(x_hat).sum(), x_hat, create_graph=create_graph)
    norm = (grad.pow(2).sum(-1) + 1e-12).sqrt()  # the 1e-12 keeps the gradient finite at 0
    return (norm - 1) ** 2


@dataclass
class GANHistory:
    """What :func:`train_wgan_gp` measured, one row per member.

    ``w_estimate``: ``mean D(real) - mean D(fake)`` on the last critic batch of each generator
    step, the critic's estimate of the Wasserstein distance; ``penalty``: the mean gradient
    penalty there; both ``(members, steps)``. ``evals``: what ``evaluate`` returned at each
    step of ``eval_steps``, each key stacked to ``(members, len(eval_steps))``.
    """

    w_estimate: np.ndarray
    penalty: np.ndarray
    eval_steps: list[int] = field(default_factory=list)
    evals: dict[str, np.ndarray] = field(default_factory=dict)


def _batches(n: int, size: int, gens: list[torch.Generator], device: torch.device) -> torch.Tensor:
    return torch.stack([torch.randint(n, (size,), generator=g) for g in gens]).to(device)


def _noise(shape: tuple[int, ...], gens: list[torch.Generator], device: torch.device, uniform: bool = False) -> torch.Tensor:
    """Each member's draws from its own (CPU) generator, so that results do not depend on the device."""
    draw = torch.rand if uniform else torch.randn
    return torch.stack([draw(shape, generator=g) for g in gens]).to(device)


def _check_data(data: object, features: int, name: str = "data") -> torch.Tensor:
    check_float_tensor(data, name)
    if data.ndim != 2 or data.shape[1] != features or len(data) < 2:
        raise ValueError(f"{name} must have shape (N >= 2, {features}), got {tuple(data.shape)}")
    return data


def train_wgan_gp(
    gen: Net,
    crit: Net,
    data: torch.Tensor,
    *,
    steps: int,
    n_critic: int = 5,
    batch_size: int = 64,
    lr: float = 1e-4,
    betas: tuple[float, float] = (0.0, 0.9),
    gp_weight: float = 10.0,
    joint: bool = False,
    eval_every: int | None = None,
    evaluate: Callable[[Net], dict[str, np.ndarray]] | None = None,
) -> GANHistory:
    """Train every member pair (``gen`` member ``s`` against ``crit`` member ``s``, stacks made
    by :func:`generator` and :func:`critic`) with WGAN-GP.

    Gulrajani et al.'s Algorithm 1: per generator step, ``n_critic`` critic steps on
    ``mean D(fake) - mean D(real) + gp_weight * mean penalty`` with fresh real mini-batches
    (drawn with replacement), noise and interpolation weights, then one generator step on
    ``-mean D(G(z))``; Adam with ``lr`` and ``betas`` for both. The critic scores the real,
    the fake and the interpolated batch in three separate calls (so a batch-norm critic
    normalizes each with its own statistics); ``joint=True`` scores the real and the fake batch
    together in the critic steps, as one batch of ``2 * batch_size``, while the generator step
    still scores a batch of generated examples alone (so a batch-norm critic still hides that
    batch's mean from the generator). Member ``s`` draws its randomness from a
    generator derived from ``gen.seeds[s]``.

    ``data``: ``(N, 64)`` images in ``[-1, 1]``. ``evaluate(gen)`` (optional) is called every
    ``eval_every`` generator steps and after the last, with both networks in eval mode, and
    returns a dict of per-member arrays ``(members,)``.
    """
    if not isinstance(gen, Net) or not isinstance(crit, Net):
        raise TypeError("gen and crit must be stacked Nets (see generator() and critic())")
    if _members(gen) != _members(crit) or gen.sizes[-1] != crit.sizes[0] or crit.sizes[-1] != 1:
        raise ValueError(f"gen and crit must have the same members and fit together, got {_members(gen)} members of sizes "
                         f"{gen.sizes} and {_members(crit)} of sizes {crit.sizes}")
    _check_data(data, crit.sizes[0])
    for value, name in ((steps, "steps"), (n_critic, "n_critic"), (batch_size, "batch_size")):
        check_positive_int(value, name)
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_number(gp_weight, "gp_weight", "a non-negative number", lambda v: v >= 0)
    check_bool(joint, "joint")
    if eval_every is not None:
        check_positive_int(eval_every, "eval_every")
    e, latent, dev = _members(gen), gen.sizes[0], data.device
    gens = [_stream(s) for s in gen.seeds]
    opt_g = torch.optim.Adam(gen.parameters(), lr=lr, betas=betas)
    opt_c = torch.optim.Adam(crit.parameters(), lr=lr, betas=betas)
    w_est, pen = torch.zeros(e, steps), torch.zeros(e, steps)
    history = GANHistory(w_estimate=np.zeros((e, steps)), penalty=np.zeros((e, steps)))
    evals: list[dict[str, np.ndarray]] = []

    def run_eval(step: int) -> None:
        gen.eval(), crit.eval()
        with torch.no_grad():
            evals.append(evaluate(gen))
        gen.train(), crit.train()
        history.eval_steps.append(step)

    gen.train(), crit.train()
    for step in range(steps):
        for _ in range(n_critic):
            real = data[_batches(len(data), batch_size, gens, dev)]
            with torch.no_grad():
                fake = gen(_noise((batch_size, latent), gens, dev))
            alpha = _noise((batch_size, 1), gens, dev, uniform=True)
            if joint:
                d_real, d_fake = crit(torch.cat([real, fake], 1))[..., 0].split(batch_size, 1)
                d_real, d_fake = d_real.mean(1), d_fake.mean(1)
            else:
                d_real, d_fake = crit(real)[..., 0].mean(1), crit(fake)[..., 0].mean(1)
            penalty = gradient_penalty(crit, real, fake, alpha).mean(1)
            loss = d_fake - d_real + gp_weight * penalty  # (members,)
            opt_c.zero_grad(set_to_none=True)
            loss.sum().backward()
            opt_c.step()
        w_est[:, step], pen[:, step] = (d_real - d_fake).detach(), penalty.detach()
        g_loss = -crit(gen(_noise((batch_size, latent), gens, dev)))[..., 0].mean(1)
        opt_g.zero_grad(set_to_none=True)
        g_loss.sum().backward(inputs=list(gen.parameters()))
        opt_g.step()
        if evaluate is not None and eval_every is not None and ((step + 1) % eval_every == 0 or step + 1 == steps):
            run_eval(step + 1)
    if evaluate is not None and eval_every is None:
        run_eval(steps)
    history.w_estimate, history.penalty = w_est.numpy(), pen.numpy()
    if evals:
        history.evals = {k: np.stack([np.asarray(d[k]) for d in evals], 1) for k in evals[0]}
    return history


def sample(gen: Net, n: int, seed: int = 0, batch_stats: bool | None = None) -> torch.Tensor:
    """``n`` images from every member of a stacked generator ``(members, n, 64)``, from the
    same noise for every member (drawn from ``seed``), without gradients. ``batch_stats`` as in
    :meth:`Net.forward` (a batch-norm generator in eval mode uses its running statistics
    unless ``batch_stats=True``); running averages are never updated here."""
    check_positive_int(n, "n")
    z = torch.randn(n, gen.sizes[0], generator=torch.Generator().manual_seed(seed))  # on the CPU: the same on any device
    was_training = gen.training
    gen.eval()
    with torch.no_grad():
        out = gen(z.to(next(gen.parameters()).device), batch_stats=batch_stats)
    gen.train(was_training)
    return out


class VAE(nn.Module):
    """One seed's VAE (Kingma and Welling): an encoder ``64 -> hidden -> (mu, log sigma^2)`` of
    a diagonal Gaussian ``q(z|x)`` over ``latent`` dimensions and a decoder ``latent -> hidden
    -> 64`` Bernoulli logits, each a :class:`Net` with ``norm`` after every hidden layer
    (encoder and decoder alike), the encoder's weights drawn from ``seed``, the decoder's from
    ``seed + 2**30``; :func:`vae` stacks one per seed with :func:`lnbook.seeds.stack`.

    :meth:`forward` takes ``x (B, 64)`` and noise ``(B, latent)`` and returns ``(logits (B,
    64), mu, logvar (B, latent))``; in a stack of ``S`` members ``x (S, B, 64)`` or ``(B, 64)``
    and noise ``(S, B, latent)``, and every output gains the leading ``S``.
    """

    def __init__(self, norm: str = "none", *, seed: int, latent: int = 8, hidden: Sequence[int] = (128,)) -> None:
        super().__init__()
        seed = _check_seed(seed)
        check_positive_int(latent, "latent")
        self.latent = latent
        self.encoder = Net((64, *hidden, 2 * latent), norm, seed=seed)
        self.decoder = Net((latent, *hidden, 64), norm, seed=seed + 2**30)
        self.norm = self.encoder.norm

    def encode(self, x: torch.Tensor, batch_stats: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, logvar)``, each ``(B, latent)``, or ``(members, B, latent)`` in a stack."""
        mu, logvar = self.encoder(x, batch_stats).chunk(2, dim=-1)
        return mu, logvar

    def forward(
        self, x: torch.Tensor, noise: torch.Tensor, batch_stats: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x, batch_stats)
        if noise.shape != mu.shape:
            raise ValueError(f"noise must have shape {tuple(mu.shape)}, got {tuple(noise.shape)}")
        z = mu + (0.5 * logvar).exp() * noise
        return self.decoder(z, batch_stats), mu, logvar


def vae(norm: str, seeds: Sequence[int], latent: int = 8, hidden: Sequence[int] = (128,)) -> VAE:
    """A :class:`VAE` for every seed, stacked by :func:`lnbook.seeds.stack`: ``x (members, B,
    64)`` or ``(B, 64)`` and noise ``(members, B, latent)`` -> ``(logits (members, B, 64), mu,
    logvar (members, B, latent))``."""
    return _stacked(lambda s: VAE(norm, seed=s, latent=latent, hidden=hidden), seeds)


def elbo(
    vae: VAE, x: torch.Tensor, noise: torch.Tensor, batch_stats: bool | None = None
) -> torch.Tensor:
    """The per-example evidence lower bound ``E_q[log p(x|z)] - KL(q(z|x) || N(0, I))`` in nats,
    ``(members, B)`` (``(B,)`` for one plain VAE): one sample ``z`` per example (the
    reparameterization with ``noise (members, B, latent)``), the Gaussian KL in closed form.
    ``x`` holds binary pixels."""
    logits, mu, logvar = vae(x, noise, batch_stats)
    target = x.expand_as(logits)
    log_lik = -nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none").sum(-1)
    kl = 0.5 * (mu.pow(2) + logvar.exp() - 1 - logvar).sum(-1)
    return log_lik - kl


def heldout_elbo(vae: VAE, x: torch.Tensor, samples: int = 10, seed: int = 0,
                 batch_stats: bool | None = None) -> torch.Tensor:
    """The mean ELBO (nats per example) of ``x (N, 64)`` for every member ``(members,)``,
    averaged over ``samples`` noise draws (from ``seed``, the same for every member), without
    gradients, in the VAE's current mode (``batch_stats`` as in :meth:`Net.forward`;
    the whole of ``x`` is one batch). A plain VAE gives one number ``()``."""
    _check_data(x, 64, "x")
    check_positive_int(samples, "samples")
    s, g = seed_axis.members(vae), torch.Generator().manual_seed(seed)
    shape = (len(x), vae.latent) if s is None else (s, len(x), vae.latent)
    with torch.no_grad():
        vals = [elbo(vae, x, torch.randn(shape, generator=g).to(x.device), batch_stats).mean(-1) for _ in range(samples)]
    return torch.stack(vals).mean(0)


def train_vae(
    vae: VAE, data: torch.Tensor, *, steps: int, batch_size: int = 64, lr: float = 1e-3
) -> np.ndarray:
    """Train every member of a stack made by :func:`vae` with Adam on the negative mean ELBO of
    mini-batches of ``data (N, 64)`` (binary pixels), each member drawing its batches (with
    replacement) and noise from a generator derived from its seed. Returns the training ELBO of every step
    ``(members, steps)`` (nats per example)."""
    if not isinstance(vae, VAE):
        raise TypeError(f"vae must be a stack of VAEs made by vae(), got {type(vae).__name__}")
    e = _members(vae)
    _check_data(data, 64)
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    gens = [_stream(s) for s in vae.seeds]
    opt = torch.optim.Adam(vae.parameters(), lr=lr)
    vae.train()
    out = torch.zeros(e, steps)
    for step in range(steps):
        x = data[_batches(len(data), batch_size, gens, data.device)]
        value = elbo(vae, x, _noise((batch_size, vae.latent), gens, data.device)).mean(1)
        opt.zero_grad(set_to_none=True)
        (-value.sum()).backward()
        opt.step()
        out[:, step] = value.detach()
    return out.numpy()


def batch_jacobian(net: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, member: int = 0) -> torch.Tensor:
    """``J (B, B)``: ``J[i, j]`` is the Frobenius norm of the Jacobian of example ``i``'s output
    with respect to example ``j``'s input, for ``member`` of ``net``, which maps ``x (B, F)``
    (the same batch for every member) to ``(members, B, out)``. A norm that works example by
    example gives exactly zero off the diagonal; a training-mode batch norm does not."""
    check_float_tensor(x, "x")
    if x.ndim != 2:
        raise ValueError(f"x must have shape (B, F), got {tuple(x.shape)}")
    jac = torch.autograd.functional.jacobian(lambda inp: net(inp)[member], x)  # (B, out, B, F)
    return jac.pow(2).sum((1, 3)).sqrt()


def frechet_distance(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    """The Fréchet distance between Gaussians fitted to feature sets ``a (N, D)`` and ``b (M, D)``:
    ``||mu_a - mu_b||^2 + tr(C_a + C_b - 2 (C_a C_b)^(1/2))`` in float64, with the trace of the
    matrix square root computed as that of the symmetric ``(C_a^(1/2) C_b C_a^(1/2))^(1/2)``."""
    a, b = (np.asarray(t.detach().cpu() if isinstance(t, torch.Tensor) else t, dtype=np.float64) for t in (a, b))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or len(a) < 2 or len(b) < 2:
        raise ValueError(f"a and b must be (N, D) and (M, D) with N, M >= 2, got {a.shape} and {b.shape}")
    ca, cb = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))
    w, v = np.linalg.eigh(ca)
    root_a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    inner = np.linalg.eigvalsh(root_a @ cb @ root_a)
    trace_root = np.sqrt(np.clip(inner, 0, None)).sum()
    return float(((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(ca) + np.trace(cb) - 2 * trace_root)


def class_coverage(logits: torch.Tensor) -> tuple[float, float]:
    """``(confidence, classes)`` of classifier ``logits (N, C)`` on samples: the mean of the
    largest class probability, and the effective number of classes predicted, ``exp`` of the
    entropy of the histogram of predicted classes (``C`` when every class is predicted
    equally often, 1 when one class takes all)."""
    check_float_tensor(logits, "logits")
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, C), got {tuple(logits.shape)}")
    probs = logits.softmax(-1)
    hist = torch.bincount(probs.argmax(-1), minlength=logits.shape[1]).double() / len(logits)
    entropy = -(hist[hist > 0] * hist[hist > 0].log()).sum()
    return float(probs.max(-1).values.mean()), float(entropy.exp())
