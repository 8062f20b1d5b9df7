"""Pickling the modules torch refuses to pickle: those with parametrizations (weight
normalization, norm ``"weight"``), plain or with a seed axis (:mod:`lnbook.seeds`).

:func:`lnbook.train.fit_many` sends models to worker processes and back, so a model that
mixes in :class:`PicklesWithParametrizations` pickles as its class, constructor arguments
and state dict instead.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.utils import parametrize

from .seeds import stack


def _rebuild(cls: type, args: tuple, kwargs: dict, state: dict, training: bool, members: int | None = None) -> nn.Module:
    """``cls(*args, **kwargs)`` (``members`` of them stacked, :func:`lnbook.seeds.stack`) with
    ``state`` loaded and the training flag set: an unpickled copy."""
    model = cls(*args, **kwargs)
    if members is not None:
        model = stack([model] * members)
    model.load_state_dict(state)
    return model.train(training)


class PicklesWithParametrizations:
    """Mixin for a module that keeps its constructor arguments in ``self.init_args``
    (``(args, kwargs)``): with parametrizations, it pickles as its class, those arguments, its
    state dict and its number of seeds; without, as usual."""

    init_args: tuple[tuple, dict[str, Any]]

    def __reduce_ex__(self, protocol: int) -> str | tuple:
        if not any(parametrize.is_parametrized(m) for m in self.modules()):
            return super().__reduce_ex__(protocol)
        cls = parametrize.type_before_parametrizations(self)
        return _rebuild, (cls, *self.init_args, self.state_dict(), self.training, getattr(self, "members", None))
