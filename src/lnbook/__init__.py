"""lnbook: the helper package of the book *Layer Normalization, from BatchNorm's failure to fused kernels*.

Modules: ``reference`` (NumPy float64 definitions), ``functional`` (torch functions with
hand-written backward passes), ``norms`` (``nn.Module`` layers), ``data`` (generated or
bundled data sets), ``train`` (a deterministic training loop), ``models`` (small models with
the norm as a setting), ``rnn`` (LSTM and GRU cells with no, batch, layer or another
normalization), ``graphs`` (graphs of varying size and a message-passing network), ``rl``
(online value prediction on a random walk), ``parallel`` (data-parallel runs on the CPU),
``plotting``, ``utils``. ``transformer``, ``kernels`` and ``bench`` are imported on their own.
"""

from . import data, functional, graphs, models, norms, parallel, plotting, reference, rl, rnn, train, utils

__version__ = "0.1.0"
__all__ = ["data", "functional", "graphs", "models", "norms", "parallel", "plotting", "reference", "rl", "rnn", "train", "utils"]
