"""Normalization layers as ``torch.nn.Module``s."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ._checks import check_eps, check_normalized_shape
from .functional import layer_norm


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
