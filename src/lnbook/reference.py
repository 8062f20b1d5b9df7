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

from ._checks import check_eps, check_mask_shape, check_shape


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
    xhat, rstd, gamma = cache
    dy = _as_float_array(dy, "dy", xhat.dtype)
    check_shape(dy.shape, xhat.shape, "dy", "the shape of x")
    lead = tuple(range(dy.ndim - 1))
    g = dy * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead)


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
