"""Chapter 06's helpers: the baselines, probes and scores its Transformers are measured with,
and the reader of the stored training run (``benchmarks/tiny_gpt.py``).

A character model is judged against :class:`Frequencies`, which knows only how often each
character occurs. BatchNorm over a causal batch leaks the future into the past through its
statistics; :func:`lm_loss_batch_statistics` scores a model with that leak open (training
mode) and :func:`with_population_statistics` gives the copy that scores it closed with
population statistics, so that a leak is never confused with stale running averages.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import train
from ._checks import check_int, check_positive_int, describe
from .norms import DyT, batch_statistics
from .transformer import GPTConfig, TinyGPT, block_grad_norms
from .utils import seed_everything, stored_number, stored_rows


class Frequencies(nn.Module):
    """Predicts each token with its frequency in ``train_ids``, whatever came before: the
    baseline a character model must beat. ``loss(idx, targets, mask=None)`` as
    :class:`~lnbook.transformer.TinyGPT`'s; targets of -100 are ignored."""

    def __init__(self, train_ids: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        check_positive_int(vocab_size, "vocab_size")
        counts = torch.bincount(train_ids, minlength=vocab_size).double()
        self.logits = nn.Parameter((counts / counts.sum()).log().float())

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return F.cross_entropy(self.logits.expand(targets.numel(), -1), targets.flatten())


def wiring(model: TinyGPT) -> list[str]:
    """What a built TinyGPT contains: embedding norm, block norm, position, final norm, biases,
    attention, init, and whether the head is tied to the token embedding."""
    names = lambda norm: type(norm.norm).__name__.replace("Identity", "—")  # noqa: E731
    biases = any(name.endswith("bias") for name, _ in model.named_parameters())
    return [names(model.norm_e) if hasattr(model, "norm_e") else "—", names(model.blocks[0].norm1), model.cfg.norm_position,
            names(model.norm_f), "yes" if biases else "no", "causal" if model.cfg.causal else "both directions", model.cfg.init,
            "tied" if model.head.weight is model.tok.weight else "own"]


def untie_head(model: TinyGPT, std: float) -> TinyGPT:
    """Give ``model`` an output head of its own, normal with standard deviation ``std`` (drawn from
    torch's global generator), in place of the token embedding it shares. Returns ``model``."""
    model.head.weight = nn.Parameter(torch.randn_like(model.tok.weight) * std)
    return model


def w2_gradients(cfg: GPTConfig, ids: torch.Tensor, seeds: Sequence[int], batch_size: int = 8,
                 head_std: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For a fresh ``TinyGPT(cfg)`` per seed (built after ``seed_everything(seed)``; with
    ``head_std``, its head untied at that scale): each block's ``W2`` gradient norm for the loss
    on ``batch_size`` windows of ``ids`` drawn with seed ``100 + seed``, ``(seeds, n_layer)``,
    and the standard deviation of the stream entering the final norm, ``(seeds,)``."""
    grads, streams = [], []
    for seed in seeds:
        seed_everything(seed)
        model = TinyGPT(cfg)
        if head_std is not None:
            untie_head(model, head_std)
        starts = torch.randint(len(ids) - cfg.block_size - 1, (batch_size,), generator=torch.Generator().manual_seed(100 + seed))
        idx, targets = train.windows(ids, starts, cfg.block_size)
        hook = model.norm_f.register_forward_pre_hook(lambda module, args: streams.append(args[0].std().item()))
        grads.append(block_grad_norms(model, idx, targets, part="ffn_out"))
        hook.remove()
    return np.array(grads), np.array(streams)


def padding_gap(model: nn.Module, seqs: Sequence[torch.Tensor], block_size: int, masked: bool = True) -> float:
    """Largest logit difference between each sequence of ``seqs`` (1-D token ids) alone and
    inside one right-padded batch (``masked=False``: the model is not told which tokens are
    padding), in the model's current mode (training mode: a batch norm uses batch statistics)."""
    idx = torch.zeros(len(seqs), block_size, dtype=torch.int64)
    mask = torch.zeros(len(seqs), block_size, dtype=torch.bool)
    for i, s in enumerate(seqs):
        idx[i, : len(s)], mask[i, : len(s)] = s, True
    with torch.no_grad():
        device = next(model.parameters()).device
        batched = model(idx.to(device), mask.to(device) if masked else None).cpu()
        return max((model(s[None].to(device)).cpu()[0] - batched[i, : len(s)]).abs().max().item() for i, s in enumerate(seqs))


def dyt_inputs(model: nn.Module, idx: torch.Tensor) -> np.ndarray:
    """For each DyT layer of ``model`` (in module order) on one batch ``idx``: the standard
    deviation of its input and of its output, and the share of entries with ``|alpha x| > 2``
    (tanh's flat part), ``(DyT layers, 3)``."""
    stats = []

    def record(module: DyT, inputs: tuple, output: torch.Tensor) -> None:
        x = inputs[0]
        stats.append([x.std().item(), output.std().item(), (module.alpha * x).abs().gt(2).float().mean().item()])

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, DyT)]
    if not hooks:
        raise ValueError("model has no DyT layer")
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return np.array(stats)


def head_input_std(model: TinyGPT, idx: torch.Tensor) -> float:
    """Standard deviation of the stream entering the final norm on one batch ``idx`` (eval mode)."""
    streams = []
    hook = model.norm_f.register_forward_pre_hook(lambda module, args: streams.append(args[0].std().item()))
    try:
        with train.evaluating(model), torch.no_grad():
            model(idx)
    finally:
        hook.remove()
    return streams[0]


def training_step(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, lr: float = 1e-3) -> Callable[[], None]:
    """One Adam step of ``model`` on a fixed batch, as a closure (for timing and counting operators)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def step() -> None:
        loss = model.loss(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def _check_batch_norm(model: nn.Module) -> None:
    if not batch_statistics(model):
        raise ValueError("model has no batch norm: it has no batch statistics to score with")


def _scored_groups(model: nn.Module, ids: torch.Tensor, block_size: int, batches: int, batch_size: int,
                   group: int | None) -> list[torch.Tensor]:
    """:func:`lnbook.train.lm_loss`'s window starts, cut into groups of ``group`` (None: ``batch_size``)."""
    _check_batch_norm(model)
    group = batch_size if group is None else check_positive_int(group, "group")
    if batch_size % group:
        raise ValueError(f"group must divide batch_size ({batch_size}), got {group}")
    starts = torch.randint(len(ids) - block_size, (batches, batch_size), generator=torch.Generator().manual_seed(0))
    return [part for s in starts for part in s.split(group)]


def _batch_norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "running_mean") and hasattr(m, "momentum")]


def lm_loss_batch_statistics(model: nn.Module, ids: torch.Tensor, block_size: int, batches: int = 4,
                             batch_size: int = 32, group: int | None = None) -> float:
    """:func:`lnbook.train.lm_loss`'s windows scored in training mode: every batch norm uses
    the statistics of the windows scored together, over every position, later ones included
    (the leak a causal mask does not stop), ``group`` windows at a time (the training batch
    size, say; None: each batch of ``batch_size``, which ``group`` must divide). Weights and
    running statistics are left as they were."""
    parts = _scored_groups(model, ids, block_size, batches, batch_size, group)
    model = copy.deepcopy(model).train()
    device = next(model.parameters()).device
    with torch.no_grad():
        losses = [float(model.loss(*(t.to(device) for t in train.windows(ids, part, block_size)))) for part in parts]
    return sum(losses) / len(losses)


def lm_loss_foreign_statistics(model: nn.Module, ids: torch.Tensor, block_size: int, batches: int = 4,
                               batch_size: int = 32, group: int | None = None) -> float:
    """:func:`lm_loss_batch_statistics`'s windows, each group of ``group`` normalized with the
    batch statistics of the next group (the last with the first's): statistics as noisy as its
    own, with no information from the scored windows, so no leak. The difference from
    :func:`lm_loss_batch_statistics` is what a model gains from its own batch's statistics."""
    parts = _scored_groups(model, ids, block_size, batches, batch_size, group)
    model = copy.deepcopy(model)
    for m in _batch_norms(model):
        m.momentum = 1.0  # a training-mode pass leaves exactly its batch's statistics in the running buffers
    device = next(model.parameters()).device
    losses = []
    with torch.no_grad():
        for i, part in enumerate(parts):
            donor = train.windows(ids, parts[(i + 1) % len(parts)], block_size)[0].to(device)
            model.train()(donor)
            losses.append(float(model.eval().loss(*(t.to(device) for t in train.windows(ids, part, block_size)))))
    return sum(losses) / len(losses)


def with_population_statistics(model: nn.Module, ids: torch.Tensor, block_size: int, batches: int = 32,
                               batch_size: int = 32) -> nn.Module:
    """A copy of ``model`` whose batch norms hold population statistics: the running mean and
    variance become the average of their batch statistics over ``batches`` batches of random
    windows of ``ids`` (seeded, in training mode, no weight changes), as Ioffe and Szegedy
    estimate them after training, in place of the moving averages of training."""
    _check_batch_norm(model)
    check_positive_int(batches, "batches")
    model = copy.deepcopy(model).train()
    norms = _batch_norms(model)
    saved = [m.momentum for m in norms]
    generator = torch.Generator().manual_seed(1)
    device = next(model.parameters()).device
    with torch.no_grad():
        for k in range(batches):
            for m in norms:
                m.momentum = 1.0 / (k + 1)  # a cumulative average: batch k weighs as much as each earlier one
            starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
            model(train.windows(ids, starts, block_size)[0].to(device))
    for m, momentum in zip(norms, saved):
        m.momentum = momentum
    return model.eval()


# The stored run of benchmarks/tiny_gpt.py, read here so that chapter 06 need not train it.
TINY_GPT_STUDIES = ("warmup", "norms", "mlm", "batchnorm")
TINY_GPT_CURVE_COLUMNS = ["study", "arm", "lr", "seed", "step", "val_loss"]
TINY_GPT_FINAL_COLUMNS = ["study", "arm", "lr", "seed", "val_loss", "test_loss", "stream_std", "final_alpha",
                  "test_loss_batch", "test_loss_foreign", "test_loss_population"]


@dataclass(frozen=True)
class StoredTinyGPT:
    """The runs of ``benchmarks/tiny_gpt.py``, per ``(study, arm, lr)`` (studies
    :data:`TINY_GPT_STUDIES`), seeds ascending (``seeds``): ``val`` and ``test``, the loss after
    the last step on the validation and test windows ``(S,)``; ``stream_std``, the standard
    deviation of the stream entering the final norm at the end; ``final_alpha``, the final
    DyT's alpha at the end; ``test_batch``, ``test_foreign`` and ``test_population``, a
    batch-norm model's test loss in training mode (its own batch's statistics), with another
    batch's statistics, and with population statistics (each ``(S,)``, ``nan`` where it does not
    apply); ``curves``, the validation loss at every step of ``steps[study]`` ``(S, E)``.
    A diverged member's losses are ``nan``. ``arms[study]`` and ``lrs[study]`` list what was run;
    ``provenance``: machine, commit, date, command, setting."""

    provenance: list[str]
    seeds: list[int]
    arms: dict[str, list[str]]
    lrs: dict[str, list[float]]
    steps: dict[str, list[int]]
    val: dict[tuple[str, str, float], np.ndarray]
    test: dict[tuple[str, str, float], np.ndarray]
    stream_std: dict[tuple[str, str, float], np.ndarray]
    final_alpha: dict[tuple[str, str, float], np.ndarray]
    test_batch: dict[tuple[str, str, float], np.ndarray]
    test_foreign: dict[tuple[str, str, float], np.ndarray]
    test_population: dict[tuple[str, str, float], np.ndarray]
    curves: dict[tuple[str, str, float], np.ndarray]


def stored_tiny_gpt(path: str | Path | None = None) -> StoredTinyGPT:
    """The stored run of ``benchmarks/tiny_gpt.py`` (``tiny_gpt-curves.csv`` and
    ``tiny_gpt-final.csv``) from the folder ``path``, by default ``lnbook/results/`` as
    installed with the package. Raises FileNotFoundError for a missing file and ValueError for
    a malformed or inconsistent one."""
    number = functools.partial(stored_number, script="tiny_gpt.py")  # one cell of its tables
    folder = resources.files("lnbook") / "results" if path is None else Path(path)
    provenance, curve_rows = stored_rows(folder, "tiny_gpt-curves.csv", TINY_GPT_CURVE_COLUMNS, "tiny_gpt.py")
    _, final_rows = stored_rows(folder, "tiny_gpt-final.csv", TINY_GPT_FINAL_COLUMNS, "tiny_gpt.py")
    final: dict[tuple[str, str, float, int], dict[str, str]] = {}
    for r in final_rows:
        if r["study"] not in TINY_GPT_STUDIES:
            raise ValueError(f"the stored tiny_gpt run's studies must be among {TINY_GPT_STUDIES}, got {r['study']!r}")
        key = (r["study"], r["arm"], number(r["lr"], "lr"), check_int(int(number(r["seed"], "seed")), "seed"))
        if key in final:
            raise ValueError(f"tiny_gpt-final.csv holds {key} twice")
        final[key] = r
    curve: dict[tuple[str, str, float, int], dict[int, float]] = {}
    for r in curve_rows:
        key = (r["study"], r["arm"], number(r["lr"], "lr"), int(number(r["seed"], "seed")))
        curve.setdefault(key, {})[int(number(r["step"], "step"))] = number(r["val_loss"], "val_loss")
    if set(curve) - set(final):
        raise ValueError("tiny_gpt-curves.csv holds runs that tiny_gpt-final.csv does not")
    seeds = sorted({k[3] for k in final})
    order = list(dict.fromkeys(k[1] for k in final))  # arms in the order the script ran them
    cells = sorted({k[:3] for k in final}, key=lambda k: (TINY_GPT_STUDIES.index(k[0]), order.index(k[1]), k[2]))
    if any((*cell, s) not in final for cell in cells for s in seeds):
        raise ValueError(f"tiny_gpt-final.csv must hold every seed {describe(seeds)} of every arm and rate")
    studies = [s for s in TINY_GPT_STUDIES if any(c[0] == s for c in cells)]
    arms = {s: list(dict.fromkeys(c[1] for c in cells if c[0] == s)) for s in studies}
    lrs = {s: sorted({c[2] for c in cells if c[0] == s}) for s in studies}
    steps = {s: sorted({t for k, v in curve.items() if k[0] == s for t in v}) for s in studies}

    def column(name: str) -> dict[tuple[str, str, float], np.ndarray]:
        return {c: np.array([number(final[(*c, s)][name], name) for s in seeds]) for c in cells}

    val, test = column("val_loss"), column("test_loss")
    if any((v[np.isfinite(v)] < 0).any() for v in (*val.values(), *test.values())):
        raise ValueError("the stored tiny_gpt run holds a negative loss")
    return StoredTinyGPT(
        provenance=provenance, seeds=seeds, arms=arms, lrs=lrs, steps=steps, val=val, test=test,
        stream_std=column("stream_std"), final_alpha=column("final_alpha"), test_batch=column("test_loss_batch"),
        test_foreign=column("test_loss_foreign"),
        test_population=column("test_loss_population"),
        curves={c: np.array([[curve.get((*c, s), {}).get(t, math.nan) for t in steps[c[0]]] for s in seeds]) for c in cells})
