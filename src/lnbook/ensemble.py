"""Many seeds trained as one model: recurrent networks whose weights have a leading member axis.

Tiny networks on a CPU are bound by the overhead of each tensor operation, not by
arithmetic, so ten independently initialized networks stacked along a first axis train in
little more time than one. Every member has its own parameters, its own statistics and its
own order of mini-batches; the loss is the sum of the members' losses, so each member's
gradient is the one it would get alone, and Adam or SGD, which act element by element,
update each exactly as separate optimizers would (gradient clipping is per member too).

:class:`EnsembleRNN` (chapter 02's recurrent networks, trained by :func:`fit`) and
:func:`accuracy`. Chapter 01's MLPs are stacked by :func:`lnbook.seeds.stack` and trained by
:func:`lnbook.seeds.fit`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ._checks import check_bool, check_choice, check_int, check_number, check_positive_int, describe
from .data import Dataset
from .train import clip_member_grads, evaluating

NORMS = ("none", "layer", "batch", "batch_unmasked", "batch_per_step")  # EnsembleRNN's
ORDERS = ("random", "bucketed")


def _uniform(shape: tuple[int, ...], bound: float) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class EnsembleRNN(nn.Module):
    """``members`` Elman classifiers with the norm inside the recurrence, run side by side.

    Each member computes ``h_t = tanh(norm(x_t W_x + h_{t-1} W_h + b))`` from ``h_0 = 0``
    (Ba et al.'s recurrent LayerNorm when ``norm="layer"``) and classifies the state after
    each sequence's last real step. ``norm``:

    - ``"none"``; ``"layer"``: each example's ``H`` summed inputs, with a gain and bias;
    - ``"batch"``: the statistics of step ``t`` over the member's batch (its real sequences
      only), with one set of running averages shared by all steps;
    - ``"batch_unmasked"``: the same, counting sequences that have ended (whose padded steps
      the network keeps running on) as data;
    - ``"batch_per_step"``: batch statistics as ``"batch"``, and running averages for each step
      up to ``max_steps`` (Cooijmans et al.); later steps reuse the last step's at inference.

    A batch norm whose step has fewer than two real sequences cannot compute a variance. With
    ``fallback=True`` (the default, as :class:`lnbook.norms.TimeStepBatchNorm`) that member
    normalizes the step with its running statistics and leaves them unchanged; with
    ``fallback=False`` it uses the formula anyway, so a lone sequence becomes ``bias`` (the
    batch of one). ``gain`` is the norm's initial gain (Cooijmans et al. start BatchNorm's at
    0.1, to keep ``tanh`` near its linear range). ``momentum=None`` makes the running
    statistics a plain average of every batch since :meth:`reset_statistics` (as
    ``torch.nn.BatchNorm1d`` does).

    Shapes: ``x`` is ``(B, T, F)``, the same data for every member, or ``(members, B, T, F)``;
    ``lengths`` (optional) ``(B,)`` or ``(members, B)``; logits ``(members, B, n_classes)``.
    """

    def __init__(
        self,
        members: int,
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
    ) -> None:
        super().__init__()
        for name, value in (("members", members), ("input_size", input_size), ("hidden_size", hidden_size),
                            ("n_classes", n_classes)):
            check_positive_int(value, name)
        self.norm = check_choice(norm, NORMS, "norm")
        if (norm == "batch_per_step") != (max_steps is not None):
            raise ValueError(f"max_steps must be given for norm='batch_per_step' and only then, got {describe(max_steps)}")
        self.max_steps = 1 if max_steps is None else check_positive_int(max_steps, "max_steps")
        if momentum is not None:
            check_number(momentum, "momentum", "a number in [0, 1] or None", lambda v: 0 <= v <= 1)
        self.momentum, self.fallback, self.eps = momentum, check_bool(fallback, "fallback"), eps
        e, f, h = members, input_size, hidden_size
        self.wx = _uniform((e, f, h), 1 / math.sqrt(f))
        if norm.startswith("batch"):  # a batch norm subtracts any bias of a; its gradient would be
            self.register_buffer("b", torch.zeros(e, 1, h))  # rounding noise, which Adam turns into steps
        else:
            self.b = _uniform((e, 1, h), 1 / math.sqrt(f))
        self.wh = nn.Parameter(torch.stack([nn.init.orthogonal_(torch.empty(h, h)) for _ in range(e)]))
        if norm != "none":
            self.gain = nn.Parameter(torch.full((e, 1, h), check_number(gain, "gain", "a positive number", lambda v: v > 0)))
            self.bias = nn.Parameter(torch.zeros(e, 1, h))
        self.head_w = _uniform((e, h, n_classes), 1 / math.sqrt(h))
        self.head_b = _uniform((e, 1, n_classes), 1 / math.sqrt(h))
        self.register_buffer("running_mean", torch.zeros(e, self.max_steps, h))
        self.register_buffer("running_var", torch.ones(e, self.max_steps, h))
        self.register_buffer("batches_tracked", torch.zeros(e, self.max_steps, 1))

    @property
    def members(self) -> int:
        return self.wx.shape[0]

    def reset_statistics(self) -> None:
        """Running statistics back to mean 0, variance 1, and no batch counted."""
        self.running_mean.zero_(), self.running_var.fill_(1.0), self.batches_tracked.zero_()

    def _normalize(self, a: torch.Tensor, real: torch.Tensor, t: int) -> torch.Tensor:
        """a (E, B, H) summed inputs of step t; real (E, B, 1): the sequences still running."""
        if self.norm == "none":
            return a
        if self.norm == "layer":
            var, mean = torch.var_mean(a, dim=-1, keepdim=True, correction=0)
        else:
            s = min(t, self.max_steps - 1)
            run_mean, run_var = self.running_mean[:, s : s + 1], self.running_var[:, s : s + 1]
            if not self.training:
                mean, var = run_mean, run_var
            else:
                w = torch.ones_like(real, dtype=a.dtype) if self.norm == "batch_unmasked" else real.to(a.dtype)
                n = w.sum(1, keepdim=True)  # (E, 1, 1) sequences the statistics rest on
                mean = (w * a).sum(1, keepdim=True) / n.clamp_min(1)
                var = (w * (a - mean) ** 2).sum(1, keepdim=True) / n.clamp_min(1)
                ok = n >= 2
                with torch.no_grad():
                    self.batches_tracked[:, s : s + 1] += ok
                    k = self.batches_tracked[:, s : s + 1]
                    m = 1 / k.clamp_min(1) if self.momentum is None else torch.full_like(k, self.momentum)
                    unbiased = var * n / (n - 1).clamp_min(1)
                    run_mean.copy_(torch.where(ok, run_mean.lerp(mean, m), run_mean))
                    run_var.copy_(torch.where(ok, run_var.lerp(unbiased, m), run_var))
                if self.fallback:
                    mean, var = torch.where(ok, mean, run_mean.clone()), torch.where(ok, var, run_var.clone())
        return (a - mean) * torch.rsqrt(var + self.eps) * self.gain + self.bias

    def states(
        self, x: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Run the recurrence: (the state after each sequence's last real step ``(E, B, H)``,
        every step's state ``h_t``, every step's summed inputs ``a_t`` before the norm; each
        ``(E, B, H)``)."""
        x, lengths = self._check(x, lengths)
        e, b, steps, _ = x.shape
        if self.training and self.norm == "batch_per_step" and steps > self.max_steps:
            raise ValueError(f"x has {steps} steps, beyond max_steps = {self.max_steps}: training needs statistics for every step")
        h = x.new_zeros(e, b, self.wh.shape[-1])
        last, hs, summed = h, [], []
        for t in range(steps):
            real = (lengths > t).unsqueeze(-1)  # (E, B, 1)
            a = torch.baddbmm(self.b, x[:, :, t], self.wx) + h @ self.wh
            h = torch.tanh(self._normalize(a, real, t))
            last = torch.where((lengths == t + 1).unsqueeze(-1), h, last)
            hs.append(h)
            summed.append(a)
        return last, hs, summed

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``(E, B, n_classes)`` of states ``h (E, B, H)``."""
        return torch.baddbmm(self.head_b, h, self.head_w)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.classify(self.states(x, lengths)[0])

    def _check(self, x: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.members
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim not in (3, 4):
            raise ValueError(f"x must be a float tensor (B, T, F) or ({e}, B, T, F), got {describe(x)}")
        if (x.ndim == 4 and x.shape[0] != e) or x.shape[-1] != self.wx.shape[1]:
            raise ValueError(f"x must have shape (B, T, {self.wx.shape[1]}) or ({e}, B, T, {self.wx.shape[1]}), got {tuple(x.shape)}")
        if x.ndim == 3:
            x = x.expand(e, *x.shape)
        b, steps = x.shape[1], x.shape[2]
        if lengths is None:
            return x, torch.full((e, b), steps, device=x.device)
        lengths = lengths.to(x.device).expand(e, b) if lengths.ndim == 1 else lengths.to(x.device)
        if lengths.shape != (e, b) or int(lengths.min()) < 1 or int(lengths.max()) > steps:
            raise ValueError(f"lengths must be (B,) or ({e}, B) = ({e}, {b}) with values in 1..{steps}, got {describe(lengths)}")
        return x, lengths


@dataclass
class EnsembleHistory:
    """What :func:`fit` measured, one column per member: ``step_loss (steps, E)``; test
    accuracy ``test_acc (evaluations, E)`` after the updates counted in ``eval_steps``."""

    step_loss: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    eval_steps: list[int] = field(default_factory=list)
    test_acc: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


def accuracy(model: EnsembleRNN, data: Dataset) -> np.ndarray:
    """Each member's fraction of ``data`` classified right, in eval mode, ``(members,)``:
    ``(x, y)`` or ``(x, lengths, y)``, the same data for every member. The data is one batch:
    eval mode has no batch statistics."""
    if not isinstance(model, EnsembleRNN):
        raise TypeError(f"model must be an EnsembleRNN, got {type(model).__name__}")
    with evaluating(model) as device:
        *inputs, y = (t.to(device) for t in data)
        return (model(*inputs).argmax(-1) == y).double().mean(-1).cpu().numpy()


def batch_order(lengths: torch.Tensor, members: int, batch_size: int, order: str, generator: torch.Generator) -> torch.Tensor:
    """One epoch of mini-batches for each member, ``(members, batches, batch_size)`` indices.

    ``"random"``: a fresh permutation per member. ``"bucketed"``: the examples sorted by length
    (ties in random order) and cut into batches of similar lengths, whose order is shuffled.
    Examples left over after the last full batch are dropped.
    """
    n = len(lengths)
    per = n // batch_size
    epochs = []
    for _ in range(members):
        perm = torch.randperm(n, generator=generator)
        if order == "bucketed":
            perm = perm[torch.sort(lengths[perm], stable=True).indices]
            perm = perm[: per * batch_size].view(per, batch_size)[torch.randperm(per, generator=generator)]
        epochs.append(perm[: per * batch_size].view(per, batch_size))
    return torch.stack(epochs)


def _sequences(data: Dataset) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, lengths, y)`` of ``(x, y)`` (every sequence full length) or ``(x, lengths, y)``."""
    *inputs, y = data
    return inputs[0], (inputs[1] if len(inputs) > 1 else torch.full((len(y),), inputs[0].shape[1])), y


def _batch(model: EnsembleRNN, x: torch.Tensor, lengths: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Logits of the members' mini-batches ``idx (E, B)``, each run only to its longest sequence."""
    device = model.wx.device
    return model(x[idx, : int(lengths[idx].max())].to(device), lengths[idx].to(device))


def fit(
    model: EnsembleRNN,
    train: Dataset,
    test: Dataset,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    grad_clip: float | None = 1.0,
    order: str = "random",
    max_steps: int | None = None,
    eval_every: int | None = None,
) -> EnsembleHistory:
    """Train every member with Adam and cross-entropy; return the :class:`EnsembleHistory`.

    ``train`` and ``test`` are ``(x, y)`` or padded ``(x, lengths, y)``. Each member draws its own
    mini-batches (:func:`batch_order`, ``order`` ``"random"`` or ``"bucketed"``), seeded by
    ``seed``; a batch runs only to its longest member. ``grad_clip`` bounds each member's
    gradient norm. Test accuracy is measured after every epoch, or every ``eval_every``
    updates; ``max_steps`` stops training after that many updates.
    """
    if not isinstance(model, EnsembleRNN):
        raise TypeError(f"model must be an EnsembleRNN, got {type(model).__name__}")
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        check_positive_int(value, name)
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_int(seed, "seed")
    check_choice(order, ORDERS, "order")
    for name, value in (("max_steps", max_steps), ("eval_every", eval_every)):
        if value is not None:
            check_positive_int(value, name)
    x, lengths, y = _sequences(train)
    if batch_size > len(y):
        raise ValueError(f"batch_size must be at most the {len(y)} training examples, got {batch_size}")
    generator = torch.Generator().manual_seed(seed)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    e = model.members
    model.train()
    losses: list[torch.Tensor] = []
    history = EnsembleHistory()
    accs: list[np.ndarray] = []

    def evaluate() -> None:
        history.eval_steps.append(len(losses))
        accs.append(accuracy(model, test))

    for _ in range(epochs):
        batches = batch_order(lengths, e, batch_size, order, generator)
        for i in range(batches.shape[1]):
            idx = batches[:, i]  # (E, B)
            logits = _batch(model, x, lengths, idx)
            yb = y[idx].to(logits.device)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view(e, -1).mean(1)
            opt.zero_grad(set_to_none=True)
            loss.sum().backward()
            if grad_clip is not None:
                clip_member_grads(params, grad_clip)
            opt.step()
            losses.append(loss.detach().cpu())
            if eval_every is not None and len(losses) % eval_every == 0:
                evaluate()
            if len(losses) == max_steps:
                break
        if len(losses) == max_steps:
            break
        if eval_every is None:
            evaluate()
    if history.eval_steps[-1:] != [len(losses)]:
        evaluate()
    history.step_loss = torch.stack(losses).numpy()
    history.test_acc = np.stack(accs)
    return history


def population_statistics(model: EnsembleRNN, data: Dataset, batch_size: int, seed: int = 0) -> None:
    """Replace the running statistics by population statistics (Cooijmans et al.): every step's
    mean and variance averaged over the batch statistics of one pass through ``data`` (random
    mini-batches of ``batch_size``, no update of the weights)."""
    if model.norm not in ("batch", "batch_unmasked", "batch_per_step"):
        raise ValueError(f"population statistics need a batch norm, the model's norm is {model.norm!r}")
    x, lengths, _ = _sequences(data)
    momentum, was_training = model.momentum, model.training
    model.momentum = None
    model.reset_statistics()
    model.train()
    try:
        with torch.no_grad():
            batches = batch_order(lengths, model.members, batch_size, "random", torch.Generator().manual_seed(seed))
            for i in range(batches.shape[1]):
                _batch(model, x, lengths, batches[:, i])
    finally:
        model.momentum = momentum
        model.train(was_training)


def trajectory(model: EnsembleRNN, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """How the recurrence evolves over the steps of one batch ``x (B, T, F)``, labels ``y (B,)``,
    in training mode (batch statistics) on a copy of the model. Each entry is ``(E, T)``:

    ``"input_mean"``, ``"input_std"``: the batch mean and standard deviation of each unit's summed
    input ``a_t`` (what a batch norm estimates at step t), averaged over the units;
    ``"state_mean"``, ``"state_rms"``: the mean and root mean square of ``h_t`` over batch and units;
    ``"grad_norm"``: the mean over the batch of ``|dL/dh_t|``, L the cross-entropy of the
    classification from the last state.
    """
    net = copy.deepcopy(model).train()
    device = net.wx.device
    x, y = x.to(device), y.to(device)
    last, hs, summed = net.states(x)
    for h in hs:
        h.retain_grad()
    loss = nn.functional.cross_entropy(net.classify(last).flatten(0, 1), y.repeat(net.members))
    (loss * net.members).backward()  # each member's own mean loss
    per_step = {
        "input_mean": [a.detach().mean(1).mean(-1) for a in summed],
        "input_std": [a.detach().std(1).mean(-1) for a in summed],
        "state_mean": [h.detach().mean((1, 2)) for h in hs],
        "state_rms": [h.detach().pow(2).mean((1, 2)).sqrt() for h in hs],
        "grad_norm": [h.grad.norm(dim=-1).mean(1) for h in hs],
    }
    return {k: torch.stack(v, 1).cpu().numpy() for k, v in per_step.items()}
