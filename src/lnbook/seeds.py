"""Many seeds as one model: the seed axis.

A comparison is decided by many seeds, and many seeds cost time. Where a network is so small
that the overhead of each tensor operation outweighs its arithmetic (the book's MLPs on a
CPU), ``S`` networks stacked along a leading axis train in little more time than one; where
the arithmetic dominates (the Transformers and LSTMs at the chapters' sizes) stacking saves
less, and still trains every seed in one process (``benchmarks/seeds.py`` measures both).
:func:`stack` turns ``S`` plain models of one architecture (an :class:`~lnbook.models.MLP`, an
LSTM or GRU :class:`~lnbook.rnn.SequenceClassifier`, a :class:`~lnbook.transformer.TinyGPT`,
a :class:`~lnbook.transformer.TinyViT`) into one
model of the same class whose every parameter and buffer has a leading seed axis, and
:func:`unstack` copies its members back into plain models. Inputs and outputs gain the same
axis: member ``s`` computes on ``x[s]`` what plain model ``s`` computes on it (up to rounding).

How: the model's own ``forward`` runs unchanged, written for any number of leading
dimensions, and only its leaves are swapped: each ``nn.Linear``, ``nn.Embedding`` and norm
becomes the :class:`Linear`, :class:`Embedding` or :class:`Norm` of ``S`` members (a
batched matrix product, one lookup, each member's own gain, bias and batch statistics), and a
parameter an lnbook module holds itself gains the seed axis (that module's code lets it
broadcast over the batch: ``x @ w.mT``, ``bias.unsqueeze(-2)``); so do its buffers where it
says its code broadcasts them too (a class attribute ``stacks_buffers = True``, as
:class:`lnbook.rnn.RecurrentBatchNorm`). Every module of the stacked model gets the attribute
``members = S``.

:func:`fit` (classifiers) and :func:`fit_lm` / :func:`fit_mlm` (Transformers) train every
member as :func:`lnbook.train.fit`, :func:`~lnbook.train.fit_lm` and
:func:`~lnbook.train.fit_mlm` train it alone: its own mini-batches from its own seed, its own
learning rate (so a learning-rate grid is one run), its own gradient clipping, and, for a
language model, its own stop when its loss stops being finite. :func:`start_runs` (and
:func:`runs`, which waits) builds, trains and unstacks in one call, here or on a worker
process. Dropout draws other masks than a model alone would.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize

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
from .norms import (
    AdaNorm,
    DetachNorm,
    DyT,
    GroupNorm,
    LayerNorm,
    MaskedBatchNorm1d,
    RMSNorm,
    TimeStepBatchNorm,
    UnmaskedBatchNorm1d,
)
from .progress import progress
from .train import (
    OPTIMIZERS,
    History,
    LMHistory,
    LMObjective,
    clip_member_grads,
    fit_many,
    lm_loss,
    make_optimizer,
    mlm_batch,
    mlm_loss,
    recording_logits,
    windows,
)
from .utils import seed_everything


def members(model: nn.Module) -> int | None:
    """How many seeds ``model`` holds (a model made by :func:`stack`), None for a plain model."""
    return getattr(model, "members", None)


def _seeded(t: torch.Tensor, s: int) -> nn.Parameter:
    """A parameter ``(S, *t.shape)``, every member a copy of ``t``."""
    return nn.Parameter(t.detach().expand(s, *t.shape).clone())


def _broadcast(p: torch.Tensor, x: torch.Tensor, trailing: int = 1) -> torch.Tensor:
    """``p (S, *shape)`` viewed to broadcast against ``x (S, *lead, *shape)``, ``trailing = len(shape)``."""
    return p.view(p.shape[0], *[1] * (x.ndim - 1 - trailing), *p.shape[1:])


class _WeightNorm(nn.Module):
    """``w = g v / ||v||`` for each member's output rows: weight normalization with a seed axis,
    stored as torch's is (``original0 = g (S, out, 1)``, ``original1 = v (S, out, in)``)."""

    def forward(self, g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return g * v / v.norm(dim=-1, keepdim=True)

    def right_inverse(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return w.norm(dim=-1, keepdim=True), w


class Linear(nn.Module):
    """``S`` linear maps side by side: ``x (S, *, in) -> (S, *, out)``, member ``s`` with its
    own ``weight[s] (out, in)`` and ``bias[s] (out,)``; weight-normalized when the plain layer is."""

    def __init__(self, linear: nn.Linear, s: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = _seeded(linear.weight, s)
        self.bias = None if linear.bias is None else _seeded(linear.bias, s)
        if parametrize.is_parametrized(linear, "weight"):
            parametrize.register_parametrization(self, "weight", _WeightNorm(), unsafe=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, lead = x.shape[0], x.shape[1:-1]
        h, w = x.reshape(s, -1, self.in_features), self.weight.mT
        y = torch.bmm(h, w) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), h, w)
        return y.view(s, *lead, self.out_features)


class Embedding(nn.Module):
    """``S`` embedding tables side by side: ids ``(S, *)`` -> vectors ``(S, *, d)`` from
    member ``s``'s ``weight[s] (vocab, d)``."""

    def __init__(self, embedding: nn.Embedding, s: int) -> None:
        super().__init__()
        if embedding.padding_idx is not None or embedding.max_norm is not None or embedding.sparse:
            raise ValueError("stack takes nn.Embedding without padding_idx, max_norm or sparse gradients")
        self.weight = _seeded(embedding.weight, s)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        s, vocab = self.weight.shape[:2]
        offsets = torch.arange(s, device=idx.device).view(s, *[1] * (idx.ndim - 1)) * vocab
        return F.embedding(idx + offsets, self.weight.flatten(0, 1))


BATCH_NORMS = (MaskedBatchNorm1d, TimeStepBatchNorm)  # UnmaskedBatchNorm1d is a MaskedBatchNorm1d


class Norm(nn.Module):
    """The norm layers of ``S`` members side by side: ``x (S, *, F)`` -> the same, member ``s``
    normalized as its own layer would, with its own gain, bias (``alpha`` for DyT) and, for a
    batch norm, its own batch and running statistics. Called as the plain layer is, through
    :func:`lnbook.norms.apply_norm`: ``mask (S, *)`` marks real positions (batch norms),
    ``t`` the time step (:class:`~lnbook.norms.TimeStepBatchNorm`)."""

    def __init__(self, norm: nn.Module, s: int) -> None:
        super().__init__()
        self.plain = type(norm)
        self.shape = tuple(getattr(norm, "normalized_shape", None) or (getattr(norm, "num_features", None) or norm.num_channels,))
        self.eps = getattr(norm, "eps", None)
        for name, p in norm.named_parameters(recurse=False):
            setattr(self, name, _seeded(p, s))
        for name in ("weight", "bias"):
            if getattr(norm, name, None) is None:
                setattr(self, name, None)
        for name, b in norm.named_buffers(recurse=False):
            self.register_buffer(name, b.detach().expand(s, *b.shape).clone())
        if isinstance(norm, BATCH_NORMS):
            self.momentum = norm.momentum
        if isinstance(norm, (AdaNorm, GroupNorm)):  # a core without parameters
            self.core = copy.deepcopy(norm) if isinstance(norm, AdaNorm) else GroupNorm(norm.num_groups, self.shape[0],
                                                                                      eps=norm.eps, affine=False)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-len(self.shape), 0))
        kind = self.plain
        if kind in (nn.LayerNorm, LayerNorm):
            return F.layer_norm(x, self.shape, eps=self.eps)
        if kind in (RMSNorm, nn.RMSNorm):
            xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            eps = torch.finfo(xf.dtype).eps if self.eps is None else self.eps
            return (xf * torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + eps)).to(x.dtype)
        if kind is DyT:
            return torch.tanh(self.alpha.view(-1, *[1] * (x.ndim - 1)) * x)
        if kind is DetachNorm:
            var, mean = torch.var_mean(x.detach(), dim=dims, correction=0, keepdim=True)
            return (x - mean) * torch.rsqrt(var + self.eps)
        return self.core(x)

    def _batch(self, x: torch.Tensor, mask: torch.Tensor | None, t: int | None) -> torch.Tensor:
        s, f = x.shape[0], x.shape[-1]
        xr = x.reshape(s, -1, f)
        real = None if mask is None or self.plain is UnmaskedBatchNorm1d else mask.reshape(s, -1, 1)
        if real is not None:
            xr = torch.where(real, xr, 0.0)
        step = None if self.plain is not TimeStepBatchNorm else min(t, self.running_mean.shape[1] - 1)
        if self.training and step is not None and step != t:
            raise ValueError(f"t = {t} is beyond max_steps = {step + 1}; training needs statistics for every step")
        run_mean = self.running_mean if step is None else self.running_mean[:, step]
        run_var = self.running_var if step is None else self.running_var[:, step]
        run_mean, run_var = run_mean.unsqueeze(1), run_var.unsqueeze(1)  # (S, 1, F)
        if not self.training:
            mean, var = run_mean, run_var
        else:
            n = torch.full((s, 1, 1), xr.shape[1], device=x.device) if real is None else real.sum(1, keepdim=True)
            mean = xr.sum(1, keepdim=True) / n.clamp_min(1) if real is not None else xr.mean(1, keepdim=True)
            centered = xr - mean if real is None else torch.where(real, xr - mean, 0.0)
            var = centered.pow(2).sum(1, keepdim=True) / n.clamp_min(1)
            ok = n >= 2
            if step is None and not bool(ok.all()):
                raise ValueError("BatchNorm needs more than one real position per feature in training, for every "
                                 f"member; got {describe(n.flatten().tolist())}")
            with torch.no_grad():
                unbiased = var * n / (n - 1).clamp_min(1)
                run_mean.copy_(torch.where(ok, run_mean.lerp(mean, self.momentum), run_mean))
                run_var.copy_(torch.where(ok, run_var.lerp(unbiased, self.momentum), run_var))
                if step in (None, 0):
                    self.num_batches_tracked += 1
            mean, var = torch.where(ok, mean, run_mean.clone()), torch.where(ok, var, run_var.clone())
        y = ((xr - mean) * torch.rsqrt(var + self.eps)).view(x.shape)
        if self.weight is not None:
            y = y * _broadcast(self.weight, y) + _broadcast(self.bias, y)
        return y if real is None else torch.where(mask.unsqueeze(-1), y, 0.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, t: int | None = None) -> torch.Tensor:
        if issubclass(self.plain, BATCH_NORMS):
            return self._batch(x, mask, t)
        y = self._normalize(x)
        trailing = len(self.shape)
        if self.weight is not None:
            y = y * _broadcast(self.weight, y, trailing)
        return y if self.bias is None else y + _broadcast(self.bias, y, trailing)


NORM_LAYERS = (nn.LayerNorm, LayerNorm, RMSNorm, nn.RMSNorm, DyT, DetachNorm, AdaNorm, GroupNorm, *BATCH_NORMS)
LEAVES = (Linear, Embedding, Norm)


def _leaf(module: nn.Module, s: int) -> nn.Module | None:
    """The seed-stacked twin of a plain leaf module (None: the module is kept as it is)."""
    if isinstance(module, nn.Linear):
        return Linear(module, s)
    if isinstance(module, nn.Embedding):
        return Embedding(module, s)
    if isinstance(module, NORM_LAYERS):
        return Norm(module, s)
    if isinstance(module, nn.Flatten):  # the seed axis comes first: flatten one dimension later
        return nn.Flatten(*(d + 1 if d >= 0 else d for d in (module.start_dim, module.end_dim)))
    return None


def _ours(module: nn.Module) -> bool:
    """Whether ``module`` is one of lnbook's (weight-normalized or not)."""
    return parametrize.type_before_parametrizations(module).__module__.startswith("lnbook.")


def _architecture(model: nn.Module) -> list:
    return [(name, type(m).__name__) for name, m in model.named_modules()] + [(k, v.shape) for k, v in model.state_dict().items()]


def stack(models: Sequence[nn.Module]) -> nn.Module:
    """One model of the same class as ``models`` (``S`` plain models of one architecture,
    typically one per seed) whose parameters and buffers are theirs, stacked on a leading seed
    axis. It takes inputs ``(S, *)`` and returns outputs ``(S, *)``: member ``s`` computes on
    ``x[s]`` what ``models[s]`` computes on it. ``models`` are left unchanged."""
    if not isinstance(models, Sequence) or not models or not all(isinstance(m, nn.Module) for m in models):
        raise TypeError(f"models must be a non-empty sequence of torch modules, got {describe(models)}")
    first = models[0]
    if members(first) is not None:
        raise ValueError("models must be plain models; models[0] already holds a seed axis")
    if any(type(m) is not type(first) or _architecture(m) != _architecture(first) for m in models):
        raise ValueError("models must share one architecture: the same class, modules and parameter shapes")
    s, skeleton, replaced = len(models), copy.deepcopy(first), []
    for name, module in list(skeleton.named_modules()):
        if not name or any(name.startswith(r + ".") for r in replaced) or "parametrizations" in name.split("."):
            continue
        twin = _leaf(module, s)
        if twin is not None:
            skeleton.set_submodule(name, twin)
            replaced.append(name)
        elif (module._parameters or module._buffers) and not _ours(module):
            raise TypeError(f"stack cannot give {type(module).__name__} ({name}) a seed axis: it stacks "
                            "nn.Linear, nn.Embedding, the norms of lnbook.norms and lnbook's own modules")
    for module in list(skeleton.modules()):  # an lnbook module's own parameters: (S, *shape)
        if isinstance(module, LEAVES) or not _ours(module):
            continue
        if any(b is not None for b in module._buffers.values()) and not getattr(module, "stacks_buffers", False):
            raise TypeError(f"stack cannot give the buffers of {type(module).__name__} a seed axis")
        for bname, b in list(module._buffers.items()):  # a module written for a seed axis on its buffers too
            if b is not None:
                module._buffers[bname] = b.detach().expand(s, *b.shape).clone()
        for pname, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[pname] = _seeded(p, s)
        for tensors in module.parametrizations.values() if parametrize.is_parametrized(module) else ():
            if [type(f).__name__ for f in tensors] != ["_WeightNorm"]:  # torch's weight norm over each output row
                raise TypeError(f"stack knows torch's weight norm as a parametrization, not {tensors}")
            tensors[0] = _WeightNorm()  # the same per member
            for i in range(tensors.ntensors):
                setattr(tensors, f"original{i}", _seeded(getattr(tensors, f"original{i}"), s))
    shared: dict[int, str] = {}  # tied weights (TinyGPT's head and token embedding) stay tied
    for name, p in first.named_parameters(remove_duplicate=False):
        if id(p) in shared:
            path, _, attr = name.rpartition(".")
            setattr(skeleton.get_submodule(path), attr, skeleton.get_parameter(shared[id(p)]))
        else:
            shared[id(p)] = name
    states = [m.state_dict() for m in models]
    _load(skeleton, {k: torch.stack([st[k] for st in states]) for k in states[0]})
    for module in skeleton.modules():
        module.members = s
    return skeleton.train(first.training)


def _load(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    model.load_state_dict({k: v.reshape(own[k].shape) for k, v in state.items()})


def unstack(model: nn.Module, models: Sequence[nn.Module]) -> list[nn.Module]:
    """Copy member ``s`` of ``model`` (made by :func:`stack`) into ``models[s]``, plain models of
    its architecture (those it was stacked from, say), and return them as a list."""
    s = members(model)
    if s is None:
        raise ValueError("model must be made by lnbook.seeds.stack (it has no seed axis)")
    if not isinstance(models, Sequence) or len(models) != s or any(members(m) is not None for m in models):
        raise ValueError(f"models must be {s} plain models, one per member, got {describe(models)}")
    state = model.state_dict()
    for i, plain in enumerate(models):
        _load(plain, {k: v[i] for k, v in state.items()})
        plain.train(model.training)
    return list(models)


def member_lrs(lr: float | Sequence[float], s: int, what: str = "member") -> list[float]:
    """One learning rate per member of an ``s``-member stack: ``lr`` repeated, or checked
    (``what`` names a member in the message: "member", "agent")."""
    number = isinstance(lr, (int, float)) and not isinstance(lr, bool)
    lrs = [lr] * s if number else list(lr) if isinstance(lr, Sequence) and not isinstance(lr, str) else None
    if lrs is None or len(lrs) != s:
        raise ValueError(f"lr must be one number or one per {what} ({s}), got {describe(lr)}")
    for value in lrs:
        check_number(value, "lr", f"a positive number (or one per {what})", lambda v: v > 0)
    return lrs


def check_seeds(seeds: Sequence[int], s: int, what: str = "member") -> list[int]:
    """``seeds`` checked to hold one integer per member of an ``s``-member stack (``what`` names
    a member in the message)."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or len(seeds) != s:
        raise ValueError(f"seeds must have one entry per {what} ({s}), got {describe(seeds)}")
    return [check_int(seed, "seeds[i]") for seed in seeds]


def stack_size(model: nn.Module) -> int:
    """The number of members of a model made by :func:`stack`; TypeError for a plain model."""
    s = members(model)
    if s is None:
        raise TypeError(f"model must be made by lnbook.seeds.stack, got a plain {type(model).__name__}")
    return s


class StackedOptimizer:
    """Adam, RAdam or SGD with momentum 0.9 (:func:`lnbook.train.make_optimizer`) over a
    stacked model, each member at its own learning rate ``lrs[s]``. Each update is the learning
    rate times a direction that does not depend on it, so the step is taken at ``max(lrs)`` and
    member ``s``'s share of it scaled by ``lrs[s] / max(lrs)``; a member that stopped
    (``active[s]`` False) keeps its weights."""

    def __init__(self, model: nn.Module, lrs: list[float], optimizer: str, grad_clip: float | None,
                 beta2: float = 0.999) -> None:
        self.params = list(model.parameters())
        self.lr = max(lrs)
        self.opt = make_optimizer(self.params, self.lr, optimizer, beta2)
        params = self.params
        self.scale = torch.tensor(lrs, device=params[0].device) / self.lr
        self.grad_clip = grad_clip

    def step(self, losses: torch.Tensor, active: torch.Tensor, factor: float = 1.0) -> None:
        """One update on the members' ``losses (S,)``; ``factor`` scales every learning rate (warm-up)."""
        for group in self.opt.param_groups:
            group["lr"] = self.lr * factor
        self.opt.zero_grad(set_to_none=True)
        (losses if bool(active.all()) else torch.where(active, losses, 0.0)).sum().backward()
        if self.grad_clip is not None:
            clip_member_grads(self.params, self.grad_clip)
        scale = self.scale * active
        if bool((scale == 1).all()):
            self.opt.step()
            return
        before = [p.detach().clone() for p in self.params]
        self.opt.step()
        with torch.no_grad():
            for p, b in zip(self.params, before):
                k = scale.view(-1, *[1] * (p.ndim - 1))
                p.copy_(torch.where(k == 1, p, torch.where(k == 0, b, b + k * (p - b))))


def _inputs(data: Dataset, idx: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    return [t[idx].to(device) for t in data]


def accuracy(model: nn.Module, data: Dataset, batch_size: int = 512) -> np.ndarray:
    """Each member's fraction of ``data = (inputs..., labels)`` classified right in eval mode,
    ``(S,)``; every member sees the same data (``lnbook.train.accuracy`` for a stacked model)."""
    s = stack_size(model)
    correct = 0
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(data[-1]), batch_size):
            *inputs, y = (t[i : i + batch_size].to(device) for t in data)
            logits = model(*(t.expand(s, *t.shape) for t in inputs))
            correct = correct + (logits.argmax(-1) == y).sum(1)
    model.train(was_training)
    return (correct.double() / len(data[-1])).cpu().numpy()


def fit(
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    *,
    epochs: int,
    lr: float | Sequence[float],
    batch_size: int,
    seeds: Sequence[int],
    optimizer: str = "adam",
    grad_clip: float | None = None,
    drop_last: bool = False,
    max_steps: int | None = None,
    order: Callable[[], Sequence[torch.Tensor]] | None = None,
    eval_every: int | None = None,
) -> list[History]:
    """Train every member of a stacked classifier with cross-entropy, as
    :func:`lnbook.train.fit` trains one model with ``seed=seeds[s]`` and ``lr=lr[s]`` (``lr``:
    one number or one per member): the same mini-batches (a ``torch.randperm`` per epoch from
    a generator seeded with the seed), ``"adam"`` or ``"sgd"`` with momentum 0.9, ``grad_clip``
    on each member's own gradient norm, ``drop_last`` and ``max_steps`` as there. ``train``,
    ``test``: ``(inputs..., labels)``, e.g. ``(x, y)`` or ``(x, lengths, y)``, the same data for
    every member. One :class:`~lnbook.train.History` per member; ``wall_time`` is the stack's.

    Two departures from :func:`lnbook.train.fit`, for loops that order or evaluate otherwise
    (:func:`lnbook.ensemble.fit`): ``order``, called at the start of every epoch, returns
    that epoch's mini-batches, a sequence of ``(S, b)`` index tensors into ``train`` (row
    ``s``: member ``s``'s examples), in place of the seeded permutations (``seeds``,
    ``batch_size`` and ``drop_last`` then do not order anything; ``steps_per_epoch`` counts
    the first epoch's batches). ``eval_every``: the test accuracy after every
    ``eval_every`` updates and after the last, in place of after every epoch."""
    s = stack_size(model)
    train, test = check_dataset(train, "train"), check_dataset(test, "test")
    check_positive_int(epochs, "epochs")
    check_positive_int(batch_size, "batch_size")
    check_choice(optimizer, OPTIMIZERS, "optimizer")
    if max_steps is not None:
        check_positive_int(max_steps, "max_steps")
    if eval_every is not None:
        check_positive_int(eval_every, "eval_every")
    if order is not None and not callable(order):
        raise TypeError(f"order must be a function returning an epoch's mini-batches, got {describe(order)}")
    step = StackedOptimizer(model, member_lrs(lr, s), optimizer, grad_clip)
    generators = [torch.Generator().manual_seed(seed) for seed in check_seeds(seeds, s)]
    device = step.params[0].device
    n = len(train[-1])
    per_epoch = n // batch_size if drop_last else -(-n // batch_size)
    seen = per_epoch * batch_size if drop_last else n
    histories = [History(steps_per_epoch=per_epoch) for _ in range(s)]
    active = torch.ones(s, dtype=torch.bool, device=device)
    elapsed, updates, evaluated = 0.0, 0, 0
    model.train()

    def evaluate() -> float:
        """Record every member's test accuracy now; the seconds it took."""
        nonlocal evaluated
        start = time.perf_counter()
        test_acc = accuracy(model, test)
        for i, h in enumerate(histories):
            h.test_acc.append(float(test_acc[i]))
        evaluated = updates
        return time.perf_counter() - start

    for epoch in progress(range(epochs), f"epochs ({s} seeds)"):
        start, count, paused = time.perf_counter(), 0, 0.0
        if order is None:
            batches = torch.stack([torch.randperm(n, generator=g)[:seen] for g in generators]).split(batch_size, dim=1)
        else:
            batches = order()
            if any(not isinstance(idx, torch.Tensor) or idx.ndim != 2 or idx.shape[0] != s for idx in batches):
                raise ValueError(f"order() must return (S = {s}, b) index tensors, got {describe(batches)}")
            if epoch == 0:
                for h in histories:
                    h.steps_per_epoch = len(batches)
        correct = torch.zeros(s, device=device)
        for idx in batches:
            *inputs, y = _inputs(train, idx, device)
            logits = model(*inputs)  # (S, b, classes)
            losses = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1)
            step.step(losses, active)
            for h, loss in zip(histories, losses.tolist()):
                h.step_loss.append(loss)
            correct += (logits.argmax(-1) == y).sum(1)
            count, updates = count + idx.shape[1], updates + 1
            if eval_every is not None and updates % eval_every == 0:
                paused += evaluate()
            if updates == max_steps:
                break
        elapsed += time.perf_counter() - start - paused
        for i, h in enumerate(histories):
            h.wall_time.append(elapsed)
            h.train_acc.append(correct[i].item() / count)
        if eval_every is None:
            evaluate()
        if updates == max_steps:
            break
    if eval_every is not None and evaluated != updates:
        evaluate()
    return histories


def _fit_steps(
    model: nn.Module, batch: Callable[[list[torch.Generator]], tuple[torch.Tensor, ...]],
    validate: Callable[[], np.ndarray], *, steps: int, lr: float | Sequence[float], seeds: Sequence[int],
    warmup: int | Callable[[int], float],
    grad_clip: float | None, eval_every: int, objective: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    record: Callable[[list[LMHistory], list[int]], None] | None = None, optimizer: str = "adam", beta2: float = 0.999,
) -> list[LMHistory]:
    """The loop of :func:`fit_lm` and :func:`fit_mlm`, :func:`lnbook.train.fit_lm`'s for every
    member: Adam (or ``optimizer``) on ``model.loss(*batch(generators))`` (or ``objective``'s ``(loss to minimize,
    loss to report)``, each ``(S,)``) with a linear warm-up, ``validate()`` every ``eval_every``
    steps, and a member's stop on its first non-finite loss."""
    s = stack_size(model)
    for name, value in (("steps", steps), ("eval_every", eval_every)):
        check_positive_int(value, name)
    if callable(warmup):  # a schedule: step (from 1) -> factor of every learning rate
        factor = warmup
    else:
        check_int(warmup, "warmup")
        factor = lambda t: min(1.0, t / warmup) if warmup else 1.0  # noqa: E731
    check_choice(optimizer, OPTIMIZERS, "optimizer")
    step = StackedOptimizer(model, member_lrs(lr, s), optimizer, grad_clip, beta2)
    generators = [torch.Generator().manual_seed(seed) for seed in check_seeds(seeds, s)]
    device = step.params[0].device
    histories = [LMHistory() for _ in range(s)]
    active = torch.ones(s, dtype=torch.bool, device=device)
    elapsed = 0.0
    model.train()
    for t in progress(range(1, steps + 1), f"steps ({s} seeds)"):
        start = time.perf_counter()
        running = active.nonzero().flatten().tolist()
        inputs = [x.to(device) for x in batch(generators)]
        loss, reported = objective(*inputs) if objective is not None else (model.loss(*inputs),) * 2
        if record is not None:
            record(histories, running)
        step.step(loss, active, float(factor(t)))
        values = reported.tolist()
        elapsed += time.perf_counter() - start
        for i in running:
            histories[i].step_loss.append(values[i])
            if not math.isfinite(values[i]):
                histories[i].diverged = True
                active[i] = False
        if not bool(active.any()):
            break
        if t % eval_every == 0 or t == steps:
            val = validate()
            for i in active.nonzero().flatten().tolist():
                histories[i].val_steps.append(t)
                histories[i].val_loss.append(float(val[i]))
                histories[i].wall_time.append(elapsed)
    return histories


def fit_lm(
    model: nn.Module,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    steps: int,
    lr: float | Sequence[float],
    batch_size: int,
    block_size: int,
    seeds: Sequence[int],
    warmup: int | Callable[[int], float] = 0,
    grad_clip: float | None = 1.0,
    eval_every: int = 50,
    z_loss: float = 0.0,
    record_logits: bool = False,
    optimizer: str = "adam",
    beta2: float = 0.999,
) -> list[LMHistory]:
    """:func:`lnbook.train.fit_lm` for every member of a stacked language model (a
    :class:`~lnbook.transformer.TinyGPT` made by :func:`stack`): member ``s`` draws its windows
    from a generator seeded with ``seeds[s]`` and trains at ``lr[s]`` (``lr``: one number or one
    per member) with ``optimizer`` (``"adam"`` or ``"radam"``, with second-moment decay ``beta2``); ``warmup`` is a number of steps of
    linear warm-up or a schedule, a picklable function of the step (from 1) that returns the factor
    of every learning rate (:func:`lnbook.train.radam_factor` or :func:`lnbook.train.warmup_cosine`, say). One
    :class:`~lnbook.train.LMHistory` per member."""
    stack_size(model)
    check_streams(train_ids, val_ids, block_size)
    check_positive_int(batch_size, "batch_size")
    high = len(train_ids) - block_size

    def batch(generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        drawn = [windows(train_ids, torch.randint(high, (batch_size,), generator=g), block_size) for g in generators]
        return torch.stack([w[0] for w in drawn]), torch.stack([w[1] for w in drawn])

    objective = LMObjective(model, z_loss)

    def record(histories: list[LMHistory], running: list[int]) -> None:
        log_z = objective.log_z.tolist()
        for i in running:
            histories[i].attn_logit_max.append(max(m.logit_max[i] for m in layers))
            histories[i].attn_entropy.append(min(m.entropy[i] for m in layers))
            histories[i].log_z.append(log_z[i])

    with recording_logits(model, record_logits) as layers:
        return _fit_steps(model, batch, lambda: lm_loss(model, val_ids, block_size), steps=steps, lr=lr, seeds=seeds,
                          warmup=warmup, grad_clip=grad_clip, eval_every=eval_every,
                          objective=objective if z_loss or record_logits else None, record=record if record_logits else None,
                          optimizer=optimizer, beta2=beta2)


def fit_mlm(
    model: nn.Module,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    steps: int,
    lr: float | Sequence[float],
    batch_size: int,
    block_size: int,
    seeds: Sequence[int],
    mask_id: int,
    min_len: int = 1,
    mask_rate: float = 0.15,
    warmup: int = 0,
    grad_clip: float | None = 1.0,
    eval_every: int = 50,
) -> list[LMHistory]:
    """:func:`lnbook.train.fit_mlm` for every member of a stacked encoder, each with its own
    batches (``seeds[s]``) and learning rate, as :func:`fit_lm`."""
    stack_size(model)
    check_streams(train_ids, val_ids, block_size)
    check_positive_int(batch_size, "batch_size")
    check_mask_id(mask_id, train_ids, val_ids)

    def batch(generators: list[torch.Generator]) -> tuple[torch.Tensor, ...]:
        drawn = [mlm_batch(train_ids, batch_size, block_size, mask_id, g, min_len, mask_rate) for g in generators]
        return tuple(torch.stack(parts) for parts in zip(*drawn))

    return _fit_steps(model, batch, lambda: mlm_loss(model, val_ids, block_size, mask_id, min_len, mask_rate),
                      steps=steps, lr=lr, seeds=seeds, warmup=warmup, grad_clip=grad_clip, eval_every=eval_every)


def start_runs(
    make: Callable[[], nn.Module],
    seeds: Sequence[int],
    workers: Executor | None = None,
    device: torch.device | str | None = None,
    *,
    fit: Callable[..., list] = fit_lm,
    **options: object,
) -> list[Future]:
    """Queue the training of one fresh ``make()`` per seed as one stacked model.

    ``seed_everything(seed)`` then ``make()`` (moved to ``device`` if given) for each seed: the
    initial weights :func:`lnbook.train.start_runs` gives. Then :func:`stack`, and
    ``fit(stacked, seeds=seeds, **options)`` (:func:`fit_lm`, :func:`fit_mlm` or :func:`fit`;
    ``lr`` may be one per seed) as one job on ``workers`` (:func:`lnbook.train.cpu_workers`),
    or here when it is None. Returns one future per seed whose result is ``(trained plain
    model, history)``, so that :func:`lnbook.train.finish_runs` collects them. A seed may
    repeat (the same start at two learning rates, say)."""
    seeds = list(seeds)
    plain = []
    for seed in seeds:
        seed_everything(seed)
        model = make()
        plain.append(model if device is None else model.to(device))
    (job,) = fit_many([dict(model=stack(plain), fit=fit, seeds=seeds, **options)], workers)
    futures = [Future() for _ in seeds]

    def finished(job: Future) -> None:
        try:
            trained, histories = job.result()
            results = list(zip(unstack(trained, plain), histories))
        except BaseException as error:  # noqa: BLE001 - every seed's future carries it
            for future in futures:
                future.set_exception(error)
            return
        for future, result in zip(futures, results):
            future.set_result(result)

    job.add_done_callback(finished)
    return futures


def runs(make: Callable[[], nn.Module], seeds: Sequence[int], *, fit: Callable[..., list] = fit_lm,
         **options: object) -> list[tuple[nn.Module, History | LMHistory]]:
    """:func:`start_runs` here, waited for: ``[(trained plain model, history)]`` in the order of ``seeds``."""
    return [future.result() for future in start_runs(make, seeds, fit=fit, **options)]
