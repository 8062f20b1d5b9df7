"""NumPy reference implementations of LayerNorm and BatchNorm, forward and backward.

These are the definitions the rest of the book is checked against: plain array code,
computed in float64 unless told otherwise. Both normalize the last axis's features:

* LayerNorm normalizes each position (each row of the last axis) over its H features.
* BatchNorm normalizes each feature (each column of the last axis) over every other axis,
  leaving padded positions out when a ``mask`` is given.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ._checks import check_eps, check_mask_shape, check_shape, describe


class LayerNormCache(NamedTuple):
    """What ``layernorm_backward`` needs: the normalized input, 1/σ per row and the gain."""

    xhat: np.ndarray  # (..., H)
    rstd: np.ndarray  # (..., 1)
    gamma: np.ndarray  # (H,)


class BatchNormCache(NamedTuple):
    """What ``batchnorm_backward`` needs; ``real`` is True on real positions, False on padding."""

    xhat: np.ndarray  # (..., C), zero at padded positions
    rstd: np.ndarray  # (C,)
    gamma: np.ndarray  # (C,)
    real: np.ndarray  # (..., 1) bool
    count: int  # number of real positions


def _as_float_array(a: ArrayLike, name: str, dtype: DTypeLike) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name} must be an array of floating-point numbers, got dtype {arr.dtype}")
    return arr.astype(dtype, copy=False)


def _inputs(x, gamma, beta, eps, dtype):
    x = _as_float_array(x, "x", dtype)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last (feature) axis, got shape {x.shape}")
    gamma = _as_float_array(gamma, "gamma", dtype)
    beta = _as_float_array(beta, "beta", dtype)
    check_shape(gamma.shape, x.shape[-1:], "gamma")
    check_shape(beta.shape, x.shape[-1:], "beta")
    return x, gamma, beta, check_eps(eps)


def layernorm_forward(
    x: ArrayLike, gamma: ArrayLike, beta: ArrayLike, eps: float = 1e-5, *, dtype: DTypeLike = np.float64
) -> tuple[np.ndarray, LayerNormCache]:
    """LayerNorm over the last axis: ``y = gamma * (x - mean) / sqrt(var + eps) + beta``.

    Args:
        x: ``(..., H)``; each of the ``...`` positions is normalized over its H features.
        gamma, beta: ``(H,)`` gain and bias.
        eps: added to the (biased) variance, > 0.
        dtype: the floating-point type to compute in.

    Returns:
        ``y`` with ``x``'s shape, and the cache for :func:`layernorm_backward`.
        A row containing NaN gives NaN in that row only.
    """
    x, gamma, beta, eps = _inputs(x, gamma, beta, eps, dtype)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * rstd
    return gamma * xhat + beta, LayerNormCache(xhat, rstd, gamma)


def layernorm_backward(dy: ArrayLike, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`layernorm_forward` given ``dy = dL/dy`` of shape ``(..., H)``.

    Returns ``(dx, dgamma, dbeta)`` with shapes ``(..., H)``, ``(H,)``, ``(H,)``:
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dy * gamma``, means over H.
    """
    return layernorm_backward_xhat(dy, *cache)


def layernorm_backward_xhat(
    dy: ArrayLike, xhat: np.ndarray, rstd: np.ndarray, gamma: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm's backward from the normalized input ``xhat (..., H)`` and ``rstd (..., 1)``.

    However ``xhat`` was kept (saved, recomputed from x, mean and rstd with
    :func:`xhat_from_input`, or recovered from the output with :func:`xhat_from_output`),
    this is the whole backward pass. Returns ``(dx, dgamma, dbeta)``.
    """
    dy = _as_float_array(dy, "dy", xhat.dtype)
    check_shape(dy.shape, xhat.shape, "dy", "the shape of xhat")
    lead = tuple(range(dy.ndim - 1))
    g = dy * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead)


def xhat_from_input(x: np.ndarray, mean: np.ndarray, rstd: np.ndarray) -> np.ndarray:
    """Recompute ``xhat = (x - mean) * rstd`` from the saved input and statistics (..., 1)."""
    return (x - mean) * rstd


def xhat_from_output(y: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Recover ``xhat = (y - beta) / gamma`` from the output, as memory-saving kernels do.

    Exact in exact arithmetic; the rounding error of y is divided by gamma, so it fails
    where a gain is near zero (and gives inf or NaN where it is zero).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return (y - beta) / gamma


def batchnorm_forward(
    x: ArrayLike,
    gamma: ArrayLike,
    beta: ArrayLike,
    eps: float = 1e-5,
    mask: ArrayLike | None = None,
    *,
    dtype: DTypeLike = np.float64,
) -> tuple[np.ndarray, BatchNormCache]:
    """Training-mode BatchNorm: each feature (last axis) normalized over all other axes.

    Args:
        x: ``(..., C)``, for example ``(B, C)`` or a padded sequence batch ``(B, T, C)``.
        gamma, beta: ``(C,)`` gain and bias.
        eps: added to the (biased) variance, > 0.
        mask: boolean, ``x.shape[:-1]``, True on real positions. Padded positions are left out
            of the statistics (whatever they hold), their output is 0 and they get zero
            gradient. ``None``: every position is real.
        dtype: the floating-point type to compute in.

    Returns:
        ``y`` with ``x``'s shape, and the cache for :func:`batchnorm_backward`.
        A NaN at a real position of feature c gives NaN in all of column c.
    """
    x, gamma, beta, eps = _inputs(x, gamma, beta, eps, dtype)
    if mask is None:
        real = np.ones(x.shape[:-1] + (1,), dtype=bool)
    else:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True on real positions), got dtype {mask.dtype}")
        check_mask_shape(mask.shape, x.shape)
        real = mask[..., None]
    count = int(real.sum())
    if count == 0:
        raise ValueError(
            f"mask (or x with shape {x.shape}) leaves the features with no real positions to "
            "compute batch statistics over; at least one position must be real"
        )
    lead = tuple(range(x.ndim - 1))
    mean = np.where(real, x, 0.0).sum(axis=lead) / count
    xc = np.where(real, x - mean, 0.0)
    rstd = 1.0 / np.sqrt((xc**2).sum(axis=lead) / count + eps)
    xhat = xc * rstd
    return np.where(real, gamma * xhat + beta, 0.0), BatchNormCache(xhat, rstd, gamma, real, count)


def batchnorm_backward(dy: ArrayLike, cache: BatchNormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`batchnorm_forward` given ``dy`` of shape ``(..., C)``.

    Returns ``(dx, dgamma, dbeta)`` with shapes ``(..., C)``, ``(C,)``, ``(C,)``; ``dx`` is zero
    at padded positions. With ``g = dy * gamma`` and sums over the n real positions,
    ``dx = rstd * (g - sum(g)/n - xhat * sum(g * xhat)/n)``.
    """
    xhat, rstd, gamma, real, count = cache
    dy = _as_float_array(dy, "dy", xhat.dtype)
    check_shape(dy.shape, xhat.shape, "dy", "the shape of x")
    lead = tuple(range(dy.ndim - 1))
    dy = np.where(real, dy, 0.0)
    g = dy * gamma
    dx = rstd * (g - g.sum(axis=lead) / count - xhat * (g * xhat).sum(axis=lead) / count)
    return np.where(real, dx, 0.0), (dy * xhat).sum(axis=lead), dy.sum(axis=lead)


def layernorm_variant(
    x: ArrayLike, eps: float = 1e-5, *, unbiased: bool = False, eps_outside_sqrt: bool = False
) -> np.ndarray:
    """LayerNorm's normalization step (no gain or bias) as variants found in real code do it.

    ``unbiased``: divide the squared deviations by H - 1 instead of H (what ``x.std()`` does
    by default in PyTorch). ``eps_outside_sqrt``: ``(x - mean) / (std + eps)`` instead of
    ``(x - mean) / sqrt(var + eps)``. Both False is ``torch.nn.LayerNorm``. Float64, last axis.
    """
    x = _as_float_array(x, "x", np.float64)
    eps = check_eps(eps)
    h = x.shape[-1]
    if unbiased and h < 2:
        raise ValueError(f"the unbiased variance needs at least 2 features, got {h}")
    centered = x - x.mean(axis=-1, keepdims=True)
    var = (centered**2).sum(axis=-1, keepdims=True) / (h - 1 if unbiased else h)
    return centered / (np.sqrt(var) + eps) if eps_outside_sqrt else centered / np.sqrt(var + eps)


def rmsnorm_forward(x: ArrayLike, gamma: ArrayLike, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm (Zhang & Sennrich, 2019) over the last axis, in float64:
    ``y = gamma * x / sqrt(mean(x**2) + eps)``: no mean subtracted, no bias. x ``(..., H)``, gamma ``(H,)``."""
    x, gamma, _, eps = _inputs(x, gamma, np.zeros(np.shape(gamma)), eps, np.float64)
    return gamma * x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)


def dyt_forward(x: ArrayLike, alpha: float, gamma: ArrayLike, beta: ArrayLike) -> np.ndarray:
    """Dynamic Tanh (Zhu et al., 2025), in float64: ``y = gamma * tanh(alpha * x) + beta``.

    No statistics at all: each element is squashed on its own. x ``(..., H)``, gamma and beta ``(H,)``.
    """
    x, gamma, beta, _ = _inputs(x, gamma, beta, 1.0, np.float64)
    return gamma * np.tanh(float(alpha) * x) + beta


def max_relative_error(a: ArrayLike, b: ArrayLike) -> float:
    """The largest absolute difference of ``a`` from the reference ``b``, over ``b``'s largest
    magnitude (same shapes): one number per comparison, insensitive to entries near zero."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or b.size == 0:
        raise ValueError(f"a and b must have the same non-empty shape, got {a.shape} and {b.shape}")
    scale = np.abs(b).max()
    if scale == 0:
        raise ValueError("b (the reference) is all zeros: a relative error is undefined")
    return float(np.abs(a - b).max() / scale)


def finite_difference_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences ``(f(x + h e_i) - f(x - h e_i)) / 2h`` of a scalar function f.

    ``x`` is float64 of any shape; the result has its shape. One pair of calls per element.
    """
    x = np.array(x, dtype=np.float64)
    grad = np.empty_like(x)
    flat, g = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        hi = f(x)
        flat[i] = old - h
        lo = f(x)
        flat[i] = old
        g[i] = (hi - lo) / (2 * h)
    return grad


# ---------------------------------------------------------------------------------------
# Variance in low precision. Each algorithm runs with every intermediate result rounded to
# the working precision, as a kernel that accumulates in that precision would.

PRECISIONS = ("float64", "float32", "float16", "bfloat16")


def round_to(x: ArrayLike, precision: str) -> np.ndarray:
    """Round to ``precision`` (one of ``PRECISIONS``), returned as an array that holds it.

    bfloat16, which NumPy lacks, is float32 rounded to its top 16 bits (8 exponent bits, 7
    mantissa bits), to nearest with ties to even, as hardware does. A float64 input goes
    through float32 first (as ``tensor.to(torch.bfloat16)`` does), so a value within one
    float32 rounding of a tie can round the other way than direct rounding would.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {describe(precision)}")
    if precision != "bfloat16":
        return np.asarray(x, dtype=precision)
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    bits = x32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x32), out, x32)  # inf and NaN pass through


class WelfordState(NamedTuple):
    """Running statistics of a stream: count, mean and M2 (the sum of squared deviations)."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray


def welford(x: ArrayLike, precision: str = "float64") -> WelfordState:
    """Welford's streaming update over the last axis of ``x (..., N)``, one element at a time.

    ``mean += (x_k - mean) / k`` and ``M2 += (x_k - mean_old) * (x_k - mean_new)``; the
    variance is ``M2 / N``. Every intermediate is rounded to ``precision``.
    """
    r = lambda a: round_to(a, precision)  # noqa: E731
    x = r(x)
    mean, m2 = r(np.zeros(x.shape[:-1])), r(np.zeros(x.shape[:-1]))
    for k in range(x.shape[-1]):
        delta = r(x[..., k] - mean)
        mean = r(mean + r(delta / (k + 1)))
        m2 = r(m2 + r(delta * r(x[..., k] - mean)))
    return WelfordState(np.full(x.shape[:-1], x.shape[-1]), mean, m2)


def welford_merge(a: WelfordState, b: WelfordState, precision: str = "float64") -> WelfordState:
    """Combine the statistics of two disjoint parts (Chan et al., 1979), as kernels that
    split a row across threads do: ``M2 = M2_a + M2_b + delta^2 * n_a * n_b / n``."""
    r = lambda v: round_to(v, precision)  # noqa: E731
    n = a.count + b.count
    delta = r(b.mean - a.mean)
    mean = r(a.mean + r(delta * r(b.count / n)))
    m2 = r(r(a.m2 + b.m2) + r(r(delta * delta) * r(a.count * b.count / n)))
    return WelfordState(n, mean, m2)


def welford_parts(x: ArrayLike, parts: int, precision: str = "float64") -> np.ndarray:
    """The variance of ``x (..., N)`` over its last axis by Welford over each of ``parts`` equal
    parts, the states then merged pairwise as a tree with :func:`welford_merge` (as a kernel
    that splits a row across ``parts`` threads). ``parts`` must be a power of 2 dividing N."""
    x = np.asarray(x, dtype=np.float64)
    n_total = x.shape[-1] if x.ndim else 0
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)) or parts < 1 or parts & (parts - 1):
        raise ValueError(f"parts must be a power of 2, got {describe(parts)}")
    if n_total % parts:
        raise ValueError(f"parts ({parts}) must divide the row length {n_total}")
    n = n_total // parts
    states = [welford(x[..., i * n : (i + 1) * n], precision) for i in range(parts)]
    while len(states) > 1:
        states = [welford_merge(a, b, precision) for a, b in zip(states[::2], states[1::2])]
    return round_to(states[0].m2 / states[0].count, precision)


def welford_lanes(x: ArrayLike, lanes: int = 8, chunk: int = 16, precision: str = "float64") -> np.ndarray:
    """The variance of ``x (..., N)`` over its last axis as a vectorized CPU kernel computes it
    (a model of ATen's ``RowwiseMoments``): element ``j`` goes to lane ``j % lanes``; each lane
    runs Welford over blocks of ``chunk`` of its elements; each lane's block states are merged
    in order, then the lanes' states one after another, all with :func:`welford_merge`.
    ``lanes`` (a power of 2) times ``chunk`` must divide N."""
    x = np.asarray(x, dtype=np.float64)
    n_total = x.shape[-1] if x.ndim else 0
    if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of 2, got {describe(lanes)}")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {describe(chunk)}")
    if n_total == 0 or n_total % (lanes * chunk):
        raise ValueError(f"lanes * chunk ({lanes * chunk}) must divide the row length {n_total}")
    blocks = n_total // (lanes * chunk)
    states = []
    for lane in range(lanes):
        per_lane = x[..., lane::lanes]  # this lane's elements, in order
        state = welford(per_lane[..., :chunk], precision)
        for k in range(1, blocks):
            state = welford_merge(state, welford(per_lane[..., k * chunk : (k + 1) * chunk], precision), precision)
        states.append(state)
    total = states[0]
    for state in states[1:]:  # the lanes, one after another, as the kernel's final loop does
        total = welford_merge(total, state, precision)
    return round_to(total.m2 / total.count, precision)


SIGNIFICAND_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


def storage_step(c: float, precision: str) -> float:
    """The spacing of ``precision``'s values near ``c >= 0``: how finely it stores ``c + N(0, 1)``."""
    if precision not in SIGNIFICAND_BITS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {describe(precision)}")
    if c < 0:
        raise ValueError(f"c must be >= 0, got {describe(c)}")
    return float(2.0 ** (np.floor(np.log2(c)) - SIGNIFICAND_BITS[precision] + 1)) if c > 0 else 0.0


def variance_error(
    rows: ArrayLike, c: float, method: str, precision: str, accumulate: str | None = None
) -> float:
    """The largest relative error, over the rows of ``rows (R, N)`` shifted by ``c``, of
    :func:`variance` against the float64 variance of the *stored* (rounded) inputs, so that it
    is the algorithm's error alone. NaN where the storage step near ``c`` exceeds the rows'
    spread (a few levels are left, not a sample) or a stored row is constant."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"rows must be 2-D (R, N), got shape {rows.shape}")
    x = c + rows
    truth = round_to(x, precision).astype(np.float64).var(axis=-1)
    if storage_step(c, precision) > rows.std() or truth.min() == 0:
        return float("nan")
    with np.errstate(all="ignore"):
        est = variance(x, method, precision, accumulate).astype(np.float64)
        return float(np.max(np.abs(est - truth) / truth))


def variance(
    x: ArrayLike, method: str = "two_pass", precision: str = "float64", accumulate: str | None = None
) -> np.ndarray:
    """The biased variance of ``x (..., N)`` over its last axis, computed by ``method``:

    * ``"one_pass"``: ``E[x^2] - E[x]^2`` from one sweep of running sums;
    * ``"two_pass"``: the mean first, then the mean squared deviation from it;
    * ``"welford"``: Welford's streaming update;
    * ``"welford_merge"``: Welford on each half of the row, then the two states merged.

    The input is first rounded to ``precision`` (how it is stored); sums then run element by
    element with every intermediate rounded to ``accumulate`` (default: ``precision``).
    Mixed-precision kernels store float16 or bfloat16 and accumulate in float32.
    """
    acc_p = accumulate or precision
    r = lambda a: round_to(a, acc_p)  # noqa: E731
    x = r(round_to(x, precision))
    n = x.shape[-1]
    if method in ("one_pass", "two_pass"):
        total = r(np.zeros(x.shape[:-1]))
        for k in range(n):
            total = r(total + x[..., k])
        mean = r(total / n)
        acc = r(np.zeros(x.shape[:-1]))
        for k in range(n):
            term = r(x[..., k] * x[..., k]) if method == "one_pass" else r(r(x[..., k] - mean) ** 2)
            acc = r(acc + term)
        return r(r(acc / n) - r(mean * mean)) if method == "one_pass" else r(acc / n)
    if method == "welford":
        state = welford(x, acc_p)
    elif method == "welford_merge":
        state = welford_merge(welford(x[..., : n // 2], acc_p), welford(x[..., n // 2 :], acc_p), acc_p)
    else:
        raise ValueError(f"method must be 'one_pass', 'two_pass', 'welford' or 'welford_merge', got {describe(method)}")
    return r(state.m2 / state.count)
