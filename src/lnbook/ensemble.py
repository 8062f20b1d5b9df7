"""Chapter 02's recurrent networks, many seeds as one model: thin uses of :mod:`lnbook.seeds`.

:func:`stacked_rnn` stacks ``members`` plain :class:`lnbook.rnn.ElmanClassifier` whose initial
weights are drawn together (:func:`plain_rnns`) with :func:`lnbook.seeds.stack`, and :func:`fit`
trains them with :func:`lnbook.seeds.fit` (Adam, each member's gradient clipped on its own), the
members' mini-batches drawn from one generator in the orders :func:`batch_order` makes (random,
or bucketed by length), the test accuracy in an :class:`EnsembleHistory` with one column per
member. :func:`population_statistics` re-estimates the batch norms' running statistics as
Cooijmans et al. do, and :func:`trajectory` measures the recurrence step by step.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from . import seeds
from ._checks import check_choice, check_int, check_number, check_positive_int
from .data import Dataset
from .rnn import ELMAN_NORMS, ElmanClassifier, RecurrentBatchNorm

NORMS = ELMAN_NORMS
ORDERS = ("random", "bucketed")


def plain_rnns(members: int, input_size: int, hidden_size: int, n_classes: int, norm: str = "none",
               **options: object) -> list[ElmanClassifier]:
    """``members`` plain :class:`~lnbook.rnn.ElmanClassifier` (``norm`` and ``options`` as
    there), their initial weights drawn together from torch's global generator, one
    ``(members, ...)`` tensor per weight: ``W_ih`` and ``b`` uniform in ``±1/sqrt(input_size)``
    (no ``b`` for a batch norm), ``W_hh`` orthogonal (member by member), the head's weight and
    bias uniform in ``±1/sqrt(hidden_size)``. Chapter 02's networks start from these draws; the
    generator is left where they leave it."""
    check_positive_int(members, "members")
    e, f, h = members, check_positive_int(input_size, "input_size"), check_positive_int(hidden_size, "hidden_size")
    check_positive_int(n_classes, "n_classes")
    with torch.random.fork_rng(devices=[]):  # the models' own initialization, overwritten below, draws nothing here
        models = [ElmanClassifier(input_size, hidden_size, n_classes, norm, **options) for _ in range(e)]

    def uniform(shape: tuple[int, ...], bound: float) -> torch.Tensor:
        return torch.empty(shape).uniform_(-bound, bound)

    w_ih = uniform((e, f, h), 1 / math.sqrt(f))
    b = None if models[0].bias is None else uniform((e, 1, h), 1 / math.sqrt(f))
    w_hh = torch.stack([nn.init.orthogonal_(torch.empty(h, h)) for _ in range(e)])
    head_w, head_b = uniform((e, h, n_classes), 1 / math.sqrt(h)), uniform((e, 1, n_classes), 1 / math.sqrt(h))
    with torch.no_grad():
        for i, model in enumerate(models):
            model.weight_ih.copy_(w_ih[i].T)
            model.weight_hh.copy_(w_hh[i].T)
            if b is not None:
                model.bias.copy_(b[i, 0])
            model.head.weight.copy_(head_w[i].T)
            model.head.bias.copy_(head_b[i, 0])
    return models


def stacked_rnn(members: int, input_size: int, hidden_size: int, n_classes: int, norm: str = "none",
                **options: object) -> nn.Module:
    """The :func:`plain_rnns` stacked into one model with a leading seed axis
    (:func:`lnbook.seeds.stack`): ``x (members, B, T, F)``, ``lengths (members, B)`` ->
    logits ``(members, B, n_classes)``."""
    return seeds.stack(plain_rnns(members, input_size, hidden_size, n_classes, norm, **options))


@dataclass
class EnsembleHistory:
    """What :func:`fit` measured, one column per member: ``step_loss (steps, E)``; test
    accuracy ``test_acc (evaluations, E)`` after the updates counted in ``eval_steps``."""

    step_loss: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    eval_steps: list[int] = field(default_factory=list)
    test_acc: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


def _stacked_rnn(model: nn.Module) -> int:
    s = seeds.members(model)
    if s is None or not isinstance(model, ElmanClassifier):
        raise TypeError(f"model must be ElmanClassifiers stacked by lnbook.seeds.stack (stacked_rnn), got {type(model).__name__}"
                        + ("" if s is None else f" of {s} members"))
    return s


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


def fit(
    model: nn.Module,
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
    """Train every member of a :func:`stacked_rnn` with Adam and cross-entropy
    (:func:`lnbook.seeds.fit`); return the :class:`EnsembleHistory`.

    ``train`` and ``test`` are ``(x, y)`` or padded ``(x, lengths, y)``. Each member draws its own
    mini-batches (:func:`batch_order`, ``order`` ``"random"`` or ``"bucketed"``), all from one
    generator seeded by ``seed``; a batch runs only to its longest member. ``grad_clip`` bounds
    each member's gradient norm. Test accuracy is measured after every epoch, or every
    ``eval_every`` updates; ``max_steps`` stops training after that many updates.
    """
    s = _stacked_rnn(model)
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        check_positive_int(value, name)
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_int(seed, "seed")
    check_choice(order, ORDERS, "order")
    for name, value in (("max_steps", max_steps), ("eval_every", eval_every)):
        if value is not None:
            check_positive_int(value, name)
    train = _sequences(train)
    if batch_size > len(train[-1]):
        raise ValueError(f"batch_size must be at most the {len(train[-1])} training examples, got {batch_size}")
    generator = torch.Generator().manual_seed(seed)
    histories = seeds.fit(model, train, test, epochs=epochs, lr=lr, batch_size=batch_size, seeds=[seed] * s,
                          grad_clip=grad_clip, max_steps=max_steps, eval_every=eval_every,
                          order=lambda: batch_order(train[1], s, batch_size, order, generator).unbind(1))
    updates = len(histories[0].step_loss)
    if eval_every is None:  # after every epoch, the last perhaps cut short by max_steps
        steps = [min((i + 1) * histories[0].steps_per_epoch, updates) for i in range(len(histories[0].test_acc))]
    else:
        steps = list(range(eval_every, updates + 1, eval_every))
        steps += [updates] if steps[-1:] != [updates] else []
    return EnsembleHistory(step_loss=np.array([h.step_loss for h in histories]).T, eval_steps=steps,
                           test_acc=np.array([h.test_acc for h in histories]).T)


def _batch_norms(model: nn.Module) -> list[RecurrentBatchNorm]:
    return [m for m in model.modules() if isinstance(m, RecurrentBatchNorm)]


def population_statistics(model: nn.Module, data: Dataset, batch_size: int, seed: int = 0) -> None:
    """Replace the running statistics of a :func:`stacked_rnn` by population statistics
    (Cooijmans et al.): every step's mean and variance averaged over the batch statistics of
    one pass through ``data`` (random mini-batches of ``batch_size``, :func:`batch_order`
    from a generator seeded with ``seed``; no update of the weights)."""
    s = _stacked_rnn(model)
    norms = _batch_norms(model)
    if not norms:
        raise ValueError(f"population statistics need a batch norm, the model's norm is {model.norm!r}")
    x, lengths, _ = _sequences(data)
    momenta, was_training = [m.momentum for m in norms], model.training
    device = next(model.parameters()).device
    for m in norms:
        m.momentum = None  # the running statistics: the plain average of every batch
        m.reset_running_stats()
    model.train()
    try:
        with torch.no_grad():
            batches = batch_order(lengths, s, batch_size, "random", torch.Generator().manual_seed(seed))
            for i in range(batches.shape[1]):
                idx = batches[:, i]
                model(x[idx].to(device), lengths[idx].to(device))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.train(was_training)


def trajectory(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """How the recurrence of a :func:`stacked_rnn` evolves over the steps of one batch
    ``x (B, T, F)`` (the same for every member), labels ``y (B,)``, in training mode (batch
    statistics) on a copy of the model. Each entry is ``(E, T)``:

    ``"input_mean"``, ``"input_std"``: the batch mean and standard deviation of each unit's summed
    input ``a_t`` (what a batch norm estimates at step t), averaged over the units;
    ``"state_mean"``, ``"state_rms"``: the mean and root mean square of ``h_t`` over batch and units;
    ``"grad_norm"``: the mean over the batch of ``|dL/dh_t|``, L the cross-entropy of the
    classification from the last state.
    """
    s = _stacked_rnn(model)
    net = copy.deepcopy(model).train()
    device = next(net.parameters()).device
    x, y = x.to(device), y.to(device)
    last, hs, summed = net.states(x.expand(s, *x.shape))
    for h in hs:
        h.retain_grad()
    loss = nn.functional.cross_entropy(net.head(last).flatten(0, 1), y.repeat(s))
    (loss * s).backward()  # each member's own mean loss
    per_step = {
        "input_mean": [a.detach().mean(1).mean(-1) for a in summed],
        "input_std": [a.detach().std(1).mean(-1) for a in summed],
        "state_mean": [h.detach().mean((1, 2)) for h in hs],
        "state_rms": [h.detach().pow(2).mean((1, 2)).sqrt() for h in hs],
        "grad_norm": [h.grad.norm(dim=-1).mean(1) for h in hs],
    }
    return {k: torch.stack(v, 1).cpu().numpy() for k, v in per_step.items()}
