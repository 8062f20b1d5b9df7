"""Fused LayerNorm and RMSNorm kernels in Triton, compiled on a GPU, interpreted on a CPU.

``layer_norm(x, weight, bias, eps)`` and ``rms_norm(x, weight, eps)`` normalize the last
dimension of ``x`` (any leading shape) with one Triton program per row in the forward pass,
statistics in float32 whatever the input dtype, and a backward pass that computes dx in one
pass over x and dy and reduces dW (and db) from per-program partial sums: no atomics, no
locks, so the results are bitwise repeatable.

Without a CUDA GPU the kernels run through Triton's interpreter: importing this package sets
``TRITON_INTERPRET=1`` (unless it is already set) before any kernel is defined. Triton reads
that setting when a kernel is decorated, so the order in which Triton and this package are
imported does not matter. The interpreter is for correctness, not speed.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401
except ImportError as error:  # pragma: no cover - only where no triton wheel exists
    raise ImportError(
        "lnbook.kernels needs Triton (pip install triton), which is published for Linux on x86-64; "
        "the rest of lnbook works without it"
    ) from error

from .modules import FusedLayerNorm, FusedRMSNorm, fuse_norms  # noqa: E402
from .norm import layer_norm, rms_norm  # noqa: E402  (after the interpreter switch)

__all__ = ["FusedLayerNorm", "FusedRMSNorm", "fuse_norms", "layer_norm", "rms_norm"]
