"""lnbook: the helper package of the book *Layer Normalization, from BatchNorm's failure to fused kernels*.

Modules: ``reference`` (NumPy float64 definitions), ``functional`` (torch functions with
hand-written backward passes), ``norms`` (``nn.Module`` layers), ``data`` (generated or
bundled data sets), ``train`` (a deterministic training loop), ``models`` (small models with
the norm as a setting), ``rnn`` (LSTM and GRU cells with no, batch or layer
normalization), ``parallel`` (data-parallel runs on the CPU), ``plotting``, ``utils``.
"""

from . import data, functional, models, norms, parallel, plotting, reference, rnn, train, utils

__version__ = "0.1.0"
__all__ = ["data", "functional", "models", "norms", "parallel", "plotting", "reference", "rnn", "train", "utils"]
