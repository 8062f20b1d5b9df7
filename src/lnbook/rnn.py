"""LSTM and GRU cells with no, batch or layer normalization, and a padded-sequence runner.

Layer normalization (torch's fused ``nn.LayerNorm``; ``lnbook.norms.replace_layer_norms``
swaps in the book's own) goes where Ba et al. (2016) put it: separately on the input-to-hidden
term ``W_x x`` and the hidden-to-hidden term ``W_h h`` (over all gates together), and, in
the LSTM, on the cell state before the output ``tanh``. Batch normalization goes in the same
places with one set of statistics per time step and gains initialized to 0.1, as Cooijmans
et al. (2017) recommend: in a cell, ``"batch"`` is the table's ``"batch_per_step"``.
Constructor flags switch each placement on or off. Every other norm over an example's
features (:data:`lnbook.norms.EXAMPLE_NORMS`) goes in the same places; ``"weight"``
weight-normalizes ``weight_ih`` (for the input term) and ``weight_hh`` (for the hidden term)
instead, with no norm layer.

Parameter names follow ``torch.nn.LSTMCell`` / ``torch.nn.GRUCell`` (``weight_ih``,
``weight_hh``, ``bias_ih``, ``bias_hh``, gates in PyTorch's order), so weights copy over.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_int, check_positive_int
from .norms import EXAMPLE_NORMS, TimeStepBatchNorm, apply_norm, check_norm, norm_layer
from .pickling import PicklesWithParametrizations

NORMS = ("none", "batch", "weight", *EXAMPLE_NORMS)


class _NormedCell(PicklesWithParametrizations, nn.Module):
    """Weights, initialization and the three optional norms shared by the LSTM and GRU cells."""

    GATES = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        norm: str = "none",
        *,
        norm_input: bool = True,
        norm_hidden: bool = True,
        norm_cell: bool = True,
        max_steps: int | None = None,
        bn_gain: float = 0.1,
    ) -> None:
        super().__init__()
        self.input_size = check_positive_int(input_size, "input_size")
        self.hidden_size = check_positive_int(hidden_size, "hidden_size")
        norm = check_norm(norm, NORMS)
        if norm == "batch" and max_steps is None:
            raise ValueError("norm='batch' needs max_steps: BatchNorm keeps statistics per time step")
        self.norm = norm
        width = self.GATES * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(width, input_size))
        self.weight_hh = nn.Parameter(torch.empty(width, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(width))
        self.bias_hh = nn.Parameter(torch.empty(width))
        bound = 1 / math.sqrt(hidden_size)  # torch.nn.LSTMCell's initialization
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)
        if norm == "weight":  # instead of a norm on a term, its weights: one gain per row, = ||row|| at first
            for name, on in (("weight_ih", norm_input), ("weight_hh", norm_hidden)):
                if on:
                    nn.utils.parametrizations.weight_norm(self, name)
        placements = dict(norm_input=norm_input, norm_hidden=norm_hidden, norm_cell=norm_cell)
        self.init_args = ((input_size, hidden_size, norm), dict(placements, max_steps=max_steps, bn_gain=bn_gain))

        kind = "batch_per_step" if norm == "batch" else norm  # BatchNorm in a cell: statistics per step

        def make(on: bool, size: int) -> nn.Module:
            """The norm of one placement (identity when off); LayerNorm is torch's fused kernel."""
            module = norm_layer(kind if on else "none", size, max_steps=max_steps, native=True)
            if isinstance(module, TimeStepBatchNorm):
                nn.init.constant_(module.weight, bn_gain)
                nn.init.zeros_(module.bias)  # the cell's own biases do the shifting
            return module

        self.norm_ih = make(norm_input, width)
        self.norm_hh = make(norm_hidden, width if self.GATES == 4 else 2 * hidden_size)
        self.norm_c = make(norm_cell and self.GATES == 4, hidden_size)

    def _check(self, x: torch.Tensor, t: int) -> None:
        shape = "(B, " if getattr(self, "members", None) is None else f"(S = {self.members}, B, "
        if x.ndim != shape.count(",") + 1 or x.shape[-1] != self.input_size:
            raise ValueError(f"x must have shape {shape}{self.input_size}), got {tuple(x.shape)}")
        check_int(t, "t", 0, "a non-negative int (the time step)")


class LSTMCell(_NormedCell):
    """LSTM cell (Hochreiter & Schmidhuber, 1997) with optional normalization.

    ``norm``: ``"none"`` (exactly ``torch.nn.LSTMCell``), ``"layer"``, ``"batch"`` or one of
    chapter 09's (module docstring); ``norm_input``, ``norm_hidden``, ``norm_cell`` select
    the placements.
    Call ``cell(x, (h, c), t, mask)`` with ``x (B, input_size)``, ``h, c (B, hidden_size)``,
    the step ``t`` (per-step statistics) and an optional ``(B,)`` mask of real sequences;
    returns ``(h, c)``.
    """

    GATES = 4

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], t: int = 0, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(x, t)
        h, c = state
        gates = (  # .mT and unsqueeze(-2): the same code runs S seeds stacked (lnbook.seeds)
            apply_norm(self.norm_ih, x @ self.weight_ih.mT, mask, t)
            + apply_norm(self.norm_hh, h @ self.weight_hh.mT, mask, t)
            + self.bias_ih.unsqueeze(-2)
            + self.bias_hh.unsqueeze(-2)
        )
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(apply_norm(self.norm_c, c, mask, t))
        return h, c


class GRUCell(_NormedCell):
    """GRU cell (Cho et al., 2014) with optional normalization, in PyTorch's formulation.

    The input term ``W_x x`` (all three gates) and the hidden term of the reset and update
    gates ``W_hr h, W_hz h`` are normalized; the candidate's hidden term is multiplied by the
    reset gate as in ``torch.nn.GRUCell``. Call ``cell(x, h, t, mask)``; returns ``h``.
    """

    GATES = 3

    def forward(self, x: torch.Tensor, h: torch.Tensor, t: int = 0, mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check(x, t)
        hs = self.hidden_size
        bias_hh = self.bias_hh.unsqueeze(-2)
        gi = apply_norm(self.norm_ih, x @ self.weight_ih.mT, mask, t) + self.bias_ih.unsqueeze(-2)
        gh = h @ self.weight_hh.mT
        rz_h = apply_norm(self.norm_hh, gh[..., : 2 * hs], mask, t)
        r = torch.sigmoid(gi[..., :hs] + rz_h[..., :hs] + bias_hh[..., :hs])
        z = torch.sigmoid(gi[..., hs : 2 * hs] + rz_h[..., hs:] + bias_hh[..., hs : 2 * hs])
        n = torch.tanh(gi[..., 2 * hs :] + r * (gh[..., 2 * hs :] + bias_hh[..., 2 * hs :]))
        return (1 - z) * n + z * h


class SequenceClassifier(nn.Module):
    """Run a cell over a padded batch and classify each sequence from its final state.

    ``x (B, T, F)`` with ``lengths (B,)``: at step t only sequences with ``t < length`` are
    real; the others keep their state, and BatchNorm leaves them out of its statistics. So a
    sequence's logits do not depend on how much padding follows it. Returns ``(B, n_classes)``.
    A model of ``S`` seeds (:func:`lnbook.seeds.stack`) takes ``x (S, B, T, F)`` and ``lengths
    (S, B)`` and returns ``(S, B, n_classes)``.
    """

    def __init__(self, cell: LSTMCell | GRUCell, n_classes: int) -> None:
        super().__init__()
        if not isinstance(cell, (LSTMCell, GRUCell)):
            raise TypeError(f"cell must be an lnbook.rnn.LSTMCell or GRUCell, got {type(cell).__name__}")
        self.cell = cell
        self.head = nn.Linear(cell.hidden_size, check_positive_int(n_classes, "n_classes"))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        stacked = getattr(self, "members", None) is not None
        if x.ndim != 3 + stacked:
            raise ValueError(f"x must have shape {'(S, B, T, F)' if stacked else '(B, T, F)'}, got {tuple(x.shape)}")
        *lead, steps, _ = x.shape  # lead: (B,), or (S, B) for S seeds
        if lengths is None:
            lengths = torch.full(lead, steps, dtype=torch.long)
        if tuple(lengths.shape) != tuple(lead) or int(lengths.min()) < 1 or int(lengths.max()) > steps:
            raise ValueError(f"lengths must be {tuple(lead)} with values in 1..{steps}")
        lengths = lengths.to(x.device)
        h = x.new_zeros(*lead, self.cell.hidden_size)
        state = (h, h.clone()) if isinstance(self.cell, LSTMCell) else h
        shortest = int(lengths.min())
        for t in range(int(lengths.max())):
            if t < shortest:  # every sequence is still real: nothing to mask
                state = self.cell(x[..., t, :], state, t)
                continue
            real = t < lengths
            new = self.cell(x[..., t, :], state, t, real)
            keep = real[..., None]
            if isinstance(self.cell, LSTMCell):
                state = (torch.where(keep, new[0], state[0]), torch.where(keep, new[1], state[1]))
            else:
                state = torch.where(keep, new, state)
        return self.head(state[0] if isinstance(self.cell, LSTMCell) else state)


def population_statistics(model: nn.Module, data: tuple[torch.Tensor, ...], batch_size: int = 64) -> torch.Tensor:
    """Re-estimate every :class:`~lnbook.norms.TimeStepBatchNorm` of ``model`` over a data set:
    Cooijmans et al.'s population statistics, in place of the moving averages of training.

    One pass over ``data = (inputs..., labels)`` (e.g. ``(x (N, T, F), y)`` or ``(x, lengths,
    y)``; the labels are ignored), in order, in batches of ``batch_size``, with the model in
    training mode, so that every step is normalized with its batch's statistics exactly as in
    training, but under ``no_grad`` and with no optimizer: no weight changes. Step ``t``'s
    ``running_mean`` and ``running_var`` become the average over the batches of that step's
    batch mean and unbiased batch variance, each batch weighted by its number of real
    sequences at step ``t`` (a cumulative average, not a moving one).

    A batch counts at step ``t`` only where at least two of its sequences are real there (the
    rule ``TimeStepBatchNorm`` trains by: one value has no variance). A step that no batch
    reaches in this way gets the statistics of the last earlier step that has some, as steps
    beyond ``max_steps`` do at inference. The model's training flag and its
    ``num_batches_tracked`` are restored. Returns the number of sequences that counted at
    each step, ``(max_steps,)`` int64 (the same for every norm of the model).
    """
    norms = [m for m in model.modules() if isinstance(m, TimeStepBatchNorm)]
    if not norms:
        raise ValueError("model has no TimeStepBatchNorm: there are no per-step statistics to estimate")
    check_positive_int(batch_size, "batch_size")
    if batch_size < 2:
        raise ValueError(f"batch_size must be at least 2 (batch statistics need two sequences), got {batch_size}")
    if not isinstance(data, (tuple, list)) or len(data) < 2 or not all(isinstance(d, torch.Tensor) for d in data):
        raise TypeError("data must be a tuple (inputs..., labels) of tensors")
    n = len(data[-1])
    sums = {id(m): [torch.zeros(m.max_steps, m.num_features, dtype=torch.float64) for _ in range(2)] for m in norms}
    counts = {id(m): torch.zeros(m.max_steps, dtype=torch.long) for m in norms}

    def record(module: TimeStepBatchNorm, args: tuple, kwargs: dict) -> None:
        x, t, mask = args[0], kwargs.get("t", args[1] if len(args) > 1 else None), kwargs.get("mask")
        if t is None:
            raise ValueError("population_statistics needs the norms called one step at a time (with t)")
        real = x if mask is None else x[mask]
        if len(real) >= 2:
            mean_sum, var_sum = sums[id(module)]
            mean_sum[t] += len(real) * real.double().mean(0)
            var_sum[t] += len(real) * real.double().var(0, unbiased=True)
            counts[id(module)][t] += len(real)

    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] < 2:  # a last batch of one joins the one before
        starts.pop()
    ends = starts[1:] + [n]
    tracked = [m.num_batches_tracked.clone() for m in norms]
    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in norms]
    was_training = model.training
    device = norms[0].running_mean.device
    try:
        model.train()
        with torch.no_grad():
            for start, end in zip(starts, ends):
                model(*(d[start:end].to(device) for d in data[:-1]))
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    with torch.no_grad():
        for m, old in zip(norms, tracked):
            (mean_sum, var_sum), count = sums[id(m)], counts[id(m)]
            for t in range(m.max_steps):
                if count[t] > 0:
                    m.running_mean[t] = (mean_sum[t] / count[t]).to(m.running_mean.dtype)
                    m.running_var[t] = (var_sum[t] / count[t]).to(m.running_var.dtype)
                elif t > 0:  # no batch reached this step: the last estimated step's statistics
                    m.running_mean[t] = m.running_mean[t - 1]
                    m.running_var[t] = m.running_var[t - 1]
            m.num_batches_tracked.copy_(old)
    return counts[id(norms[0])]
