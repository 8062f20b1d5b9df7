"""lnbook: the helper package of the book *Layer Normalization, from BatchNorm's failure to fused kernels*.

Modules: ``reference`` (NumPy float64 definitions), ``functional`` (torch functions with
hand-written backward passes), ``norms`` (``nn.Module`` layers), ``plotting`` and ``utils``.
"""

from . import functional, norms, plotting, reference, utils

__version__ = "0.1.0"
__all__ = ["functional", "norms", "plotting", "reference", "utils"]
