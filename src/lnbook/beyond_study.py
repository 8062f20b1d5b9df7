"""Chapter 09's experiments and the helpers that read them: graphs, a vision transformer, DQN,
a plasticity test and ten norms in an MLP and an LSTM, all queued at once.

:func:`setup` builds the data and the settings of every experiment (``full=True``: twice the
epochs and tasks, and 10 graph and 10 ViT seeds); :func:`queue` starts every
job on the chapter's workers (:func:`lnbook.train.cpu_workers`) and returns the futures by
section, so that each section of the chapter waits only for its own runs. Every arm except the
graph networks trains its seeds as one stacked model (:mod:`lnbook.seeds`). A stacked member is
the model a single run with its seed would train for the classifiers and the refitted MLPs. (The
chapter's DQN and streaming agents are stored runs of ``benchmarks/dqn_rl.py`` and
``benchmarks/stream_rl.py``, read by :func:`lnbook.rl.stored_dqn_run` and
:func:`lnbook.rl.stored_stream_run`.)

The rest reads the results: :func:`updates` (the budget of a run, in optimizer updates),
:func:`mean`, :func:`vit_compare`, :func:`batch_mate_effect`,
:func:`vit_accuracy` and :func:`said` (one comparison's verdict as the closing table quotes it).

Section 5's MLP and LSTM are a stored sweep (``benchmarks/norm_sweep.py``): :func:`train_norm_arm`
trains one arm at every rate and seed, :func:`stored_norm_sweep` reads the sweep, and
:func:`norm_questions`, :func:`question_table` and :func:`changed_verdicts` make the section's
tables, one Holm family per question of :data:`QUESTIONS`.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import data, graphs, models, norms, rl, rnn, seeds, train
from ._checks import check_bool, check_positive_int, describe
from .compare import Comparisons, by_measure, compare
from .transformer import TinyViT
from .utils import Table, ci, seed_everything

GRAPH_NORMS = {"no norm": "none", "BatchNorm": "batch", "LayerNorm, node": "layer_node",
               "LayerNorm, graph": "layer_graph", "GraphNorm": "graph"}
VIT_NORMS = {"no norm": "none", "LayerNorm": "layernorm", "BatchNorm": "batchnorm"}
PATCHES = (2, 4)
REFIT_NORMS = {"no norm": "none", "LayerNorm": "layer"}
NORMS = {"none": "no norm", "batch": "BatchNorm", "layer": "LayerNorm", "layer_simple": "LayerNorm, no gain or bias",
         "group4": "GroupNorm (4 groups)", "weight": "weight normalization", "rms": "RMSNorm", "dyt": "DyT",
         "detach": "DetachNorm", "adanorm": "AdaNorm"}
# section 5's arms beyond the ten norms: Xu et al.'s C = 2 for AdaNorm (MLP and LSTM), and in the MLP Salimans and
# Kingma's data-dependent initialization, with the weight norm and without it (the control: the init alone)
EXTRA = {"adanorm_c2": "AdaNorm, C = 2", "weight_ddi": "weight normalization, data-dependent init",
         "ddi": "data-dependent init, no weight normalization"}
LSTM_ARMS = (*NORMS, "adanorm_c2")
MLP_ARMS = (*NORMS, *EXTRA)
ARMS = {**NORMS, **EXTRA}
COLOR = {"no norm": "C0", "BatchNorm": "C1", "LayerNorm": "C2", "LayerNorm, node": "C2", "LayerNorm, graph": "C4",
         "GraphNorm": "C5"}  # the same colour for a norm in every figure of the chapter


@dataclass
class Setup:
    """The data and the settings of every experiment of chapter 09 (see :func:`setup`). The
    ``*_fit`` dicts are the keyword arguments of each training function, ``refit``
    includes its ``fit``; ``seeds`` are the graph seeds (one job each), ``vit_seeds`` the
    ViT's and ``many`` those of every other stacked arm."""

    full: bool
    scale: int
    seeds: range
    vit_seeds: range
    many: range
    graph_train: list
    graph_test: list
    graph_large: list
    images_train: tuple
    images_test: tuple
    pixels_train: tuple
    pixels_test: tuple
    steps_train: tuple
    steps_test: tuple
    refit_x: torch.Tensor
    targets: dict[str, torch.Tensor]
    graph_fit: dict = field(default_factory=dict)
    vit_fit: dict = field(default_factory=dict)
    refit: dict = field(default_factory=dict)
    mlp_fit: dict = field(default_factory=dict)
    lstm_fit: dict = field(default_factory=dict)


def setup(full: bool = False, tiny: bool = False) -> Setup:
    """The chapter's data and settings. ``full``: twice the epochs and tasks, and 10 graph and
    10 ViT seeds instead of 5. ``tiny`` (for tests): a few graphs and images, one epoch, 2 seeds
    and 5 updates per task, the same code paths."""
    check_bool(full, "full")
    check_bool(tiny, "tiny")
    scale = 2 if full else 1
    graph_train = graphs.random_graphs(16 if tiny else 320, 5, 100, seed=0)
    graph_test = graphs.random_graphs(8 if tiny else 200, 5, 100, seed=1)
    graph_large = graphs.random_graphs(4 if tiny else 200, 101, 200, seed=2)
    images_train, images_test = data.digits_sequences("row")  # x: (N, 8, 8)
    pixels_train, pixels_test = data.digits_sequences("pixel")  # x: (N, 64, 1)
    if tiny:
        images_train, images_test, pixels_train, pixels_test = (tuple(t[:128] for t in d) for d in
                                                                (images_train, images_test, pixels_train, pixels_test))
    tasks = 2 if tiny else 8 * scale
    epochs = 1 if tiny else scale
    s = Setup(
        full=full, scale=scale, seeds=range(2 if tiny else 10 if full else 5),
        vit_seeds=range(2 if tiny else 10 if full else 5), many=range(2 if tiny else 10),
        graph_train=graph_train, graph_test=graph_test, graph_large=graph_large,
        images_train=images_train, images_test=images_test, pixels_train=pixels_train, pixels_test=pixels_test,
        steps_train=data.as_steps(pixels_train, 4), steps_test=data.as_steps(pixels_test, 4),  # 4 pixels a step
        refit_x=pixels_train[0][:512].flatten(1),  # 512 digits (fewer when tiny), 64 pixels each
        targets={"re-drawn": rl.shifted_targets(min(512, len(pixels_train[0])), tasks, 0.0, seed=0),
                 "re-drawn, mean +1 per task": rl.shifted_targets(min(512, len(pixels_train[0])), tasks, 1.0, seed=0)},
    )
    s.graph_fit = dict(fit=graphs.fit_graphs, train=graph_train, test=graph_test, epochs=epochs * (1 if tiny else 6),
                       lr=3e-3, batch_size=16)
    s.vit_fit = dict(train=images_train, test=images_test, epochs=epochs * (1 if tiny else 8), lr=3e-3, batch_size=64,
                     drop_last=True)
    s.refit = dict(fit=rl.refit, x=s.refit_x, steps=5 if tiny else 150, lr=1e-3, batch_size=64)
    s.mlp_fit = dict(train=pixels_train, test=pixels_test, epochs=epochs * (1 if tiny else 5), lr=0.1, batch_size=64,
                     optimizer="sgd")
    s.lstm_fit = dict(train=s.steps_train, test=s.steps_test, epochs=epochs * (1 if tiny else 3), lr=1e-2, batch_size=64,
                      grad_clip=1.0)
    return s


def make_mlp(arm: str, ddi_x: torch.Tensor | None = None) -> nn.Module:
    """Section 5's MLP (64 pixels, 3 hidden layers of 64, 10 classes) for one arm of
    :data:`MLP_ARMS`; ``ddi_x (B, 64, 1)``, the batch the data-dependent initialization sees."""
    if arm not in MLP_ARMS:
        raise ValueError(f"arm must be one of {MLP_ARMS}, got {describe(arm)}")
    if arm == "adanorm_c2":
        return norms.set_adanorm(models.MLP(64, (64, 64, 64), 10, "adanorm"), C=2.0)
    if arm in ("weight_ddi", "ddi"):
        if ddi_x is None:
            raise ValueError(f"arm {arm!r} needs ddi_x, the batch of inputs its initialization sees")
        return models.weight_norm_init(models.MLP(64, (64, 64, 64), 10, "weight"), ddi_x, keep_weight_norm=arm == "weight_ddi")
    return models.MLP(64, (64, 64, 64), 10, arm)


def make_lstm(arm: str) -> nn.Module:
    """Section 5's LSTM classifier (4 pixels a step, hidden size 64, 16 steps) for one arm of
    :data:`LSTM_ARMS`."""
    if arm not in LSTM_ARMS:
        raise ValueError(f"arm must be one of {LSTM_ARMS}, got {describe(arm)}")
    if arm == "adanorm_c2":
        return norms.set_adanorm(rnn.SequenceClassifier(rnn.LSTMCell(4, 64, "adanorm", max_steps=16), 10), C=2.0)
    return rnn.SequenceClassifier(rnn.LSTMCell(4, 64, arm, max_steps=16), 10)


def _start_stacked(make, seed_list: Sequence[int], workers: Executor | None, device: torch.device | str,
                   **job: object) -> Future:
    """ONE job: a fresh ``make()`` per seed (each built after ``seed_everything(seed)``), stacked
    into one model with a member per seed and trained by ``job["fit"]`` (rl.refit)."""
    members = []
    for seed in seed_list:
        seed_everything(seed)
        members.append(make())
    return train.fit_many([dict(model=seeds.stack(members).to(device), seeds=list(seed_list), **job)], workers)[0]


SECTIONS = ("lstm", "graphs", "vit", "refit", "mlp")


def queue(s: Setup, workers: Executor | None = None, device: torch.device | str = "cpu",
          sections: Sequence[str] = SECTIONS) -> dict[str, dict]:
    """Start the training jobs of the chapter's ``sections`` (of :data:`SECTIONS`; the chapter
    reads section 5's MLP and LSTM from the stored sweep, :func:`stored_norm_sweep`) on
    ``workers`` (here, one after the other, when None), the longest first so that two workers
    finish together. Returns ``{section: {arm: futures}}``: for "graphs", "vit", "mlp" and
    "lstm" a list of futures, one per seed, each giving ``(trained model, history)``; for
    "refit" one future giving ``(stacked model, history of every member)``."""
    if not isinstance(s, Setup):
        raise TypeError(f"s must be a Setup (beyond_study.setup()), got {describe(s)}")
    if isinstance(sections, str) or not set(sections) <= set(SECTIONS):
        raise ValueError(f"sections must be a sequence of {SECTIONS}, got {describe(sections)}")
    device = torch.device(device)

    def stacked_classifier(make, seed_list, **job):
        return seeds.start_runs(make, seed_list, workers, device, fit=seeds.fit, **job)

    q: dict[str, dict] = {}
    if "lstm" in sections:
        q["lstm"] = {arm: stacked_classifier(lambda a=arm: make_lstm(a), s.many, **s.lstm_fit) for arm in LSTM_ARMS}
    if "graphs" in sections:
        q["graphs"] = {name: train.start_runs(lambda n=norm: graphs.GraphNet(2, 32, 3, n), s.seeds, workers, device,
                                          **s.graph_fit) for name, norm in GRAPH_NORMS.items()}
    if "vit" in sections:
        q["vit"] = {(p, name): stacked_classifier(lambda p=p, n=norm: TinyViT(patch_size=p, norm=n), s.vit_seeds, **s.vit_fit)
                for p in PATCHES for name, norm in VIT_NORMS.items()}
    if "refit" in sections:
        q["refit"] = {(kind, name): _start_stacked(lambda n=norm: models.MLP(64, (128, 128), 1, n), s.many, workers, device,
                                               targets=targets, **s.refit)
                  for kind, targets in s.targets.items() for name, norm in REFIT_NORMS.items()}
    ddi_x = s.pixels_train[0][:512]  # the first 512 training digits: the data-dependent initialization's batch
    if "mlp" in sections:
        q["mlp"] = {arm: stacked_classifier(lambda a=arm: make_mlp(a, ddi_x), s.many, **s.mlp_fit) for arm in MLP_ARMS}
    return q


def jobs_line(queued: Mapping[str, Mapping]) -> str:
    """``"11 for lstm, 25 for graphs, ... = 44 jobs queued"``: a job per graph seed, one per
    other arm (its seeds stacked)."""
    jobs = {section: sum(len(f) if section == "graphs" else 1 for f in runs.values()) for section, runs in queued.items()}
    return ", ".join(f"{n} for {section}" for section, n in jobs.items()) + f" = {sum(jobs.values())} jobs queued"


def learning_rates(s: Setup) -> str:
    """The one learning rate each experiment the chapter trains live trains with, as a line of
    text (section 5's MLP and LSTM: their grid in :data:`SWEEP_RATES`)."""
    rates = {"graphs": s.graph_fit["lr"], "ViT": s.vit_fit["lr"], "refitting": s.refit["lr"]}
    return "learning rates: " + ", ".join(f"{name} {lr:g}" for name, lr in rates.items())


def updates(histories: Sequence[object]) -> int:
    """The budget of a set of runs in optimizer updates: the length of their ``step_loss``
    (every run of the set must have made as many)."""
    if not histories or not all(hasattr(h, "step_loss") for h in histories):
        raise TypeError(f"histories must be a non-empty sequence of histories with a step_loss, got {describe(histories)}")
    counts = {len(h.step_loss) for h in histories}
    if len(counts) != 1:
        raise ValueError(f"histories must all have made the same number of updates, got {sorted(counts)}")
    return counts.pop()


def dqn_updates(steps: int, learning_starts: int, train_every: int, **_: object) -> int:
    """The optimizer updates each :func:`lnbook.rl.dqn` agent makes: one every ``train_every``
    environment steps from step ``learning_starts`` on (the count its loop makes)."""
    for name, value in (("steps", steps), ("learning_starts", learning_starts), ("train_every", train_every)):
        check_positive_int(value, name)
    return sum(1 for t in range(steps) if t + 1 >= learning_starts and (t + 1) % train_every == 0)


def budgets(s: Setup) -> dict[str, int]:
    """Each experiment's budget in optimizer updates per run, from its settings: epochs times
    batches per epoch (the last, smaller batch kept unless ``drop_last``); the plasticity test's
    updates per task. The chapter checks each against the runs."""
    if not isinstance(s, Setup):
        raise TypeError(f"s must be a Setup (beyond_study.setup()), got {describe(s)}")

    def per_epoch(fit: dict, n: int) -> int:
        return n // fit["batch_size"] if fit.get("drop_last") else -(-n // fit["batch_size"])

    return {"graphs": s.graph_fit["epochs"] * per_epoch(s.graph_fit, len(s.graph_train)),
            "ViT": s.vit_fit["epochs"] * per_epoch(s.vit_fit, len(s.images_train[0])),
            "plasticity (per task)": s.refit["steps"],
            "MLP": s.mlp_fit["epochs"] * per_epoch(s.mlp_fit, len(s.pixels_train[0])),
            "LSTM": s.lstm_fit["epochs"] * per_epoch(s.lstm_fit, len(s.steps_train[0]))}


def mean(values: Sequence[float], digits: int = 3) -> str:
    """The mean of per-seed ``values`` as text with ``digits`` decimals."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or len(v) == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence of numbers, got {describe(values)}")
    return f"{v.mean():.{digits}f}"


def vit_compare(acc: Mapping[tuple[int, str], Sequence[float]]) -> Comparisons:
    """One family: at each patch size, LayerNorm against no norm and BatchNorm against both,
    paired by seed. ``acc[(patch, norm name)]``: per-seed accuracies."""
    arms = {f"{name}, {p}×{p}": acc[p, name] for p in PATCHES for name in VIT_NORMS}
    pairs = [(f"{a}, {p}×{p}", f"{b}, {p}×{p}") for p in PATCHES
             for a, b in (("LayerNorm", "no norm"), ("BatchNorm", "LayerNorm"), ("BatchNorm", "no norm"))]
    return compare(arms, pairs=pairs)


def batch_mate_effect(model: nn.Module, x: torch.Tensor, images: int = 40, draws: int = 10,
                      mates: int = 7) -> tuple[float, int]:
    """Each of the first ``images`` of ``x (N, H, W)`` classified in ``draws`` batches with
    ``mates`` other random images of ``x``, in training mode (on a copy: no running statistic
    moves): the largest change of a logit across the draws, and how many images get more
    than one predicted class."""
    for name, value in (("images", images), ("draws", draws), ("mates", mates)):
        check_positive_int(value, name)
    if not isinstance(x, torch.Tensor) or x.ndim != 3 or len(x) <= max(images, mates):
        raise ValueError(f"x must be images (N, H, W) with N > images and N > mates, got {describe(x)}")
    model = copy.deepcopy(model).train()
    g = torch.Generator().manual_seed(0)
    largest, changed = 0.0, 0
    with torch.no_grad():
        for i in range(images):
            others = [j for j in torch.randperm(len(x), generator=g).tolist() if j != i]
            logits = torch.stack([model(x[[i, *others[k * mates : (k + 1) * mates]]])[0] for k in range(draws)])
            largest = max(largest, (logits.max(0).values - logits.min(0).values).max().item())
            changed += len(logits.argmax(1).unique()) > 1
    return largest, changed


def vit_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None) -> float:
    """Accuracy on ``(x (N, H, W), y (N,))`` with running statistics (``batch_size`` None: eval
    mode, as the model is served), or normalizing with the statistics of each batch of
    ``batch_size`` images, as in training (on a copy)."""
    if batch_size is not None:
        check_positive_int(batch_size, "batch_size")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"x and y must be tensors of one non-zero length, got {describe(x)} and {describe(y)}")
    model = copy.deepcopy(model).train(batch_size is not None)
    size = batch_size or len(x)
    with torch.no_grad():
        logits = torch.cat([model(x[i : i + size]) for i in range(0, len(x), size)])
    return (logits.argmax(1) == y).float().mean().item()


def said(result: Comparisons, a: str, b: str, name_a: str, name_b: str) -> str:
    """The verdict of the comparison of ``a`` with ``b`` in ``result``, with the names
    shortened: ``"BN beats LN (BN − LN +0.034 [+0.022, +0.046])"`` or ``"no difference measured
    (...)"``."""
    c = result[a, b]
    names: dict[Hashable, str] = {a: name_a, b: name_b}
    won = "no difference measured" if c.winner is None else f"{names[c.winner]} beats {names[c.loser]}"
    return f"{won} ({names[c.a]} − {names[c.b]} {c.interval})"


def dots_and_intervals(ax, groups: Mapping[str, Sequence[float]], xlabel: str, colors: Mapping[str, str] | None = None,
                       reference: float | None = None) -> None:
    """One row per group on ``ax``: each seed's value as a dot, the mean as a bar with its 95%
    t-interval (:func:`lnbook.utils.interval`), the first group on top; ``reference`` draws a
    dashed vertical line (a baseline)."""
    from .utils import interval

    if not isinstance(groups, Mapping) or not groups:
        raise ValueError(f"groups must map names to per-seed values, got {describe(groups)}")
    names = list(groups)
    for row, name in enumerate(names):
        v = np.asarray(groups[name], dtype=float)
        if v.ndim != 1 or len(v) < 2:
            raise ValueError(f"groups[{name!r}] must hold at least 2 per-seed values, got {describe(groups[name])}")
        y = len(names) - 1 - row
        color = (colors or {}).get(name, "C0")
        ax.plot(v, np.full(len(v), y) + np.linspace(-0.15, 0.15, len(v)), "o", ms=3, alpha=0.5, color=color)
        m, lo, hi = interval(v)
        ax.errorbar([m], [y], xerr=[[m - lo], [hi - m]], fmt="s", ms=5, color=color, capsize=3, lw=1.5)
    if reference is not None:
        ax.axvline(reference, color="0.5", ls="--", lw=1)
    ax.set_yticks(range(len(names)), names[::-1])
    ax.set(xlabel=xlabel)


NETS = {"mlp": "MLP", "lstm": "LSTM"}
SHARED_RATE = {"mlp": 0.1, "lstm": 0.01}  # the chapter's rate of each network: speed is read with every arm at it
# around each network's chapter rate (0.1; 0.01); the MLP's starts at 0.003 because at the long budget four arms
# chose 0.01, the lowest rate of a grid that began there
SWEEP_RATES = {"mlp": (0.003, 0.01, 0.03, 0.1, 0.3), "lstm": (1e-3, 3e-3, 1e-2, 3e-2, 0.1)}


def norm_sweep_data() -> dict[str, dict[str, tuple]]:
    """The data of the stored norm sweep: per network (``"mlp"``, ``"lstm"``) the ``"fit"`` and
    ``"val"`` parts of the training digits (:func:`lnbook.data.validation_split`) and the
    ``"test"`` digits; the MLP reads pixels ``(N, 64, 1)``, the LSTM 4 pixels a step ``(N, 16, 4)``."""
    train_set, test_set = data.digits_sequences("pixel")
    fit_set, val_set = data.validation_split(train_set)
    pixels = {"fit": fit_set, "val": val_set, "test": test_set}
    return {"mlp": pixels, "lstm": {k: data.as_steps(v, 4) for k, v in pixels.items()}}


def train_norm_arm(net: str, arm: str, lrs: Sequence[float], seed_list: Sequence[int], epochs: int,
                   sets: Mapping[str, tuple]) -> dict[str, np.ndarray]:
    """One arm of the stored norm sweep (``benchmarks/norm_sweep.py``): every rate of ``lrs`` x
    every seed of ``seed_list`` as one stacked model (member ``i``: rate ``lrs[i // S]``, seed
    ``seed_list[i % S]``, built after ``seed_everything(seed)``), trained for ``epochs`` on
    ``sets["fit"]`` as section 5 trains (MLP: SGD with momentum, LSTM: Adam, gradient norm
    clipped at 1; batches of 64). Returns, per member ``(R*S, ...)``: ``"val"`` and ``"test"``,
    the accuracy after each epoch ``(R*S, epochs)``; ``"loss"``, each epoch's mean training
    loss ``(R*S, epochs)``; ``"to_loss_1"``, the update at which the 10-update mean of the loss
    first fell below 1.0 (``nan``: never) ``(R*S,)``; ``"per_epoch"``, updates per epoch."""
    if net not in NETS:
        raise ValueError(f"net must be one of {tuple(NETS)}, got {describe(net)}")
    if arm not in (MLP_ARMS if net == "mlp" else LSTM_ARMS):
        raise ValueError(f"arm must be an arm of the {NETS[net]}, got {describe(arm)}")
    check_positive_int(epochs, "epochs")
    if not lrs or not seed_list:
        raise ValueError(f"lrs and seed_list must be non-empty, got {describe(lrs)} and {describe(seed_list)}")
    fit_set, val_set = sets["fit"], sets["val"]
    members = []
    for _ in lrs:
        for seed in seed_list:
            seed_everything(seed)
            members.append(make_mlp(arm, fit_set[0][:512]) if net == "mlp" else make_lstm(arm))
    model = seeds.stack(members)
    n, size = len(fit_set[-1]), 64
    generators = [torch.Generator().manual_seed(s) for s in list(seed_list) * len(lrs)]
    val_acc: list[np.ndarray] = []

    def order() -> list[torch.Tensor]:
        """The epoch's seeded mini-batches, drawn as ``seeds.fit`` draws them; before each epoch
        after the first, the validation accuracy the last one reached."""
        if epochs_started[0]:
            val_acc.append(seeds.accuracy(model, val_set))
        epochs_started[0] += 1
        return list(torch.stack([torch.randperm(n, generator=g) for g in generators]).split(size, dim=1))

    epochs_started = [0]
    hist = seeds.fit(model, fit_set, sets["test"], epochs=epochs, lr=[lr for lr in lrs for _ in seed_list],
                     batch_size=size, seeds=list(seed_list) * len(lrs), optimizer="sgd" if net == "mlp" else "adam",
                     grad_clip=None if net == "mlp" else 1.0, order=order)
    val_acc.append(seeds.accuracy(model, val_set))
    per_epoch = hist[0].steps_per_epoch
    reached_at = [train.updates_to(h) for h in hist]
    return {"val": np.stack(val_acc, 1), "test": np.array([h.test_acc for h in hist]),
            "loss": np.array([np.reshape(h.step_loss, (epochs, per_epoch)).mean(1) for h in hist]),
            "to_loss_1": np.array([np.nan if r is None else r for r in reached_at], dtype=float),
            "per_epoch": np.array(per_epoch)}


# section 5's questions: one table, and one Holm family, each (its comparisons in both networks, on both measures)
QUESTIONS = {
    "the gradients through the statistics (Xu et al.)": [("detach", "layer")],
    "the gain and bias (Xu et al.)": [("layer_simple", "layer"), ("adanorm", "layer"), ("adanorm", "layer_simple"),
                                      ("adanorm_c2", "layer"), ("adanorm_c2", "adanorm")],
    "LayerNorm against no norm": [("layer", "none")],
    "replacing LayerNorm": [("rms", "layer"), ("group4", "layer"), ("dyt", "layer")],
    "weight normalization and its initialization (Salimans and Kingma)": [("weight", "none"), ("weight_ddi", "none"),
                                                                          ("weight_ddi", "weight"), ("ddi", "none"),
                                                                          ("weight_ddi", "ddi")],
    "BatchNorm against the per-example norms": [("batch", n) for n in NORMS if n not in ("batch", "none")],
}
ABBR = {"none": "none", "batch": "BN", "layer": "LN", "layer_simple": "LN-simple", "group4": "GroupNorm", "weight": "WN",
        "rms": "RMSNorm", "dyt": "DyT", "detach": "DetachNorm", "adanorm": "AdaNorm", "adanorm_c2": "AdaNorm C=2",
        "weight_ddi": "WN+DDI", "ddi": "DDI"}  # each arm's short name, for tables narrow enough to read


@dataclass
class NormSweep:
    """The stored norm sweep of ``benchmarks/norm_sweep.py`` (:func:`stored_norm_sweep`), keyed by
    ``(net, arm, lr)``: ``loss``, ``val``, ``test``, per seed and epoch ``(S, epochs[net])``, the
    epoch's mean training loss and the validation and test accuracy after it; ``to_loss_1``,
    the update at which the 10-update mean loss first fell below 1.0, ``nan`` when never
    ``(S,)``. ``per_epoch[net]``: updates per epoch. Seeds ascending; ``provenance``: machine,
    commit, date, command, versions and setting."""

    provenance: list[str]
    seeds: list[int]
    arms: dict[str, list[str]]
    lrs: dict[str, list[float]]
    epochs: dict[str, int]
    per_epoch: dict[str, int]
    loss: dict[tuple[str, str, float], np.ndarray]
    val: dict[tuple[str, str, float], np.ndarray]
    test: dict[tuple[str, str, float], np.ndarray]
    to_loss_1: dict[tuple[str, str, float], np.ndarray]

    def epoch_near(self, net: str, updates: int) -> int:
        """The stored epoch whose budget in updates is nearest ``updates`` (the earlier on a tie)."""
        check_positive_int(updates, "updates")
        return min(range(1, self.epochs[net] + 1), key=lambda e: abs(e * self.per_epoch[net] - updates))

    def select(self, net: str, epoch: int) -> tuple[dict[str, float], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Each arm of ``net`` at its rate chosen on the mean validation accuracy after ``epoch``
        (:func:`lnbook.compare.select`): ``(rate, test accuracy (S,), updates to loss 1.0 (S,))``
        per arm, the updates counted up to ``epoch``'s budget (a run that never got there counts
        as the budget: a lower bound, in its favour)."""
        from .compare import select

        if net not in self.arms:
            raise ValueError(f"net must be one of {list(self.arms)}, got {describe(net)}")
        if not isinstance(epoch, int) or not 1 <= epoch <= self.epochs[net]:
            raise ValueError(f"epoch must be an int in 1..{self.epochs[net]}, got {describe(epoch)}")
        chosen = select({a: {lr: self.val[net, a, lr][:, epoch - 1] for lr in self.lrs[net]} for a in self.arms[net]},
                        lambda a, lr: self.test[net, a, lr][:, epoch - 1])
        budget = epoch * self.per_epoch[net]
        reached = {a: np.nan_to_num(self.to_loss_1[net, a, lr], nan=budget).clip(max=budget)
                   for a, lr in chosen.setting.items()}
        return dict(chosen.setting), chosen.test, reached

    def reached(self, net: str, lr: float, epoch: int) -> dict[str, np.ndarray]:
        """Every arm of ``net`` at one rate ``lr`` of the grid (not the rate chosen for accuracy):
        the update at which its 10-update mean loss first fell below 1.0, per seed ``(S,)``,
        counted up to ``epoch``'s budget (a run that never got there counts as the budget)."""
        if net not in self.arms:
            raise ValueError(f"net must be one of {list(self.arms)}, got {describe(net)}")
        if lr not in self.lrs[net]:
            raise ValueError(f"lr must be one of {self.lrs[net]}, got {describe(lr)}")
        if not isinstance(epoch, int) or not 1 <= epoch <= self.epochs[net]:
            raise ValueError(f"epoch must be an int in 1..{self.epochs[net]}, got {describe(epoch)}")
        budget = epoch * self.per_epoch[net]
        return {a: np.nan_to_num(self.to_loss_1[net, a, lr], nan=budget).clip(max=budget) for a in self.arms[net]}

    def at_edge(self, net: str, epoch: int) -> list[str]:
        """The arms of ``net`` whose rate chosen after ``epoch`` is the lowest or highest of the grid."""
        return at_grid_edge(self.select(net, epoch)[0], self.lrs[net])


def stored_norm_sweep(folder: str | Path | None = None) -> NormSweep:
    """The norm sweep that chapter 09 cannot afford to train, read from the files
    ``benchmarks/norm_sweep.py`` wrote into ``lnbook/results/`` (installed with the package;
    ``folder``: another folder the script wrote into), checked for completeness: every arm of
    each network at every rate holds every seed and epoch."""
    from importlib import resources

    from .batchnorm_study import per_seed
    from .utils import stored_rows

    if folder is not None and not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be a path or None, got {describe(folder)}")
    where = resources.files("lnbook") / "results" if folder is None else Path(folder)
    provenance, final_rows = stored_rows(where, "norm_sweep-final.csv", ["net", "arm", "lr", "seed", "to_loss_1"], "norm_sweep.py")
    seed_list, final = per_seed(final_rows, lambda r: (r["net"], r["arm"], float(r["lr"])), "norm sweep")
    arms = {n: list(dict.fromkeys(k[1] for k in final if k[0] == n)) for n in dict.fromkeys(k[0] for k in final)}
    lrs = {n: sorted({k[2] for k in final if k[0] == n}) for n in arms}
    if set(final) != {(n, a, lr) for n in arms for a in arms[n] for lr in lrs[n]}:
        raise ValueError("the stored norm sweep does not hold every arm at every rate")
    rows: dict[tuple[str, str, float], dict[int, list[dict[str, str]]]] = {}
    curve_columns = ["net", "arm", "lr", "seed", "epoch", "updates", "train_loss", "val_acc", "test_acc"]
    for r in stored_rows(where, "norm_sweep-curves.csv", curve_columns, "norm_sweep.py")[1]:
        rows.setdefault((r["net"], r["arm"], float(r["lr"])), {}).setdefault(int(r["seed"]), []).append(r)
    epochs = {n: max(len(rows.get((n, arms[n][0], lrs[n][0]), {}).get(seed_list[0], [])), 1) for n in arms}
    if set(rows) != set(final):
        raise ValueError("the stored norm sweep's curves do not hold every arm at every rate")
    for key, by_seed in rows.items():
        if sorted(by_seed) != seed_list or any([int(r["epoch"]) for r in by_seed[s]] != list(range(1, epochs[key[0]] + 1))
                                               for s in seed_list):
            raise ValueError(f"the stored norm sweep's curves for {key} do not hold every seed and epoch")

    def column(name: str) -> dict[tuple[str, str, float], np.ndarray]:
        return {k: np.array([[float(r[name]) for r in by_seed[s]] for s in seed_list]) for k, by_seed in rows.items()}

    first = {n: rows[n, arms[n][0], lrs[n][0]][seed_list[0]][0] for n in arms}
    return NormSweep(provenance=provenance, seeds=seed_list, arms=arms, lrs=lrs, epochs=epochs,
                     per_epoch={n: int(r["updates"]) for n, r in first.items()},
                     loss=column("train_loss"), val=column("val_acc"), test=column("test_acc"),
                     to_loss_1={k: np.array([float(g[s]["to_loss_1"] or "nan") for s in seed_list]) for k, g in final.items()})


def norm_family(pairs: Sequence[tuple[str, str]], values: Mapping[tuple[str, str], Sequence[float]], higher: bool,
                digits: int) -> Comparisons:
    """One family of section 5: each pair ``(arm a, arm b)`` in each network that ran both
    (``values[(net, arm)]``: per-seed results; the data-dependent initialization: the MLP only),
    paired by seed, named ``"LayerNorm (MLP)"`` and so on."""
    keys = [(kind, net, a, b) for kind, net in NETS.items() for a, b in pairs if (kind, a) in values and (kind, b) in values]
    if not keys:
        raise ValueError(f"values must hold both arms of a pair in some network, got {describe(values)}")
    arms = {f"{ARMS[n]} ({net})": values[kind, n] for kind, net, a, b in keys for n in (a, b)}
    return compare(arms, pairs=[(f"{ARMS[a]} ({net})", f"{ARMS[b]} ({net})") for _, net, a, b in keys],
                   higher=higher, digits=digits)


def cell(c: object) -> list[str]:
    """A comparison of section 5 as three table cells: its difference [95% CI], Holm's p and the
    verdict in the arms' short names (:data:`ABBR`, no network): ``"BN beats LN"``."""
    if not all(hasattr(c, k) for k in ("interval", "p_holm", "winner", "a", "b")):
        raise TypeError(f"c must be a Comparison, got {describe(c)}")
    p = "<0.001" if c.p_holm < 0.001 else f"{c.p_holm:.3f}"
    short = {label: ABBR[arm] for arm, label in ARMS.items()}

    def name(label: str) -> str:
        return short[label.rsplit(" (", 1)[0]]

    won = "no difference measured" if c.winner is None else f"{name(c.winner)} beats {name(c.b if c.winner == c.a else c.a)}"
    return [c.interval, p, won]


def norm_questions(final: Mapping[tuple[str, str], Sequence[float]]) -> dict[str, Comparisons]:
    """Section 5's accuracy verdicts, one Holm family per question of :data:`QUESTIONS` over
    both networks (``final[(net, arm)]``: per-seed test accuracy, higher is better), each
    readable as ``result[question]["accuracy"]`` (:func:`lnbook.compare.by_measure`)."""
    return {q: by_measure({"accuracy": norm_family(pairs, final, True, 3)}) for q, pairs in QUESTIONS.items()}


def norm_speed(reached: Mapping[tuple[str, str], Sequence[float]]) -> Comparisons:
    """Section 5's speed comparisons, the pairs of every question of :data:`QUESTIONS` in both
    networks as one Holm family of their own (``reached[(net, arm)]``: per-seed updates to loss
    1.0 with every arm at one shared rate, :meth:`NormSweep.reached`; lower is better), read as
    ``result[question][pair]``."""
    return by_measure({q: norm_family(pairs, reached, False, 1) for q, pairs in QUESTIONS.items()})


def question_table(table: Comparisons, question: str, final: Mapping[tuple[str, str], Sequence[float]],
                   speed: Comparisons) -> Table:
    """One question's rows: comparison (short names, :data:`ABBR`), network, then the test
    accuracy's difference [95% CI], Holm's p and verdict from :func:`norm_questions`' ``table``,
    then the same for updates to loss 1.0 at the shared rate from :func:`norm_speed`'s ``speed``
    (its own family)."""
    rows = []
    for a, b in QUESTIONS[question]:
        for kind, net in NETS.items():
            if (kind, a) in final and (kind, b) in final:
                key = (f"{ARMS[a]} ({net})", f"{ARMS[b]} ({net})")
                rows.append([f"{ABBR[a]} − {ABBR[b]}", net, *cell(table["accuracy"][key]), *cell(speed[question][key])])
    return Table(["comparison", "net", "acc.: a − b [95% CI]", "p (Holm)", "verdict", "updates, shared rate [95% CI]",
                  "p (Holm)", "verdict"], rows)


def net_verdicts(tables: Mapping[str, Comparisons], net: str) -> str:
    """Section 6's verdicts for one network (``"MLP"`` or ``"LSTM"``) from :func:`norm_questions`'
    accuracy tables: BatchNorm against LayerNorm, LayerNorm against no norm, and DetachNorm and
    RMSNorm against LayerNorm."""
    if net not in NETS.values():
        raise ValueError(f"net must be one of {list(NETS.values())}, got {describe(net)}")
    quoted = [("BatchNorm against the per-example norms", "batch", "layer"), ("LayerNorm against no norm", "layer", "none"),
              ("the gradients through the statistics (Xu et al.)", "detach", "layer"), ("replacing LayerNorm", "rms", "layer")]
    return "; ".join(said(tables[q]["accuracy"], f"{ARMS[a]} ({net})", f"{ARMS[b]} ({net})", ABBR[a], ABBR[b])
                     for q, a, b in quoted)


def active_units(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """For each member of a stacked MLP (``models.MLP`` through :func:`lnbook.seeds.stack`) and
    each hidden layer, the smallest number of active ReLU units over the inputs ``x (N, D)``:
    ``(members, layers)``."""
    s = seeds.members(model)
    if s is None or not hasattr(model, "net"):
        raise TypeError(f"model must be a stacked models.MLP, got {describe(model)}")
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"x must be a tensor (N, D), got {describe(x)}")
    smallest, h = [], x.expand(s, *x.shape)
    with torch.no_grad():
        for layer in model.net[:-1]:
            h = layer(h)
            if isinstance(layer, nn.ReLU):
                smallest.append((h > 0).sum(-1).min(-1).values)  # (members,): the fewest active units on any input
    return torch.stack(smallest, 1)


def changed_verdicts(short: Mapping[str, Comparisons], long: Mapping[str, Comparisons],
                     final: Mapping[tuple[str, str], Sequence[float]]) -> list[list[str]]:
    """The comparisons of section 5 whose accuracy verdict differs between two budgets' tables
    of :func:`norm_questions` (``final``: the arms that ran, ``(net, arm)``), as rows: the
    comparison with its network, then each budget's verdict and difference [95% CI]."""
    rows = []
    for q, pairs in QUESTIONS.items():
        for a, b in pairs:
            for net, name in NETS.items():
                if (net, a) not in final or (net, b) not in final:
                    continue
                key = (f"{ARMS[a]} ({name})", f"{ARMS[b]} ({name})")
                cs = [tables[q]["accuracy"][key] for tables in (short, long)]
                if cs[0].winner != cs[1].winner:
                    rows.append([f"{ABBR[a]} − {ABBR[b]} ({name})", *(f"{cell(c)[2]}, {c.interval}" for c in cs)])
    return rows


def epochs_to(curves: np.ndarray, level: float) -> np.ndarray:
    """Per run, the first epoch whose mean training loss is below ``level``, from ``curves (S,
    epochs)``; a run that never gets there counts as its number of epochs (a lower bound, in
    its favour): ``(S,)``, how fast each run fits, counted in epochs."""
    c = np.asarray(curves, dtype=float)
    if c.ndim != 2 or c.shape[1] == 0:
        raise ValueError(f"curves must be a (runs, epochs) array, got {describe(curves)}")
    if not isinstance(level, (int, float)) or isinstance(level, bool) or not level > 0:
        raise ValueError(f"level must be a positive number, got {describe(level)}")
    below = c < level
    return np.where(below.any(1), below.argmax(1) + 1, c.shape[1]).astype(float)


def learned_alpha(model: nn.Module) -> list[float]:
    """The mean over features of each GraphNorm layer's learned mean scale alpha (PyG's
    ``mean_scale``) in ``model`` (a :class:`lnbook.graphs.GraphNet` with GraphNorm), one per layer."""
    from torch_geometric.nn import GraphNorm

    found = [m.mean_scale.mean().item() for m in model.modules() if isinstance(m, GraphNorm)]
    if not found:
        raise ValueError(f"model must hold GraphNorm layers, got {describe(model)}")
    return found


def at_grid_edge(setting: Mapping[str, float], grid: Sequence[float]) -> list[str]:
    """The arms of a selection (``setting``: arm -> the rate chosen on validation,
    :class:`lnbook.compare.Selection`'s) whose rate is the lowest or the highest of ``grid``:
    the grid may not bracket their best rate."""
    if not grid or not isinstance(setting, Mapping):
        raise ValueError(f"setting must map arms to rates and grid hold the rates, got {describe(setting)} and {describe(grid)}")
    return [a for a, lr in setting.items() if lr in (min(grid), max(grid))]


def named_table(selection: object, names: Mapping[str, str], validation: str, test: str, scale: float = 1.0,
                digits: int = 3) -> Table:
    """A :class:`lnbook.compare.Selection` as a table in the chapter's names (``names``: package
    key -> name): arm, the rate chosen on validation, the mean validation result divided by
    ``scale`` (headed ``validation``, which names its unit) and the test result at that rate
    [95% CI] (headed ``test``)."""
    if not all(hasattr(selection, k) for k in ("setting", "validation", "test")):
        raise TypeError(f"selection must be a compare.Selection, got {describe(selection)}")
    if not isinstance(names, Mapping) or set(selection.setting) - set(names):
        raise ValueError(f"names must name every arm of the selection, got {describe(names)}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
        raise ValueError(f"scale must be a positive number, got {describe(scale)}")
    return Table(["arm", "rate chosen on validation", validation, test],
                 [[names[a], f"{lr:g}", f"{selection.validation[a] / scale:.{digits}f}", ci(selection.test[a], digits)]
                  for a, lr in selection.setting.items()])


def span(values: Sequence[float], digits: int = 3) -> str:
    """The mean of a non-negative per-seed quantity with the smallest and largest seed's value,
    ``"mean [min, max]"`` (a t-interval there could reach below 0)."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0 or not np.isfinite(v).all():
        raise ValueError(f"values must be a non-empty 1-d sequence of finite numbers, got {describe(values)}")
    return f"{v.mean():.{digits}f} [{v.min():.{digits}f}, {v.max():.{digits}f}]"


def q_check(model: nn.Module, states: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """For stacked Q-networks (:func:`lnbook.rl.stream_agents`, ``A`` agents) on the same
    ``states (N, obs)``: the largest |Q| of each agent over the states and actions ``(A,)``,
    and the share of the states on which the agent's greedy action is its most frequent one
    ``(A,)`` (1: the policy has collapsed onto one action)."""
    s = seeds.members(model)
    if s is None:
        raise TypeError(f"model must be stacked Q-networks (rl.stream_agents), got {describe(model)}")
    if not isinstance(states, torch.Tensor) or states.ndim != 2:
        raise ValueError(f"states must be a tensor (N, obs), got {describe(states)}")
    with torch.no_grad():
        q = model(states.expand(s, *states.shape))  # (A, N, actions)
    greedy = q.argmax(-1)  # (A, N)
    share = np.array([np.bincount(g.numpy(), minlength=q.shape[-1]).max() / len(g) for g in greedy])
    return q.abs().amax((1, 2)).numpy(), share
