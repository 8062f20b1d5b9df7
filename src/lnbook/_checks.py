"""Every argument check of the package, in one place.

Each check raises ``ValueError`` or ``TypeError`` with a message that names the argument
and says what was expected, so that bad input never silently produces wrong numbers.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Sequence

import torch

Shape = tuple[int, ...]


def describe(value: object) -> str:
    """A bounded description of ``value`` for an error message.

    A tensor or array (anything with ``shape`` and ``dtype`` but a number such as a NumPy
    scalar) is named by its type, shape and dtype; anything else by its ``repr``, cut short
    by ``reprlib`` when longer than 80 characters.
    """
    name = type(value).__name__
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, numbers.Number):
        return f"{name} of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else f"{name} {reprlib.repr(value)}"


def check_eps(eps: object) -> float:
    """Return ``eps`` as a float, or raise if it is not a finite number > 0."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a positive real number, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite number, got {describe(eps)}")
    return float(eps)


def check_int(value: object, name: str, minimum: int = 0, expected: str | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) >= ``minimum``, else raise ``ValueError``
    saying ``name`` must be ``expected`` (by default "a non-negative int", "a positive int" or
    "an int >= minimum")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        expected = expected or {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ValueError(f"{name} must be {expected}, got {describe(value)}")
    return int(value)


def check_positive_int(value: object, name: str) -> int:
    """Return ``value`` if it is an int >= 1 (not a bool), else raise ``ValueError``."""
    return check_int(value, name, 1)


def check_number(value: object, name: str, expected: str, ok: Callable[[float], bool] = lambda v: True) -> float:
    """Return ``value`` as a float if it is a finite real number (not a bool) for which
    ``ok(value)`` holds, else raise ``ValueError`` saying ``name`` must be ``expected``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{name} must be {expected}, got {describe(value)}")
    return float(value)


def check_bool(value: object, name: str) -> bool:
    """Return ``value`` if it is a bool, else raise ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_choice(value: object, choices: Sequence[str], name: str) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {describe(value)}")
    return value


def check_float_tensor(t: object, name: str) -> torch.Tensor:
    """Return ``t`` if it is a real floating-point tensor, else raise ``TypeError``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def check_normalized_shape(normalized_shape: int | Sequence[int]) -> Shape:
    """Return ``normalized_shape`` as a tuple of positive ints, or raise."""
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else normalized_shape
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {type(normalized_shape).__name__}"
        ) from None
    if not shape or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in shape):
        raise TypeError(f"normalized_shape must be an int or a non-empty sequence of ints, got {describe(normalized_shape)}")
    if any(d <= 0 for d in shape):
        raise ValueError(
            f"normalized_shape must contain only positive sizes (a zero-size dimension has no "
            f"mean or variance), got {describe(shape)}"
        )
    return tuple(int(d) for d in shape)


def check_trailing(x_shape: Shape, normalized_shape: Shape, name: str = "x") -> None:
    """Raise unless ``x_shape`` ends with ``normalized_shape``."""
    if tuple(x_shape[-len(normalized_shape) :]) != tuple(normalized_shape):
        raise ValueError(
            f"normalized_shape {describe(normalized_shape)} does not match the trailing dimensions of "
            f"{name} with shape {tuple(x_shape)}"
        )


def check_shape(shape: Shape, expected: Shape, name: str, what: str = "the normalized shape") -> None:
    """Raise unless ``name`` has exactly the ``expected`` shape (``what`` says why)."""
    if tuple(shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)} ({what}), got {tuple(shape)}")


def check_mask_shape(mask_shape: Shape, x_shape: Shape) -> None:
    """Raise unless ``mask`` has ``x``'s shape without its last (feature) axis."""
    if tuple(mask_shape) != tuple(x_shape[:-1]):
        raise ValueError(
            f"mask must have x's shape without the feature axis, {tuple(x_shape[:-1])}, "
            f"got {tuple(mask_shape)}"
        )


def check_dataset(data: object, name: str) -> tuple[torch.Tensor, ...]:
    """``data`` if it is a tuple ``(inputs..., labels)`` of tensors with one first dimension and int64 labels."""
    if not isinstance(data, tuple) or len(data) < 2 or not all(isinstance(t, torch.Tensor) for t in data):
        raise TypeError(f"{name} must be a tuple of tensors (inputs..., targets), got {type(data).__name__}")
    n = len(data[-1])
    if any(len(t) != n for t in data):
        raise ValueError(f"{name}'s tensors must all have the same first dimension, got {describe([len(t) for t in data])}")
    if data[-1].dtype != torch.int64:
        raise TypeError(f"{name}'s targets must be int64 class labels, got {data[-1].dtype}")
    return data


def check_streams(train_ids: object, val_ids: object, block_size: int) -> None:
    """Two 1-D int64 token streams, each longer than ``block_size``."""
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        if not isinstance(ids, torch.Tensor) or ids.ndim != 1 or ids.dtype != torch.int64:
            raise TypeError(f"{name} must be a 1-D int64 tensor of token ids")
    check_positive_int(block_size, "block_size")
    if min(len(train_ids), len(val_ids)) <= block_size:
        raise ValueError(f"train_ids and val_ids must be longer than block_size = {block_size}")


def check_mask_id(mask_id: object, *streams: torch.Tensor) -> int:
    """``mask_id`` if it is a token id that none of the token ``streams`` uses."""
    largest = int(max(ids.max() for ids in streams))
    return check_int(mask_id, "mask_id", largest + 1, f"a token id no stream uses (> {largest})")
