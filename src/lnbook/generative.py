"""Generative models on 8x8 digits with no, batch or layer normalization: WGAN-GP and a VAE.

Chapter 10 asks where batch normalization's coupling of the examples of a batch breaks a
generative model's objective. Every network here is an ensemble, as in :mod:`lnbook.ensemble`:
``members`` independently initialized MLPs side by side, with a leading member axis on every
weight, so that five seeds train in little more time than one. Member ``s`` is initialized from
its own seed and draws its own mini-batches and noise, and the loss is the sum of the members'
losses, so Adam (which acts element by element) updates each member exactly as it would be
updated alone.

- :class:`EnsembleNet`: ``[Linear -> norm -> activation] * hidden -> Linear`` with norm
  ``"none"``, ``"batch"`` (statistics over the member's batch) or ``"layer"`` (over each
  example's features); :func:`generator` and :func:`critic` build the two halves of a GAN.
- :func:`gradient_penalty` and :func:`train_wgan_gp`: Gulrajani et al.'s WGAN-GP.
- :class:`EnsembleVAE`, :func:`elbo` and :func:`train_vae`: Kingma and Welling's VAE with a
  Bernoulli decoder.
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

from ._checks import check_bool, check_choice, check_float_tensor, check_number, check_positive_int, describe
from .functional import layer_norm

NORMS = ("none", "batch", "layer")
ACTIVATIONS = ("relu", "leaky_relu")
OUTPUTS = ("none", "tanh")


def _check_seeds(seeds: Sequence[int], name: str = "seeds") -> list[int]:
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise TypeError(f"{name} must be a non-empty sequence of ints, one per member, got {describe(seeds)}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s < 2**31:
            raise ValueError(f"{name} must hold ints in [0, 2**31), got {describe(seeds)}")
    return [int(s) for s in seeds]


def _stream(seed: int) -> torch.Generator:
    """A member's training randomness: a generator derived from its seed, distinct from the
    one that initialized its weights."""
    return torch.Generator().manual_seed(1_000_003 * (seed + 1))


class EnsembleNet(nn.Module):
    """``len(seeds)`` MLPs ``[Linear -> norm -> activation] * (len(sizes) - 2) -> Linear``, side by side.

    Args:
        sizes: ``(in_features, hidden..., out_features)``.
        norm: ``"none"``; ``"batch"``: each feature normalized with the mean and biased variance
            of the member's batch in training (running averages of the mean and the unbiased
            variance, with ``momentum``, as ``torch.nn.BatchNorm1d`` keeps them) and with the
            running averages in eval mode; ``"layer"``: each example normalized over its
            features. Both with a gain and a shift per feature. A Linear layer that feeds a
            batch norm has no bias (the norm subtracts it).
        seeds: one per member; member ``s`` draws its weights as ``torch.nn.Linear`` does,
            ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, from a generator seeded with ``seeds[s]``.
        activation: ``"relu"`` or ``"leaky_relu"`` (slope 0.2).
        output: ``"none"`` or ``"tanh"`` after the last Linear layer.
        first_norm: ``False`` leaves the first hidden layer without a norm (DCGAN's
            discriminator, whose input layer has no batch norm).
        native: for ``norm="layer"``, standardize with torch's fused ``layer_norm`` (fewer
            operators) or, ``False``, with :func:`lnbook.functional.layer_norm` (the book's
            hand-written backward, twice differentiable): the same numbers up to rounding.

    Shapes: ``x (members, B, in_features)`` (member ``s`` sees ``x[s]``) or ``(B, in_features)``,
    the same batch for every member; output ``(members, B, out_features)``.

    A training-mode batch norm on a batch of one normalizes with that example's own statistics,
    so every feature becomes its shift whatever the input; it leaves the running averages as
    they are (an unbiased variance needs two examples).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        norm: str = "none",
        *,
        seeds: Sequence[int],
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
        self.seeds = _check_seeds(seeds)
        self.sizes = tuple(int(s) for s in sizes)
        e, layers = len(self.seeds), len(self.sizes) - 1
        gens = [torch.Generator().manual_seed(s) for s in self.seeds]
        for i, (fan_in, fan_out) in enumerate(zip(self.sizes, self.sizes[1:])):
            bound = 1 / math.sqrt(fan_in)
            draw = lambda shape: torch.stack([torch.rand(shape, generator=g) for g in gens]) * 2 * bound - bound  # noqa: E731
            self.register_parameter(f"weight{i}", nn.Parameter(draw((fan_in, fan_out))))
            bias = draw((1, fan_out))
            hidden = i < layers - 1
            normed = hidden and norm != "none" and (first_norm or i > 0)
            if normed and norm == "batch":
                self.register_buffer(f"bias{i}", torch.zeros(e, 1, fan_out))
            else:
                self.register_parameter(f"bias{i}", nn.Parameter(bias))
            if normed:
                self.register_parameter(f"gain{i}", nn.Parameter(torch.ones(e, 1, fan_out)))
                self.register_parameter(f"shift{i}", nn.Parameter(torch.zeros(e, 1, fan_out)))
            if normed and norm == "batch":
                self.register_buffer(f"running_mean{i}", torch.zeros(e, 1, fan_out))
                self.register_buffer(f"running_var{i}", torch.ones(e, 1, fan_out))

    @property
    def members(self) -> int:
        return len(self.seeds)

    def _norm(self, h: torch.Tensor, i: int, batch_stats: bool) -> torch.Tensor:
        if self.norm == "none" or (i == 0 and not self.first_norm):
            return h
        if self.norm == "layer":
            standardize = nn.functional.layer_norm if self.native else layer_norm
            h = standardize(h, h.shape[-1:], eps=self.eps)
            return h * getattr(self, f"gain{i}") + getattr(self, f"shift{i}")
        if batch_stats:
            mean = h.mean(1, keepdim=True)
            var = (h - mean).pow(2).mean(1, keepdim=True)
            n = h.shape[1]
            if self.training and n > 1:
                with torch.no_grad():
                    getattr(self, f"running_mean{i}").lerp_(mean, self.momentum)
                    getattr(self, f"running_var{i}").lerp_(var * n / (n - 1), self.momentum)
        else:
            mean, var = getattr(self, f"running_mean{i}"), getattr(self, f"running_var{i}")
        return (h - mean) * torch.rsqrt(var + self.eps) * getattr(self, f"gain{i}") + getattr(self, f"shift{i}")

    def forward(self, x: torch.Tensor, batch_stats: bool | None = None) -> torch.Tensor:
        """``x (members, B, in)`` or ``(B, in)`` -> ``(members, B, out)``. ``batch_stats``
        (batch norm only): ``None`` follows the mode (batch statistics in training, running
        ones in eval); ``True`` uses the batch's statistics in either mode (updating the
        running averages only in training); ``False`` the running ones."""
        check_float_tensor(x, "x")
        e, f = self.members, self.sizes[0]
        if x.ndim == 2:
            x = x.expand(e, *x.shape)
        if x.ndim != 3 or x.shape[0] != e or x.shape[-1] != f:
            raise ValueError(f"x must have shape (B, {f}) or ({e}, B, {f}), got {tuple(x.shape)}")
        use_batch = self.training if batch_stats is None else bool(batch_stats)
        h, layers = x, len(self.sizes) - 1
        for i in range(layers):
            h = torch.baddbmm(getattr(self, f"bias{i}"), h, getattr(self, f"weight{i}"))
            if i < layers - 1:
                h = self._norm(h, i, use_batch)
                h = torch.relu(h) if self.activation == "relu" else nn.functional.leaky_relu(h, 0.2)
        return torch.tanh(h) if self.output == "tanh" else h

    def member(self, s: int) -> "EnsembleNet":
        """Member ``s`` as an ensemble of one (parameters and statistics copied)."""
        one = EnsembleNet(self.sizes, self.norm, seeds=[self.seeds[s]], activation=self.activation,
                          output=self.output, first_norm=self.first_norm, momentum=self.momentum, eps=self.eps,
                          native=self.native)
        one.load_state_dict({k: v[s : s + 1].clone() for k, v in self.state_dict().items()})
        return one.train(self.training)


def generator(norm: str, seeds: Sequence[int], latent: int = 16, hidden: Sequence[int] = (128, 256)) -> EnsembleNet:
    """A GAN generator: noise ``(members, B, latent)`` -> images ``(members, B, 64)`` in
    ``[-1, 1]`` (``tanh``), ReLU hidden layers; ``norm="batch"`` is the DCGAN arrangement
    (a batch norm after every hidden layer, none on the output)."""
    return EnsembleNet((latent, *hidden, 64), norm, seeds=seeds, activation="relu", output="tanh")


def critic(
    norm: str, seeds: Sequence[int], hidden: Sequence[int] = (256, 256), first_norm: bool = True, native: bool = True
) -> EnsembleNet:
    """A WGAN critic: images ``(members, B, 64)`` -> scores ``(members, B, 1)``, leaky-ReLU
    hidden layers (slope 0.2), no output activation; ``first_norm=False``: no norm after the
    first hidden layer (DCGAN's discriminator); ``native`` as :class:`EnsembleNet`'s."""
    return EnsembleNet((64, *hidden, 1), norm, seeds=seeds, activation="leaky_relu", first_norm=first_norm, native=native)


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
    gen: EnsembleNet,
    crit: EnsembleNet,
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
    evaluate: Callable[[EnsembleNet], dict[str, np.ndarray]] | None = None,
) -> GANHistory:
    """Train every member pair (``gen`` member ``s`` against ``crit`` member ``s``) with WGAN-GP.

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
    if not isinstance(gen, EnsembleNet) or not isinstance(crit, EnsembleNet):
        raise TypeError("gen and crit must be EnsembleNet (see generator() and critic())")
    if gen.members != crit.members or gen.sizes[-1] != crit.sizes[0] or crit.sizes[-1] != 1:
        raise ValueError(f"gen and crit must have the same members and fit together, got sizes {gen.sizes} and {crit.sizes}")
    _check_data(data, crit.sizes[0])
    for value, name in ((steps, "steps"), (n_critic, "n_critic"), (batch_size, "batch_size")):
        check_positive_int(value, name)
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_number(gp_weight, "gp_weight", "a non-negative number", lambda v: v >= 0)
    check_bool(joint, "joint")
    if eval_every is not None:
        check_positive_int(eval_every, "eval_every")
    e, latent, dev = gen.members, gen.sizes[0], data.device
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


def sample(gen: EnsembleNet, n: int, seed: int = 0, batch_stats: bool | None = None) -> torch.Tensor:
    """``n`` images from every member ``(members, n, 64)``, from the same noise for every
    member (drawn from ``seed``), without gradients. ``batch_stats`` as in
    :meth:`EnsembleNet.forward` (a batch-norm generator in eval mode uses its running
    statistics unless ``batch_stats=True``); running averages are never updated here."""
    check_positive_int(n, "n")
    z = torch.randn(n, gen.sizes[0], generator=torch.Generator().manual_seed(seed))  # on the CPU: the same on any device
    was_training = gen.training
    gen.eval()
    with torch.no_grad():
        out = gen(z.to(gen.weight0.device), batch_stats=batch_stats)
    gen.train(was_training)
    return out


class EnsembleVAE(nn.Module):
    """``len(seeds)`` VAEs side by side (Kingma and Welling): an encoder
    ``64 -> hidden -> (mu, log sigma^2)`` of a diagonal Gaussian ``q(z|x)`` over ``latent``
    dimensions and a decoder ``latent -> hidden -> 64`` Bernoulli logits, each an
    :class:`EnsembleNet` with ``norm`` after every hidden layer (encoder and decoder alike).

    :meth:`forward` takes ``x (members, B, 64)`` or ``(B, 64)`` and noise ``(members, B,
    latent)`` and returns ``(logits (members, B, 64), mu, logvar (members, B, latent))``.
    """

    def __init__(self, norm: str, seeds: Sequence[int], latent: int = 8, hidden: Sequence[int] = (128,)) -> None:
        super().__init__()
        seeds = _check_seeds(seeds)
        check_positive_int(latent, "latent")
        self.latent = latent
        self.encoder = EnsembleNet((64, *hidden, 2 * latent), norm, seeds=seeds)
        self.decoder = EnsembleNet((latent, *hidden, 64), norm, seeds=[s + 2**30 for s in seeds])

    @property
    def members(self) -> int:
        return self.encoder.members

    @property
    def norm(self) -> str:
        return self.encoder.norm

    def encode(self, x: torch.Tensor, batch_stats: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, logvar)``, each ``(members, B, latent)``."""
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


def elbo(
    vae: EnsembleVAE, x: torch.Tensor, noise: torch.Tensor, batch_stats: bool | None = None
) -> torch.Tensor:
    """The per-example evidence lower bound ``E_q[log p(x|z)] - KL(q(z|x) || N(0, I))`` in nats,
    ``(members, B)``: one sample ``z`` per example (the reparameterization with ``noise
    (members, B, latent)``), the Gaussian KL in closed form. ``x`` holds binary pixels."""
    logits, mu, logvar = vae(x, noise, batch_stats)
    target = x.expand_as(logits)
    log_lik = -nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none").sum(-1)
    kl = 0.5 * (mu.pow(2) + logvar.exp() - 1 - logvar).sum(-1)
    return log_lik - kl


def heldout_elbo(vae: EnsembleVAE, x: torch.Tensor, samples: int = 10, seed: int = 0,
                 batch_stats: bool | None = None) -> torch.Tensor:
    """The mean ELBO (nats per example) of ``x (N, 64)`` for every member ``(members,)``,
    averaged over ``samples`` noise draws (from ``seed``, the same for every member), without
    gradients, in the VAE's current mode (``batch_stats`` as in :meth:`EnsembleNet.forward`;
    the whole of ``x`` is one batch)."""
    _check_data(x, 64, "x")
    check_positive_int(samples, "samples")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        vals = [elbo(vae, x, torch.randn(vae.members, len(x), vae.latent, generator=g).to(x.device), batch_stats).mean(1)
                for _ in range(samples)]
    return torch.stack(vals).mean(0)


def train_vae(
    vae: EnsembleVAE, data: torch.Tensor, *, steps: int, batch_size: int = 64, lr: float = 1e-3
) -> np.ndarray:
    """Train every member with Adam on the negative mean ELBO of mini-batches of ``data (N, 64)``
    (binary pixels), each member drawing its batches (with replacement) and noise from a
    generator derived from its encoder's seed. Returns the training ELBO of every step
    ``(members, steps)`` (nats per example)."""
    if not isinstance(vae, EnsembleVAE):
        raise TypeError(f"vae must be an EnsembleVAE, got {type(vae).__name__}")
    _check_data(data, 64)
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    gens = [_stream(s) for s in vae.encoder.seeds]
    opt = torch.optim.Adam(vae.parameters(), lr=lr)
    vae.train()
    out = torch.zeros(vae.members, steps)
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
