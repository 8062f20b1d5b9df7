"""Argument checks shared by the NumPy reference, the torch functions and the modules.

Each check raises ``ValueError`` or ``TypeError`` with a message that names the argument
and says what was expected, so that bad input never silently produces wrong numbers.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Sequence

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


def check_positive_int(value: object, name: str) -> int:
    """Return ``value`` if it is an int >= 1 (not a bool), else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {describe(value)}")
    return int(value)


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
