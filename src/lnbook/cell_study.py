"""Chapter 05's helpers: gated cells trained over a learning-rate grid, BatchNorm scored with
its moving averages and with population statistics, and the probes the chapter measures with.

Cooijmans et al. (2017) score the BN-LSTM with population statistics, estimated over the
training set after training (:func:`lnbook.rnn.population_statistics`); a model's moving
averages are a different estimate, and early in training a poor one.
:func:`with_population_statistics` gives a trained model's copy with that estimate, so that a
chapter can score it both ways and never confuse the estimate with the norm.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import rnn, train
from ._checks import check_int, check_number, check_positive_int, describe
from .data import Dataset
from .norms import TimeStepBatchNorm, apply_norm
from .utils import stored_rows


def grid(lrs: Sequence[float], seeds: Sequence[int]) -> tuple[list[int], list[float]]:
    """The members of a learning-rate grid trained as one stack: ``(seeds, lrs)``, one entry
    per member, every seed at every rate (rate-major), for :func:`lnbook.seeds.start_runs`."""
    lrs, seeds = list(lrs), list(seeds)
    if not lrs or len(set(lrs)) != len(lrs) or any(not isinstance(lr, (int, float)) or lr <= 0 for lr in lrs):
        raise ValueError(f"lrs must be distinct positive learning rates, at least one, got {describe(lrs)}")
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    return seeds * len(lrs), [lr for lr in lrs for _ in seeds]


def by_rate(runs: Sequence, lrs: Sequence[float]) -> dict[float, list]:
    """Split a grid's results (in :func:`grid`'s order) into ``{lr: [one result per seed]}``."""
    lrs = list(lrs)
    if not lrs or len(runs) % len(lrs):
        raise ValueError(f"got {len(runs)} results, not a multiple of the {len(lrs)} rates")
    n = len(runs) // len(lrs)
    return {lr: list(runs[i * n : (i + 1) * n]) for i, lr in enumerate(lrs)}


def with_population_statistics(model: nn.Module, data: Dataset, batch_size: int = 64) -> nn.Module:
    """A copy of ``model`` whose per-step BatchNorm statistics are re-estimated over ``data``
    (:func:`lnbook.rnn.population_statistics`); ``model`` itself is left as it was."""
    model = copy.deepcopy(model)
    rnn.population_statistics(model, data, batch_size)
    return model


def has_steps(model: nn.Module) -> bool:
    """Whether ``model`` keeps per-step BatchNorm statistics (a :class:`~lnbook.norms.TimeStepBatchNorm`)."""
    return any(isinstance(m, TimeStepBatchNorm) for m in model.modules())


def with_steps(model: nn.Module, max_steps: int) -> nn.Module:
    """A copy of ``model`` whose :class:`~lnbook.norms.TimeStepBatchNorm` layers keep
    statistics for ``max_steps`` steps; a new step starts with the last trained step's
    statistics (what inference reuses anyway), so the copy answers as the model does until
    :func:`lnbook.rnn.population_statistics` estimates the new steps."""
    check_positive_int(max_steps, "max_steps")
    model = copy.deepcopy(model)
    if not has_steps(model):
        raise ValueError("model has no TimeStepBatchNorm: it keeps no per-step statistics")
    for m in [m for m in model.modules() if isinstance(m, TimeStepBatchNorm)]:
        if max_steps < m.max_steps:
            raise ValueError(f"max_steps must be at least the model's {m.max_steps}, got {max_steps}")
        last = torch.arange(max_steps).clamp(max=m.max_steps - 1)
        m.running_mean, m.running_var = m.running_mean[last].clone(), m.running_var[last].clone()
        m.max_steps = max_steps
    return model


def splice_statistics(model: nn.Module, donor: nn.Module, first_step: int) -> nn.Module:
    """A copy of ``model`` whose per-step BatchNorm statistics from ``first_step`` on are
    ``donor``'s (the same architecture, with at least as many steps; ``model`` is first given
    ``donor``'s number of steps by :func:`with_steps`). Used to change only the steps past the
    trained length and keep the trained steps' statistics."""
    norms = [m for m in donor.modules() if isinstance(m, TimeStepBatchNorm)]
    if not norms:
        raise ValueError("donor has no TimeStepBatchNorm: it keeps no per-step statistics")
    steps = norms[0].max_steps
    check_int(first_step, "first_step", 0, f"an int in 0..{steps - 1}")
    if first_step >= steps:
        raise ValueError(f"first_step must be below the donor's {steps} steps, got {first_step}")
    spliced = with_steps(model, steps)
    targets = [m for m in spliced.modules() if isinstance(m, TimeStepBatchNorm)]
    if len(targets) != len(norms) or any(t.running_mean.shape != d.running_mean.shape for t, d in zip(targets, norms)):
        raise ValueError("model and donor must have the same per-step BatchNorm layers")
    with torch.no_grad():
        for t, d in zip(targets, norms):
            t.running_mean[first_step:] = d.running_mean[first_step:]
            t.running_var[first_step:] = d.running_var[first_step:]
    return spliced


def batch_accuracy(model: nn.Module, test: Dataset, batch_size: int) -> float:
    """Test accuracy of a BN model that normalizes with the statistics of each test batch of
    ``batch_size`` sequences, as in training (on a copy: its statistics do not change)."""
    check_positive_int(batch_size, "batch_size")
    model = copy.deepcopy(model).train()
    device = next(model.parameters()).device
    x, y = test[0].to(device), test[-1].to(device)
    with torch.no_grad():
        logits = torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])
    return (logits.argmax(-1) == y).double().mean().item()


def term_sizes(model: rnn.SequenceClassifier, x: torch.Tensor) -> tuple[float, float]:
    """Root-mean-square of an LSTM's input term and recurrent term as the gates receive them
    (after their norm, if any), over steps 2..T of a batch ``x (B, T, F)``; ``h`` is 0 at
    step 1. A BatchNorm model must be in eval mode (training mode would update its statistics)."""
    cell = model.cell
    if not isinstance(cell, rnn.LSTMCell):
        raise TypeError(f"model.cell must be an lnbook.rnn.LSTMCell, got {type(cell).__name__}")
    h = c = x.new_zeros(len(x), cell.hidden_size)
    sizes = []
    with torch.no_grad():
        for t in range(x.shape[1]):
            if t > 0:
                a = apply_norm(cell.norm_ih, x[:, t] @ cell.weight_ih.T, None, t)
                r = apply_norm(cell.norm_hh, h @ cell.weight_hh.T, None, t)
                sizes.append([a.pow(2).mean().sqrt().item(), r.pow(2).mean().sqrt().item()])
            h, c = cell(x[:, t], (h, c), t)
    a, r = np.mean(sizes, axis=0)
    return float(a), float(r)


def dynamics(model: rnn.SequenceClassifier, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """On a batch ``x (B, T, F)``, ``y (B,)`` in training mode (on a copy: no statistics
    change): the RMS of ``h_t`` and the mean over the sequences of ``|dl/dh_t|``, each
    sequence's own loss ``l``, for every step: ``(2, T)``."""
    model = copy.deepcopy(model).train()
    states = []

    def keep(module: nn.Module, inputs: tuple, output: tuple) -> None:
        output[0].retain_grad()
        states.append(output[0])

    hook = model.cell.register_forward_hook(keep)
    try:
        F.cross_entropy(model(x), y, reduction="sum").backward()
    finally:
        hook.remove()
    return np.array([[h.pow(2).mean().sqrt().item() for h in states], [h.grad.norm(dim=1).mean().item() for h in states]])


def set_gain(model: nn.Module, placement: str, gain: float) -> nn.Module:
    """Set the gain of an LSTM's norm on ``placement`` (``"input"``, ``"recurrent"`` or
    ``"cell"``) to ``gain`` in place, e.g. to start a term at the size of the other; returns
    ``model``."""
    layers = {"input": "norm_ih", "recurrent": "norm_hh", "cell": "norm_c"}
    if placement not in layers:
        raise ValueError(f"placement must be one of {tuple(layers)}, got {describe(placement)}")
    check_number(gain, "gain", "a positive number", lambda g: g > 0)
    norm = getattr(model.cell, layers[placement])
    if getattr(norm, "weight", None) is None:
        raise ValueError(f"the {placement} term has no norm with a gain in this model")
    with torch.no_grad():
        norm.weight.fill_(gain)
    return model


# The stored character-level run (benchmarks/char_lm.py), read here so that chapter 05 need not train it.
CHAR_LM_ARMS = ("LSTM", "LN-LSTM", "BN-LSTM")
_CURVE_COLUMNS = ["arm", "lr", "seed", "step", "val_loss"]
_FINAL_COLUMNS = ["arm", "lr", "seed", "val_loss", "test_loss", "val_loss_population", "test_loss_population"]


@dataclass(frozen=True)
class StoredCharLM:
    """The character-level LSTM / LN-LSTM / BN-LSTM run of ``benchmarks/char_lm.py``, per
    ``(arm, lr)`` (arms :data:`CHAR_LM_ARMS`), seeds in ascending order (``seeds``): ``val`` and
    ``test``, the loss (nats per character) after the last step on the validation and test
    windows ``(S,)`` (BatchNorm with its moving averages); ``val_population`` and
    ``test_population``, the BN-LSTM's on the same windows with population statistics ``(S,)``
    (BN-LSTM keys only); ``curves``, the validation loss at every step of ``steps`` ``(S, E)``.
    A diverged member's losses are ``nan``. ``provenance``: machine, commit, date, command, setting."""

    provenance: list[str]
    seeds: list[int]
    lrs: list[float]
    steps: list[int]
    val: dict[tuple[str, float], np.ndarray]
    test: dict[tuple[str, float], np.ndarray]
    val_population: dict[tuple[str, float], np.ndarray]
    test_population: dict[tuple[str, float], np.ndarray]
    curves: dict[tuple[str, float], np.ndarray]


def stored_char_lm(path: str | Path | None = None) -> StoredCharLM:
    """The stored run of ``benchmarks/char_lm.py`` (``char_lm-curves.csv`` and
    ``char_lm-final.csv``) from the folder ``path``, by default ``lnbook/results/`` as installed
    with the package (so it reads from any working directory, Colab included). Raises
    FileNotFoundError for a missing file and ValueError for a malformed or inconsistent one."""
    folder = resources.files("lnbook") / "results" if path is None else Path(path)
    provenance, curve_rows = stored_rows(folder, "char_lm-curves.csv", _CURVE_COLUMNS, "char_lm.py")
    _, final_rows = stored_rows(folder, "char_lm-final.csv", _FINAL_COLUMNS, "char_lm.py")
    try:
        final = {(r["arm"], float(r["lr"]), int(r["seed"])): r for r in final_rows}
        curve = {(r["arm"], float(r["lr"]), int(r["seed"]), int(r["step"])): float(r["val_loss"]) for r in curve_rows}
    except ValueError as error:
        raise ValueError(f"the stored char_lm run holds a value that is not a number: {error}") from None
    present = {k[0] for k in final}
    if not present <= set(CHAR_LM_ARMS):
        raise ValueError(f"the stored char_lm run's arms must be among {CHAR_LM_ARMS}, got {sorted(present)}")
    arms = [a for a in CHAR_LM_ARMS if a in present]
    lrs, seeds = sorted({k[1] for k in final}), sorted({k[2] for k in final})
    steps = sorted({k[3] for k in curve})
    if len(final) != len(final_rows) or len(final) != len(arms) * len(lrs) * len(seeds):
        raise ValueError("char_lm-final.csv must hold one row per arm, rate and seed, every seed at every rate")
    if {k[:3] for k in curve} != set(final):
        raise ValueError("char_lm-curves.csv and char_lm-final.csv disagree on their arms, rates or seeds")

    def loss(text: str) -> float:
        value = float(text)
        if not (math.isnan(value) or 0 <= value < math.inf):
            raise ValueError(f"the stored char_lm run holds a loss of {text}, expected one >= 0 (or nan: diverged)")
        return value

    def per_seed(arm: str, lr: float, column: str) -> np.ndarray:
        try:
            return np.array([loss(final[arm, lr, s][column]) for s in seeds])
        except ValueError as error:
            raise ValueError(f"char_lm-final.csv, {arm} at lr {lr}, column {column}: {error}") from None

    keys = [(a, lr) for a in arms for lr in lrs]
    bn = [k for k in keys if k[0] == "BN-LSTM"]
    return StoredCharLM(
        provenance=provenance, seeds=seeds, lrs=lrs, steps=steps,
        val={k: per_seed(*k, "val_loss") for k in keys}, test={k: per_seed(*k, "test_loss") for k in keys},
        val_population={k: per_seed(*k, "val_loss_population") for k in bn},
        test_population={k: per_seed(*k, "test_loss_population") for k in bn},
        curves={k: np.array([[curve.get((*k, s, t), math.nan) for t in steps] for s in seeds]) for k in keys})


# The stored 20-epoch digits run (benchmarks/digits_long.py), read here so that chapter 05 need not train it.
DIGITS_LONG_TASKS = ("sequential", "permuted")
DIGITS_LONG_ARMS = ("LSTM", "BN-LSTM", "LN-LSTM", "GRU", "BN-GRU", "LN-GRU")
_DIGITS_CURVE_COLUMNS = ["task", "arm", "lr", "seed", "epoch", "val_acc"]
_DIGITS_FINAL_COLUMNS = ["task", "arm", "lr", "seed", "val_acc", "test_acc", "val_acc_population",
                         "test_acc_population", "updates_to_1"]


@dataclass(frozen=True)
class StoredDigitsLong:
    """The 20-epoch digits run of ``benchmarks/digits_long.py``, per ``(task, arm, lr)`` (tasks
    :data:`DIGITS_LONG_TASKS`, arms :data:`DIGITS_LONG_ARMS`), seeds in ascending order
    (``seeds[task, arm]``; ``lrs[task, arm]``, that arm's rates, ascending): ``val`` and ``test``,
    the accuracy after the last epoch on the validation and test digits ``(S,)`` (BatchNorm with
    its moving averages); ``val_population`` and ``test_population``, the BN arms' with
    population statistics over the fit digits ``(S,)`` (BN keys only); ``updates_to_1``, each
    seed's updates to training loss 1.0 (:func:`lnbook.train.updates_to`; None: never);
    ``curves``, the validation accuracy after every epoch of ``epochs`` ``(S, E)``. A diverged
    member's accuracies are ``nan``. ``provenance``: machine, commit, date, command, setting."""

    provenance: list[str]
    seeds: dict[tuple[str, str], list[int]]
    lrs: dict[tuple[str, str], list[float]]
    epochs: list[int]
    val: dict[tuple[str, str, float], np.ndarray]
    test: dict[tuple[str, str, float], np.ndarray]
    val_population: dict[tuple[str, str, float], np.ndarray]
    test_population: dict[tuple[str, str, float], np.ndarray]
    updates_to_1: dict[tuple[str, str, float], list[int | None]]
    curves: dict[tuple[str, str, float], np.ndarray]


def stored_digits_long(path: str | Path | None = None) -> StoredDigitsLong:
    """The stored run of ``benchmarks/digits_long.py`` (``digits_long-curves.csv`` and
    ``digits_long-final.csv``) from the folder ``path``, by default ``lnbook/results/`` as
    installed with the package. Raises FileNotFoundError for a missing file and ValueError for a
    malformed or inconsistent one."""
    folder = resources.files("lnbook") / "results" if path is None else Path(path)
    provenance, curve_rows = stored_rows(folder, "digits_long-curves.csv", _DIGITS_CURVE_COLUMNS, "digits_long.py")
    _, final_rows = stored_rows(folder, "digits_long-final.csv", _DIGITS_FINAL_COLUMNS, "digits_long.py")
    try:
        final = {(r["task"], r["arm"], float(r["lr"]), int(r["seed"])): r for r in final_rows}
        curve = {(r["task"], r["arm"], float(r["lr"]), int(r["seed"]), int(r["epoch"])): float(r["val_acc"])
                 for r in curve_rows}
    except ValueError as error:
        raise ValueError(f"the stored digits_long run holds a value that is not a number: {error}") from None
    if len(final) != len(final_rows):
        raise ValueError("digits_long-final.csv must hold one row per task, arm, rate and seed, got a repeated one")
    bad = sorted({k[:2] for k in final if k[0] not in DIGITS_LONG_TASKS or k[1] not in DIGITS_LONG_ARMS})
    if bad:
        raise ValueError(f"the stored digits_long run's (task, arm) must be among {DIGITS_LONG_TASKS} x "
                         f"{DIGITS_LONG_ARMS}, got {bad}")
    pairs = [(t, a) for t in DIGITS_LONG_TASKS for a in DIGITS_LONG_ARMS if any(k[:2] == (t, a) for k in final)]
    lrs = {p: sorted({k[2] for k in final if k[:2] == p}) for p in pairs}
    seeds = {p: sorted({k[3] for k in final if k[:2] == p}) for p in pairs}
    if len(final) != sum(len(lrs[p]) * len(seeds[p]) for p in pairs):
        raise ValueError("digits_long-final.csv must hold one row per task, arm, rate and seed, every seed at every "
                         "rate of its arm")
    if {k[:4] for k in curve} != set(final):
        raise ValueError("digits_long-curves.csv and digits_long-final.csv disagree on their tasks, arms, rates or seeds")
    epochs = sorted({k[4] for k in curve})
    if len(curve) != len(final) * len(epochs):
        raise ValueError(f"digits_long-curves.csv must hold every member's accuracy at each of the epochs {epochs}")
    if any(not (math.isnan(v) or 0 <= v <= 1) for v in curve.values()):
        raise ValueError("digits_long-curves.csv holds a val_acc outside [0, 1]")

    def accuracy(text: str) -> float:
        value = float(text)
        if not (math.isnan(value) or 0 <= value <= 1):
            raise ValueError(f"an accuracy of {text}, expected one in [0, 1] (or nan: diverged)")
        return value

    def updates(text: str) -> int | None:
        if not text:
            return None
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"updates of {text!r}, expected a positive integer (or empty: never)")
        return int(text)

    def per_seed(key: tuple[str, str, float], column: str, read=accuracy) -> list:
        try:
            return [read(final[(*key, s)][column]) for s in seeds[key[:2]]]
        except ValueError as error:
            raise ValueError(f"digits_long-final.csv, {key[1]} on {key[0]} digits at lr {key[2]}, column {column}: "
                             f"{error}") from None

    keys = [(*p, lr) for p in pairs for lr in lrs[p]]
    bn = [k for k in keys if k[1].startswith("BN-")]
    return StoredDigitsLong(
        provenance=provenance, seeds=seeds, lrs=lrs, epochs=epochs,
        val={k: np.array(per_seed(k, "val_acc")) for k in keys}, test={k: np.array(per_seed(k, "test_acc")) for k in keys},
        val_population={k: np.array(per_seed(k, "val_acc_population")) for k in bn},
        test_population={k: np.array(per_seed(k, "test_acc_population")) for k in bn},
        updates_to_1={k: per_seed(k, "updates_to_1", updates) for k in keys},
        curves={k: np.array([[curve[(*k, s, e)] for e in epochs] for s in seeds[k[:2]]]) for k in keys})
