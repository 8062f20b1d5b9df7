"""Chapter 01's experiments on what BatchNorm buys, as functions the notebook calls.

- :class:`SigmoidMLP`: Ioffe and Szegedy's MNIST network (sigmoid units from a small Gaussian
  initialization, BatchNorm before each sigmoid or none), a plain model that
  :func:`lnbook.seeds.stack` stacks; :func:`recording_inputs` records what reaches one or all of
  its sigmoids during training, for the percentiles of their Fig. 1(b, c), and :func:`drift` says
  how far those percentiles moved.
- :func:`fit_scored`: :func:`lnbook.seeds.fit` on a training split, scoring a validation split
  every epoch (to choose settings on) and the test set only after the epochs asked for.
- :func:`stored_sigmoid_run` and :func:`stored_depth_sweep`: the runs of
  ``benchmarks/sigmoid_full.py`` (50,000 updates) and ``benchmarks/depth_sweep.py`` (depth 3 to
  20), too long for the notebook, whose results ship inside the package (``lnbook/results/``),
  so the chapter reads them in Colab too.
- :func:`seeded_mlp`: the ReLU MLP of the chapter's sweeps (and of the depth sweep) for one seed,
  with PyTorch's default or He initialization.
- :func:`largest_trained`: the chapter's range rule (the largest learning rate at which every
  seed's accuracy is above a floor).
- :class:`Grid` (:func:`grid_compare`): one family of paired comparisons over a grid of settings
  (learning rates), with table cells that say what the verdict says, and a heatmap of it.
- Probes of a trained MLP: :func:`layer_report` (layer statistics and weight norms per seed),
  :func:`dead_fraction` (ReLU units that never fire), :func:`bn_projection` (how much of the
  upstream gradient BatchNorm's backward pass removes), :func:`fold_batchnorm` (eval-mode
  BatchNorm folded into the linear layer before it), :func:`batch_answers` (one example's
  answer in training mode, batch by batch), and :func:`default_init_std` (the pre-activation
  scale that PyTorch's default initialization predicts, layer by layer).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import seeds as seeds_mod
from ._checks import describe
from .compare import Comparison, Comparisons, by_measure, compare, compare_items
from .data import Dataset
from .models import MLP, layer_stats, mlp_layers
from .norms import MaskedBatchNorm1d, norm_layer
from .train import History
from .utils import seed_everything

__all__ = [
    "SigmoidMLP", "recording_inputs", "percentiles", "fit_scored", "Grid", "grid_compare", "jointly", "layer_report",
    "dead_fraction", "bn_projection", "fold_batchnorm", "batch_answers", "default_init_std", "correct",
    "validation_accuracy", "drift", "seeded_mlp", "largest_trained", "tally", "log_band", "train_until",
]


class SigmoidMLP(nn.Module):
    """``[Linear -> norm -> sigmoid] * len(hidden) -> Linear``, Ioffe and Szegedy's MNIST
    network (three hidden layers of 100 sigmoid units in the paper).

    Input ``(*, in_features)``, output logits ``(*, n_classes)``. Weights drawn from
    ``N(0, std^2)`` with a generator seeded by ``seed``, biases 0. ``norm``: ``"none"`` or
    ``"batch"`` (:class:`lnbook.norms.MaskedBatchNorm1d` over the batch, before each sigmoid).
    A plain model: :func:`lnbook.seeds.stack` stacks one per seed.
    """

    NORMS = ("none", "batch")

    def __init__(self, in_features: int, hidden: Sequence[int], n_classes: int, norm: str = "none",
                 std: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        widths = [in_features, *hidden, n_classes]
        if not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths) or not hidden:
            raise ValueError(f"in_features, hidden and n_classes must be positive ints (hidden not empty), got "
                             f"{describe(in_features)}, {describe(hidden)}, {describe(n_classes)}")
        if norm not in self.NORMS:
            raise ValueError(f"norm must be one of {self.NORMS}, got {norm!r}")
        if not isinstance(std, (int, float)) or isinstance(std, bool) or not std > 0:
            raise ValueError(f"std must be a positive number, got {describe(std)}")
        self.norm = norm
        g = torch.Generator().manual_seed(seed)
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            linear = nn.Linear(a, b)
            with torch.no_grad():
                linear.weight.copy_(torch.randn(b, a, generator=g) * std)
                linear.bias.zero_()
            layers.append(linear)
            if i < len(widths) - 2:
                if norm == "batch":
                    layers.append(norm_layer("batch", b))
                layers.append(nn.Sigmoid())
        self.net = nn.Sequential(*layers)

    def sigmoids(self) -> list[nn.Sigmoid]:
        """The sigmoid modules, first hidden layer first."""
        return [m for m in self.net if isinstance(m, nn.Sigmoid)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@contextlib.contextmanager
def recording_inputs(module: nn.Module, unit: int | None = 0, rows: int | None = None) -> Iterator[list[torch.Tensor]]:
    """While open, every eval-mode call of ``module`` (on ``rows`` examples, when given: the
    evaluation set's size) appends what reaches it to the list it yields, one entry per call:
    the input of feature ``unit``, ``(S, B)`` for a stacked model (``(B,)`` for a plain one), or,
    with ``unit=None``, of every feature, ``(S, U, B)`` (``(U, B)``), the examples last.
    (:func:`lnbook.seeds.fit` evaluates in eval mode, so with ``eval_every`` this records the
    inputs on the evaluation set over training.)"""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch module, got {describe(module)}")
    if unit is not None and (not isinstance(unit, int) or isinstance(unit, bool) or unit < 0):
        raise ValueError(f"unit must be a feature index >= 0 or None (every feature), got {describe(unit)}")
    seen: list[torch.Tensor] = []

    def hook(m: nn.Module, inputs: tuple, _out: torch.Tensor) -> None:
        if not m.training and (rows is None or inputs[0].shape[-2] == rows):
            x = inputs[0].detach()
            seen.append((x.transpose(-1, -2) if unit is None else x[..., unit]).cpu().clone())

    handle = module.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def percentiles(records: Sequence[torch.Tensor], q: Sequence[float] = (15, 50, 85)) -> np.ndarray:
    """``records``: what :func:`recording_inputs` recorded, ``E`` tensors ``(S, B)`` or
    ``(S, U, B)``. Returns the ``q`` percentiles over the ``B`` examples, ``(E, S, len(q))`` or
    ``(E, S, U, len(q))``."""
    if not records:
        raise ValueError("records must hold at least one recorded evaluation, got none")
    return np.stack([np.moveaxis(np.percentile(r.double().numpy(), list(q), axis=-1), 0, -1) for r in records])


def fit_scored(
    model: nn.Module, fit: Dataset, val: Dataset, test: Dataset, *, epochs: int, lr: float | Sequence[float],
    batch_size: int, seeds: Sequence[int], optimizer: str = "sgd", test_at: Sequence[int] = (),
    eval_every: int | None = None, items: bool = False,
) -> tuple[list[History], dict[int, np.ndarray]]:
    """Train a stacked classifier with :func:`lnbook.seeds.fit` on ``fit``, recording the
    accuracy on ``val`` (the histories' ``test_acc``: a validation accuracy, to choose settings
    on), and score ``test`` only after the epochs in ``test_at`` (and after the last).

    Member ``s`` sees the mini-batches :func:`lnbook.seeds.fit` would give it (a
    ``torch.randperm`` per epoch from a generator seeded with ``seeds[s]``). Returns the
    histories and ``{epoch: test accuracy (S,)}``; with ``items``, ``{epoch: (S, N)}``, whether
    each member got each of the ``N`` test examples right (1.0 or 0.0; its row mean is the accuracy).
    """
    if not all(isinstance(e, int) and 0 < e <= epochs for e in test_at):
        raise ValueError(f"test_at must hold epochs in 1..epochs = {epochs}, got {describe(test_at)}")
    s = seeds_mod.members(model)
    if s is None:
        raise ValueError("model must be a stacked model (lnbook.seeds.stack)")
    if len(seeds) != s:
        raise ValueError(f"seeds must hold one seed per member ({s}), got {describe(seeds)}")
    n = len(fit[-1])
    generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    scored: dict[int, np.ndarray] = {}
    done = [0]

    def order() -> Sequence[torch.Tensor]:
        if done[0] in test_at:  # the epochs before this call are finished
            scored[done[0]] = correct(model, test) if items else seeds_mod.accuracy(model, test)
        done[0] += 1
        return torch.stack([torch.randperm(n, generator=g) for g in generators]).split(batch_size, dim=1)

    histories = seeds_mod.fit(model, fit, val, epochs=epochs, lr=lr, batch_size=batch_size, seeds=seeds,
                              optimizer=optimizer, order=order, eval_every=eval_every)
    scored[epochs] = correct(model, test) if items else seeds_mod.accuracy(model, test)
    return histories, scored


def correct(model: nn.Module, data: Dataset, batch_size: int = 512) -> np.ndarray:
    """Whether each member of a stacked classifier gets each example of ``data = (inputs...,
    labels)`` right in eval mode: ``(S, N)`` of 1.0 and 0.0 (its row means are
    :func:`lnbook.seeds.accuracy`)."""
    s = seeds_mod.members(model)
    if s is None:
        raise ValueError("model must be a stacked model (lnbook.seeds.stack)")
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    rows = []
    try:
        with torch.no_grad():
            for i in range(0, len(data[-1]), batch_size):
                *inputs, y = (t[i : i + batch_size].to(device) for t in data)
                rows.append(model(*(t.expand(s, *t.shape) for t in inputs)).argmax(-1) == y)
    finally:
        model.train(was)
    return torch.cat(rows, 1).double().cpu().numpy()


def validation_accuracy(histories: Sequence[History]) -> np.ndarray:
    """The validation accuracy of each member at each evaluation, ``(S, evaluations)``, from the
    histories of :func:`fit_scored` (which records the validation split where
    :class:`lnbook.train.History` has its ``test_acc`` field: the name is train.fit's, the data the
    validation split)."""
    if not histories:
        raise ValueError("histories must hold at least one History")
    return np.array([h.test_acc for h in histories], dtype=float)


def drift(pct: np.ndarray, start: int | Sequence[int], stop: int | Sequence[int] = -1) -> np.ndarray:
    """How far a unit's input distribution moved between two evaluations, per member (and unit):
    ``pct (E, S, Q)`` or ``(E, S, U, Q)`` are the percentiles of one unit or of ``U`` units
    (:func:`percentiles`, 15/50/85 by default); the result, ``(S,)`` or ``(S, U)``, is the mean
    over the Q percentiles of ``|pct[stop] - pct[start]|`` in units of the spread at ``stop``
    (last percentile minus first). ``start``/``stop``: one evaluation index for all members, or
    one per member (a window matched on each member's progress). 0: the distribution stood still."""
    pct = np.asarray(pct, dtype=float)
    if pct.ndim not in (3, 4) or pct.shape[-1] < 2:
        raise ValueError(f"pct must be (evaluations, members, [units,] percentiles >= 2), got shape {pct.shape}")
    e, s = pct.shape[:2]
    idx = [np.broadcast_to(np.asarray(v), (s,)) for v in (start, stop)]
    if not all(np.issubdtype(v.dtype, np.integer) and (v >= -e).all() and (v < e).all() for v in idx):
        raise ValueError(f"start and stop must be evaluation indices in -{e}..{e - 1} (one, or one per member), "
                         f"got {describe(start)}, {describe(stop)}")
    members = np.arange(s)
    a, b = pct[idx[0], members], pct[idx[1], members]  # (S, [U,] Q)
    return np.abs(b - a).mean(-1) / (b[..., -1] - b[..., 0])


@dataclass
class StoredRun:
    """A stored run of :class:`SigmoidMLP` stacks (``benchmarks/sigmoid_full.py``), keyed by
    ``(norm, lr)``: ``val`` and ``loss`` map each evaluation's update to the per-seed validation
    accuracy and mean training loss since the last evaluation ``(S,)``; ``right`` holds whether
    each test digit was classified right after the last update ``(S, n_test)``. Seeds in
    ascending order (``seeds``); ``provenance``: the machine, commit, date and command."""

    provenance: list[str]
    seeds: list[int]
    val: dict[tuple[str, float], dict[int, np.ndarray]]
    loss: dict[tuple[str, float], dict[int, np.ndarray]]
    right: dict[tuple[str, float], np.ndarray]


def _stored_csv(name: str) -> tuple[list[str], list[dict[str, str]]]:
    lines = (resources.files("lnbook") / "results" / name).read_text().splitlines()
    return [line[2:] for line in lines if line.startswith("# ")], list(csv.DictReader(l for l in lines if not l.startswith("#")))


def per_seed(rows: list[dict[str, str]], key: Callable[[dict[str, str]], Hashable], what: str
              ) -> tuple[list[int], dict[Hashable, dict[int, dict[str, str]]]]:
    """A stored file's rows grouped by ``key(row)``, then by seed: (the seeds, ascending; the
    groups). Every group must hold the same seeds."""
    groups: dict[Hashable, dict[int, dict[str, str]]] = {}
    for r in rows:
        groups.setdefault(key(r), {})[int(r["seed"])] = r
    seeds = sorted(next(iter(groups.values())))
    if any(sorted(g) != seeds for g in groups.values()):
        raise ValueError(f"the stored {what} does not hold every seed in every setting")
    return seeds, groups


def stored_sigmoid_run() -> StoredRun:
    """The 50,000-update sigmoid run that chapter 01 cannot afford to train (ten seeds; no norm
    and BatchNorm at the rates it names), read from the files ``benchmarks/sigmoid_full.py``
    wrote into ``lnbook/results/``: installed with the package, so no repository is needed."""
    provenance, curve_rows = _stored_csv("sigmoid_full-curves.csv")
    seeds, curves = per_seed(curve_rows, lambda r: (r["arm"], float(r["lr"]), int(r["update"])), "sigmoid run")
    test_seeds, tests = per_seed(_stored_csv("sigmoid_full-test.csv")[1], lambda r: (r["arm"], float(r["lr"])), "sigmoid run")
    if test_seeds != seeds or {k[:2] for k in curves} != set(tests):
        raise ValueError("the stored sigmoid run's files disagree on its arms, rates or seeds")
    val: dict[tuple[str, float], dict[int, np.ndarray]] = {}
    loss: dict[tuple[str, float], dict[int, np.ndarray]] = {}
    for (arm, lr, update), g in sorted(curves.items()):
        val.setdefault((arm, lr), {})[update] = np.array([float(g[s]["val_acc"]) for s in seeds])
        loss.setdefault((arm, lr), {})[update] = np.array([float(g[s]["train_loss"]) for s in seeds])
    return StoredRun(provenance=provenance, seeds=seeds, val=val, loss=loss,
                     right={k: np.array([[int(c) for c in g[s]["right"]] for s in seeds], dtype=float)
                            for k, g in sorted(tests.items())})


@dataclass
class DepthSweep:
    """The stored depth sweep of ``benchmarks/depth_sweep.py``: chapter 01's ReLU MLP at several
    depths, per ``(depth, arm, lr)`` (arms ``"none"``, ``"none_he"``, ``"batch"``, ``"layer"``):
    ``val`` the validation accuracy after the last epoch ``(S,)``, ``updates`` the updates to a
    training loss of 0.5 (None: never), ``last_loss`` the last epoch's mean training loss ``(S,)``,
    ``right`` whether each test digit is right after the last epoch ``(S, n_test)``; per
    ``(depth, arm)``, ``init_grad`` the weight-gradient norm of every linear layer at
    initialization ``(S, depth + 1)``. Seeds in ascending order; ``provenance`` as in
    :class:`StoredRun`."""

    provenance: list[str]
    seeds: list[int]
    depths: list[int]
    lrs: list[float]
    val: dict[tuple[int, str, float], np.ndarray]
    updates: dict[tuple[int, str, float], list[int | None]]
    last_loss: dict[tuple[int, str, float], np.ndarray]
    right: dict[tuple[int, str, float], np.ndarray]
    init_grad: dict[tuple[int, str], np.ndarray]


def stored_depth_sweep() -> DepthSweep:
    """The depth sweep that chapter 01 cannot afford to train, read from the file
    ``benchmarks/depth_sweep.py`` wrote into ``lnbook/results/`` (installed with the package)."""
    provenance, rows = _stored_csv("depth_sweep.csv")
    seeds, by_seed = per_seed(rows, lambda r: (int(r["depth"]), r["arm"], float(r["lr"])), "depth sweep")

    def column(key: str, convert: Callable[[str], object]) -> dict:
        return {k: [convert(v[s][key]) for s in seeds] for k, v in by_seed.items()}

    return DepthSweep(
        provenance=provenance, seeds=seeds, depths=sorted({k[0] for k in by_seed}), lrs=sorted({k[2] for k in by_seed}),
        val={k: np.array(v) for k, v in column("val_acc", float).items()},
        updates=column("updates_to_0.5", lambda u: int(u) if u else None),
        last_loss={k: np.array(v) for k, v in column("last_loss", float).items()},
        right={k: np.array(v, dtype=float) for k, v in column("right", lambda t: [int(c) for c in t]).items()},
        init_grad={k[:2]: np.array(v) for k, v in column("init_grad", lambda t: [float(g) for g in t.split(";")]).items()})


def seeded_mlp(norm: str, seed: int, depth: int = 3, init: str = "default") -> MLP:
    """Chapter 01's ReLU MLP on the 8 x 8 digits, ``MLP(64, (64,) * depth, 10, norm)``, built after
    ``seed_everything(seed)``; ``init="he"`` then redraws every linear layer's weights from He et
    al.'s N(0, 2 / fan-in) and zeroes its biases."""
    if init not in ("default", "he"):
        raise ValueError(f"init must be 'default' or 'he', got {init!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int (hidden layers), got {depth!r}")
    seed_everything(seed)
    net = MLP(64, (64,) * depth, 10, norm)
    if init == "he":
        for linear in mlp_layers(net)[0]:
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
    return net


def largest_trained(accuracy: Mapping[float, Sequence[float]], floor: float = 0.5) -> float | None:
    """The chapter's range rule: the largest learning rate at which *every* seed's accuracy is
    above ``floor``. ``accuracy``: learning rate -> per-seed accuracies ``(S,)``. None: no rate."""
    if not accuracy:
        raise ValueError("accuracy must map at least one learning rate to per-seed accuracies")
    rates = [lr for lr, acc in accuracy.items() if len(acc) and (np.asarray(acc, dtype=float) > floor).all()]
    return max(rates) if rates else None


def tally(grid: "Grid", a: Hashable, b: Hashable) -> tuple[list, list, list]:
    """Over the grid's settings: where ``a`` wins, where ``b`` wins, where the adjusted test
    separates neither (settings not compared are in none of the three)."""
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a Grid (grid_compare), got {describe(grid)}")
    found = {s: grid.get(s, a, b) for s in grid.settings}
    found = {s: c for s, c in found.items() if c is not None}
    return ([s for s, c in found.items() if c.winner == c.a], [s for s, c in found.items() if c.winner == c.b],
            [s for s, c in found.items() if c.winner is None])


def log_band(ax, x: Sequence[float], runs: np.ndarray, label: str, **kwargs) -> None:
    """For a log-scale axis: the geometric mean over runs ``(n_runs, len(x))`` (positive values)
    as a line, and the 95% interval of the mean of log(value) (Student t), exponentiated, as a band;
    it never reaches 0 the way a linear-space interval does. ``kwargs`` go to the line."""
    from .utils import interval

    logs = np.log(np.asarray(runs, dtype=float))
    if logs.ndim != 2 or logs.shape[1] != len(x) or not np.isfinite(logs).all():
        raise ValueError(f"runs must be positive and finite, shape (n_runs, {len(x)}), got shape {np.shape(runs)}")
    (line,) = ax.plot(x, np.exp(logs.mean(0)), label=f"{label} (geometric mean of {len(logs)})", **kwargs)
    low, high = np.array([interval(col)[1:] for col in logs.T]).T
    ax.fill_between(x, np.exp(low), np.exp(high), color=line.get_color(), alpha=0.2, lw=0)


def train_until(model: nn.Module, fit: Dataset, val: Dataset, *, steps: int, lr: float, seed: int,
                batch_size: int = 64, epochs: int = 1000) -> nn.Module:
    """Train a plain ``model`` with :func:`lnbook.train.fit` (SGD with momentum 0.9, the batches of
    ``seed``) for exactly ``steps`` updates, the same updates its stacked twin made with that seed
    (to checkpoint it, e.g., where the twin's loss first fell below a level). Returns ``model``."""
    from . import train

    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive int (None: the level was never reached), got {describe(steps)}")
    train.fit(model, fit, val, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, optimizer="sgd",
              max_steps=steps)
    return model


@dataclass
class Grid:
    """Paired comparisons of arms at every setting of a grid, one family (Holm over all of them).

    ``found``: the :class:`~lnbook.compare.Comparisons`, arms named ``"<name>, <label> <setting>"``;
    ``skipped``: ``(setting, a, b) -> reason`` for pairs not compared (a seed without a result, or
    the two arms equal on every seed)."""

    found: Comparisons
    skipped: dict[tuple, str]
    names: Mapping[Hashable, str]
    label: str = "lr"
    settings: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.found)

    def get(self, setting: Hashable, a: Hashable, b: Hashable) -> Comparison | None:
        """The comparison ``a − b`` at ``setting`` (None: not compared)."""
        try:
            return self.found[f"{self.names[a]}, {self.label} {setting}", f"{self.names[b]}, {self.label} {setting}"]
        except KeyError:
            return None

    def cell(self, setting: Hashable, a: Hashable, b: Hashable) -> str:
        """A table cell that says what the verdict says: ``"+d [lo, hi], A beats B"``; an
        interval that excludes 0 without a verdict says so (``"not separated after Holm, p 0.07"``);
        a pair not compared says why."""
        if (setting, a, b) in self.skipped:
            return self.skipped[setting, a, b]
        c = self.get(setting, a, b)
        if c is None:
            return "-"
        if c.winner is not None:
            win, lose = (a, b) if c.winner == c.a else (b, a)
            verb = "is larger than" if c.higher is None else "beats"
            return f"{c.interval}, {self.names[win]} {verb} {self.names[lose]}"
        if c.low > 0 or c.high < 0:
            return f"{c.interval}, not separated after Holm (p {c.p_holm:.2f})"
        return f"{c.interval}, no difference measured"

    def heatmap(self, ax, pairs: Sequence[tuple[Hashable, Hashable]], scale: float | None = None, title: str = "") -> object:
        """Draw the grid on a matplotlib ``ax``: rows the settings, columns the pairs, the number the
        difference ``a − b``, the colour that difference signed so that positive (blue) means ``a``
        is better (negated where smaller is better; divided by ``scale``, default the largest
        magnitude; where no side is better, the plain difference), hatched where
        the adjusted test does not separate it, grey where not compared. Returns the image."""
        from matplotlib.patches import Rectangle

        diff = np.full((len(self.settings), len(pairs)), np.nan)
        for i, setting in enumerate(self.settings):
            for j, (a, b) in enumerate(pairs):
                c = self.get(setting, a, b)
                if c is not None:  # coloured so that one colour always means "the first arm is better"
                    diff[i, j] = -c.diff if c.higher is False else c.diff
        scale = scale or (np.nanmax(np.abs(diff)) if np.isfinite(diff).any() else 1.0)
        ax.set_facecolor("0.85")
        image = ax.imshow(diff / scale, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
        for i, setting in enumerate(self.settings):
            for j, (a, b) in enumerate(pairs):
                c = self.get(setting, a, b)
                text = "n/c" if c is None else f"{c.diff:+.{min(c.digits, 3)}f}".replace("-", "−")
                if c is not None and c.winner is None:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.4",
                                           linewidth=0))
                dark = np.isfinite(diff[i, j]) and abs(diff[i, j] / scale) > 0.6
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
        ax.set_xticks(range(len(pairs)), [f"{self.names[a]}\n− {self.names[b]}" for a, b in pairs], fontsize=7)
        ax.set_yticks(range(len(self.settings)), [str(s) for s in self.settings])
        ax.set_ylabel(self.label)
        if title:
            ax.set_title(title, fontsize=9)
        return image


def grid_compare(
    measure: Callable[[Hashable, Hashable], Sequence[float] | None], pairs: Sequence[tuple[Hashable, Hashable]],
    settings: Sequence[Hashable], names: Mapping[Hashable, str], *, higher: bool = True, digits: int = 3,
    label: str = "lr", chance: float | None = None,
) -> Grid:
    """One call of :func:`lnbook.compare.compare`: each pair ``(a, b)`` at every setting where
    both arms have a result for every seed (``measure(arm, setting)`` -> per-seed values, or
    None). A pair whose two arms are equal on every seed is not compared; its cell reads "both at
    chance; not compared" when both are at or below ``chance`` + 0.05."""
    results: dict[str, np.ndarray] = {}
    asked, skipped = [], {}
    for setting in settings:
        for a, b in pairs:
            va, vb = measure(a, setting), measure(b, setting)
            if va is None or vb is None:
                continue
            va, vb = np.asarray(va, dtype=float), np.asarray(vb, dtype=float)
            if np.array_equal(va, vb):
                top = max((v.mean(-1) if v.ndim == 2 else v).max() for v in (va, vb))  # the best seed's score
                low = chance is not None and top <= chance + 0.05
                skipped[setting, a, b] = "both at chance; not compared" if low else "equal on every seed; not compared"
                continue
            ka, kb = f"{names[a]}, {label} {setting}", f"{names[b]}, {label} {setting}"
            results[ka], results[kb] = va, vb
            asked.append((ka, kb))
    if not asked:
        raise ValueError("measure gave no pair a result for every seed at any setting: nothing to compare")
    items = any(v.ndim == 2 for v in results.values())
    found = (compare_items(results, pairs=asked, higher=higher, digits=digits) if items
             else compare(results, pairs=asked, higher=higher, digits=digits))
    return Grid(found, skipped, names, label, list(settings))


def jointly(grids: Mapping[str, Grid]) -> dict[str, Grid]:
    """Several grids shown in one table, and so tested as one family: Holm's adjustment redone
    over all their comparisons (:func:`lnbook.compare.by_measure`); the same grids, re-adjusted."""
    if not isinstance(grids, Mapping) or not grids or not all(isinstance(g, Grid) for g in grids.values()):
        raise TypeError(f"grids must map measure names to Grid objects, got {describe(grids)}")
    table = by_measure({m: g.found for m, g in grids.items()})
    return {m: replace(g, found=table[m]) for m, g in grids.items()}


def layer_report(nets: Sequence[MLP], x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """:func:`lnbook.models.layer_stats` of each plain MLP in ``nets`` on ``x (B, in)``, ``y (B,)``,
    and the Frobenius norm of each Linear layer's weight (``"weight"``): arrays ``(len(nets), L)``."""
    if not nets:
        raise ValueError("nets must hold at least one models.MLP")
    stats = []
    for m in nets:
        s = layer_stats(m, x, y)
        s["weight"] = np.array([lin.weight.norm().item() for lin in mlp_layers(m)[0]])
        stats.append(s)
    return {k: np.array([s[k] for s in stats]) for k in stats[0]}


def dead_fraction(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    """The fraction of each hidden layer's ReLU units that output 0 for every example of
    ``x (B, in)``, in eval mode: ``(S, layers)`` for a stacked MLP, ``(1, layers)`` for a plain one.
    When every unit of a hidden layer is dead, the layers after it see a constant and the logits are
    the same for every input (the output layer's bias, when the dead layer is the last hidden one)."""
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    if not relus:
        raise ValueError(f"model must hold nn.ReLU units, got {type(model).__name__} without any")
    s = seeds_mod.members(model)
    outs: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda m, i, o: outs.append(o.detach())) for r in relus]
    was = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(x if s is None else x.expand(s, *x.shape))
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    fires = [(o.reshape(s or 1, -1, o.shape[-1]) > 0).any(1) for o in outs]  # (S, units) per layer
    return np.stack([(~f).double().mean(-1).cpu().numpy() for f in fires], axis=1)


def bn_projection(model: MLP, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """For each BatchNorm layer of a plain MLP, ``||dL/dx|| / ||g / sigma||`` over one
    training-mode pass on ``x (B, in)``, ``y (B,)`` (cross-entropy), on a copy: ``x`` the layer's
    input, ``g = gain * dL/dy`` the upstream gradient, ``sigma`` the batch standard deviation. The
    backward pass gives ``dL/dx = (g - mean(g) - x_hat mean(g x_hat)) / sigma``: it removes ``g``'s
    components along the constant and along ``x_hat``; the ratio (at most 1) is what is left. ``(layers,)``."""
    if not isinstance(model, MLP) or model.norm != "batch":
        raise TypeError(f"model must be an lnbook.models.MLP with norm='batch', got {describe(model)}")
    probe = copy.deepcopy(model).train()
    norms = [m for m in probe.modules() if isinstance(m, MaskedBatchNorm1d)]
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(m: nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        inputs[0].retain_grad()
        out.retain_grad()
        seen.append((inputs[0], out))

    hooks = [n.register_forward_hook(hook) for n in norms]
    try:
        xin = x.clone().requires_grad_(True)  # so every norm's input is part of the graph
        F.cross_entropy(probe(xin), y).backward()
    finally:
        for h in hooks:
            h.remove()
    ratios = []
    for n, (inp, out) in zip(norms, seen):
        sigma = torch.sqrt(inp.detach().var(0, unbiased=False) + n.eps)
        g = out.grad * n.weight.detach()
        ratios.append((inp.grad.norm() / (g / sigma).norm()).item())
    return np.array(ratios)


def fold_batchnorm(model: MLP) -> MLP:
    """An MLP without norm layers that computes what ``model`` (a plain ``models.MLP`` with
    ``norm="batch"``) computes in eval mode: each BatchNorm, with its running statistics, is the
    affine map ``y = a x + c`` (``a = gain / sqrt(running_var + eps)``, ``c = bias - a running_mean``),
    folded into the Linear layer before it (``W' = a W``, ``b' = a b + c``)."""
    if not isinstance(model, MLP) or model.norm != "batch":
        raise TypeError(f"model must be an lnbook.models.MLP with norm='batch', got {describe(model)}")
    (in_features, hidden, n_classes, _), _ = model.init_args
    folded = MLP(in_features, hidden, n_classes, "none").to(next(model.parameters()).device)
    linears, norms = mlp_layers(model)
    new_linears, _ = mlp_layers(folded)
    with torch.no_grad():
        for i, (lin, new) in enumerate(zip(linears, new_linears)):
            w, b = lin.weight.clone(), lin.bias.clone()
            if i < len(norms) and norms[i] is not None:
                bn = norms[i]
                a = bn.weight / torch.sqrt(bn.running_var + bn.eps)
                w, b = a[:, None] * w, a * (b - bn.running_mean) + bn.bias
            new.weight.copy_(w)
            new.bias.copy_(b)
    return folded.eval()


def batch_answers(net: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, draws: int = 3,
                  seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Each example of ``x (N, in)`` (labels ``y (N,)``) put into ``draws`` random batches of
    ``batch_size - 1`` other examples of ``x``, through a stacked classifier ``net`` in the mode
    it is in: its probability for the true class and whether its prediction is right, each
    ``(draws, S, N)``. In training mode a BatchNorm network answers differently batch by batch.
    The network's running statistics move if it is in training mode; pass a copy."""
    s = seeds_mod.members(net)
    if s is None:
        raise ValueError("net must be a stacked model (lnbook.seeds.stack)")
    if not isinstance(batch_size, int) or not 2 <= batch_size <= len(y):
        raise ValueError(f"batch_size must be an int in 2..{len(y)}, got {describe(batch_size)}")
    n, device = len(y), x.device
    g = torch.Generator().manual_seed(seed)
    p, right = torch.empty(draws, s, n), torch.empty(draws, s, n)
    with torch.no_grad():
        for d in range(draws):
            for i in range(n):
                mates = torch.randint(0, n - 1, (s, batch_size - 1), generator=g)
                idx = torch.cat([torch.full((s, 1), i), mates + (mates >= i)], 1).to(device)
                out = net(x[idx])[:, 0].cpu()  # (S, classes): example i's logits
                p[d, :, i], right[d, :, i] = out.softmax(-1)[:, int(y[i])], out.argmax(-1) == int(y[i])
    return p.numpy(), right.numpy()


def default_init_std(first: float, layers: int, fan_in: int, normalized: bool = False) -> np.ndarray:
    """The standard deviation of each Linear layer's output that PyTorch's default
    initialization predicts in a ReLU MLP of constant width: weights and biases uniform in
    ``±1/sqrt(fan_in)`` (variance ``1/(3 fan_in)``), ReLU halving the second moment of a
    zero-mean symmetric input, so ``v[l+1] = v[l] / 6 + 1/(3 fan_in)`` from ``v[1] = first^2``;
    with a norm before each ReLU (``normalized``), every layer after the first gets ``1/6 + 1/(3 fan_in)``.
    ``(layers,)``."""
    if not isinstance(layers, int) or layers < 1 or not isinstance(fan_in, int) or fan_in < 1:
        raise ValueError(f"layers and fan_in must be positive ints, got {describe(layers)}, {describe(fan_in)}")
    v, out = first**2, [first]
    for _ in range(layers - 1):
        v = (1.0 if normalized else v) / 6 + 1 / (3 * fan_in)
        out.append(math.sqrt(v))
    return np.array(out)
