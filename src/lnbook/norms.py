"""Normalization layers as ``torch.nn.Module``s (LayerNorm, RMSNorm, DyT, DetachNorm, AdaNorm,
GroupNorm and the batch norms Part I measures), and the table that names them.

Every model of the package takes its norm by name, from one table (:data:`NORMS`), builds it
with :func:`norm_layer` and calls it with :func:`apply_norm`, which hands a norm the mask of
real positions and the time step when its ``forward`` takes them (``mask``, ``t``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._checks import (
    check_bool,
    check_choice,
    check_eps,
    check_float_tensor,
    check_int,
    check_mask_shape,
    check_normalized_shape,
    check_number,
    check_positive_int,
    check_trailing,
)
from .functional import all_reduce_sum, layer_norm


class NotScriptable:
    """Mixin for modules TorchScript cannot compile (an ``autograd.Function``, Python argument
    checks): ``torch.jit.script`` on them, or on a model holding them, raises an error that says
    so and names the supported paths, instead of TorchScript's parse error."""

    def __prepare_scriptable__(self) -> nn.Module:
        raise RuntimeError(
            f"{type(self).__module__}.{type(self).__name__} does not support TorchScript (torch.jit.script, "
            "deprecated by PyTorch): export with torch.export.export, compile with torch.compile, or use "
            "torch.nn's modules where TorchScript is required"
        )


class LayerNorm(NotScriptable, nn.Module):
    """LayerNorm over the trailing ``normalized_shape`` dimensions (Ba et al., 2016).

    Same constructor, parameters (``weight``, ``bias``) and state dict as
    :class:`torch.nn.LayerNorm`, so it stands in for it anywhere; the gradient comes from the
    hand-written backward of :func:`lnbook.functional.layer_norm`.

    Shapes: input ``(*, *normalized_shape)``, output the same.
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        self.eps = check_eps(eps)
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, **factory))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:
            self.bias = nn.Parameter(torch.zeros(self.normalized_shape, **factory))
        else:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        """Gain 1 and bias 0: at initialization the layer only standardizes."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


def _statistics_input(x: torch.Tensor, normalized_shape: tuple[int, ...]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``x`` checked to end with ``normalized_shape``, in float32 if it is float16 or bfloat16
    (the precision of the statistics), and the dimensions to normalize over."""
    check_float_tensor(x, "x")
    check_trailing(tuple(x.shape), normalized_shape)
    return (x.float() if x.dtype in (torch.float16, torch.bfloat16) else x), tuple(range(-len(normalized_shape), 0))


class RMSNorm(NotScriptable, nn.Module):
    """RMSNorm (Zhang & Sennrich, 2019): ``y = weight * x / sqrt(mean(x**2) + eps)``.

    LayerNorm without the mean subtraction and without a bias: each position is rescaled by
    the root mean square of its trailing ``normalized_shape`` elements. Statistics are
    computed in float32 for float16 and bfloat16 inputs. Same parameter name (``weight``) as
    :class:`torch.nn.RMSNorm`. Shapes: input ``(*, *normalized_shape)``, output the same.
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        self.eps = check_eps(eps)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf, dims = _statistics_input(x, self.normalized_shape)
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class DyT(NotScriptable, nn.Module):
    """Dynamic Tanh (Zhu et al., 2025): ``y = weight * tanh(alpha * x) + bias``.

    A drop-in replacement for a norm that computes no statistics: one learnable scalar
    ``alpha`` (initialized to ``alpha_init``) squashes every element, then a per-feature gain
    and, if ``bias``, a bias (their LLaMA models have none: ``weight * tanh(alpha * x)``).
    Shapes: input ``(*, *normalized_shape)``, output the same.
    """

    def __init__(self, normalized_shape: int | Sequence[int], alpha_init: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        self.alpha = nn.Parameter(torch.tensor(check_number(alpha_init, "alpha_init", "a finite number")))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape)) if check_bool(bias, "bias") else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor(x, "x")
        check_trailing(tuple(x.shape), self.normalized_shape)
        y = self.weight * torch.tanh(self.alpha * x)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, alpha={self.alpha.item():.3g}, bias={self.bias is not None}"


class DetachNorm(NotScriptable, nn.Module):
    """DetachNorm (Xu et al., 2019): LayerNorm whose mean and standard deviation are constants
    in the backward pass.

    The forward pass is LayerNorm's, ``y = weight * (x - mean) / sqrt(var + eps) + bias`` over
    the trailing ``normalized_shape`` elements (biased variance), but the statistics are
    computed from ``x.detach()``, so the gradient is only the first term of LayerNorm's:
    ``dL/dx = rstd * weight * dL/dy``. Xu et al. use it without gain and bias
    (``elementwise_affine=False``), and their code divides by the unbiased standard deviation
    plus eps. Statistics are computed in float32 for float16 and bfloat16 inputs.
    Shapes: input ``(*, *normalized_shape)``, output the same.
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        self.eps = check_eps(eps)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf, dims = _statistics_input(x, self.normalized_shape)
        var, mean = torch.var_mean(xf.detach(), dim=dims, correction=0, keepdim=True)
        y = (xf - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class AdaNorm(NotScriptable, nn.Module):
    """AdaNorm (Xu et al., 2019): LayerNorm with its gain and bias replaced by an adaptive scale.

    ``z = phi(y) * y`` with ``phi(y) = C * (1 - k * y)``, where ``y = (x - mean) / sqrt(var + eps)``
    is LayerNorm's output without gain or bias, over the trailing ``normalized_shape`` elements.
    ``phi(y)`` is detached: a constant in the backward pass, so ``dL/dx`` is LayerNorm's
    backward applied to ``phi(y) * dL/dz``, while ``y`` keeps the gradients of the mean and
    variance. No learnable parameters. ``phi`` averages ``C`` over a row (y has mean 0) and is
    positive while ``|y| < 1/k``. The paper's values: Xu et al. recommend ``k = 1/10`` (their
    code hard-codes it) and treat ``C`` as a hyperparameter; their released IWSLT14 De-En
    script (``lancopku/AdaNorm``, ``baseline-adanorm-km.sh``) runs ``C = 2`` (``adanorm_scale``),
    with 1.5, 1 and 0.8 left commented out; their code divides by the unbiased standard
    deviation plus eps. The defaults here, ``k = 0.1`` and ``C = 1``, are what the norm name
    ``"adanorm"`` builds; :func:`set_adanorm` sets other values on a built model.
    Shapes: input ``(*, *normalized_shape)``, output the same.
    """

    def __init__(self, normalized_shape: int | Sequence[int], k: float = 0.1, C: float = 1.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        self.k = check_number(k, "k", "a finite number >= 0", lambda v: v >= 0)
        self.C = check_number(C, "C", "a finite number > 0", lambda v: v > 0)
        self.eps = check_eps(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor(x, "x")
        check_trailing(tuple(x.shape), self.normalized_shape)
        y = nn.functional.layer_norm(x, self.normalized_shape, eps=self.eps)
        return self.C * (1 - self.k * y.detach()) * y

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, k={self.k}, C={self.C}, eps={self.eps}"


def set_adanorm(model: nn.Module, *, C: float, k: float = 0.1) -> nn.Module:
    """Set ``C`` and ``k`` on every :class:`AdaNorm` inside ``model`` (built with the norm name
    ``"adanorm"``, which takes ``C = 1``, ``k = 0.1``), in place; returns ``model``. E.g.
    ``set_adanorm(models.MLP(64, (64,), 10, "adanorm"), C=2.0)``: the ``C`` of Xu et al.'s
    released IWSLT script. AdaNorm has no parameters, so nothing else changes; a model stacked
    by :mod:`lnbook.seeds` afterwards keeps the values. Raises ``ValueError`` if ``model`` has no
    AdaNorm."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    C = check_number(C, "C", "a finite number > 0", lambda v: v > 0)
    k = check_number(k, "k", "a finite number >= 0", lambda v: v >= 0)
    found = [m for m in model.modules() if isinstance(m, AdaNorm)]
    if not found:
        raise ValueError("model has no AdaNorm (build it with norm='adanorm')")
    for m in found:
        m.C, m.k = C, k
    return model


def _check_mask(mask: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """A (*lead, 1) boolean tensor of real positions for x of shape (*lead, F); None if no mask."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean tensor (True on real positions), got {got}")
    check_mask_shape(tuple(mask.shape), tuple(x.shape))
    return mask.unsqueeze(-1)


def _masked_moments(
    x: torch.Tensor, real: torch.Tensor | None, process_group: object | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-feature mean, biased variance and count over the real positions of x (*lead, F).

    ``real`` is the (*lead, 1) mask (padded positions of x already hold zeros), or None when
    every position is real. With a process group, the sums are all-reduced (one
    differentiable collective forward, one backward) so that every replica normalizes with
    the statistics of the global batch.
    """
    f = x.shape[-1]
    if process_group is not None:
        xd = x.double()  # float64 sums: E[x^2] - E[x]^2 cancels badly in float32 at large means
        ones = torch.ones_like(xd) if real is None else real.to(xd.dtype).expand_as(xd)
        sums = torch.stack([ones, xd, xd * xd]).reshape(3, -1, f).sum(1)
        count, s1, s2 = all_reduce_sum(sums, process_group)
        n = int(count[0])
        mean64 = s1 / max(n, 1)
        mean, var = mean64.to(x.dtype), (s2 / max(n, 1) - mean64**2).clamp_min(0).to(x.dtype)
    elif real is None:
        n = x.numel() // f
        var, mean = torch.var_mean(x.reshape(-1, f), dim=0, correction=0)
    else:
        n = int(real.sum())
        mean = x.reshape(-1, f).sum(0) / max(n, 1)
        var = (torch.where(real, x - mean, 0.0) ** 2).reshape(-1, f).sum(0) / max(n, 1)
    if n < 2:
        raise ValueError(
            f"BatchNorm needs more than one real position per feature in training, got {n} "
            "(one value has no variance); use eval mode, a larger batch or fewer padded steps"
        )
    return mean, var, n


def _update_running(mean_buf, var_buf, mean, var, n: int, momentum: float) -> None:
    """running = (1 - momentum) * running + momentum * batch, with the unbiased variance."""
    with torch.no_grad():
        mean_buf.lerp_(mean.detach(), momentum)
        var_buf.lerp_(var.detach() * n / (n - 1), momentum)


class _BatchNormBase(NotScriptable, nn.Module):
    """Parameters, buffers and the affine output shared by the two batch norms below."""

    def __init__(self, num_features: int, eps: float, momentum: float, affine: bool, stats_shape: tuple) -> None:
        super().__init__()
        (self.num_features,) = check_normalized_shape(num_features)
        self.eps = check_eps(eps)
        self.momentum = check_number(momentum, "momentum", "a number in [0, 1]", lambda v: 0 <= v <= 1)
        self.affine = affine
        f = self.num_features
        self.weight = nn.Parameter(torch.ones(f)) if affine else None
        self.bias = nn.Parameter(torch.zeros(f)) if affine else None
        self.register_buffer("running_mean", torch.zeros(stats_shape + (f,)))
        self.register_buffer("running_var", torch.ones(stats_shape + (f,)))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def _check_input(self, x: torch.Tensor, ndim: str) -> None:
        check_float_tensor(x, "x")
        if x.ndim < 2 or x.shape[-1] != self.num_features:
            raise ValueError(f"x must have shape {ndim} with F = {self.num_features}, got {tuple(x.shape)}")

    def _real_input(self, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(x with zeros on padding, the (*lead, 1) mask or None): NaN or inf in the padding
        can then reach neither the statistics nor any gradient."""
        real = _check_mask(mask, x)
        return (x, None) if real is None else (torch.where(real, x, 0.0), real)

    def _affine(self, x, real, mean, var) -> torch.Tensor:
        y = (x - mean) * torch.rsqrt(var + self.eps)
        if self.affine:
            y = y * self.weight + self.bias
        return y if real is None else torch.where(real, y, 0.0)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class MaskedBatchNorm1d(_BatchNormBase):
    """BatchNorm over the real positions of a padded batch (Ioffe & Szegedy, 2015).

    Input ``(*lead, F)``, e.g. ``(B, F)`` or a padded sequence batch ``(B, T, F)``, with an
    optional boolean ``mask`` of shape ``lead``, True on real positions. Each feature is
    normalized with the mean and biased variance of its real positions; padded positions
    are left out of the statistics (whatever they hold) and their output is 0. ``mask=None``
    counts every position as real: on a padded batch that is the padding-polluted BatchNorm.

    Train and eval behave as ``nn.BatchNorm1d`` (whose parameter and buffer names it keeps):
    training normalizes with batch statistics and moves ``running_mean``/``running_var``
    (unbiased) towards them by ``momentum``; eval uses the running statistics. Training with
    a single real position raises, as torch does. With ``process_group``, the statistics
    are those of the global batch across data-parallel replicas (torch's ``SyncBatchNorm``
    runs on GPUs only).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        process_group: object | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, ())
        self.process_group = process_group

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, "(*lead, F)")
        x, real = self._real_input(x, mask)
        if not self.training:
            return self._affine(x, real, self.running_mean, self.running_var)
        mean, var, n = _masked_moments(x, real, self.process_group)
        _update_running(self.running_mean, self.running_var, mean, var, n, self.momentum)
        self.num_batches_tracked += 1
        return self._affine(x, real, mean, var)


class TimeStepBatchNorm(_BatchNormBase):
    """BatchNorm with separate statistics for each time step (Cooijmans et al., 2017).

    Step t of a sequence is normalized with the batch statistics of step t in training, and
    with step t's own running averages in eval. Gain and bias are shared by all steps. At
    inference, steps at or beyond ``max_steps`` reuse the statistics of the last trained step
    ``max_steps - 1``, as that paper does; training on them raises. At a step where the
    ``mask`` leaves fewer than two real sequences (the tail of a padded batch), batch
    statistics do not exist: training then normalizes with that step's running statistics
    and leaves them unchanged. This fallback is the mask's: without a ``mask`` every row is a
    real sequence, and a training batch of one (``B = 1``) raises instead of falling back,
    while the same batch with an all-True mask takes the fallback (a fresh module then
    returns its input divided by sqrt(1 + eps), as its running statistics are still mean 0 and
    variance 1).

    Call with ``x`` of shape ``(B, F)`` and the step ``t`` (inside a recurrence), or with a
    whole sequence batch ``(B, T, F)`` and ``t=None``. ``mask`` has ``x``'s shape without F.
    Buffers: ``running_mean`` and ``running_var`` of shape ``(max_steps, F)``.
    """

    def __init__(self, num_features: int, max_steps: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True) -> None:
        check_positive_int(max_steps, "max_steps")
        super().__init__(num_features, eps, momentum, affine, (max_steps,))
        self.max_steps = max_steps

    def forward(self, x: torch.Tensor, t: int | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        if t is None:
            self._check_input(x, "(B, T, F) when t is None")
            if x.ndim != 3:
                raise ValueError(f"x must have shape (B, T, F) when t is None, got {tuple(x.shape)}")
            _check_mask(mask, x)
            steps = [self._step(x[:, s], s, None if mask is None else mask[:, s]) for s in range(x.shape[1])]
            return torch.stack(steps, dim=1)
        self._check_input(x, "(B, F) for one step t")
        if x.ndim != 2:
            raise ValueError(f"x must have shape (B, F) for one step t, got {tuple(x.shape)}")
        return self._step(x, t, mask)

    def _step(self, x: torch.Tensor, t: int, mask: torch.Tensor | None) -> torch.Tensor:
        check_int(t, "t", 0, "a non-negative int (the time step)")
        x, real = self._real_input(x, mask)
        if not self.training:
            s = min(t, self.max_steps - 1)
            return self._affine(x, real, self.running_mean[s], self.running_var[s])
        if t >= self.max_steps:
            raise ValueError(f"t = {t} is beyond max_steps = {self.max_steps}; training needs statistics for every step")
        if real is None and x.shape[0] > 1:  # no padding: torch's fused kernel, which also
            if t == 0:  # updates step t's running statistics (unbiased variance, as ours)
                self.num_batches_tracked += 1
            # .data: the same memory under a separate version counter. The kernel saves its
            # running-statistics arguments for backward (unused in training mode), and later
            # steps update other rows of the buffers in place, which must not invalidate them.
            return nn.functional.batch_norm(
                x, self.running_mean.data[t], self.running_var.data[t], self.weight, self.bias, True, self.momentum, self.eps
            )
        if real is not None and int(real.sum()) < 2:
            return self._affine(x, real, self.running_mean[t], self.running_var[t])
        mean, var, n = _masked_moments(x, real)
        _update_running(self.running_mean[t], self.running_var[t], mean, var, n, self.momentum)
        if t == 0:
            self.num_batches_tracked += 1
        return self._affine(x, real, mean, var)


class UnmaskedBatchNorm1d(MaskedBatchNorm1d):
    """:class:`MaskedBatchNorm1d` that takes no mask: on a padded batch, the padding counts as
    data in its statistics (the padding-polluted BatchNorm chapter 02 measures)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class GroupNorm(NotScriptable, nn.GroupNorm):
    """``torch.nn.GroupNorm`` over the last dimension of any ``(*, F)`` input: each position's
    ``F`` features in ``num_groups`` groups of consecutive features, each group normalized
    alone (on ``(B, F)`` exactly ``torch.nn.GroupNorm``). Shapes: ``(*, F)`` -> the same."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor(x, "x")
        return super().forward(x.reshape(-1, x.shape[-1])).reshape(x.shape)


@dataclass(frozen=True)
class NormKind:
    """A row of :data:`NORMS`: ``build(size)`` makes the module over ``size`` features
    (``build(size, max_steps)`` for a norm over ``"step"``), and ``over`` says what its
    statistics are taken over: ``"example"`` (one position's features, whatever the leading
    shape), ``"batch"`` (every real position of the batch), ``"step"`` (the batch at one time
    step, kept for ``max_steps`` steps), ``"weights"`` (no layer: the model reparametrizes its
    weights) or ``"nothing"``."""

    build: Callable[..., nn.Module]
    over: str


NORMS: dict[str, NormKind] = {
    "none": NormKind(lambda size: nn.Identity(), "nothing"),
    "layer": NormKind(LayerNorm, "example"),
    "layer_simple": NormKind(lambda size: LayerNorm(size, elementwise_affine=False), "example"),
    "group4": NormKind(lambda size: GroupNorm(4, size), "example"),
    "rms": NormKind(RMSNorm, "example"),
    "dyt": NormKind(DyT, "example"),
    "detach": NormKind(DetachNorm, "example"),
    "adanorm": NormKind(lambda size: AdaNorm(size, k=0.1, C=1.0), "example"),  # set_adanorm for other C, k
    "batch": NormKind(MaskedBatchNorm1d, "batch"),
    "batch_unmasked": NormKind(UnmaskedBatchNorm1d, "batch"),
    "batch_per_step": NormKind(TimeStepBatchNorm, "step"),
    "weight": NormKind(lambda size: nn.Identity(), "weights"),
}
"""The norms by name: the one vocabulary of every model's ``norm`` setting."""

EXAMPLE_NORMS = tuple(name for name, kind in NORMS.items() if kind.over == "example")
"""The norms over one example's features, which every model accepts."""

ALIASES = {"layernorm": "layer", "rmsnorm": "rms", "batchnorm": "batch"}
"""Older spellings (chapter 06's) that :func:`check_norm` accepts."""

INSTANCE_REFUSED = (
    "norm='instance' has nothing to normalize over in a hidden vector (B, H): InstanceNorm "
    "normalizes each feature over the spatial positions of one example, and here each "
    "feature has a single value, so (x - mean) is 0 and the output is the bias for every "
    "input (torch.nn.InstanceNorm1d on (B, H, 1) raises; GroupNorm(H, H) returns the bias)"
)


def check_norm(norm: object, allowed: Sequence[str]) -> str:
    """The table name of ``norm`` (an alias resolved) if it is one of ``allowed``, else raise
    ``ValueError`` listing them (and saying why ``"instance"`` is not one)."""
    if not isinstance(norm, str):
        return check_choice(norm, allowed, "norm")  # raises, naming the type
    if norm == "instance":
        raise ValueError(INSTANCE_REFUSED)
    return check_choice(ALIASES.get(norm, norm), allowed, "norm")


def norm_layer(kind: str, size: int, *, max_steps: int | None = None, native: bool = False) -> nn.Module:
    """The module that :data:`NORMS` names ``kind`` (or an alias), over ``size`` features.

    ``max_steps``: the longest training sequence, which a norm over ``"step"`` needs (and the
    other norms ignore). ``native``: for ``"layer"`` and ``"layer_simple"``, torch's
    ``nn.LayerNorm`` (one fused kernel) instead of :class:`LayerNorm` (the book's hand-written
    backward). ``"layer_simple"`` is LayerNorm without gain and bias (Xu et al.'s
    "LayerNorm-simple"): it only standardizes.
    """
    name = check_norm(kind, tuple(NORMS))
    if name in ("layer", "layer_simple") and native:
        return nn.LayerNorm(size, elementwise_affine=name == "layer")
    if NORMS[name].over != "step":
        return NORMS[name].build(size)
    if max_steps is None:
        raise ValueError(f"norm={name!r} needs max_steps, the longest training sequence")
    return NORMS[name].build(size, max_steps)


@functools.cache
def _takes(cls: type) -> tuple[bool, bool]:
    parameters = inspect.signature(cls.forward).parameters
    return "mask" in parameters, "t" in parameters


def apply_norm(norm: nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None, t: int | None = None) -> torch.Tensor:
    """``norm(x)``, handing ``norm`` the ``mask`` of real positions (shape ``x.shape[:-1]``) if
    its ``forward`` takes a ``mask``, and the time step ``t`` if it takes a ``t``: the one way
    every model calls its norms. Shapes: ``x (*, F)`` -> the same."""
    takes_mask, takes_t = _takes(type(norm))
    options: dict[str, Any] = {}
    if takes_mask:
        options["mask"] = mask
    if takes_t:
        options["t"] = t
    return norm(x, **options)


def batch_statistics(model: nn.Module) -> bool:
    """Whether any module of ``model`` normalizes with the statistics of its batch in training
    (the batch norms here, or torch's)."""
    batch_norms = (_BatchNormBase, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
    return any(isinstance(m, batch_norms) for m in model.modules())


def swap_modules(model: nn.Module, replacement: Callable[[nn.Module], nn.Module | None]) -> int:
    """Replace, in place, every submodule of ``model`` for which ``replacement(module)`` returns
    a new module (a module it returns None for is searched further). The new module gets the
    old one's state dict, device and dtype. Returns how many modules were replaced."""
    count = 0
    for name, child in model.named_children():
        new = replacement(child)
        if new is None:
            count += swap_modules(child, replacement)
            continue
        reference = next(child.parameters(), None)
        if reference is not None:  # device and dtype first: loading into float32 would round float64 values
            new.to(device=reference.device, dtype=reference.dtype)
        new.load_state_dict(child.state_dict())
        setattr(model, name, new)
        count += 1
    return count


def replace_layer_norms(model: nn.Module) -> int:
    """Swap every ``torch.nn.LayerNorm`` inside ``model`` for :class:`LayerNorm`, in place.

    Settings, parameters, device and dtype are carried over, so outputs and gradients stay
    the same. Returns how many modules were replaced.
    """

    def ours(child: nn.Module) -> nn.Module | None:
        if not isinstance(child, nn.LayerNorm):
            return None
        return LayerNorm(child.normalized_shape, child.eps, child.elementwise_affine, child.bias is not None)

    return swap_modules(model, ours)
