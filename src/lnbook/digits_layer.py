"""One LayerNorm layer on the 8x8 digits, ``softmax(V norm(W x))``, trained by SGD on ``W`` alone,
with many models (seeds, batch orders, learning rates) run as one batched tensor; the same layer
with a trainable gain and read-out (``train_affine``, ``best_rate``; ``fixed_norm`` holds ``|W|`` at
its initial value, the control for the norm's growth); and the detached gradient's
error: its two terms at the norm (``error_parts``) and its split in weight space into the parts
the model can and cannot see (``error_split``).

Shapes: pixels ``X`` ``(N, 64)``, labels ``y`` ``(N,)``; weights ``W`` ``(R, H, 64)`` and the
fixed read-out ``V`` ``(R, 10, H)``, one model per leading index ``r``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import check_positive_int
from .progress import progress

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
    on_step: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SGD on ``W`` (a copy; ``V`` stays fixed). ``lr``: a number, or one rate per model ``(R,)``.
    ``batches(step)`` gives each model's minibatch ``(R, B)``. ``on_step(step, W, grad)`` is called before each update. Returns the final ``W`` and, per
    step ``(steps, R)``: ``loss`` (minibatch), ``norm`` (``|W|`` after the step) and ``cosine``
    (of the step's gradient with ``W``)."""
    _check_models(W, V)
    check_positive_int(steps, "steps")
    rate = torch.as_tensor(lr, dtype=W.dtype).expand(len(W)).reshape(-1, 1, 1)
    if not bool((rate > 0).all()):
        raise ValueError(f"lr must be positive, got {lr}")
    W = W.clone()
    record: dict[str, list[torch.Tensor]] = {"loss": [], "norm": [], "cosine": []}
    for step in progress(range(steps), "steps"):
        Wr = W.clone().requires_grad_()
        loss = layer_loss(Wr, V, X, y, batches(step), norm)
        (grad,) = torch.autograd.grad(loss.sum(), Wr)
        if on_step is not None:
            on_step(step, W, grad)
        record["loss"].append(loss.detach())
        record["cosine"].append((grad * W).sum((1, 2)) / grad.norm(dim=(1, 2)) / W.norm(dim=(1, 2)))
        W = W - rate * grad
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
    gradient's norm at ``W/|W|``), ``cosine`` (``|cos|`` of the gradient with ``W``) and ``loss``
    (the minibatch loss before the step).
    ``fixed_norm``: the control, ``W`` re-projected to its initial norm after every step."""
    _check_models(W, V)
    check_positive_int(steps, "steps")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    norm = norm or (lambda a: torch.nn.functional.layer_norm(a, (a.shape[-1],)))
    initial = W.norm(dim=(1, 2), keepdim=True)
    record: dict[str, list[torch.Tensor]] = {k: [] for k in ("norm", "turn", "unit gradient", "cosine", "loss")}
    for step in progress(range(steps), "steps"):
        idx = batches(step)
        Wr = W.clone().requires_grad_()
        loss = layer_loss(Wr, V, X, y, idx, norm)
        (grad,) = torch.autograd.grad(loss.sum(), Wr)
        record["loss"].append(loss.detach())
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


def error_parts(a: torch.Tensor, g_hat: torch.Tensor, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm's true input gradient for summed inputs ``a`` and upstream gradient ``g_hat``
    (both ``(..., H)``), and the two terms it removes from ``r g_hat``, which the detached
    gradient keeps: returns ``(true, along_1, along_xhat)``, each ``(..., H)``;
    ``r g_hat = true + along_1 + along_xhat``."""
    if not isinstance(a, torch.Tensor) or not isinstance(g_hat, torch.Tensor) or a.shape != g_hat.shape or a.dim() < 1:
        raise ValueError(f"a and g_hat must be tensors of one shape (..., H), got "
                         f"{getattr(a, 'shape', type(a).__name__)} and {getattr(g_hat, 'shape', type(g_hat).__name__)}")
    if not eps >= 0:
        raise ValueError(f"eps must be non-negative, got {eps}")
    var, mu = torch.var_mean(a, -1, correction=0, keepdim=True)
    r = torch.rsqrt(var + eps)
    xhat = (a - mu) * r
    along_1 = r * g_hat.mean(-1, keepdim=True).expand_as(g_hat)
    along_x = r * xhat * (g_hat * xhat).mean(-1, keepdim=True)
    return r * g_hat - along_1 - along_x, along_1, along_x


def train_affine(
    W: torch.Tensor,
    V: torch.Tensor,
    X: torch.Tensor,
    y: torch.Tensor,
    norm: Norm,
    lr: float | torch.Tensor,
    steps: int,
    batches: Callable[[int], torch.Tensor],
    train_gain: bool = False,
    train_readout: bool = False,
    measure: bool = False,
    fixed_norm: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """SGD on ``softmax(V (gain * norm(W x)))``: on ``W`` always, on the gain ``(R, 1, H)``
    (starting at 1) if ``train_gain``, on ``V`` if ``train_readout`` (copies; the inputs are not
    changed). ``lr``: a number or one rate per model ``(R,)``. Returns the final ``{"W", "V",
    "gain"}`` and, per step ``(steps, R)``, the minibatch ``loss``. With ``measure`` (``norm``
    must then be LayerNorm with eps 1e-5) it also records, before each update, the detached
    gradient's error on that step's upstream gradient ``g_hat = dL/dxhat``: ``error`` (ratio of
    RMS errors over the batch), ``median error`` (median over the examples), ``along xhat``
    (share of the squared error along xhat), and the weight-space shares of ``error_split``
    (``row mean``, ``along W``, ``visible``). ``fixed_norm``: the control for the norm's growth,
    each model's ``W`` re-projected to its initial norm ``|W|`` after every step, so that a
    scale-invariant norm sees a constant effective rate ``lr / |W|^2``."""
    _check_models(W, V)
    check_positive_int(steps, "steps")
    rate = torch.as_tensor(lr, dtype=W.dtype).expand(len(W)).reshape(-1, 1, 1)
    if not bool((rate > 0).all()):
        raise ValueError(f"lr must be positive, got {lr}")
    initial = W.norm(dim=(1, 2), keepdim=True)
    params = {"W": W.clone(), "V": V.clone(), "gain": torch.ones(len(W), 1, W.shape[1], dtype=W.dtype)}
    trained = ["W"] + ["gain"] * train_gain + ["V"] * train_readout
    record: dict[str, list[torch.Tensor]] = {"loss": []}
    for step in progress(range(steps), "steps"):
        idx = batches(step)
        p = {k: v.clone().requires_grad_(k in trained) for k, v in params.items()}
        a = X[idx] @ p["W"].transpose(1, 2)
        h = norm(a)
        logits = (p["gain"] * h) @ p["V"].transpose(1, 2)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y[idx].flatten(), reduction="none").view(len(W), -1).mean(1)
        grads = torch.autograd.grad(loss.sum(), [p[k] for k in trained] + ([h] if measure else []))
        record["loss"].append(loss.detach())
        if measure:
            true, along_1, along_x = error_parts(a.detach(), grads[-1])
            error = along_1 + along_x
            for key, value in (("error", error.norm(dim=(1, 2)) / true.norm(dim=(1, 2))),
                               ("median error", (error.norm(dim=2) / true.norm(dim=2)).median(1).values),
                               ("along xhat", along_x.pow(2).sum((1, 2)) / error.pow(2).sum((1, 2)))):
                record.setdefault(key, []).append(value)
            G_true = true.transpose(1, 2) @ X[idx]  # dL/dW = sum over the batch of (dL/da) x^T
            for key, value in error_split(params["W"], G_true, (true + error).transpose(1, 2) @ X[idx]).items():
                record.setdefault(key, []).append(value)
        for k, g in zip(trained, grads):
            params[k] = params[k] - rate * g
        if fixed_norm:
            params["W"] = params["W"] * (initial / params["W"].norm(dim=(1, 2), keepdim=True))
    return params, {k: torch.stack(v) for k, v in record.items()}


def best_rate(
    W: torch.Tensor,
    V: torch.Tensor,
    fit: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    norm: Norm,
    rates: tuple[float, ...],
    steps: int,
    batches: Callable[[int], torch.Tensor],
    train_gain: bool = False,
    train_readout: bool = False,
    fixed_norm: bool = False,
) -> dict:
    """Train every model of ``W`` ``(R, H, 64)`` at every rate, as one batched model, on the
    pixels and labels ``fit``, and pick the rate with the lowest mean loss on ``val`` (a model
    that diverged counts as infinite loss). Returns ``val_loss`` (one per rate), ``rate``,
    ``params`` (the chosen rate's ``W``, ``V``, ``gain``), ``model`` (``x -> logits``'s norm
    part, ``gain * norm``, for ``full_loss`` and ``accuracy``) and ``loss`` ``(steps, rates, R)``,
    every rate's minibatch loss. ``fixed_norm``: ``train_affine``'s control, ``W`` re-projected
    to its initial norm after every step."""
    _check_models(W, V)
    if not rates or any(not rate > 0 for rate in rates):
        raise ValueError(f"rates must be positive numbers, got {rates}")
    k, R = len(rates), len(W)
    lr = torch.tensor(rates, dtype=W.dtype).repeat_interleave(R)
    params, record = train_affine(W.repeat(k, 1, 1), V.repeat(k, 1, 1), *fit, norm, lr, steps,
                                  lambda step: batches(step).repeat(k, 1), train_gain, train_readout,
                                  fixed_norm=fixed_norm)
    g = params["gain"]
    val_loss = full_loss(params["W"], params["V"], *val, lambda a: g * norm(a)).view(k, R).mean(1)
    best = int(torch.nan_to_num(val_loss, nan=float("inf")).argmin())
    pick = {key: value[best * R:(best + 1) * R] for key, value in params.items()}
    gain = pick["gain"]
    return {"val_loss": val_loss, "rate": rates[best], "params": pick, "model": lambda a: gain * norm(a),
            "loss": record["loss"].view(steps, k, R)}
