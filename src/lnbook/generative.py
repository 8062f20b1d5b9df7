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
- Chapter 10's measurements: :func:`off_diagonal_share`, :func:`penalty_spread`,
  :func:`shift_gradients`, :func:`own_slopes`, :func:`one_at_a_time`, :func:`batchmate_spread`,
  :func:`normalized_means`, :func:`sample_grid`; :func:`said` and :func:`claim_verdict` read a
  comparison for the chapter's closing table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from . import seeds as seed_axis
from ._checks import check_bool, check_choice, check_float_tensor, check_int, check_number, check_positive_int, describe
from .functional import layer_norm
from .norms import MaskedBatchNorm1d
from .progress import progress

if TYPE_CHECKING:
    import matplotlib.figure

    from .compare import Comparisons

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

    def hidden(self, x: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """Hidden layer ``layer``'s pre-activations (0: the first), the output of its Linear layer
        before its norm, without gradients and without touching running statistics: ``x (B, in)``,
        or in a stack ``(S, B, in)`` or ``(B, in)``, -> ``(B, F)`` or ``(S, B, F)`` (``F`` =
        ``sizes[layer + 1]``). Layers before ``layer`` run in the network's current mode."""
        check_float_tensor(x, "x")
        hidden_layers = len(self.sizes) - 2
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < hidden_layers:
            raise ValueError(f"layer must be an int in [0, {hidden_layers}), got {describe(layer)}")
        s = seed_axis.members(self)
        if s is not None and x.ndim == 2:
            x = x.expand(s, *x.shape)
        seen = -1
        with torch.no_grad(), _buffers_kept(self):
            for module in self.layers:
                x = module(x)
                if isinstance(module, (nn.Linear, seed_axis.Linear)):
                    seen += 1
                    if seen == layer:
                        break
        return x

    def norm_statistics(self, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The running mean and (unbiased) variance of hidden layer ``layer``'s batch norm, each
        ``(F,)`` or ``(S, F)`` in a stack. Raises ``ValueError`` where that layer has no batch norm."""
        hidden_layers = len(self.sizes) - 2
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < hidden_layers:
            raise ValueError(f"layer must be an int in [0, {hidden_layers}), got {describe(layer)}")
        seen, modules = -1, list(self.layers)
        for i, module in enumerate(modules):
            if isinstance(module, (nn.Linear, seed_axis.Linear)):
                seen += 1
                if seen == layer:
                    following = modules[i + 1] if i + 1 < len(modules) else None
                    if following is None or not _is_batch_norm(following):
                        raise ValueError(f"layer {layer} has no batch norm (norm={self.norm!r}, first_norm={self.first_norm})")
                    return following.running_mean.clone(), following.running_var.clone()
        raise ValueError(f"layer {layer} not found")  # unreachable: the range is checked above


def _is_batch_norm(module: nn.Module) -> bool:
    return isinstance(getattr(module, "running_mean", None), torch.Tensor)


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


class ConvNet(nn.Module):
    """A small DCGAN-style convolutional critic or generator on 8x8 images for ``S`` seeds at
    once. Every convolution (4x4 kernels, stride 2, padding 1) is computed as an im2col product:
    the patches gathered by a fixed index, then a batched matrix product per member (the
    transposed convolutions scatter-add by the same index), which for images this small is
    faster on a CPU than
    ``torch``'s grouped convolutions, and computes the same function.

    - ``kind="critic"``: ``64 -> (1, 8, 8) -> conv -> (c1, 4, 4) -> norm -> leaky ReLU(0.2)
      -> conv -> (c2, 2, 2) -> norm -> leaky ReLU -> Linear -> 1``.
    - ``kind="generator"``: ``latent -> Linear -> (c2, 2, 2) -> norm -> ReLU -> transposed conv
      -> (c1, 4, 4) -> norm -> ReLU -> transposed conv -> (1, 8, 8) -> tanh -> 64``.

    ``norm``: ``"none"``; ``"batch"``: each channel normalized over the batch *and* the image's
    positions (as ``torch.nn.BatchNorm2d``; running averages of the mean and unbiased variance
    with ``momentum``, used in eval mode); ``"layer"``: each example normalized over all its
    channels and positions, with a gain and a shift per channel.
    ``first_norm=False`` (critic): no norm after the first convolution (DCGAN's and Arjovsky
    et al.'s discriminators). Member ``s``'s weights are drawn from a generator seeded with
    ``seeds[s]``, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Shapes: critic ``x (S, B, 64)`` or ``(B, 64)`` -> ``(S, B, 1)``; generator ``z (S, B,
    latent)`` or ``(B, latent)`` -> ``(S, B, 64)`` in ``[-1, 1]``. ``sizes`` is ``(64, 1)``
    or ``(latent, 64)``, as :func:`train_wgan_gp` reads it from a :class:`Net`.
    """

    def __init__(self, kind: str, norm: str, seeds: Sequence[int], channels: tuple[int, int] = (16, 32),
                 latent: int = 16, first_norm: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.kind = check_choice(kind, ("critic", "generator"), "kind")
        self.norm = check_choice(norm, NORMS, "norm")
        self.first_norm = check_bool(first_norm, "first_norm")
        self.seeds = _check_seeds(seeds)
        if not isinstance(channels, (tuple, list)) or len(channels) != 2:
            raise ValueError(f"channels must be a pair (c1, c2), got {describe(channels)}")
        c1, c2 = (check_positive_int(c, "channels") for c in channels)
        check_positive_int(latent, "latent")
        momentum = check_number(momentum, "momentum", "a number in [0, 1]", lambda v: 0 <= v <= 1)
        eps = check_number(eps, "eps", "a positive number", lambda v: v > 0)
        self.members = len(self.seeds)
        self.channels = (c1, c2)
        gens = [torch.Generator().manual_seed(seed) for seed in self.seeds]

        def uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:  # one draw per member, stacked: (S, *shape)
            bound = 1 / math.sqrt(fan_in)
            return nn.Parameter(torch.stack([torch.rand(shape, generator=g) * 2 * bound - bound for g in gens]))

        # weights as (S, inputs, outputs); a convolution's inputs in unfold's order (channel, row, column)
        if self.kind == "critic":
            self.sizes = (64, 1)
            self.w1, self.b1 = uniform((16, c1), 16), uniform((1, c1), 16)
            self.w2, self.b2 = uniform((c1 * 16, c2), c1 * 16), uniform((1, c2), c1 * 16)
            self.w3, self.b3 = uniform((4 * c2, 1), 4 * c2), uniform((1, 1), 4 * c2)
            normed, norm_channels = (first_norm, True), (c1, c2)
        else:
            self.sizes = (latent, 64)
            self.w1, self.b1 = uniform((latent, 4 * c2), latent), uniform((1, 4 * c2), latent)
            self.w2, self.b2 = uniform((c2, c1 * 16), c2 * 4), uniform((c1, 1), c2 * 4)  # each output sees 4 inputs a channel
            self.w3, self.b3 = uniform((c1, 16), c1 * 4), uniform((1,), c1 * 4)
            normed, norm_channels = (True, True), (c2, c1)
        self.norms = nn.ModuleList([_ConvNorm(self.norm if on else "none", self.members, c, momentum, eps)
                                    for c, on in zip(norm_channels, normed)])

    def forward(self, x: torch.Tensor, batch_stats: bool | None = None) -> torch.Tensor:
        """See the class; ``batch_stats`` as :meth:`Net.forward`'s (batch norm only; batch
        statistics outside training leave the running averages as they were)."""
        check_float_tensor(x, "x")
        s, f = self.members, self.sizes[0]
        if x.ndim == 2:
            x = x.expand(s, *x.shape)
        if x.ndim != 3 or x.shape[0] != s or x.shape[-1] != f:
            raise ValueError(f"x must have shape (B, {f}) or ({s}, B, {f}), got {tuple(x.shape)}")
        use_batch = self.training if batch_stats is None else bool(batch_stats)
        bns = [m for m in self.norms if m.kind == "batch"]
        if not bns or use_batch == self.training:
            return self._forward(x)
        kept = [(m.running_mean.clone(), m.running_var.clone()) for m in bns]
        for m in bns:
            m.train(use_batch)
        try:
            return self._forward(x)
        finally:
            with torch.no_grad():
                for m, (mean, var) in zip(bns, kept):
                    m.train(self.training)
                    m.running_mean.copy_(mean), m.running_var.copy_(var)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b = self.members, x.shape[1]
        c1, c2 = self.channels
        act = nn.functional.leaky_relu if self.kind == "critic" else nn.functional.relu
        if self.kind == "critic":
            cols = _unfold(x, 8).view(s, b, 16, 16)  # (S, B, positions, kernel)
            h = act(self.norms[0](cols @ self.w1.unsqueeze(1) + self.b1.unsqueeze(1)), 0.2)  # (S, B, 16, c1)
            cols = _unfold(h.transpose(2, 3), 4)  # (S, B, c1, 4 positions x 16 kernel)
            cols = cols.view(s, b, c1, 4, 16).permute(0, 1, 3, 2, 4).reshape(s, b * 4, c1 * 16)
            h = torch.baddbmm(self.b2, cols, self.w2).view(s, b, 4, c2)
            h = act(self.norms[1](h), 0.2)
            return torch.baddbmm(self.b3, h.reshape(s, b, 4 * c2), self.w3)
        h = act(self.norms[0](torch.baddbmm(self.b1, x, self.w1).view(s, b, 4, c2)))  # (S, B, 2x2 positions, c2)
        vals = torch.bmm(h.reshape(s, b * 4, c2), self.w2).view(s, b, 4, c1, 16).permute(0, 1, 3, 2, 4)
        h = _fold(vals.reshape(s, b, c1, 64), 4) + self.b2.unsqueeze(1)  # (S, B, c1, 16 positions)
        h = act(self.norms[1](h.transpose(2, 3)))  # (S, B, 16, c1)
        vals = torch.bmm(h.reshape(s, b * 16, c1), self.w3).view(s, b, 256)  # (S, B, 16 positions x 16 kernel)
        return torch.tanh(_fold(vals, 8) + self.b3.view(s, 1, 1))


_UNFOLD: dict[tuple[int, str], torch.Tensor] = {}


def _unfold_index(size: int, device: torch.device) -> torch.Tensor:
    """``(((size // 2)**2 * 16,)`` indices into a ``size x size`` image flattened row-major with
    one zero appended (index ``size**2``): for each output position of a 4x4 convolution with
    stride 2 and padding 1 (row-major), the 16 pixels its kernel reads (row-major over the
    kernel), the appended zero where it reads the padding."""
    key = (size, str(device))
    if key not in _UNFOLD:
        out, idx = size // 2, []
        for oy in range(out):
            for ox in range(out):
                for ky in range(4):
                    for kx in range(4):
                        iy, ix = 2 * oy - 1 + ky, 2 * ox - 1 + kx
                        idx.append(iy * size + ix if 0 <= iy < size and 0 <= ix < size else size * size)
        _UNFOLD[key] = torch.tensor(idx, device=device)
    return _UNFOLD[key]


def _unfold(x: torch.Tensor, size: int) -> torch.Tensor:
    """The patches of images ``x (..., size**2)``: ``(..., (size // 2)**2 * 16)``, positions then kernel."""
    padded = nn.functional.pad(x, (0, 1))
    return padded.index_select(-1, _unfold_index(size, x.device))


def _fold(vals: torch.Tensor, size: int) -> torch.Tensor:
    """The adjoint of :func:`_unfold`, a transposed convolution's scatter: ``vals (..., (size //
    2)**2 * 16)`` summed into ``(..., size**2)``, whatever lands on the padding dropped."""
    out = vals.new_zeros(*vals.shape[:-1], size * size + 1)
    return out.index_add(-1, _unfold_index(size, vals.device), vals)[..., :-1]


class _ConvNorm(nn.Module):
    """The norm of :class:`ConvNet`'s feature maps ``(S, B, P, C)`` (``P`` positions): ``"batch"``
    over the batch and the positions per member and channel (running statistics ``(S, C)`` in
    eval mode), ``"layer"`` over the positions and channels per member and example, ``"none"``
    the identity; a gain and a shift per member and channel."""

    def __init__(self, kind: str, members: int, channels: int, momentum: float, eps: float) -> None:
        super().__init__()
        self.kind, self.momentum, self.eps = kind, momentum, eps
        if kind != "none":
            self.weight = nn.Parameter(torch.ones(members, 1, 1, channels))
            self.bias = nn.Parameter(torch.zeros(members, 1, 1, channels))
        if kind == "batch":
            self.register_buffer("running_mean", torch.zeros(members, 1, 1, channels))
            self.register_buffer("running_var", torch.ones(members, 1, 1, channels))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return h
        if self.kind == "layer":
            var, mean = torch.var_mean(h, dim=(2, 3), correction=0, keepdim=True)
        elif self.training:
            var, mean = torch.var_mean(h, dim=(1, 2), correction=0, keepdim=True)
            n = h.shape[1] * h.shape[2]
            if n < 2:
                raise ValueError("a batch norm needs more than one value per channel in training")
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var * n / (n - 1), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        return (h - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


def conv_critic(norm: str, seeds: Sequence[int], channels: tuple[int, int] = (16, 32), first_norm: bool = True) -> ConvNet:
    """A DCGAN-style convolutional WGAN critic for every seed (:class:`ConvNet`, ``kind="critic"``):
    images ``(members, B, 64)`` -> scores ``(members, B, 1)``."""
    return ConvNet("critic", norm, seeds, channels, first_norm=first_norm)


def conv_generator(norm: str, seeds: Sequence[int], channels: tuple[int, int] = (16, 32), latent: int = 16) -> ConvNet:
    """A DCGAN-style convolutional generator for every seed (:class:`ConvNet`, ``kind="generator"``):
    noise ``(members, B, latent)`` -> images ``(members, B, 64)`` in ``[-1, 1]``."""
    return ConvNet("generator", norm, seeds, channels, latent=latent)


def frozen_forward(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``net(x)`` with every training-mode batch norm's batch statistics held constant: the
    same values as ``net(x)`` in training mode (each batch norm normalizes with the mean and
    biased variance of this batch, and the running averages are updated as that pass would
    update them), but gradients treat the statistics as fixed numbers, so example ``i``'s
    output depends on example ``i``'s input alone. The statistics are constants with respect to
    the parameters too (they are computed from the norms' inputs under ``no_grad``), so a loss
    on this output also loses the parameter gradient that flows through the batch statistics
    (for BatchNorm, the part that makes the output invariant to a scale of the weights before
    it): a control built on it changes that as well as the coupling. A network without batch
    norms, or in eval mode, is simply called. Shapes as ``net``'s (``(S, B, F)`` in a stack)."""
    norms = [m for m in net.modules() if _is_batch_norm(m)]
    if not norms or not net.training:
        return net(x)
    if not all(isinstance(m, (seed_axis.Norm, MaskedBatchNorm1d)) for m in norms):
        raise TypeError("frozen_forward supports the batch norms of Net (MaskedBatchNorm1d, stacked or not)")
    inputs: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, args, i=i: inputs.__setitem__(i, args[0].detach()))
             for i, m in enumerate(norms)]
    try:
        with torch.no_grad():
            net(x)  # training mode: records each norm's input and updates the running averages
    finally:
        for h in hooks:
            h.remove()
    saved = [(m.running_mean, m.running_var) for m in norms]
    try:
        for i, m in enumerate(norms):
            var, mean = torch.var_mean(inputs[i], dim=-2, correction=0)  # this batch's statistics, (S, F) or (F,)
            m.running_mean, m.running_var = mean, var  # a new tensor under the buffer's name, not an in-place copy
        net.eval()
        out = net(x)
    finally:
        net.train()
        for m, (mean, var) in zip(norms, saved):
            m.running_mean, m.running_var = mean, var
    return out


@contextmanager
def _buffers_kept(module: nn.Module) -> Iterator[None]:
    """Run the ``with`` block, then put every buffer of ``module`` (a batch norm's running
    averages) back as it was: a measurement in training mode leaves the model unchanged."""
    kept = {name: b.clone() for name, b in module.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in module.named_buffers():
                b.copy_(kept[name])


def input_gradient_norms(critic_net: nn.Module, x: torch.Tensor, frozen: bool = False) -> torch.Tensor:
    """The norm of the gradient of the batch's summed scores with respect to each example of
    ``x (members, B, F)``, ``(members, B)``, scored in the critic's current mode. ``frozen=False``
    is the gradient the paper's penalty takes (with a training-mode batch norm it carries the
    batch-mates' scores); ``frozen=True`` goes through :func:`frozen_forward`: each example's own
    slope in the function that scored this batch. The critic's buffers (running averages) are
    left as they were."""
    check_float_tensor(x, "x")
    check_bool(frozen, "frozen")
    if x.ndim != 3:
        raise ValueError(f"x must have shape (members, B, F), got {tuple(x.shape)}")
    with _buffers_kept(critic_net):
        x = x.detach().requires_grad_(True)
        scores = frozen_forward(critic_net, x) if frozen else critic_net(x)
        (grad,) = torch.autograd.grad(scores.sum(), x)
    return grad.norm(dim=-1).detach()


def gradient_penalty(
    critic_net: nn.Module, real: torch.Tensor, fake: torch.Tensor, alpha: torch.Tensor, create_graph: bool = True,
    frozen: bool = False,
) -> torch.Tensor:
    """Gulrajani et al.'s penalty ``(||grad_x D(x_hat)|| - 1)^2`` at ``x_hat = alpha real + (1 - alpha) fake``.

    ``real``, ``fake``: ``(members, B, F)``; ``alpha``: ``(members, B, 1)`` in ``[0, 1]``.
    Returns the per-example penalties ``(members, B)``. As in the paper's code, the gradient
    is that of the *sum* of the batch's scores with respect to each ``x_hat_i``: with a norm
    that works example by example this is the gradient of ``D(x_hat_i)`` alone; with a
    training-mode batch norm it also carries every batch-mate's score. ``frozen=True`` scores
    the batch through :func:`frozen_forward`: a batch norm still normalizes with the batch's
    statistics, held constant, so the gradient is each example's own and the penalty is per
    example again.
    """
    for name, t in (("real", real), ("fake", fake), ("alpha", alpha)):
        check_float_tensor(t, name)
    check_bool(frozen, "frozen")
    if real.ndim != 3 or fake.shape != real.shape:
        raise ValueError(f"real and fake must have the same shape (members, B, F), got {tuple(real.shape)} and {tuple(fake.shape)}")
    if alpha.shape != real.shape[:2] + (1,):
        raise ValueError(f"alpha must have shape {tuple(real.shape[:2]) + (1,)}, got {tuple(alpha.shape)}")
    x_hat = (alpha * real + (1 - alpha) * fake).detach().requires_grad_(True)
    scores = frozen_forward(critic_net, x_hat) if frozen else critic_net(x_hat)
    (grad,) = torch.autograd.grad(scores.sum(), x_hat, create_graph=create_graph)
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
    penalty: str = "coupled",
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
    together, as one batch of ``2 * batch_size``, in the critic steps *and* in the generator
    step (which draws a fresh real batch to score its generated batch with), so a batch-norm
    critic sees the difference between the real and the generated batch's means; the
    interpolated batch of the penalty is still scored alone. ``penalty="frozen"`` computes the
    penalty with the batch statistics held constant (:func:`gradient_penalty` with
    ``frozen=True``: per example again), ``"coupled"`` as the paper's code. Member ``s`` draws
    its randomness from a generator derived from ``gen.seeds[s]``. ``gen`` and ``crit`` may
    also be the convolutional stacks of :func:`conv_generator` and :func:`conv_critic`.

    ``data``: ``(N, 64)`` images in ``[-1, 1]``. ``evaluate(gen)`` (optional) is called every
    ``eval_every`` generator steps and after the last, with both networks in eval mode, and
    returns a dict of per-member arrays ``(members,)``.
    """
    if not isinstance(gen, (Net, ConvNet)) or not isinstance(crit, (Net, ConvNet)):
        raise TypeError("gen and crit must be stacked Nets or ConvNets (see generator(), critic(), conv_generator(), conv_critic())")
    if _members(gen) != _members(crit) or gen.sizes[-1] != crit.sizes[0] or crit.sizes[-1] != 1:
        raise ValueError(f"gen and crit must have the same members and fit together, got {_members(gen)} members of sizes "
                         f"{gen.sizes} and {_members(crit)} of sizes {crit.sizes}")
    _check_data(data, crit.sizes[0])
    for value, name in ((steps, "steps"), (n_critic, "n_critic"), (batch_size, "batch_size")):
        check_positive_int(value, name)
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_number(gp_weight, "gp_weight", "a non-negative number", lambda v: v >= 0)
    check_bool(joint, "joint")
    check_choice(penalty, ("coupled", "frozen"), "penalty")
    if penalty == "frozen" and not isinstance(crit, Net):
        raise ValueError("penalty='frozen' needs an MLP critic (a Net)")
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
    for step in progress(range(steps), "WGAN-GP steps"):
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
            gp = gradient_penalty(crit, real, fake, alpha, frozen=penalty == "frozen").mean(1)
            loss = d_fake - d_real + gp_weight * gp  # (members,)
            opt_c.zero_grad(set_to_none=True)
            loss.sum().backward()
            opt_c.step()
        w_est[:, step], pen[:, step] = (d_real - d_fake).detach(), gp.detach()
        if joint:
            real = data[_batches(len(data), batch_size, gens, dev)]
            fake = gen(_noise((batch_size, latent), gens, dev))
            g_loss = -crit(torch.cat([real, fake], 1))[:, batch_size:, 0].mean(1)
        else:
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


def sample(gen: Net | ConvNet, n: int, seed: int = 0, batch_stats: bool | None = None) -> torch.Tensor:
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
    vae: VAE, data: torch.Tensor, *, steps: int, batch_size: int = 64, lr: float = 1e-3,
    every: int = 0, evaluate: Callable[[int, VAE], None] | None = None,
) -> np.ndarray:
    """Train every member of a stack made by :func:`vae` with Adam on the negative mean ELBO of
    mini-batches of ``data (N, 64)`` (binary pixels), each member drawing its batches (with
    replacement) and noise from a generator derived from its seed. With ``evaluate`` and
    ``every > 0``, ``evaluate(step, vae)`` is called after every ``every`` steps (the VAE in
    eval mode, back in training mode after; the training itself is unchanged). Returns the
    training ELBO of every step ``(members, steps)`` (nats per example)."""
    if not isinstance(vae, VAE):
        raise TypeError(f"vae must be a stack of VAEs made by vae(), got {type(vae).__name__}")
    e = _members(vae)
    _check_data(data, 64)
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise ValueError(f"every must be a non-negative int, got {every!r}")
    if evaluate is not None and not callable(evaluate):
        raise TypeError(f"evaluate must be callable, got {type(evaluate).__name__}")
    gens = [_stream(s) for s in vae.seeds]
    opt = torch.optim.Adam(vae.parameters(), lr=lr)
    vae.train()
    out = torch.zeros(e, steps)
    for step in progress(range(steps), "VAE steps"):
        x = data[_batches(len(data), batch_size, gens, data.device)]
        value = elbo(vae, x, _noise((batch_size, vae.latent), gens, data.device)).mean(1)
        opt.zero_grad(set_to_none=True)
        (-value.sum()).backward()
        opt.step()
        out[:, step] = value.detach()
        if evaluate is not None and every and (step + 1) % every == 0:
            vae.eval()
            evaluate(step + 1, vae)
            vae.train()
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


# ---------------------------------------------------------------------------------------------
# Chapter 10's measurements of trained and untrained stacks (the notebook calls them).

def _seed_count(net: nn.Module, name: str) -> int:
    seeds = getattr(net, "seeds", None)
    if not isinstance(net, nn.Module) or not isinstance(seeds, list) or not seeds:
        raise TypeError(f"{name} must be a stack made by critic(), conv_critic(), generator() or vae(), got {describe(net)}")
    return len(seeds)


def _device(net: nn.Module) -> torch.device:
    return next(net.parameters()).device


def off_diagonal_share(jac: torch.Tensor) -> float:
    """How much of a batch Jacobian's mass lies off its diagonal, relative to the diagonal:
    ``sum_{i != j} J[i, j] / sum_i J[i, i]`` for ``jac (B, B)`` from :func:`batch_jacobian`
    (0 for a network that works example by example)."""
    check_float_tensor(jac, "jac")
    if jac.ndim != 2 or jac.shape[0] != jac.shape[1] or len(jac) < 2:
        raise ValueError(f"jac must be a square (B, B) matrix with B >= 2, got shape {tuple(jac.shape)}")
    diag = jac.diag().sum()
    if not diag > 0:
        raise ValueError("jac must have a positive diagonal (each output depends on its own input)")
    return float((jac.sum() - diag) / diag)


def penalty_spread(crit: nn.Module, real: torch.Tensor, fake: torch.Tensor, batch_size: int = 16, draws: int = 20,
                   seed: int = 1) -> np.ndarray:
    """The relative spread (standard deviation over mean) of one example's gradient penalty
    when its batch-mates are redrawn, per member ``(members,)``: example 0 of ``real`` and of
    ``fake`` (pools ``(N, 64)``, row ``i`` of each paired) with a fixed ``alpha``, and
    ``batch_size - 1`` batch-mates drawn ``draws`` times from rows ``1..N-1`` (generator
    ``seed``). 0 for a critic whose penalty is per example."""
    s = _seed_count(crit, "crit")
    real, fake = _check_data(real, 64, "real"), _check_data(fake, 64, "fake")
    if real.shape != fake.shape or len(real) < 2:
        raise ValueError(f"real and fake must be paired pools of the same shape (N >= 2, 64), got {tuple(real.shape)} "
                         f"and {tuple(fake.shape)}")
    check_int(batch_size, "batch_size", 2)
    check_int(draws, "draws", 2)
    device, g = _device(crit), torch.Generator().manual_seed(_check_seed(seed))
    alpha = torch.rand(1, batch_size, 1, generator=g).expand(s, batch_size, 1).to(device)
    values = []
    for _ in range(draws):
        idx = torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(1, len(real), (batch_size - 1,), generator=g)])
        r, f = (pool[idx].to(device).expand(s, batch_size, 64) for pool in (real, fake))
        values.append(gradient_penalty(crit, r, f, alpha, create_graph=False)[:, 0].detach())
    stacked = torch.stack(values)  # (draws, members)
    return (stacked.std(0) / stacked.mean(0)).cpu().numpy()


def shift_gradients(crit: nn.Module, x: torch.Tensor, x_other: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whether a critic (in its current mode) sees what a batch has in common, per member
    ``(members,)`` each: ``|d mean score / d shift|`` for one vector added to every example of
    ``x (B, 64)`` with the batch scored alone, the same with the shifted batch as the second
    half of a joint batch after ``x_other (B, 64)``, and the mean norm of the gradient of the
    summed scores with respect to each example (the gradient the penalty takes). The critic's
    buffers (running averages) are left as they were."""
    s = _seed_count(crit, "crit")
    x, x_other = _check_data(x, 64, "x"), _check_data(x_other, 64, "x_other")
    if x.shape != x_other.shape:
        raise ValueError(f"x and x_other must have the same shape, got {tuple(x.shape)} and {tuple(x_other.shape)}")
    b = len(x)
    with _buffers_kept(crit):  # a training-mode batch norm would move its running averages
        shift = torch.zeros(s, 1, 64, device=x.device, requires_grad=True)
        (alone,) = torch.autograd.grad(crit(x + shift)[..., 0].mean(1).sum(), shift)
        joint_batch = torch.cat([x_other.expand(s, b, 64), x + shift], 1)
        (joint,) = torch.autograd.grad(crit(joint_batch)[:, b:, 0].mean(1).sum(), shift)
        x_each = x.expand(s, b, 64).clone().requires_grad_(True)
        (each,) = torch.autograd.grad(crit(x_each)[..., 0].sum(), x_each)
    return (alone.norm(dim=-1)[:, 0].cpu().numpy(), joint.norm(dim=-1)[:, 0].cpu().numpy(),
            each.norm(dim=-1).mean(1).cpu().numpy())


def own_slopes(crit: nn.Module, real: torch.Tensor, fake: torch.Tensor, joint: bool) -> np.ndarray:
    """Each example's own slope (input-gradient norm, :func:`input_gradient_norms` with
    ``frozen=True``) in the function that scores it as training scored it, averaged over the
    examples, per member ``(members,)``: ``real (B, 64)`` and ``fake (members, B, 64)`` as one
    joint batch (``joint=True``) or each batch alone. The critic runs in training mode (its
    running averages are left as they were) and is put back in the mode it was in."""
    s = _seed_count(crit, "crit")
    real = _check_data(real, 64, "real")
    check_float_tensor(fake, "fake")
    check_bool(joint, "joint")
    if fake.shape != (s, *real.shape):
        raise ValueError(f"fake must have shape {(s, *real.shape)} (members, B, 64), got {tuple(fake.shape)}")
    was_training = crit.training
    crit.train()
    try:
        real_s = real.expand(s, -1, -1)
        if joint:
            slopes = input_gradient_norms(crit, torch.cat([real_s, fake], 1), frozen=True)
        else:
            slopes = torch.cat([input_gradient_norms(crit, real_s, frozen=True), input_gradient_norms(crit, fake, frozen=True)], 1)
    finally:
        crit.train(was_training)
    return slopes.mean(1).cpu().numpy()


def one_at_a_time(vae: VAE, x: torch.Tensor, batch_stats: bool | None = True, seed: int = 0) -> tuple[np.ndarray, float]:
    """Every example of ``x (N, 64)`` encoded and scored as a batch of one (one noise draw
    each, from ``seed``): the mean ELBO per member ``(members,)``, and the largest spread of the
    encoder's means across the examples (max - min over examples, largest over members and
    latent dimensions). With ``batch_stats=True`` a batch-norm VAE normalizes each example with
    its own statistics: a misuse, kept to show what the coupling is."""
    if not isinstance(vae, VAE):
        raise TypeError(f"vae must be a stack of VAEs made by vae(), got {describe(vae)}")
    s = _members(vae)
    x = _check_data(x, 64, "x")
    g = torch.Generator().manual_seed(_check_seed(seed))
    with torch.no_grad():
        values = [elbo(vae, x[i : i + 1], torch.randn(s, 1, vae.latent, generator=g).to(x.device), batch_stats)
                  for i in range(len(x))]
        mus = torch.cat([vae.encode(x[i : i + 1], batch_stats)[0] for i in range(len(x))], 1)  # (members, N, latent)
    return torch.cat(values, 1).mean(1).cpu().numpy(), float((mus.max(1).values - mus.min(1).values).max())


def batchmate_spread(vae: VAE, x: torch.Tensor, pool: torch.Tensor, batch_size: int = 64, draws: int = 20,
                     seed: int = 2) -> np.ndarray:
    """The standard deviation (nats) of one digit's training-mode ELBO (batch statistics) over
    ``draws`` sets of ``batch_size - 1`` batch-mates drawn from ``pool (N, 64)`` (generator
    ``seed``; the same noise every draw), per member ``(members,)``; ``x (1, 64)`` is the digit.
    0 for a VAE that works example by example."""
    if not isinstance(vae, VAE):
        raise TypeError(f"vae must be a stack of VAEs made by vae(), got {describe(vae)}")
    s = _members(vae)
    check_float_tensor(x, "x")
    pool = _check_data(pool, 64, "pool")
    if x.shape != (1, 64):
        raise ValueError(f"x must be one digit (1, 64), got {tuple(x.shape)}")
    check_int(batch_size, "batch_size", 2)
    check_int(draws, "draws", 2)
    g = torch.Generator().manual_seed(_check_seed(seed))
    noise = torch.randn(s, batch_size, vae.latent, generator=g).to(x.device)
    values = []
    with torch.no_grad():
        for _ in range(draws):
            batch = torch.cat([x, pool[torch.randint(len(pool), (batch_size - 1,), generator=g)]])
            values.append(elbo(vae, batch, noise, batch_stats=True)[:, 0])
    return torch.stack(values).std(0).cpu().numpy()


def normalized_means(crit: Net, batch: torch.Tensor, layer: int = 0) -> torch.Tensor:
    """Each unit's mean over ``batch`` (``(B, 64)`` or ``(members, B, 64)``) of hidden layer
    ``layer``'s pre-activations, minus the layer's batch norm's running mean, in units of its
    running standard deviation: ``(members, F)`` (see :meth:`Net.hidden`, :meth:`Net.norm_statistics`)."""
    if not isinstance(crit, Net):
        raise TypeError(f"crit must be a Net stack made by critic(), got {describe(crit)}")
    running_mean, running_var = crit.norm_statistics(layer)
    return (crit.hidden(batch, layer).mean(-2) - running_mean) / running_var.sqrt()


def sample_grid(rows: Mapping[str, torch.Tensor], title: str) -> "matplotlib.figure.Figure":
    """One row of digits per entry of ``rows`` (label -> images ``(n, 64)`` in ``[0, 1]``, the
    same ``n`` for every row), drawn side by side in gray; returns the figure."""
    import matplotlib.pyplot as plt

    if not isinstance(rows, Mapping) or not rows:
        raise ValueError(f"rows must map labels to images (n, 64), got {describe(rows)}")
    n = len(next(iter(rows.values())))
    for label, images in rows.items():
        check_float_tensor(images, f"rows[{label!r}]")
        if images.shape != (n, 64):
            raise ValueError(f"rows[{label!r}] must have shape ({n}, 64), got {tuple(images.shape)}")
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 0.8 * len(rows)), squeeze=False)
    for ax, (label, images) in zip(axes[:, 0], rows.items()):
        ax.imshow(torch.cat(list(images.detach().cpu().reshape(n, 8, 8)), 1).numpy(), cmap="gray_r", vmin=0, vmax=1)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
    axes[0, 0].set_title(title)
    return fig


def said(table: Comparisons, a: str, b: str) -> str:
    """One comparison of ``table`` (a :func:`lnbook.compare.compare` or ``by_measure`` result),
    short: ``"a − b = d [lo, hi]"``, the difference with its 95% interval."""
    c = table[a, b]
    return f"{c.a} − {c.b} = {c.interval}"


def claim_verdict(table: Comparisons, a: str, b: str, claimed: str | None) -> str:
    """The verdict on a claim that ``claimed`` is better than the other of ``a`` and ``b``
    (``None``: a claim of no difference), computed from their comparison in ``table``:
    ``"holds"`` (the claimed arm wins after the table's Holm correction), ``"not shown (no
    difference measured)"``, ``"contradicted (...)"`` (the other arm wins), or for ``None``
    ``"no difference measured"`` / the winner."""
    c = table[a, b]
    if claimed is not None and claimed not in (c.a, c.b):
        raise ValueError(f"claimed must be {c.a!r}, {c.b!r} or None, got {claimed!r}")
    if claimed is None:
        return c.short
    if c.winner is None:
        return "not shown (no difference measured)"
    return "holds" if c.winner == claimed else f"contradicted ({c.short})"


# ---------------------------------------------------------------------------------------------
# Chapter 10's experiments as one configuration, shared by the notebook and the stored run of
# benchmarks/generative.py (so that the two compute the same numbers).

@dataclass
class Judge:
    """A classifier trained on the real training digits that scores generated ones:
    ``classifier`` maps images ``(N, 64)`` in ``[0, 1]`` to logits ``(N, 10)``; ``reference``
    ``(N_train, 128)`` is its hidden features of the training digits; ``test_acc`` its accuracy
    on the held-out digits."""

    classifier: nn.Module
    reference: torch.Tensor
    test_acc: float

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The 128 ReLU features under the output layer, ``(N, 64)`` -> ``(N, 128)``."""
        return self.classifier.net[:-1](images)

    def scores(self, images: torch.Tensor) -> tuple[float, float, float]:
        """``(Fréchet distance to the training digits, confidence, classes)`` of ``images (n, 64)``
        in ``[0, 1]`` (see :func:`frechet_distance`, :func:`class_coverage`)."""
        check_float_tensor(images, "images")
        with torch.no_grad():
            return (frechet_distance(self.features(images), self.reference), *class_coverage(self.classifier(images)))

    def evaluator(self, n: int = 360, seed: int = 1) -> Callable[[nn.Module], dict[str, np.ndarray]]:
        """For :func:`train_wgan_gp`'s ``evaluate``: ``n`` samples of every member from the same
        noise (``seed``), scored; returns ``{"fd", "confidence", "classes"}``, each ``(members,)``."""
        def evaluate(gen: nn.Module) -> dict[str, np.ndarray]:
            per_member = [self.scores((images + 1) / 2) for images in sample(gen, n, seed=seed)]
            return {key: np.array([s[i] for s in per_member]) for i, key in enumerate(("fd", "confidence", "classes"))}
        return evaluate


def digits_judge(train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor],
                 device: torch.device | str = "cpu") -> Judge:
    """Chapter 10's judge: ``lnbook.models.MLP(64, (128,), 10)`` initialized after
    ``seed_everything(0)`` and trained by :func:`lnbook.train.fit` for 30 epochs (Adam at
    ``1e-3``, batches of 64, seed 0) on ``train = (images (N, 64) in [0, 1], labels (N,))``,
    scored on ``test``; in eval mode on ``device``."""
    from . import models, train as train_mod
    from .utils import seed_everything

    seed_everything(0)
    net = models.MLP(64, (128,), 10)
    history = train_mod.fit(net, train, test, epochs=30, lr=1e-3, batch_size=64, seed=0)
    net = net.to(device).eval()
    with torch.no_grad():
        reference = net.net[:-1](train[0].to(device))
    return Judge(net, reference, float(history.test_acc[-1]))


@dataclass(frozen=True)
class GanArm:
    """One WGAN-GP setting of chapter 10: the generator's and the critic's norm, the penalty
    weight ``gp_weight`` (lambda), a norm after the critic's first layer (``first_norm``),
    ``joint`` and ``penalty`` as :func:`train_wgan_gp`'s, and ``conv``: the convolutional
    networks of :func:`conv_generator` and :func:`conv_critic` instead of MLPs."""

    gen_norm: str
    crit_norm: str
    gp_weight: float = 10.0
    first_norm: bool = True
    joint: bool = False
    penalty: str = "coupled"
    conv: bool = False


GAN_ARMS: dict[str, GanArm] = {
    "no-norm critic": GanArm("batch", "none"),
    "LN critic": GanArm("batch", "layer"),
    "BN critic": GanArm("batch", "batch"),
    "BN critic, no penalty": GanArm("batch", "batch", gp_weight=0.0),
    "BN critic, DCGAN-style": GanArm("batch", "batch", first_norm=False),
    "LN critic, no-norm generator": GanArm("none", "layer"),
    "BN critic, joint batches": GanArm("batch", "batch", joint=True),
    "BN critic, per-example penalty": GanArm("batch", "batch", penalty="frozen"),
    "BN critic, joint batches, per-example penalty": GanArm("batch", "batch", joint=True, penalty="frozen"),
    "no-norm critic, no penalty": GanArm("batch", "none", gp_weight=0.0),
    "conv, no-norm critic": GanArm("batch", "none", conv=True),
    "conv, LN critic": GanArm("batch", "layer", conv=True),
    "conv, BN critic": GanArm("batch", "batch", conv=True),
    "conv, BN critic, DCGAN-style": GanArm("batch", "batch", first_norm=False, conv=True),
}
"""Chapter 10's WGAN-GP settings by name (the MLP generator has BatchNorm unless said)."""

CHAPTER_GAN = dict(steps=150, n_critic=5, batch_size=64, lr=1e-3, betas=(0.0, 0.9), eval_every=15)
"""The chapter's WGAN-GP budget: 150 generator steps at 10x the paper's learning rate."""
PAPER_GAN = dict(steps=1000, n_critic=5, batch_size=64, lr=1e-4, betas=(0.0, 0.9), eval_every=100)
"""The paper's learning rate and Adam betas (Algorithm 1), for 1,000 generator steps (the notebook's FULL budget)."""
GEN_HIDDEN, CRIT_HIDDEN, CONV_CHANNELS = (64, 128), (64, 64), (8, 16)
CHAPTER_VAE = dict(steps=800, batch_size=64, lr=1e-3)
"""The chapter's VAE budget: 800 Adam steps on batches of 64 at 1e-3."""
LONG_VAE = dict(steps=5000, batch_size=64, lr=1e-3, every=200)
"""The stored longer VAE run: the same recipe for 5,000 steps (the notebook's FULL), held-out ELBO every 200 (so step 800 is the chapter's budget)."""
VAE_RATES = (3e-4, 1e-3, 3e-3)
"""The stored VAE rate study's grid of Adam learning rates (each norm's rate chosen on validation)."""


def build_gan(arm: GanArm, seeds: Sequence[int], gen_hidden: Sequence[int] = GEN_HIDDEN,
              crit_hidden: Sequence[int] = CRIT_HIDDEN, channels: tuple[int, int] = CONV_CHANNELS) -> tuple[nn.Module, nn.Module]:
    """The stacked generator and critic of ``arm`` for every seed: MLPs (:func:`generator`,
    :func:`critic`) or the convolutional pair (:func:`conv_generator`, :func:`conv_critic`)."""
    if not isinstance(arm, GanArm):
        raise TypeError(f"arm must be a GanArm, got {type(arm).__name__}")
    if arm.conv:
        return conv_generator(arm.gen_norm, seeds, channels), conv_critic(arm.crit_norm, seeds, channels, arm.first_norm)
    return generator(arm.gen_norm, seeds, hidden=gen_hidden), critic(arm.crit_norm, seeds, crit_hidden, first_norm=arm.first_norm)


def train_arm(arm: GanArm, seeds: Sequence[int], data: torch.Tensor, judge: Judge, settings: dict | None = None,
              **sizes: object) -> tuple[nn.Module, nn.Module, GANHistory]:
    """Build ``arm`` for every seed (:func:`build_gan`, ``sizes`` passed on) on ``data``'s
    device and train it with :func:`train_wgan_gp` on ``data (N, 64)`` in ``[-1, 1]`` with
    ``settings`` (default :data:`CHAPTER_GAN`), ``judge``'s scores of 360 samples at every
    evaluation. Returns ``(gen, crit, history)``."""
    gen, crit = (m.to(data.device) for m in build_gan(arm, seeds, **sizes))
    history = train_wgan_gp(gen, crit, data, gp_weight=arm.gp_weight, joint=arm.joint, penalty=arm.penalty,
                            evaluate=judge.evaluator(), **(CHAPTER_GAN if settings is None else settings))
    return gen, crit, history


@dataclass
class StoredGenerative:
    """Chapter 10's runs as ``benchmarks/generative.py`` stored them.

    ``gan[(study, arm)]``: ``{"steps": (T,), "fd", "confidence", "classes": (seeds, T)}``, the
    judge's scores at every evaluation, ``study`` ``"chapter"`` (:data:`CHAPTER_GAN`) or
    ``"paper"`` (:data:`PAPER_GAN`); ``vae[norm]``: the held-out ELBO in eval mode after
    :data:`CHAPTER_VAE`'s training, ``(seeds,)`` nats per digit; ``seeds``; ``provenance``: the
    file's ``#`` lines. ``vae_long[norm]`` (empty where the folder has no
    ``generative-vae-long.csv``): the :data:`LONG_VAE` run, ``{"steps": (T,), "heldout": (seeds,
    T)`` (eval mode at every checkpoint), ``"train_objective"`` (mean training-mode ELBO of the
    last 200 steps), ``"train_eval"`` (the training digits in eval mode), ``"heldout_batch"``
    (the held-out digits as one batch with its own statistics)``: (seeds,)}``, nats per digit;
    ``vae_long_provenance``: that file's ``#`` lines. ``vae_rates[norm][lr]`` (empty where the
    folder has no ``generative-vae-rates.csv``): each norm at each rate of :data:`VAE_RATES`,
    trained for :data:`LONG_VAE`'s steps on the fit part of the training digits,
    ``{"steps": (T,), "validation", "test": (seeds, T)`` (eval-mode ELBO at every checkpoint of
    the validation part and the test digits), ``"train_objective"`` (mean training-mode ELBO of
    the last 200 steps), ``"train_eval"`` (the fit digits in eval mode)``: (seeds,)}``, nats per
    digit; ``vae_rates_provenance``: that file's ``#`` lines."""

    provenance: list[str]
    seeds: list[int]
    gan: dict[tuple[str, str], dict[str, np.ndarray]]
    vae: dict[str, np.ndarray]
    vae_long: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    vae_long_provenance: list[str] = field(default_factory=list)
    vae_rates: dict[str, dict[float, dict[str, np.ndarray]]] = field(default_factory=dict)
    vae_rates_provenance: list[str] = field(default_factory=list)

    def final_fd(self, arm: str, study: str = "chapter") -> np.ndarray:
        """The Fréchet distance at the last evaluation of ``arm`` in ``study``, per seed ``(seeds,)``."""
        if (study, arm) not in self.gan:
            raise ValueError(f"no stored run ({study!r}, {arm!r}); stored: {sorted(self.gan)}")
        return self.gan[(study, arm)]["fd"][:, -1]


def stored_generative(folder: str | None = None) -> StoredGenerative:
    """Read ``generative-gan.csv`` and ``generative-vae.csv`` as ``benchmarks/generative.py``
    wrote them, from ``lnbook/results/`` (installed with the package) or ``folder``; checks
    that every (study, arm) has every seed at every evaluation step."""
    import csv
    import io
    from importlib import resources
    from pathlib import Path

    def read(name: str) -> tuple[list[str], list[dict[str, str]]]:
        text = (Path(folder) / name).read_text() if folder is not None else \
            resources.files("lnbook").joinpath("results", name).read_text()
        head = [line[2:] for line in text.splitlines() if line.startswith("# ")]
        body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
        return head, list(csv.DictReader(io.StringIO(body)))

    provenance, gan_rows = read("generative-gan.csv")
    _, vae_rows = read("generative-vae.csv")
    seeds = sorted({int(r["seed"]) for r in gan_rows})
    gan: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    for key in sorted({(r["study"], r["arm"]) for r in gan_rows}):
        rows = [r for r in gan_rows if (r["study"], r["arm"]) == key]
        steps = sorted({int(r["step"]) for r in rows})
        table = {(int(r["seed"]), int(r["step"])): r for r in rows}
        if len(table) != len(rows) or set(table) != {(s, t) for s in seeds for t in steps}:
            raise ValueError(f"stored run {key} is incomplete or has duplicates: expected seeds {seeds} x steps {steps}")
        gan[key] = {"steps": np.array(steps)} | {m: np.array([[float(table[(s, t)][m]) for t in steps] for s in seeds])
                                                 for m in ("fd", "confidence", "classes")}
    vae_out: dict[str, np.ndarray] = {}
    for norm in sorted({r["norm"] for r in vae_rows}):
        by_seed = {int(r["seed"]): float(r["heldout_elbo"]) for r in vae_rows if r["norm"] == norm}
        if sorted(by_seed) != seeds:
            raise ValueError(f"stored VAE {norm!r} has seeds {sorted(by_seed)}, expected {seeds}")
        vae_out[norm] = np.array([by_seed[s] for s in seeds])
    long_out: dict[str, dict[str, np.ndarray]] = {}
    long_head: list[str] = []
    exists = (Path(folder) / "generative-vae-long.csv").exists() if folder is not None else \
        resources.files("lnbook").joinpath("results", "generative-vae-long.csv").is_file()
    if exists:
        long_head, long_rows = read("generative-vae-long.csv")
        for norm in sorted({r["norm"] for r in long_rows}):
            rows = [r for r in long_rows if r["norm"] == norm]
            table = {(r["measure"], int(r["seed"]), int(r["step"])): float(r["value"]) for r in rows}
            steps = sorted({int(r["step"]) for r in rows if r["measure"] == "heldout"})
            final = max(steps, default=0)
            expected = {("heldout", s, t) for s in seeds for t in steps} | \
                {(m, s, final) for m in ("train_objective", "train_eval", "heldout_batch") for s in seeds}
            if not steps or len(table) != len(rows) or set(table) != expected:
                raise ValueError(f"stored long VAE {norm!r} is incomplete or has duplicates: expected seeds {seeds}, "
                                 f"checkpoints {steps} and the three final measures")
            long_out[norm] = {"steps": np.array(steps),
                              "heldout": np.array([[table[("heldout", s, t)] for t in steps] for s in seeds])} | \
                {m: np.array([table[(m, s, final)] for s in seeds]) for m in ("train_objective", "train_eval", "heldout_batch")}
    rates_out: dict[str, dict[float, dict[str, np.ndarray]]] = {}
    rates_head: list[str] = []
    exists = (Path(folder) / "generative-vae-rates.csv").exists() if folder is not None else \
        resources.files("lnbook").joinpath("results", "generative-vae-rates.csv").is_file()
    if exists:
        rates_head, rate_rows = read("generative-vae-rates.csv")
        for norm, lr in sorted({(r["norm"], float(r["lr"])) for r in rate_rows}):
            rows = [r for r in rate_rows if r["norm"] == norm and float(r["lr"]) == lr]
            table = {(r["measure"], int(r["seed"]), int(r["step"])): float(r["value"]) for r in rows}
            steps = sorted({int(r["step"]) for r in rows if r["measure"] == "validation"})
            final = max(steps, default=0)
            expected = {(m, s, t) for m in ("validation", "test") for s in seeds for t in steps} | \
                {(m, s, final) for m in ("train_objective", "train_eval") for s in seeds}
            if not steps or len(table) != len(rows) or set(table) != expected:
                raise ValueError(f"stored VAE rate run ({norm!r}, {lr:g}) is incomplete or has duplicates: expected "
                                 f"seeds {seeds}, checkpoints {steps} and the two final measures")
            rates_out.setdefault(norm, {})[lr] = {"steps": np.array(steps)} | \
                {m: np.array([[table[(m, s, t)] for t in steps] for s in seeds]) for m in ("validation", "test")} | \
                {m: np.array([table[(m, s, final)] for s in seeds]) for m in ("train_objective", "train_eval")}
    return StoredGenerative(provenance, seeds, gan, vae_out, long_out, long_head, rates_out, rates_head)
