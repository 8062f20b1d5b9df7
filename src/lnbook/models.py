"""The multilayer perceptron that chapters 01, 02 and 09 train, with its normalization as a setting,
and many seeds of it (or of an LSTM classifier) trained as one model.

Norms are named as in :data:`lnbook.norms.NORMS`: ``"none"``; ``"batch"``
(:class:`~lnbook.norms.MaskedBatchNorm1d`); ``"weight"`` (weight normalization of the layers
that feed the norm, and no norm layer); and every norm over one example's features
(:data:`~lnbook.norms.EXAMPLE_NORMS`: ``"layer"``, ``"layer_simple"`` (without gain and bias),
``"group4"`` with 4 groups of consecutive features, ``"rms"``, ``"dyt"``, ``"detach"``,
``"adanorm"``). ``"instance"`` is refused, with the reason. Chapter 02's recurrent networks
are :class:`lnbook.ensemble.EnsembleRNN`.

:class:`StackedMLP` and :class:`StackedLSTM` put ``S`` such models (one per seed) side by side
with a leading member axis, for every norm, and :func:`fit_stacked` trains them at once.

:func:`layer_stats` looks inside an MLP: per Linear layer, the statistics of its output and the
norm of its weight gradient, from one training-mode pass.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from ._checks import check_choice, check_number, check_positive_int, describe
from .norms import EXAMPLE_NORMS, DetachNorm, GroupNorm, RMSNorm, check_norm, norm_layer
from .pickling import PicklesWithParametrizations
from .rnn import LSTMCell
from .train import OPTIMIZERS, History, clip_member_grads


class MLP(PicklesWithParametrizations, nn.Module):
    """Flatten, then ``[Linear -> norm -> ReLU] * len(hidden) -> Linear``.

    Input ``(B, ...)`` with ``in_features`` numbers per example; output logits ``(B, n_classes)``.
    ``norm``: ``"none"``, ``"batch"`` (BatchNorm over the batch), or a norm over an example's
    features (``"layer"``, ``"group4"``, ``"rms"``, ``"dyt"``, ``"detach"``, ``"adanorm"``, and
    any added to :data:`lnbook.norms.NORMS`); ``"weight"``: no norm layer, the hidden Linear
    layers weight-normalized (``torch.nn.utils.parametrizations.weight_norm``, one gain per
    output feature, initialized to leave the layer unchanged), the output layer not.
    """

    NORMS = ("none", "batch", "weight", *EXAMPLE_NORMS)

    def __init__(self, in_features: int, hidden: tuple[int, ...], n_classes: int, norm: str = "none") -> None:
        super().__init__()
        self.norm = check_norm(norm, self.NORMS)
        self.init_args = ((in_features, hidden, n_classes, norm), {})
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers.append(nn.Linear(width, h))
            if self.norm == "weight":
                nn.utils.parametrizations.weight_norm(layers[-1])
            elif self.norm != "none":
                layers.append(norm_layer(self.norm, h))
            layers.append(nn.ReLU())
            width = h
        layers.append(nn.Linear(width, n_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mlp_layers(model: MLP) -> tuple[list[nn.Linear], list[nn.Module | None]]:
    """The Linear layers of an MLP and, for each hidden one, its norm module (None: no norm)."""
    linears, norms = [], []
    for module in model.net:
        if isinstance(module, nn.Linear):
            linears.append(module)
            norms.append(None)
        elif not isinstance(module, (nn.ReLU, nn.Flatten)):
            norms[-1] = module
    return linears, norms[:-1]


def layer_stats(model: MLP, x: torch.Tensor, y: torch.Tensor) -> dict[str, np.ndarray]:
    """One training-mode forward and backward pass of ``model`` on ``x (B, in_features)`` with
    labels ``y (B,)`` and the cross-entropy loss, on a copy (the model's running statistics
    and gradients are left as they were).

    Returns arrays of shape ``(L,)``, one entry per Linear layer (the hidden ones, then the
    output layer): ``"mean"`` and ``"std"`` of that layer's output over the batch and its
    features (the pre-activations, before any norm), and ``"grad"``, the Frobenius norm of
    the gradient of the loss with respect to its weight matrix.
    """
    if not isinstance(model, MLP):
        raise TypeError(f"model must be an lnbook.models.MLP, got {type(model).__name__}")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or len(x) != len(y) or len(x) < 2:
        raise ValueError(f"x and y must be tensors with the same first dimension >= 2, got {describe(x)} and {describe(y)}")
    probe = copy.deepcopy(model).train()
    linears, _ = mlp_layers(probe)
    outputs = []
    hooks = [lin.register_forward_hook(lambda m, i, out: outputs.append(out.detach())) for lin in linears]
    try:
        nn.functional.cross_entropy(probe(x), y).backward()
    finally:
        for h in hooks:
            h.remove()
    return {
        "mean": np.array([o.mean().item() for o in outputs]),
        "std": np.array([o.std(unbiased=False).item() for o in outputs]),
        "grad": np.array([lin.weight.grad.norm().item() for lin in linears]),
    }


# Many seeds as one model: chapter 09's nine norms, ten seeds each, at the cost of about one.
# The pattern of lnbook.ensemble (a leading member axis on every weight, one loss summed over
# the members), for every norm of the table: each member's norm keeps its own gain, bias and
# (BatchNorm) batch and running statistics, and the normalization itself is the package's.


def _stack(tensors: Sequence[torch.Tensor], shape: tuple[int, ...] | None = None) -> nn.Parameter:
    """One parameter ``(S, *shape)`` from the members' tensors (copied)."""
    stacked = torch.stack([t.detach() for t in tensors]).clone()
    return nn.Parameter(stacked if shape is None else stacked.reshape(len(tensors), *shape))


class StackedNorm(nn.Module):
    """The norm layers of ``S`` member models side by side: ``a (S, B, F)`` -> the same, member
    ``s``'s slice normalized as its own module ``modules[s]`` would (parameters copied from it).

    ``kind`` is the table name (:data:`lnbook.norms.NORMS`). The norms over an example's
    features use the package's module without gain and bias (the normalization itself), then
    each member's gain and bias; ``"dyt"`` each member's ``alpha``; ``"batch"`` normalizes
    each member with the mean and biased variance of its own batch (dim 1) in training, moving
    its own running statistics (unbiased, ``momentum``), and with them in eval; ``steps > 1``
    keeps statistics per time step ``t`` (:class:`lnbook.norms.TimeStepBatchNorm`).
    ``"none"`` and ``"weight"`` pass ``a`` through.
    """

    def __init__(self, kind: str, modules: Sequence[nn.Module], size: int, steps: int = 1) -> None:
        super().__init__()
        self.kind, s = kind, len(modules)
        first = modules[0]
        if kind in ("none", "weight"):
            return
        self.eps = getattr(first, "eps", 1e-5)
        cores = {
            "layer": lambda: norm_layer("layer_simple", size, native=True),
            "layer_simple": lambda: norm_layer("layer_simple", size, native=True),
            "group4": lambda: GroupNorm(first.num_groups, size, eps=first.eps, affine=False),
            "rms": lambda: RMSNorm(size, eps=first.eps, elementwise_affine=False),
            "detach": lambda: DetachNorm(size, eps=first.eps, elementwise_affine=False),
            "adanorm": lambda: copy.deepcopy(first),
        }
        self.core = cores[kind]() if kind in cores else None
        if kind == "dyt":
            self.alpha = _stack([m.alpha for m in modules], (1, 1))
        if kind == "batch":
            self.momentum = first.momentum
            shape = (steps, size)
            self.register_buffer("running_mean", torch.stack([m.running_mean.reshape(shape) for m in modules]).clone())
            self.register_buffer("running_var", torch.stack([m.running_var.reshape(shape) for m in modules]).clone())
        self.weight = _stack([m.weight for m in modules], (1, size)) if getattr(first, "weight", None) is not None else None
        self.bias = _stack([m.bias for m in modules], (1, size)) if getattr(first, "bias", None) is not None else None

    def forward(self, a: torch.Tensor, t: int = 0) -> torch.Tensor:
        if self.kind in ("none", "weight"):
            return a
        if self.kind == "dyt":
            y = torch.tanh(self.alpha * a)
        elif self.kind == "batch":
            step = min(t, self.running_mean.shape[1] - 1)
            if self.training:
                var, mean = torch.var_mean(a, dim=1, correction=0, keepdim=True)
                n = a.shape[1]
                with torch.no_grad():
                    self.running_mean[:, step : step + 1].lerp_(mean, self.momentum)
                    self.running_var[:, step : step + 1].lerp_(var * n / (n - 1), self.momentum)
            else:
                mean, var = self.running_mean[:, step : step + 1], self.running_var[:, step : step + 1]
            y = (a - mean) * torch.rsqrt(var + self.eps)
        else:
            y = self.core(a)
        if self.weight is not None:
            y = y * self.weight
        return y if self.bias is None else y + self.bias


class _StackedLinear(nn.Module):
    """The Linear maps ``h (S, B, in) -> (S, B, out)`` of ``S`` members: ``linears[s]`` for member
    ``s``, weight-normalized (``w = g v / ||v||`` per output row) when the members' are. With
    ``bias=False`` the members' biases are left out (a cell adds its own)."""

    def __init__(self, weights: Sequence[nn.Module | torch.Tensor], biases: Sequence[torch.Tensor] | None,
                 weight_norm: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        super().__init__()
        if weight_norm is not None:
            self.g = _stack([g for g, _ in weight_norm])
            self.v = _stack([v for _, v in weight_norm])
        else:
            self.w = _stack(weights)
        self.b = _stack([b[None] for b in biases]) if biases is not None else None

    def weight(self) -> torch.Tensor:
        """``(S, out, in)``."""
        if hasattr(self, "v"):
            return self.g * self.v / self.v.norm(dim=2, keepdim=True)
        return self.w

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        w = self.weight().transpose(1, 2)
        return torch.bmm(h, w) if self.b is None else torch.baddbmm(self.b, h, w)


def _linear(linears: Sequence[nn.Linear], bias: bool = True, name: str = "weight") -> _StackedLinear:
    """Stack the members' Linear layers (or the tensor ``name`` of cells), weight norm included."""
    parametrized = parametrize.is_parametrized(linears[0], name)
    pairs = [(getattr(m.parametrizations, name).original0, getattr(m.parametrizations, name).original1)
             for m in linears] if parametrized else None
    weights = None if parametrized else [getattr(m, name) for m in linears]
    return _StackedLinear(weights, [m.bias for m in linears] if bias else None, pairs)


class StackedMLP(nn.Module):
    """``S`` copies of :class:`MLP` with any norm of its table, run side by side, each with its
    own weights, norm parameters and statistics, copied from ``mlps`` (built with the same
    constructor arguments, typically one per seed). Input ``x (S, B, in_features)`` (member
    ``s`` sees ``x[s]``) or ``(B, in_features)`` (every member sees it); logits ``(S, B, n_classes)``.
    Member ``s`` computes what ``mlps[s]`` computes (up to rounding); train it with :func:`fit_stacked`."""

    def __init__(self, mlps: Sequence[MLP]) -> None:
        super().__init__()
        if not isinstance(mlps, Sequence) or not mlps or not all(isinstance(m, MLP) for m in mlps):
            raise TypeError("mlps must be a non-empty sequence of lnbook.models.MLP")
        if any(m.init_args != mlps[0].init_args for m in mlps):
            raise ValueError("mlps must all have the same constructor arguments")
        self.norm, self.init_args = mlps[0].norm, mlps[0].init_args
        layers = [mlp_layers(m) for m in mlps]
        depth = len(layers[0][0])
        self.linears = nn.ModuleList(_linear([ls[0][i] for ls in layers]) for i in range(depth))
        self.norms = nn.ModuleList(
            StackedNorm(self.norm, [ls[1][i] for ls in layers] if self.norm not in ("none", "weight") else [None] * len(mlps),
                        layers[0][0][i].out_features)
            for i in range(depth - 1))

    @property
    def members(self) -> int:
        return self.linears[0].b.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(2) if x.ndim >= 3 and x.shape[0] == self.members else x.flatten(1).expand(self.members, -1, -1)
        for linear, norm in zip(self.linears, self.norms):
            h = torch.relu(norm(linear(h)))
        return self.linears[-1](h)


class StackedLSTM(nn.Module):
    """``S`` copies of an LSTM classifier (:class:`lnbook.rnn.SequenceClassifier` around an
    :class:`lnbook.rnn.LSTMCell`, any norm of its table, in its three places), run side by side
    on full-length sequences: ``x (S, B, T, F)`` or ``(B, T, F)`` -> logits ``(S, B, n_classes)``.
    Parameters copied from ``classifiers``; member ``s`` computes what ``classifiers[s]`` computes."""

    def __init__(self, classifiers: Sequence[nn.Module]) -> None:
        super().__init__()
        cells = [c.cell for c in classifiers]
        if not all(isinstance(c, LSTMCell) for c in cells) or any(c.init_args != cells[0].init_args for c in cells):
            raise ValueError("classifiers must be SequenceClassifiers around LSTMCells with the same constructor arguments")
        first, self.norm = cells[0], cells[0].norm
        steps = first.init_args[1]["max_steps"] or 1
        kind = "none" if self.norm == "weight" else self.norm
        self.w_ih = _linear(cells, bias=False, name="weight_ih")
        self.w_hh = _linear(cells, bias=False, name="weight_hh")
        self.bias_ih = _stack([c.bias_ih for c in cells], (1, 4 * first.hidden_size))
        self.bias_hh = _stack([c.bias_hh for c in cells], (1, 4 * first.hidden_size))
        for place, size in (("norm_ih", 4 * first.hidden_size), ("norm_hh", 4 * first.hidden_size), ("norm_c", first.hidden_size)):
            on = not isinstance(getattr(first, place), nn.Identity)
            setattr(self, place, StackedNorm(kind if on else "none", [getattr(c, place) for c in cells], size, steps))
        self.head = _linear([c.head for c in classifiers])

    @property
    def members(self) -> int:
        return self.bias_ih.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 3:
            x = x.expand(self.members, *x.shape)
        s, b, steps, _ = x.shape
        h = x.new_zeros(s, b, self.bias_ih.shape[-1] // 4)
        c = h
        w_ih, w_hh = self.w_ih.weight().transpose(1, 2), self.w_hh.weight().transpose(1, 2)
        for t in range(steps):
            gates = self.norm_ih(torch.bmm(x[:, :, t], w_ih), t) + self.norm_hh(torch.bmm(h, w_hh), t) + self.bias_ih + self.bias_hh
            i, f, g, o = gates.chunk(4, dim=2)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(self.norm_c(c, t))
        return self.head(h)


def fit_stacked(
    model: StackedMLP | StackedLSTM,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seeds: Sequence[int],
    optimizer: str = "adam",
    grad_clip: float | None = None,
) -> list:
    """Train every member with cross-entropy, as :func:`lnbook.train.fit` trains one model with
    ``seed=seeds[s]`` (the same order of mini-batches: a ``torch.randperm`` per epoch from a
    generator seeded with it; the last mini-batch may be smaller; ``"adam"``, or ``"sgd"`` with
    momentum 0.9; ``grad_clip`` bounds each member's own gradient norm). Returns one
    :class:`lnbook.train.History` per member; ``wall_time`` is that of the whole stack.
    ``train``, ``test``: ``(x (N, ...), y (N,))``, the same data for every member."""
    if not isinstance(model, (StackedMLP, StackedLSTM)):
        raise TypeError(f"model must be a StackedMLP or a StackedLSTM, got {type(model).__name__}")
    check_positive_int(epochs, "epochs")
    check_positive_int(batch_size, "batch_size")
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_choice(optimizer, OPTIMIZERS, "optimizer")
    members = model.members
    if len(seeds) != members:
        raise ValueError(f"seeds must have one entry per member ({members}), got {len(seeds)}")
    params = list(model.parameters())
    device = params[0].device
    opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr, momentum=0.9)
    x, y = train[0].to(device), train[1].to(device)
    n = len(y)
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    histories = [History(steps_per_epoch=-(-n // batch_size)) for _ in range(members)]
    elapsed = 0.0
    model.train()
    for _ in range(epochs):
        start = time.perf_counter()
        order = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(device)  # (S, n)
        correct = torch.zeros(members, device=device)
        for idx in order.split(batch_size, dim=1):
            logits, targets = model(x[idx]), y[idx]  # (S, b, classes), (S, b)
            losses = nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(1)
            opt.zero_grad(set_to_none=True)
            losses.sum().backward()
            if grad_clip is not None:
                clip_member_grads(params, grad_clip)
            opt.step()
            for h, loss in zip(histories, losses.tolist()):
                h.step_loss.append(loss)
            correct += (logits.argmax(-1) == targets).sum(1)
        elapsed += time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            test_acc = (model(test[0].to(device)).argmax(-1) == test[1].to(device)).double().mean(1).tolist()
        model.train()
        for s, h in enumerate(histories):
            h.wall_time.append(elapsed)
            h.train_acc.append(correct[s].item() / n)
            h.test_acc.append(test_acc[s])
    return histories
