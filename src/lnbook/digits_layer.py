"""One LayerNorm layer on the 8x8 digits, ``softmax(V norm(W x))``, trained by SGD on ``W`` alone,
with many models (seeds, batch orders, learning rates) run as one batched tensor; and the split
of the detached gradient's error into the parts the model can and cannot see.

Shapes: pixels ``X`` ``(N, 64)``, labels ``y`` ``(N,)``; weights ``W`` ``(R, H, 64)`` and the
fixed read-out ``V`` ``(R, 10, H)``, one model per leading index ``r``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import check_positive_int

Norm = Callable[[torch.Tensor], torch.Tensor]


def _check_models(W: torch.Tensor, V: torch.Tensor) -> None:
    if not isinstance(W, torch.Tensor) or W.dim() != 3:
        raise ValueError(f"W must be a tensor of shape (R, H, 64), got {getattr(W, 'shape', type(W).__name__)}")
    if not isinstance(V, torch.Tensor) or V.dim() != 3 or V.shape[0] != W.shape[0] or V.shape[2] != W.shape[1]:
        raise ValueError(f"V must be a tensor of shape (R, 10, H) matching W {tuple(W.shape)}, "
                         f"got {getattr(V, 'shape', type(V).__name__)}")


def init_layers(seeds: list[int], hidden: int = 32, inputs: int = 64, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh float64 weights, one model per seed: ``W`` ``(R, hidden, inputs)`` with entries of
    standard deviation 1/8, and ``V`` ``(R, classes, hidden)`` with 1/6."""
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    for name, value in (("hidden", hidden), ("inputs", inputs), ("classes", classes)):
        check_positive_int(value, name)
    Ws, Vs = [], []
    for seed in seeds:
        gen = torch.Generator().manual_seed(int(seed))
        Ws.append(torch.randn(hidden, inputs, generator=gen, dtype=torch.float64) / 8)
        Vs.append(torch.randn(classes, hidden, generator=gen, dtype=torch.float64) / 6)
    return torch.stack(Ws), torch.stack(Vs)


def batch_indices(step: int, orders: int, n: int, batch: int = 64, offset: int = 0) -> torch.Tensor:
    """``(orders, batch)``: minibatch ``step`` of each batch order, drawn with replacement from
    ``range(n)``; order ``o`` is seeded by ``10_000 * (o + offset) + step``, so every arm sees
    the same batches."""
    for name, value in (("orders", orders), ("n", n), ("batch", batch)):
        check_positive_int(value, name)
    return torch.stack([torch.randint(0, n, (batch,), generator=torch.Generator().manual_seed(10_000 * (o + offset) + step))
                        for o in range(orders)])


def layer_loss(W: torch.Tensor, V: torch.Tensor, X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Mean cross-entropy of ``softmax(V norm(W x))`` per model over its examples ``idx``
    ``(R, B)``: returns ``(R,)``."""
    _check_models(W, V)
    if idx.shape[0] != W.shape[0]:
        raise ValueError(f"idx must have one row per model ({W.shape[0]}), got shape {tuple(idx.shape)}")
    logits = norm(X[idx] @ W.transpose(1, 2)) @ V.transpose(1, 2)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y[idx].flatten(), reduction="none").view(len(W), -1).mean(1)


def full_loss(W: torch.Tensor, V: torch.Tensor, X: torch.Tensor, y: torch.Tensor, norm: Norm) -> torch.Tensor:
    """``(R,)``: each model's mean cross-entropy over all of ``X``."""
    with torch.no_grad():
        return layer_loss(W, V, X, y, torch.arange(len(X)).expand(len(W), -1), norm)


def accuracy(W: torch.Tensor, V: torch.Tensor, X: torch.Tensor, y: torch.Tensor, norm: Norm) -> torch.Tensor:
    """``(R,)``: each model's share of ``X`` classified correctly."""
    _check_models(W, V)
    with torch.no_grad():
        return (norm(X @ W.transpose(1, 2)) @ V.transpose(1, 2)).argmax(-1).eq(y).double().mean(1)


def train_layer(
    W: torch.Tensor,
    V: torch.Tensor,
    X: torch.Tensor,
    y: torch.Tensor,
    norm: Norm,
    lr: float | torch.Tensor,
    steps: int,
    batches: Callable[[int], torch.Tensor],
    undo_drift: torch.Tensor | None = None,
    on_step: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SGD on ``W`` (a copy; ``V`` stays fixed). ``lr``: a number, or one rate per model ``(R,)``.
    ``batches(step)`` gives each model's minibatch ``(R, B)``. ``undo_drift``: ``(steps, R)``
    norms; after every step, put the mean of each model's rows back to its initial value and
    scale the rest so that ``|W|`` is that step's norm (both invisible to LayerNorm's output).
    ``on_step(step, W, grad)`` is called before each update. Returns the final ``W`` and, per
    step ``(steps, R)``: ``loss`` (minibatch), ``norm`` (``|W|`` after the step) and ``cosine``
    (of the step's gradient with ``W``)."""
    _check_models(W, V)
    check_positive_int(steps, "steps")
    rate = torch.as_tensor(lr, dtype=W.dtype).expand(len(W)).reshape(-1, 1, 1)
    if not bool((rate > 0).all()):
        raise ValueError(f"lr must be positive, got {lr}")
    if undo_drift is not None and tuple(undo_drift.shape) != (steps, len(W)):
        raise ValueError(f"undo_drift must have shape (steps, R) = ({steps}, {len(W)}), got {tuple(undo_drift.shape)}")
    row_mean = W.mean(1, keepdim=True)
    W = W.clone()
    record: dict[str, list[torch.Tensor]] = {"loss": [], "norm": [], "cosine": []}
    for step in range(steps):
        Wr = W.clone().requires_grad_()
        loss = layer_loss(Wr, V, X, y, batches(step), norm)
        (grad,) = torch.autograd.grad(loss.sum(), Wr)
        if on_step is not None:
            on_step(step, W, grad)
        record["loss"].append(loss.detach())
        record["cosine"].append((grad * W).sum((1, 2)) / grad.norm(dim=(1, 2)) / W.norm(dim=(1, 2)))
        W = W - rate * grad
        if undo_drift is not None:  # the row mean back to its initial value, then |W| to the target by scaling the rest
            rest = W - W.mean(1, keepdim=True)  # orthogonal to every matrix with equal rows
            target = (undo_drift[step] ** 2 - row_mean.expand_as(W).pow(2).sum((1, 2))).clamp_min(0).sqrt()
            W = row_mean + rest * (target / rest.norm(dim=(1, 2))).view(-1, 1, 1)
        record["norm"].append(W.norm(dim=(1, 2)))
    return W, {k: torch.stack(v) for k, v in record.items()}


def error_split(W: torch.Tensor, true_grad: torch.Tensor, detached_grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """Where the detached gradient's error ``D = detached_grad - true_grad`` lies in weight
    space, per model ``(R,)``, as shares of ``|D|^2``: ``"row mean"``, the same vector on every
    row (LayerNorm cannot see it); ``"along W"``, the rest's component along ``W`` with its row
    mean removed (a change of scale, which it cannot see either); ``"visible"``, what is left,
    which changes the outputs. All three ``(R, H, 64)``."""
    if true_grad.shape != W.shape or detached_grad.shape != W.shape or W.dim() != 3:
        raise ValueError(f"W, true_grad and detached_grad must share one (R, H, 64) shape, got "
                         f"{tuple(W.shape)}, {tuple(true_grad.shape)}, {tuple(detached_grad.shape)}")
    D = detached_grad - true_grad
    row_mean = D.mean(1, keepdim=True).expand_as(D)
    rest = D - row_mean
    Wc = W - W.mean(1, keepdim=True)
    along = (rest * Wc).sum((1, 2), keepdim=True) / (Wc * Wc).sum((1, 2), keepdim=True) * Wc
    total = D.pow(2).sum((1, 2))
    shares = {"row mean": row_mean.pow(2).sum((1, 2)) / total, "along W": along.pow(2).sum((1, 2)) / total}
    shares["visible"] = (rest - along).pow(2).sum((1, 2)) / total
    return shares


def turn_run(
    W: torch.Tensor,
    V: torch.Tensor,
    X: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    steps: int,
    batches: Callable[[int], torch.Tensor],
    fixed_norm: bool = False,
    norm: Norm | None = None,
) -> dict[str, torch.Tensor]:
    """SGD through LayerNorm (or ``norm``), recording per step ``(steps, R)``: ``norm`` (``|W|``
    before the step), ``turn`` (how far the step moves ``W/|W|``), ``unit gradient`` (the
    gradient's norm at ``W/|W|``) and ``cosine`` (``|cos|`` of the gradient with ``W``).
    ``fixed_norm``: the control, ``W`` re-projected to its initial norm after every step."""
    _check_models(W, V)
    check_positive_int(steps, "steps")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    norm = norm or (lambda a: torch.nn.functional.layer_norm(a, (a.shape[-1],)))
    initial = W.norm(dim=(1, 2), keepdim=True)
    record: dict[str, list[torch.Tensor]] = {k: [] for k in ("norm", "turn", "unit gradient", "cosine")}
    for step in range(steps):
        idx = batches(step)
        Wr = W.clone().requires_grad_()
        (grad,) = torch.autograd.grad(layer_loss(Wr, V, X, y, idx, norm).sum(), Wr)
        size = W.norm(dim=(1, 2), keepdim=True)
        W_unit = (W / size).requires_grad_()  # the direction alone, at norm 1
        (grad_unit,) = torch.autograd.grad(layer_loss(W_unit, V, X, y, idx, norm).sum(), W_unit)
        record["norm"].append(size.flatten())
        record["unit gradient"].append(grad_unit.norm(dim=(1, 2)))
        record["cosine"].append((grad * W).sum((1, 2)).abs() / grad.norm(dim=(1, 2)) / size.flatten())
        before = W / size
        W = W - lr * grad
        if fixed_norm:
            W = W * (initial / W.norm(dim=(1, 2), keepdim=True))
        record["turn"].append((W / W.norm(dim=(1, 2), keepdim=True) - before).norm(dim=(1, 2)))
    return {k: torch.stack(v) for k, v in record.items()}
