"""Small, deterministic training loops, their pieces, and many runs side by side.

The pieces every loop of the package shares: :func:`prepare` (optimizer, device and seeded
generator), :func:`optimizer_step` (and :func:`clip_member_grads` for stacked members) and
:func:`evaluating` (eval mode, no autograd, the model's
device). :func:`start_runs` and :func:`finish_runs` queue one run per seed and collect them;
:func:`smoothed` and :func:`updates_to` read a history's per-step losses.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ._checks import (
    check_choice,
    check_dataset,
    check_int,
    check_mask_id,
    check_number,
    check_positive_int,
    check_streams,
    describe,
)
from .data import Dataset
from .progress import progress
from .utils import seed_everything

OPTIMIZERS = ("adam", "sgd", "radam")


@dataclass
class History:
    """What :func:`fit` measured.

    ``step_loss``: training loss of every optimizer step. ``train_acc``: accuracy on each
    epoch's training mini-batches, in training mode, as they were seen. ``test_acc``: test
    accuracy after each epoch, in eval mode. ``wall_time``: seconds of training (evaluation
    excluded) at the end of each epoch. Accuracies are fractions in [0, 1].
    """

    step_loss: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    test_acc: list[float] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    steps_per_epoch: int = 0


def smoothed(losses: Sequence[float], window: int = 10) -> np.ndarray:
    """Moving average of per-step losses over ``window`` steps, ``(len(losses) - window + 1,)``
    (the first ``window - 1`` steps have no full window and are dropped)."""
    check_positive_int(window, "window")
    return np.convolve(losses, np.ones(window) / window, mode="valid")


def updates_to(history: History, level: float = 1.0, window: int = 10) -> int | None:
    """The first update after which the ``window``-step mean of the training loss is below
    ``level`` (None: never): how fast a run learns, counted in updates."""
    below = np.flatnonzero(smoothed(history.step_loss, window) < level)
    return int(below[0]) + window if len(below) else None


class Run(NamedTuple):
    """What a training loop starts from (:func:`prepare`)."""

    optimizer: torch.optim.Optimizer
    device: torch.device
    generator: torch.Generator


def make_optimizer(params: Sequence[torch.Tensor], lr: float, optimizer: str = "adam",
                   beta2: float = 0.999) -> torch.optim.Optimizer:
    """The optimizer :data:`OPTIMIZERS` names over ``params``: ``"adam"``; ``"sgd"`` with momentum
    0.9; or ``"radam"``, Adam whose early steps are rectified for the variance of its
    second-moment estimate (Liu et al., 2020, "On the variance of the adaptive learning rate"),
    torch's defaults otherwise. ``beta2``: Adam's (and RAdam's) second-moment decay, 0.999 by
    default; large-model recipes use 0.95."""
    check_choice(optimizer, OPTIMIZERS, "optimizer")
    check_number(beta2, "beta2", "a number in (0, 1)", lambda v: 0 < v < 1)
    if optimizer == "sgd":
        if beta2 != 0.999:
            raise ValueError(f"beta2 is Adam's; optimizer='sgd' has none, got beta2={beta2}")
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return (torch.optim.Adam if optimizer == "adam" else torch.optim.RAdam)(params, lr=lr, betas=(0.9, beta2))


def warmup_cosine(step: int, warmup: int, steps: int) -> float:
    """The learning-rate factor at step ``step`` (from 1) of ``steps``: a linear warm-up over the
    first ``warmup`` steps, then a cosine decay that reaches 0 at the last step. Picklable as
    ``functools.partial(warmup_cosine, warmup=..., steps=...)``, a ``warmup`` for
    :func:`lnbook.seeds.fit_lm`."""
    check_positive_int(step, "step")
    check_int(warmup, "warmup")
    check_positive_int(steps, "steps")
    if not 0 <= warmup < steps:
        raise ValueError(f"warmup must be in 0..steps-1 = {steps - 1}, got {warmup}")
    if step <= warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * min(step - warmup, steps - warmup) / (steps - warmup)))


def radam_factor(step: int, beta2: float = 0.999) -> float:
    """The factor by which RAdam's rectification scales Adam's step ``step`` (from 1), for
    ``beta2``: ``r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))``
    where the variance is tractable (``rho_t > 5``), else 0 (RAdam then takes an un-adapted
    momentum step instead). As a learning-rate schedule for Adam it gives RAdam's step sizes
    without its correction of the direction, the control that tells the two apart."""
    check_positive_int(step, "step")
    rho_inf = 2 / (1 - beta2) - 1
    rho = rho_inf - 2 * step * beta2**step / (1 - beta2**step)
    if rho <= 5:
        return 0.0
    return math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))


def prepare(model: nn.Module, lr: float, seed: int, optimizer: str = "adam") -> Run:
    """The start of every training loop: check ``lr``, make the optimizer (:func:`make_optimizer`)
    over the model's parameters, seed torch's global generator (dropout) and a generator for
    the data order with ``seed``, and put the model in training mode."""
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    params = list(model.parameters())
    opt = make_optimizer(params, lr, optimizer)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model.train()
    return Run(opt, params[0].device, generator)


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float | None = None) -> float:
    """One step on ``loss``: gradients, their global norm clipped to ``grad_clip`` if given,
    and the update of every parameter ``optimizer`` holds. Returns the loss as a float."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip is not None:
        nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], grad_clip)
    optimizer.step()
    return loss.item()


def clip_member_grads(params: Sequence[torch.Tensor], max_norm: float) -> None:
    """Gradient clipping for many models stacked as one: ``params`` each have a leading member
    axis ``(S, ...)``, and each member's gradients are scaled so that their global norm is at
    most ``max_norm``, as ``clip_grad_norm_`` would on that member alone."""
    norm = sum(p.grad.pow(2).reshape(len(p.grad), -1).sum(1) for p in params).sqrt()  # (S,)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad.mul_(scale.view(-1, *[1] * (p.ndim - 1)))


@contextmanager
def evaluating(model: nn.Module) -> Iterator[torch.device]:
    """Inside the block, ``model`` is in eval mode and autograd records nothing; yields the
    device of the model's parameters. The model's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield next(model.parameters()).device
    finally:
        model.train(was_training)


def accuracy(model: nn.Module, data: Dataset, batch_size: int = 512) -> float:
    """Fraction of ``data = (inputs..., labels)`` that ``model`` (in eval mode) classifies right."""
    correct = 0
    with evaluating(model) as device:
        for i in range(0, len(data[-1]), batch_size):
            *inputs, y = (t[i : i + batch_size].to(device) for t in data)
            correct += int((model(*inputs).argmax(-1) == y).sum())
    return correct / len(data[-1])


def fit(
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    optimizer: str = "adam",
    grad_clip: float | None = None,
    drop_last: bool = False,
    max_steps: int | None = None,
) -> History:
    """Train a classifier with cross-entropy; evaluate on ``test`` after every epoch.

    Args:
        model: called as ``model(*inputs)`` on a mini-batch, returns logits ``(B, classes)``.
        train, test: tuples ``(inputs..., labels)`` of tensors sharing their first dimension,
            e.g. ``(x, y)`` or ``(x, lengths, y)``; labels are int64.
        epochs, lr, batch_size: the usual; the last mini-batch of an epoch may be smaller.
        seed: seeds the shuffling and any randomness inside the model (dropout). Initialize
            the model after ``seed_everything`` for a fully repeatable run; on a CPU with a
            fixed thread count, the same seed gives the same history.
        optimizer: ``"adam"``, or ``"sgd"`` with momentum 0.9.
        grad_clip: if given, clip the global gradient norm to it (recurrent networks).
        drop_last: skip each epoch's last mini-batch when it is smaller than ``batch_size``
            (BatchNorm cannot train on a batch of one).
        max_steps: stop after this many optimizer steps, even inside an epoch (which is then
            evaluated as the last): a budget in updates that is the same for every batch size.
    """
    train, test = check_dataset(train, "train"), check_dataset(test, "test")
    check_positive_int(epochs, "epochs")
    check_positive_int(batch_size, "batch_size")
    if max_steps is not None:
        check_positive_int(max_steps, "max_steps")
    run = prepare(model, lr, seed, optimizer)
    n = len(train[-1])
    history = History(steps_per_epoch=n // batch_size if drop_last else -(-n // batch_size))
    seen = history.steps_per_epoch * batch_size if drop_last else n
    elapsed = 0.0
    for _ in progress(range(epochs), "epochs"):
        start, correct, count = time.perf_counter(), 0, 0
        for idx in torch.randperm(n, generator=run.generator)[:seen].split(batch_size):
            *inputs, y = (t[idx].to(run.device) for t in train)
            logits = model(*inputs)
            history.step_loss.append(optimizer_step(run.optimizer, nn.functional.cross_entropy(logits, y), grad_clip))
            correct += int((logits.argmax(-1) == y).sum())
            count += len(y)
            if len(history.step_loss) == max_steps:
                break
        elapsed += time.perf_counter() - start
        history.wall_time.append(elapsed)
        history.train_acc.append(correct / count)
        history.test_acc.append(accuracy(model, test))
        if len(history.step_loss) == max_steps:
            break
    return history


@dataclass
class LMHistory:
    """What :func:`fit_lm` measured: the training loss of every step; the validation loss
    ``val_loss[i]`` after step ``val_steps[i]`` and the training seconds so far, ``wall_time[i]``;
    and whether training stopped early on a non-finite loss (``diverged``).

    With ``fit_lm(..., record_logits=True)``, one entry per step, measured on the step's batch
    before its update: ``attn_logit_max``, the largest attention logit of any layer and head;
    ``attn_entropy``, the smallest over the layers and heads of a head's attention entropy
    averaged over the batch and the queries (nats; one collapsed head shows);
    ``log_z``, the mean over positions of the output's ``logsumexp(logits)``. Empty otherwise.
    With a ``z_loss`` weight, ``step_loss`` is the cross-entropy alone, without the z-loss term."""

    step_loss: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    diverged: bool = False
    attn_logit_max: list[float] = field(default_factory=list)
    attn_entropy: list[float] = field(default_factory=list)
    log_z: list[float] = field(default_factory=list)


def windows(ids: torch.Tensor, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of a token stream ``ids`` starting at ``starts (*)``: inputs and next-token targets, each ``(*, block_size)``."""
    rows = starts[:, None] + torch.arange(block_size + 1)
    chunk = ids[rows]
    return chunk[:, :-1], chunk[:, 1:]


def _per_member(model: nn.Module, inputs: Sequence[torch.Tensor], device: torch.device) -> float | np.ndarray:
    """``model.loss(*inputs)`` as a float, or, for a model of many seeds (:mod:`lnbook.seeds`),
    with the inputs given to every member, one loss per member ``(S,)``."""
    s = getattr(model, "members", None)
    inputs = [t.to(device) if s is None else t.to(device).expand(s, *t.shape) for t in inputs]
    loss = model.loss(*inputs)
    return float(loss) if s is None else loss.double().cpu().numpy()


def lm_loss(model: nn.Module, ids: torch.Tensor, block_size: int, batches: int = 4, batch_size: int = 32) -> float | np.ndarray:
    """Mean next-token loss of ``model`` (in eval mode) on ``batches`` fixed windows of ``ids``
    (one per member, ``(S,)``, for a model of many seeds)."""
    starts = torch.randint(len(ids) - block_size, (batches, batch_size), generator=torch.Generator().manual_seed(0))
    with evaluating(model) as device:
        losses = [_per_member(model, windows(ids, s, block_size), device) for s in starts]
    return sum(losses) / len(losses)


def mlm_batch(
    ids: torch.Tensor, batch_size: int, block_size: int, mask_id: int, generator: torch.Generator,
    min_len: int = 1, mask_rate: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A right-padded batch for masked-token prediction, as BERT's pre-training (simplified).

    Draws ``batch_size`` windows of ``ids`` with lengths uniform in ``min_len..block_size``,
    replaces each real token with ``mask_id`` with probability ``mask_rate`` (at least one per
    window; BERT also leaves some unchanged or random, this does not) and pads to ``block_size``.
    Returns ``idx (B, T)`` with the masked input, ``targets (B, T)``: the original token where
    it was masked, -100 (ignored) elsewhere, and ``mask (B, T)``: True on the real tokens.
    """
    check_positive_int(batch_size, "batch_size")
    check_int(min_len, "min_len", 1)
    if min_len > block_size:
        raise ValueError(f"min_len must be at most block_size = {block_size}, got {min_len}")
    check_number(mask_rate, "mask_rate", "a number in (0, 1]", lambda v: 0 < v <= 1)
    lengths = torch.randint(min_len, block_size + 1, (batch_size,), generator=generator)
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    tokens = ids[starts[:, None] + torch.arange(block_size)]
    mask = torch.arange(block_size) < lengths[:, None]
    hidden = (torch.rand(batch_size, block_size, generator=generator) < mask_rate) & mask
    hidden[torch.arange(batch_size), (torch.rand(batch_size, generator=generator) * lengths).long()] = True
    return tokens.masked_fill(hidden, mask_id).masked_fill(~mask, 0), tokens.masked_fill(~hidden, -100), mask


def mlm_loss(model: nn.Module, ids: torch.Tensor, block_size: int, mask_id: int, min_len: int = 1,
             mask_rate: float = 0.15, batches: int = 4, batch_size: int = 32) -> float | np.ndarray:
    """Mean masked-token loss of ``model`` (in eval mode) on ``batches`` fixed batches of
    :func:`mlm_batch` drawn from ``ids`` (one per member, ``(S,)``, for a model of many seeds)."""
    generator = torch.Generator().manual_seed(0)
    with evaluating(model) as device:
        losses = [_per_member(model, mlm_batch(ids, batch_size, block_size, mask_id, generator, min_len, mask_rate), device)
                  for _ in range(batches)]
    return sum(losses) / len(losses)


def _fit_steps(
    model: nn.Module, batch: Callable[[torch.Generator], tuple[torch.Tensor, ...]], validate: Callable[[], float],
    *, steps: int, lr: float, seed: int, warmup: int, grad_clip: float | None, eval_every: int,
    objective: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    record: Callable[[LMHistory], None] | None = None, optimizer: str = "adam",
) -> LMHistory:
    """The loop :func:`fit_lm` and :func:`fit_mlm` share: Adam (or ``optimizer``) on ``model.loss(*batch(generator))``
    with a linear warm-up, ``validate()`` every ``eval_every`` steps, a stop on a non-finite loss.

    ``objective(*batch)``, if given, replaces ``model.loss`` and returns ``(loss to minimize,
    loss to report)``; ``record(history)``, if given, runs after each step's forward pass."""
    for name, value in (("steps", steps), ("eval_every", eval_every)):
        check_positive_int(value, name)
    check_int(warmup, "warmup")
    run = prepare(model, lr, seed, optimizer)
    history, elapsed = LMHistory(), 0.0
    for step in progress(range(1, steps + 1), "steps"):
        start = time.perf_counter()
        for group in run.optimizer.param_groups:
            group["lr"] = lr * min(1.0, step / warmup) if warmup else lr
        inputs = (t.to(run.device) for t in batch(run.generator))
        if objective is None:  # the default path, as it always was
            history.step_loss.append(optimizer_step(run.optimizer, model.loss(*inputs), grad_clip))
        else:
            loss, reported = objective(*inputs)
            if record is not None:
                record(history)
            optimizer_step(run.optimizer, loss, grad_clip)
            history.step_loss.append(reported.item())
        elapsed += time.perf_counter() - start
        if not math.isfinite(history.step_loss[-1]):
            history.diverged = True
            break
        if step % eval_every == 0 or step == steps:
            history.val_steps.append(step)
            history.val_loss.append(validate())
            history.wall_time.append(elapsed)
    return history


def fit_lm(
    model: nn.Module,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    block_size: int,
    seed: int,
    warmup: int = 0,
    grad_clip: float | None = 1.0,
    eval_every: int = 50,
    z_loss: float = 0.0,
    record_logits: bool = False,
    optimizer: str = "adam",
) -> LMHistory:
    """Train a next-token model on random windows of a token stream, with Adam.

    Args:
        model: has ``model.loss(idx (B, T), targets (B, T)) -> scalar``, e.g. ``TinyGPT``.
        train_ids, val_ids: 1-D int64 token streams; each step draws ``batch_size`` windows
            of ``block_size + 1`` tokens from ``train_ids``.
        steps, lr, seed: the usual; the learning rate rises linearly from ``lr / warmup`` to
            ``lr`` over the first ``warmup`` steps (0: no warm-up), then stays.
        grad_clip: clip the global gradient norm to it (None: no clipping).
        eval_every: measure the validation loss (:func:`lm_loss`) every this many steps and
            after the last. A non-finite training loss stops training (``diverged``).
        z_loss: add ``z_loss * mean(log(Z)**2)`` to the loss, where ``log Z = logsumexp(logits)``
            over the vocabulary at each position (PaLM's auxiliary loss, which keeps the
            softmax normalizer near 1; PaLM used 1e-4). 0: none. ``model(idx)`` must return
            the logits ``(B, T, vocab)``.
        record_logits: record ``attn_logit_max``, ``attn_entropy`` and ``log_z`` of every step
            in the history (see :class:`LMHistory`); the model's attention layers (those with a
            ``record_logits`` attribute, as ``TinyGPT``'s) compute attention explicitly while
            training, which is slower. The default (False) leaves the training step as it is.
        optimizer: ``"adam"``, or another of :data:`OPTIMIZERS` (``"radam"``: Adam rectified
            for its early variance, a warm-up built into the optimizer).
    """
    check_streams(train_ids, val_ids, block_size)
    check_positive_int(batch_size, "batch_size")

    def batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return windows(train_ids, torch.randint(len(train_ids) - block_size, (batch_size,), generator=generator), block_size)

    objective = LMObjective(model, z_loss)

    def record(history: LMHistory) -> None:
        history.attn_logit_max.append(max(m.logit_max for m in layers))
        history.attn_entropy.append(min(m.entropy for m in layers))
        history.log_z.append(objective.log_z.item())

    with recording_logits(model, record_logits) as layers:
        return _fit_steps(model, batch, lambda: lm_loss(model, val_ids, block_size), steps=steps, lr=lr, seed=seed,
                          warmup=warmup, grad_clip=grad_clip, eval_every=eval_every,
                          objective=objective if z_loss or record_logits else None, record=record if record_logits else None,
                          optimizer=optimizer)


class LMObjective:
    """What :func:`fit_lm` minimizes when it records or adds PaLM's z-loss: ``objective(idx,
    targets) -> (loss, cross-entropy)``, the loss ``cross-entropy + z_loss * mean(log(Z)**2)``
    with ``log Z = logsumexp(logits)`` over the vocabulary at each position. Keeps ``log_z``,
    the last call's mean log Z: a scalar, or one per member ``(S,)`` for a model of many seeds
    (``idx (S, B, T)``, :mod:`lnbook.seeds`), whose losses are then ``(S,)`` too."""

    def __init__(self, model: nn.Module, z_loss: float = 0.0) -> None:
        self.model = model
        self.z_loss = check_number(z_loss, "z_loss", "a number >= 0", lambda v: v >= 0)
        self.log_z = torch.zeros(())

    def __call__(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(idx)
        if idx.ndim == 2:
            cross_entropy = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            log_z = logits.logsumexp(-1)  # (B, T)
            squared = log_z.pow(2).mean()
            self.log_z = log_z.detach().mean()
        else:  # one loss per member
            each = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none")
            cross_entropy = each.view(len(idx), -1).mean(1)
            log_z = logits.logsumexp(-1).flatten(1)  # (S, B * T)
            squared = log_z.pow(2).mean(1)
            self.log_z = log_z.detach().mean(1)
        return (cross_entropy + self.z_loss * squared if self.z_loss else cross_entropy), cross_entropy


@contextmanager
def recording_logits(model: nn.Module, record: bool) -> Iterator[list[nn.Module]]:
    """Inside the block, the attention layers of ``model`` (its modules with a ``record_logits``
    attribute, as ``TinyGPT``'s) compute attention explicitly and keep their largest logit and
    entropy if ``record`` is True; yields those layers. Recording is off after the block."""
    if not isinstance(record, bool):
        raise TypeError(f"record_logits must be a bool, got {type(record).__name__}")
    layers = [m for m in model.modules() if hasattr(m, "record_logits")]
    if record and not layers:
        raise ValueError("record_logits=True needs attention layers with a record_logits attribute (as TinyGPT's)")
    for m in layers:
        m.record_logits = record
    try:
        yield layers
    finally:
        for m in layers:
            m.record_logits = False


def fit_mlm(
    model: nn.Module,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    block_size: int,
    seed: int,
    mask_id: int,
    min_len: int = 1,
    mask_rate: float = 0.15,
    warmup: int = 0,
    grad_clip: float | None = 1.0,
    eval_every: int = 50,
) -> LMHistory:
    """Train an encoder on masked-token prediction over padded batches (:func:`mlm_batch`), with Adam.

    ``model.loss(idx, targets, mask)`` must ignore targets of -100 and take the padding mask,
    as ``TinyGPT`` does (build it with ``causal=False`` and ``vocab_size > mask_id``).
    ``mask_id`` is a token id that neither stream uses. The validation loss is
    :func:`mlm_loss`; ``min_len`` and ``mask_rate`` are :func:`mlm_batch`'s; everything else is
    as in :func:`fit_lm`.
    """
    check_streams(train_ids, val_ids, block_size)
    check_positive_int(batch_size, "batch_size")
    check_mask_id(mask_id, train_ids, val_ids)

    def batch(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return mlm_batch(train_ids, batch_size, block_size, mask_id, generator, min_len, mask_rate)

    return _fit_steps(model, batch, lambda: mlm_loss(model, val_ids, block_size, mask_id, min_len, mask_rate), steps=steps,
                      lr=lr, seed=seed, warmup=warmup, grad_clip=grad_clip, eval_every=eval_every)


def fit_job(job: dict) -> tuple[nn.Module, History | LMHistory]:
    """``fit(**job)`` (or ``job["fit"](**job)``, e.g. :func:`fit_lm`), returning the trained
    model with its history: one unit of work for :func:`fit_many` (a module-level function,
    so a worker process can unpickle it)."""
    job = dict(job)
    model = job.pop("model")
    return model, job.pop("fit", fit)(model, **job)


def cpu_workers(processes: int = 2) -> Executor | None:
    """A pool of up to ``processes`` fresh Python processes with one CPU thread each, for
    :func:`fit_many`, sized to the cores this process may use and shares: under pytest-xdist
    (nbval runs notebooks side by side) each worker's share. None when that leaves one core:
    jobs then run in this process, one after the other, with the same results.

    A model's result does not depend on where it ran (one thread each). Starting a worker costs
    an ``import torch`` (seconds), so make one pool and reuse it; it closes with
    ``shutdown()`` or when Python exits.
    """
    check_positive_int(processes, "processes")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = max(1, cores // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    if min(processes, share) == 1:
        return None
    context = multiprocessing.get_context("spawn")  # fork is unsafe once torch has started threads
    return ProcessPoolExecutor(min(processes, share), mp_context=context, initializer=_init_worker)


def _init_worker() -> None:
    torch.set_num_threads(1)
    os.environ["LNBOOK_PROGRESS"] = "0"  # the notebook shows the runs finishing; a worker's own lines would go to the server's log
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the notebook's to handle, not each worker's


def fit_many(jobs: Sequence[dict], workers: Executor | None = None) -> list[Future]:
    """Start independent :func:`fit` calls; return one future per job, in order.

    Each job is a dict of :func:`fit`'s keyword arguments, including ``model``, ``train`` and
    ``test`` (or, with ``"fit": fit_lm``, of :func:`fit_lm`'s); a future's ``result()`` is
    ``(trained model, history)``. With an executor
    (:func:`cpu_workers`) the jobs queue on it and this returns at once; the trained models
    come back as copies. Without one, the jobs run here before this returns. On a CPU with
    one thread per process, a job's result does not depend on where it ran.
    """
    for i, job in enumerate(jobs):
        if not isinstance(job, dict) or not isinstance(job.get("model"), nn.Module):
            raise TypeError(f"jobs[{i}] must be a dict of fit's keyword arguments with an nn.Module under 'model'")
    if workers is not None:
        return [workers.submit(fit_job, job) for job in jobs]
    futures = []
    for job in progress(jobs, "runs"):
        futures.append(Future())
        futures[-1].set_result(fit_job(job))
    return futures


def start_runs(
    make: Callable[[], nn.Module],
    seeds: Sequence[int],
    workers: Executor | None = None,
    device: torch.device | str | None = None,
    **job: object,
) -> list[Future]:
    """Queue one run per seed: ``seed_everything(seed)``, a fresh ``make()`` (moved to
    ``device`` if given) and ``fit_many`` of ``dict(model=..., seed=seed, **job)`` on
    ``workers``. Returns the futures in the order of ``seeds``; :func:`finish_runs` waits for them."""
    jobs = []
    for seed in seeds:
        seed_everything(seed)
        model = make()
        jobs.append(dict(model=model if device is None else model.to(device), seed=seed, **job))
    return fit_many(jobs, workers)


def finish_runs(started: Mapping[Hashable, Sequence[Future]]) -> dict[Hashable, list[tuple[nn.Module, object]]]:
    """Wait for queued runs: ``{name: futures}`` -> ``{name: [(trained model, history) per seed]}``."""
    waiting = [f for futures in started.values() for f in futures]
    for _ in progress(as_completed(waiting), "runs finished", total=len(waiting)):
        pass
    return {name: [f.result() for f in futures] for name, futures in started.items()}
