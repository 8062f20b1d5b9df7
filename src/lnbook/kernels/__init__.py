"""Fused LayerNorm and RMSNorm kernels in Triton, compiled on a GPU, interpreted on a CPU.

``layer_norm(x, weight, bias, eps)`` and ``rms_norm(x, weight, eps)`` normalize the last
dimension of ``x`` (any leading shape) with one Triton program per row in the forward pass,
statistics in float32 whatever the input dtype, and a backward pass that computes dx in one
pass over x and dy and reduces dW (and db) from per-program partial sums: no atomics, no
locks, so the results are bitwise repeatable. ``add_layer_norm`` and ``add_rms_norm`` fuse a
Pre-LN block's residual add into the norm. The kernels are ``torch.library`` custom ops, so
``torch.compile(fullgraph=True)`` traces through them; :mod:`lnbook.kernels.compile_check`
compiles them for T4, A100 and H100 without a GPU and reports registers, spills and occupancy.

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

from .modules import FusedLayerNorm, FusedRMSNorm, fuse_norms, fuse_residual_adds  # noqa: E402
from .norm import add_layer_norm, add_rms_norm, layer_norm, rms_norm  # noqa: E402  (after the interpreter switch)
from .tiling import Plan, plan  # noqa: E402

__all__ = [
    "FusedLayerNorm", "FusedRMSNorm", "Plan", "add_layer_norm", "add_rms_norm", "fuse_norms", "fuse_residual_adds",
    "layer_norm", "plan", "rms_norm",
]
