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

Chapter 02's network is simpler: :class:`ElmanClassifier`, a tanh RNN with its norm inside the
recurrence, which keeps running on padded steps and classifies each sequence's state after its
last real step; its batch norms are :class:`RecurrentBatchNorm` (masked or not, running
statistics shared by all steps or kept per step, a fallback where a step has one sequence).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (
    check_bool,
    check_choice,
    check_eps,
    check_int,
    check_number,
    check_positive_int,
    check_streams,
    describe,
)
from .norms import EXAMPLE_NORMS, TimeStepBatchNorm, apply_norm, check_norm, norm_layer
from .pickling import PicklesWithParametrizations
from .train import lm_loss, windows

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


class RecurrentBatchNorm(nn.Module):
    """BatchNorm of a recurrence's summed inputs, called once per step: the batch norms of
    :class:`ElmanClassifier` (chapter 02).

    Step ``t``'s input ``x (*, B, F)`` (``B`` sequences; ``*``: nothing, or a seed axis) is
    normalized per feature with its mean and biased variance over the batch, then scaled by
    ``weight`` (initially ``gain``) and shifted by ``bias``. ``masked=True`` takes the
    statistics over the sequences still running (``mask (*, B)``, True on real steps) only;
    ``masked=False`` counts every sequence, the padded ones as data. The output is not zeroed
    on padded steps: the recurrence keeps running there.

    Running averages (``momentum``, unbiased variance, as ``torch.nn.BatchNorm1d``), used in
    eval mode: one set for every step (``max_steps=None``), or one set per step up to
    ``max_steps`` (Cooijmans et al.), whose later steps reuse the last set at inference and
    refuse to train. ``momentum=None`` makes them the plain average of every batch since
    :meth:`reset_running_stats`. A step whose statistics rest on fewer than two sequences has
    no variance: with ``fallback=True`` it is normalized with the running statistics, which
    it leaves unchanged; with ``fallback=False`` the formula is used anyway, so a lone
    sequence becomes ``bias``.

    ``online=True`` (a streaming BatchNorm, in the family of Liao et al.'s streaming
    normalization, Ioffe's Batch Renormalization and Chiley et al.'s Online Normalization):
    in training the running statistics first follow the stream, an exponential moving average
    over updates with weight ``momentum`` (the mean and the variance about it, the batch's
    spread included, so a batch of one is enough), and every batch is normalized with them,
    treated as constants in the backward pass; ``fallback`` is then unused.

    Buffers: ``running_mean``, ``running_var`` ``(steps, F)`` and ``batches_tracked``
    ``(steps,)``, the batches each step's running statistics took in (``steps``:
    ``max_steps``, or 1). Written for any leading dimensions (``stacks_buffers``):
    :func:`lnbook.seeds.stack` gives its parameters and buffers a seed axis.
    """

    stacks_buffers = True

    def __init__(
        self,
        num_features: int,
        max_steps: int | None = None,
        *,
        masked: bool = True,
        momentum: float | None = 0.1,
        fallback: bool = True,
        gain: float = 1.0,
        eps: float = 1e-5,
        online: bool = False,
    ) -> None:
        super().__init__()
        self.num_features = check_positive_int(num_features, "num_features")
        self.online = check_bool(online, "online")
        if online and momentum is None:
            raise ValueError("momentum must be a number for online=True (the stream's moving average), got None")
        self.max_steps = None if max_steps is None else check_positive_int(max_steps, "max_steps")
        if momentum is not None:
            check_number(momentum, "momentum", "a number in [0, 1] or None", lambda v: 0 <= v <= 1)
        self.masked, self.fallback = check_bool(masked, "masked"), check_bool(fallback, "fallback")
        self.momentum, self.eps = momentum, check_eps(eps)
        f, steps = self.num_features, self.max_steps or 1
        self.weight = nn.Parameter(torch.full((f,), check_number(gain, "gain", "a positive number", lambda v: v > 0)))
        self.bias = nn.Parameter(torch.zeros(f))
        self.register_buffer("running_mean", torch.zeros(steps, f))
        self.register_buffer("running_var", torch.ones(steps, f))
        self.register_buffer("batches_tracked", torch.zeros(steps, dtype=torch.long))

    def reset_running_stats(self) -> None:
        """Running statistics back to mean 0 and variance 1, with no batch counted."""
        self.running_mean.zero_(), self.running_var.fill_(1.0), self.batches_tracked.zero_()

    def forward(self, x: torch.Tensor, t: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.training and self.max_steps is not None and t >= self.max_steps:
            raise ValueError(f"t = {t} is beyond max_steps = {self.max_steps}: training needs statistics for every step")
        s = min(t, self.running_mean.shape[-2] - 1)
        run_mean, run_var = self.running_mean[..., s : s + 1, :], self.running_var[..., s : s + 1, :]  # (*, 1, F)
        if not self.training:
            mean, var = run_mean, run_var
        elif self.online:
            mean, var = self._follow_stream(x, mask, s, run_mean, run_var)
        else:
            w = mask.unsqueeze(-1).to(x.dtype) if self.masked and mask is not None else torch.ones_like(x[..., :1])
            n = w.sum(-2, keepdim=True)  # (*, 1, 1): the sequences the statistics rest on
            mean = (w * x).sum(-2, keepdim=True) / n.clamp_min(1)
            var = (w * (x - mean) ** 2).sum(-2, keepdim=True) / n.clamp_min(1)
            ok = n >= 2
            with torch.no_grad():
                tracked = self.batches_tracked[..., s : s + 1, None]
                tracked += ok
                k = tracked.to(x.dtype)
                m = 1 / k.clamp_min(1) if self.momentum is None else torch.full_like(k, self.momentum)
                unbiased = var * n / (n - 1).clamp_min(1)
                run_mean.copy_(torch.where(ok, run_mean.lerp(mean, m), run_mean))
                run_var.copy_(torch.where(ok, run_var.lerp(unbiased, m), run_var))
            if self.fallback:
                mean, var = torch.where(ok, mean, run_mean.clone()), torch.where(ok, var, run_var.clone())
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight.unsqueeze(-2) + self.bias.unsqueeze(-2)

    def _follow_stream(self, x: torch.Tensor, mask: torch.Tensor | None, s: int, run_mean: torch.Tensor,
                       run_var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """online=True: move step s's running statistics by this batch (mean d away: mean += m d,
        var = (1 - m)(var + m d^2) + m * batch variance) and return them, detached, (*, 1, F)."""
        w = mask.unsqueeze(-1).to(x.dtype) if self.masked and mask is not None else torch.ones_like(x[..., :1])
        with torch.no_grad():
            n = w.sum(-2, keepdim=True)
            mean = (w * x).sum(-2, keepdim=True) / n.clamp_min(1)
            var = (w * (x - mean) ** 2).sum(-2, keepdim=True) / n.clamp_min(1)
            seen, m = n >= 1, self.momentum
            d = mean - run_mean
            run_mean.copy_(torch.where(seen, run_mean + m * d, run_mean))
            run_var.copy_(torch.where(seen, (1 - m) * (run_var + m * d**2) + m * var, run_var))
            self.batches_tracked[..., s : s + 1, None] += seen
        return run_mean.clone(), run_var.clone()

    def extra_repr(self) -> str:
        return (f"{self.num_features}, max_steps={self.max_steps}, masked={self.masked}, momentum={self.momentum}, "
                f"fallback={self.fallback}, eps={self.eps}" + (", online=True" if self.online else ""))


ELMAN_NORMS = ("none", "layer", "batch", "batch_unmasked", "batch_per_step")


class ElmanClassifier(nn.Module):
    """A tanh RNN (an Elman network) with the norm inside the recurrence, classifying each
    sequence from its state after its last real step (chapter 02's network).

    ``h_t = tanh(norm(W_ih x_t + W_hh h_{t-1} + b))`` from ``h_0 = 0`` (Ba et al.'s recurrent
    LayerNorm when ``norm="layer"``); logits ``head(h_T)``, ``T`` each sequence's length. The
    network keeps running on padded steps (it does not hold the state); their states are
    never classified. ``norm``:

    - ``"none"``; ``"layer"``: each example's ``H`` summed inputs (``nn.LayerNorm``);
    - ``"batch"``: :class:`RecurrentBatchNorm` over the batch's running sequences at each
      step, one set of running averages for all steps; ``"batch_unmasked"``: the same with
      the ended sequences counted as data; ``"batch_per_step"``: running averages for each
      step up to ``max_steps`` (Cooijmans et al.).

    A batch norm subtracts any bias before it, so the batch norms have no ``b`` (its gradient
    would be rounding noise, which Adam turns into steps). ``gain`` is the norm's initial
    gain; ``momentum``, ``fallback`` and ``online`` as in :class:`RecurrentBatchNorm`. Initialization:
    ``W_ih``, ``b`` uniform in ``±1/sqrt(input_size)``, ``W_hh`` orthogonal, the head as
    ``nn.Linear``.

    Shapes: ``x (B, T, F)``, ``lengths (B,)`` (default: all ``T``), logits ``(B, n_classes)``;
    a model of ``S`` seeds (:func:`lnbook.seeds.stack`) takes ``x (S, B, T, F)``,
    ``lengths (S, B)``. A batch runs only up to its longest sequence.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        n_classes: int,
        norm: str = "none",
        *,
        max_steps: int | None = None,
        momentum: float | None = 0.1,
        fallback: bool = True,
        gain: float = 1.0,
        eps: float = 1e-5,
        online: bool = False,
    ) -> None:
        super().__init__()
        self.input_size = check_positive_int(input_size, "input_size")
        self.hidden_size = check_positive_int(hidden_size, "hidden_size")
        check_positive_int(n_classes, "n_classes")
        self.norm = check_choice(norm, ELMAN_NORMS, "norm")
        if (norm == "batch_per_step") != (max_steps is not None):
            raise ValueError(f"max_steps must be given for norm='batch_per_step' and only then, got {describe(max_steps)}")
        check_number(gain, "gain", "a positive number", lambda v: v > 0)
        f, h = input_size, hidden_size
        self.weight_ih = nn.Parameter(torch.empty(h, f).uniform_(-1 / math.sqrt(f), 1 / math.sqrt(f)))
        if norm.startswith("batch"):
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(torch.empty(h).uniform_(-1 / math.sqrt(f), 1 / math.sqrt(f)))
        self.weight_hh = nn.Parameter(nn.init.orthogonal_(torch.empty(h, h)))
        if norm == "none":
            self.norm_a: nn.Module = nn.Identity()
        elif norm == "layer":
            self.norm_a = nn.LayerNorm(h, eps=eps)
            nn.init.constant_(self.norm_a.weight, gain)
        else:
            self.norm_a = RecurrentBatchNorm(h, max_steps, masked=norm != "batch_unmasked", momentum=momentum,
                                             fallback=fallback, gain=gain, eps=eps, online=online)
        self.head = nn.Linear(h, n_classes)

    def states(
        self, x: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Run the recurrence up to the longest sequence: (the state after each sequence's last
        real step ``(*, B, H)``, every step's state ``h_t``, every step's summed inputs ``a_t``
        before the norm; each ``(*, B, H)``, ``*`` the seed axis of a stacked model)."""
        stacked = getattr(self, "members", None) is not None
        shape = "(S, B, T, F)" if stacked else "(B, T, F)"
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim != 3 + stacked or x.shape[-1] != self.input_size:
            raise ValueError(f"x must be a float tensor {shape} with F = {self.input_size}, got {describe(x)}")
        *lead, steps, _ = x.shape
        if lengths is None:
            lengths = torch.full(lead, steps, dtype=torch.long)
        if tuple(lengths.shape) != tuple(lead) or int(lengths.min()) < 1 or int(lengths.max()) > steps:
            raise ValueError(f"lengths must be {tuple(lead)} with values in 1..{steps}, got {describe(lengths)}")
        lengths, run = lengths.to(x.device), int(lengths.max())
        if self.training and self.norm == "batch_per_step" and run > self.norm_a.max_steps:
            raise ValueError(f"the batch runs {run} steps, beyond max_steps = {self.norm_a.max_steps}: "
                             "training needs statistics for every step")
        h = x.new_zeros(*lead, self.hidden_size)
        last, hs, summed = h, [], []
        for t in range(run):  # .mT and unsqueeze(-2): the same code runs S seeds stacked (lnbook.seeds)
            a = x[..., t, :] @ self.weight_ih.mT
            if self.bias is not None:
                a = a + self.bias.unsqueeze(-2)
            a = a + h @ self.weight_hh.mT
            h = torch.tanh(apply_norm(self.norm_a, a, lengths > t, t))
            last = torch.where((lengths == t + 1).unsqueeze(-1), h, last)
            hs.append(h)
            summed.append(a)
        return last, hs, summed

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.states(x, lengths)[0])


class CharLSTM(nn.Module):
    """A character-level language model: an embedding, an :class:`LSTMCell` run over the
    steps, and a linear head to next-token logits (the regime of Ba et al.'s and Cooijmans et
    al.'s language-modelling claims).

    ``forward(idx (B, T) int64) -> logits (B, T, vocab_size)``, the state starting at zero for
    every window; ``norm`` is the cell's (``"none"``, ``"layer"``, ``"batch"``, ...). A
    BatchNorm cell keeps statistics per step and needs ``max_steps``, the longest training
    window (longer windows reuse the last step's statistics in eval mode). A model of ``S``
    seeds (:func:`lnbook.seeds.stack`) takes ``(S, B, T)`` and returns ``(S, B, T, vocab_size)``;
    it trains with :func:`lnbook.seeds.fit_lm`, a plain one with :func:`lnbook.train.fit_lm`.
    """

    def __init__(self, vocab_size: int, hidden_size: int, norm: str = "none", *, embed_size: int = 32,
                 max_steps: int | None = None) -> None:
        super().__init__()
        self.vocab_size, self.max_steps = check_positive_int(vocab_size, "vocab_size"), max_steps
        self.embed = nn.Embedding(vocab_size, check_positive_int(embed_size, "embed_size"))
        self.cell = LSTMCell(embed_size, hidden_size, norm, max_steps=max_steps)
        self.head = nn.Linear(self.cell.hidden_size, vocab_size)

    def _check_ids(self, ids: object, name: str) -> None:
        stacked = getattr(self, "members", None)
        shape = "(B, T)" if stacked is None else f"(S, B, T) with S = {stacked} seeds"
        if (not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.ndim != len(shape.split(","))
                or ids.numel() == 0 or (stacked is not None and ids.shape[0] != stacked)):
            raise ValueError(f"{name} must be a non-empty int64 tensor of shape {shape}, got {describe(ids)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"{name} must hold token ids in 0..{self.vocab_size - 1}, "
                             f"got {int(ids.min())}..{int(ids.max())}")

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self._check_ids(idx, "idx")
        steps = idx.shape[-1]
        if self.training and self.cell.norm == "batch" and steps > self.max_steps:
            raise ValueError(f"idx has {steps} steps, beyond max_steps = {self.max_steps}: "
                             "BatchNorm trains with statistics per step")
        h = idx.new_zeros(*idx.shape[:-1], self.cell.hidden_size, dtype=self.head.weight.dtype)
        state, outputs = (h, h), []
        for t, x in enumerate(self.embed(idx).unbind(-2)):  # x (*, B, embed_size)
            state = self.cell(x, state, t)
            outputs.append(state[0])
        return self.head(torch.stack(outputs, dim=-2))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) over every position; ``targets`` has ``idx``'s
        shape. A model of ``S`` seeds returns each member's, ``(S,)``."""
        self._check_ids(targets, "targets")
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have idx's shape {tuple(idx.shape)}, got {tuple(targets.shape)}")
        each = F.cross_entropy(self(idx).flatten(0, -2), targets.flatten(), reduction="none")
        return each.mean() if targets.ndim == 2 else each.view(len(targets), -1).mean(1)


def lm_loss_population(model: nn.Module, train_ids: torch.Tensor, val_ids: torch.Tensor, block_size: int, *,
                       n_windows: int = 512, batch_size: int = 64, seed: int = 0, batches: int = 4) -> float:
    """Validation loss (mean next-token cross-entropy, nats) of a plain BatchNorm language model
    (a :class:`CharLSTM` with ``norm="batch"``) scored with Cooijmans et al.'s population
    statistics instead of its moving averages.

    On a deep copy of ``model`` (which is left unchanged): :func:`population_statistics` over
    ``n_windows`` windows of ``block_size`` tokens of ``train_ids``, their starts drawn from a
    generator seeded with ``seed`` (the same windows for every model), in batches of
    ``batch_size``; then :func:`lnbook.train.lm_loss` on ``val_ids`` (its ``batches`` fixed
    batches of 32 windows), the very windows ``lm_loss(model, val_ids, block_size, batches)``
    scores the moving averages on, so the two scores pair.
    """
    if getattr(model, "members", None) is not None:
        raise ValueError("model must be a plain model; unstack a model of many seeds first (lnbook.seeds.unstack)")
    check_streams(train_ids, val_ids, block_size)
    check_int(n_windows, "n_windows", 2, "an int >= 2 (batch statistics need two windows)")
    check_positive_int(batches, "batches")
    starts = torch.randint(len(train_ids) - block_size, (n_windows,), generator=torch.Generator().manual_seed(seed))
    scored = copy.deepcopy(model)
    population_statistics(scored, windows(train_ids, starts, block_size), batch_size=batch_size)
    return float(lm_loss(scored, val_ids, block_size, batches=batches))
