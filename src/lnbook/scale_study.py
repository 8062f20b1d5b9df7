"""Chapter 07's helpers: Wortsman et al.'s learning-rate sensitivity, the residual stream's
size block by block, and the reader of the stored sweep (``benchmarks/scale_sweep.py``).

The sensitivity of one seed over a grid of rates is the mean over the grid of
``min(loss, ceiling)`` minus the seed's best loss, where the ceiling is the loss at
initialization: 0 for an arrangement whose loss does not depend on the rate, larger the
narrower its basin.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import train
from ._checks import check_number, describe
from .transformer import GPTConfig, TinyGPT
from .utils import stored_number, stored_rows

BLOCK, BATCH, BETA2 = 32, 8, 0.95
"""The sweep's windows of characters, windows per step, and Adam's beta2 (Wortsman et al.'s)."""

SCALE_STUDIES = ("sweep", "scale", "zloss", "depth")
SCALE_CURVE_COLUMNS = ["study", "arm", "width", "lr", "seed", "step", "train_loss", "val_loss", "logit_max", "entropy",
                       "log_z"]
SCALE_FINAL_COLUMNS = ["study", "arm", "width", "lr", "seed", "val_loss", "test_loss", "logit_max_first", "logit_max",
                       "entropy", "log_z", "stream_rms"]
CURVES = SCALE_CURVE_COLUMNS[6:]
FINALS = SCALE_FINAL_COLUMNS[5:-1]


def schedule(steps: int, warmup_share: float = 0.1) -> functools.partial:
    """The sweep's learning-rate schedule for a run of ``steps``: a linear warm-up over
    ``warmup_share`` of the steps, then a cosine decay to 0 (:func:`lnbook.train.warmup_cosine`)."""
    check_number(warmup_share, "warmup_share", "a number in (0, 1)", lambda v: 0 < v < 1)
    return functools.partial(train.warmup_cosine, warmup=max(1, round(warmup_share * steps)), steps=steps)


def sweep_model(vocab_size: int, width: int, **settings: object) -> TinyGPT:
    """The sweep's TinyGPT: 2 blocks of ``width`` features in heads of 16 on windows of
    :data:`BLOCK`, or, when ``settings`` give ``n_layer``, that many blocks in 2 heads; any other
    :class:`~lnbook.transformer.GPTConfig` setting as given."""
    size = dict(n_head=2) if "n_layer" in settings else dict(n_layer=2, n_head=max(1, width // 16))
    return TinyGPT(GPTConfig(vocab_size, BLOCK, d_model=width, **size, **settings))


def lr_sensitivity(losses: np.ndarray, ceiling: float) -> np.ndarray:
    """Wortsman et al.'s learning-rate sensitivity per seed from ``losses (rates, seeds)``, the
    final losses over a grid of rates: the mean over the rates of ``min(loss, ceiling)`` minus the
    seed's lowest loss; a non-finite loss (a diverged run) counts as ``ceiling``. ``(seeds,)``."""
    losses = np.asarray(losses, dtype=float)
    if losses.ndim != 2 or 0 in losses.shape:
        raise ValueError(f"losses must be a (rates, seeds) array, got shape {losses.shape}")
    check_number(ceiling, "ceiling", "a finite number", math.isfinite)
    capped = np.minimum(np.where(np.isfinite(losses), losses, ceiling), ceiling)
    return capped.mean(0) - capped.min(0)


def stream_rms(model: TinyGPT, idx: torch.Tensor) -> np.ndarray:
    """The RMS of the residual stream after each block of ``model`` on one batch ``idx (B, T)``
    (eval mode), then of what the head receives (after the final norm, if any): ``(n_layer + 1,)``."""
    if not isinstance(model, TinyGPT):
        raise TypeError(f"model must be a TinyGPT, got {describe(model)}")
    seen: list[float] = []
    rms = lambda x: x.pow(2).mean().sqrt().item()  # noqa: E731
    hooks = [block.register_forward_hook(lambda module, args, out: seen.append(rms(out))) for block in model.blocks]
    hooks.append(model.head.register_forward_pre_hook(lambda module, args: seen.append(rms(args[0]))))
    try:
        with train.evaluating(model), torch.no_grad():
            model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return np.array(seen)


@dataclass(frozen=True)
class StoredScaleSweep:
    """The runs of ``benchmarks/scale_sweep.py``, per ``(study, arm, width, lr)`` (studies
    :data:`SCALE_STUDIES`), seeds ascending (``seeds``). ``final[column][cell]``, ``(S,)``, for
    each of ``val_loss`` and ``test_loss`` (the loss after the last step on the validation and
    test windows), ``logit_max_first`` (the largest attention logit at step 1), ``logit_max``,
    ``entropy`` (the lowest head's attention entropy) and ``log_z`` at the last step;
    ``stream[cell]``, ``(S, n_layer + 1)``, :func:`stream_rms` after training on the test windows;
    ``curves[column][cell]``, ``(S, len(steps[study]))``, for ``train_loss`` (the mean of the
    steps since the previous row), ``val_loss`` (where evaluated), ``logit_max``, ``entropy``
    and ``log_z`` at ``steps[study]``. ``nan`` where not measured or after a divergence.
    ``cells[study]`` lists the cells run; ``provenance``: machine, commit, date, command, setting."""

    provenance: list[str]
    seeds: list[int]
    cells: dict[str, list[tuple[str, str, int, float]]]
    steps: dict[str, list[int]]
    final: dict[str, dict[tuple[str, str, int, float], np.ndarray]]
    stream: dict[tuple[str, str, int, float], np.ndarray]
    curves: dict[str, dict[tuple[str, str, int, float], np.ndarray]]

    def arms(self, study: str) -> list[str]:
        """The arms of ``study``, in the order they were run."""
        return list(dict.fromkeys(c[1] for c in self.cells[study]))

    def lrs(self, study: str) -> list[float]:
        """The rates of ``study``, ascending."""
        return sorted({c[3] for c in self.cells[study]})

    def widths(self, study: str, arm: str) -> list[int]:
        """The widths ``arm`` of ``study`` was run at, ascending."""
        return sorted({c[2] for c in self.cells[study] if c[1] == arm})

    def grid(self, column: str, study: str, arm: str, width: int) -> np.ndarray:
        """``final[column]`` of one arm and width over ``lrs(study)``: ``(rates, seeds)``."""
        return np.array([self.final[column][(study, arm, width, lr)] for lr in self.lrs(study)])


def stored_scale_sweep(path: str | Path | None = None) -> StoredScaleSweep:
    """The stored run of ``benchmarks/scale_sweep.py`` (``scale_sweep-curves.csv`` and
    ``scale_sweep-final.csv``) from the folder ``path``, by default ``lnbook/results/`` as
    installed with the package. Raises FileNotFoundError for a missing file and ValueError for
    a malformed or inconsistent one."""
    number = functools.partial(stored_number, script="scale_sweep.py")  # one cell of its tables
    folder = resources.files("lnbook") / "results" if path is None else Path(path)
    provenance, curve_rows = stored_rows(folder, "scale_sweep-curves.csv", SCALE_CURVE_COLUMNS, "scale_sweep.py")
    _, final_rows = stored_rows(folder, "scale_sweep-final.csv", SCALE_FINAL_COLUMNS, "scale_sweep.py")

    def key(r: dict[str, str]) -> tuple[str, str, int, float, int]:
        if r["study"] not in SCALE_STUDIES:
            raise ValueError(f"the stored scale sweep's studies must be among {SCALE_STUDIES}, got {r['study']!r}")
        return r["study"], r["arm"], int(number(r["width"], "width")), number(r["lr"], "lr"), int(number(r["seed"], "seed"))

    final: dict[tuple, dict[str, str]] = {}
    for r in final_rows:
        if key(r) in final:
            raise ValueError(f"scale_sweep-final.csv holds {key(r)} twice")
        final[key(r)] = r
    seeds = sorted({k[4] for k in final})
    cells = list(dict.fromkeys(k[:4] for k in final))
    if any((*c, s) not in final for c in cells for s in seeds):
        raise ValueError(f"scale_sweep-final.csv must hold every seed {describe(seeds)} of every arm, width and rate")
    curve: dict[tuple, dict[int, dict[str, str]]] = {}
    for r in curve_rows:
        curve.setdefault(key(r), {})[int(number(r["step"], "step"))] = r
    if set(curve) - set(final):
        raise ValueError("scale_sweep-curves.csv holds runs that scale_sweep-final.csv does not")
    studies = [s for s in SCALE_STUDIES if any(c[0] == s for c in cells)]
    steps = {s: sorted({t for k, v in curve.items() if k[0] == s for t in v}) for s in studies}
    losses = [number(r[c], c) for r in final.values() for c in ("val_loss", "test_loss")]
    if any(v < 0 for v in losses if math.isfinite(v)):
        raise ValueError("the stored scale sweep holds a negative loss")
    stream = {}
    for c in cells:
        rows = [[number(v, "stream_rms") for v in final[(*c, s)]["stream_rms"].split(";")] for s in seeds]
        stream[c] = np.array(rows) if len({len(r) for r in rows}) == 1 else np.full((len(seeds), 1), math.nan)
    return StoredScaleSweep(
        provenance=provenance, seeds=seeds, cells={s: [c for c in cells if c[0] == s] for s in studies}, steps=steps,
        final={name: {c: np.array([number(final[(*c, s)][name], name) for s in seeds]) for c in cells} for name in FINALS},
        stream=stream,
        curves={name: {c: np.array([[number(curve.get((*c, s), {}).get(t, {}).get(name, ""), name) for t in steps[c[0]]]
                                    for s in seeds]) for c in cells} for name in CURVES})
