"""lnbook: the helper package of the book *Layer Normalization, from BatchNorm's failure to fused kernels*.

Modules: ``reference`` (NumPy float64 definitions), ``functional`` (torch functions with
hand-written backward passes), ``norms`` (``nn.Module`` layers), ``data`` (generated or
bundled data sets), ``train`` (a deterministic training loop), ``models`` (small models with
the norm as a setting), ``rnn`` (LSTM and GRU cells with no, batch, layer or another
normalization), ``seeds`` (many seeds of any of these models as one model, and their
training loops), ``pickling`` (weight-normalized models to and from worker processes),
``parallel`` (data-parallel runs on the CPU), ``compare`` (paired
differences, their intervals and the verdicts), ``plotting``, ``utils``.
``transformer``, ``kernels``, ``bench``, ``ensemble``, ``generative``, ``graphs`` (graph
batches and message passing, with PyTorch Geometric) and ``rl`` (online learning, with
gymnasium) are imported on their own (``from lnbook import graphs``), so that ``import lnbook``
loads neither PyTorch Geometric nor gymnasium nor Triton.
"""

from . import compare, data, functional, models, norms, parallel, pickling, plotting, reference, rnn, seeds, train, utils

__version__ = "0.1.0"
__all__ = ["compare", "data", "functional", "models", "norms", "parallel", "pickling", "plotting", "reference", "rnn", "seeds",
           "train", "utils"]
