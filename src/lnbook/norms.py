"""Normalization layers as ``torch.nn.Module``s: LayerNorm, RMSNorm, DyT, DetachNorm, AdaNorm,
and the batch norms Part I measures."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ._checks import check_eps, check_mask_shape, check_normalized_shape, check_positive_int, check_trailing, describe
from .functional import check_float_tensor, layer_norm


class LayerNorm(nn.Module):
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


class RMSNorm(nn.Module):
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
        check_float_tensor(x, "x")
        check_trailing(tuple(x.shape), self.normalized_shape)
        dims = tuple(range(-len(self.normalized_shape), 0))
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class DyT(nn.Module):
    """Dynamic Tanh (Zhu et al., 2025): ``y = weight * tanh(alpha * x) + bias``.

    A drop-in replacement for a norm that computes no statistics: one learnable scalar
    ``alpha`` (initialized to ``alpha_init``) squashes every element, then a per-feature gain
    and bias. Shapes: input ``(*, *normalized_shape)``, output the same.
    """

    def __init__(self, normalized_shape: int | Sequence[int], alpha_init: float = 0.5) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        if isinstance(alpha_init, bool) or not isinstance(alpha_init, (int, float)) or not math.isfinite(alpha_init):
            raise ValueError(f"alpha_init must be a finite number, got {describe(alpha_init)}")
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor(x, "x")
        check_trailing(tuple(x.shape), self.normalized_shape)
        return self.weight * torch.tanh(self.alpha * x) + self.bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, alpha={self.alpha.item():.3g}"


class DetachNorm(nn.Module):
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
        check_float_tensor(x, "x")
        check_trailing(tuple(x.shape), self.normalized_shape)
        dims = tuple(range(-len(self.normalized_shape), 0))
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        var, mean = torch.var_mean(xf.detach(), dim=dims, correction=0, keepdim=True)
        y = (xf - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class AdaNorm(nn.Module):
    """AdaNorm (Xu et al., 2019): LayerNorm with its gain and bias replaced by an adaptive scale.

    ``z = phi(y) * y`` with ``phi(y) = C * (1 - k * y)``, where ``y = (x - mean) / sqrt(var + eps)``
    is LayerNorm's output without gain or bias, over the trailing ``normalized_shape`` elements.
    ``phi(y)`` is detached: a constant in the backward pass, so ``dL/dx`` is LayerNorm's
    backward applied to ``phi(y) * dL/dz``, while ``y`` keeps the gradients of the mean and
    variance. No learnable parameters. ``phi`` averages ``C`` over a row (y has mean 0) and is
    positive while ``|y| < 1/k``. Xu et al. take ``k = 1/10`` and treat ``C`` as a
    hyperparameter (their IWSLT script uses 2); their code divides by the unbiased standard
    deviation plus eps. Shapes: input ``(*, *normalized_shape)``, output the same.
    """

    def __init__(self, normalized_shape: int | Sequence[int], k: float = 0.1, C: float = 1.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.normalized_shape = check_normalized_shape(normalized_shape)
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not (math.isfinite(k) and k >= 0):
            raise ValueError(f"k must be a finite number >= 0, got {describe(k)}")
        if isinstance(C, bool) or not isinstance(C, (int, float)) or not (math.isfinite(C) and C > 0):
            raise ValueError(f"C must be a finite number > 0, got {describe(C)}")
        self.k, self.C = float(k), float(C)
        self.eps = check_eps(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float_tensor(x, "x")
        check_trailing(tuple(x.shape), self.normalized_shape)
        y = nn.functional.layer_norm(x, self.normalized_shape, eps=self.eps)
        return self.C * (1 - self.k * y.detach()) * y

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, k={self.k}, C={self.C}, eps={self.eps}"


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
        from .parallel import all_reduce_sum

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


def _check_momentum(momentum: object) -> float:
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum <= 1:
        raise ValueError(f"momentum must be a number in [0, 1], got {describe(momentum)}")
    return float(momentum)


class _BatchNormBase(nn.Module):
    """Parameters, buffers and the affine output shared by the two batch norms below."""

    def __init__(self, num_features: int, eps: float, momentum: float, affine: bool, stats_shape: tuple) -> None:
        super().__init__()
        (self.num_features,) = check_normalized_shape(num_features)
        self.eps = check_eps(eps)
        self.momentum = _check_momentum(momentum)
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
    and leaves them unchanged.

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
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"t must be a non-negative int (the time step), got {describe(t)}")
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
        new.load_state_dict(child.state_dict())
        reference = next(child.parameters(), None)
        if reference is not None:
            new.to(device=reference.device, dtype=reference.dtype)
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
