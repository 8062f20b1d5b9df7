"""Chapter 02's helper: plain recurrent networks trained at several learning rates as one
stack, so that each network's rate can be chosen on a validation split (:func:`grid_fit`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from . import ensemble, seeds
from ._checks import check_number, check_positive_int, describe
from .data import Dataset
from .utils import seed_everything


def grid_fit(norm: str, fit: Dataset, val: Dataset, test: Dataset, *, members: int, lrs: Sequence[float],
             epochs: int, horizon: int | None = None, hidden_size: int = 64, n_classes: int = 10,
             batch_size: int = 64, seed: int = 0, device: torch.device | str = "cpu", **options: object
             ) -> tuple[np.ndarray, np.ndarray, Callable[[float], nn.Module]]:
    """Train ``members`` tanh RNNs (:func:`lnbook.ensemble.plain_rnns` with ``norm``,
    ``max_steps=horizon`` and ``options``, ``hidden_size`` units, ``n_classes`` outputs, drawn
    after ``seed_everything(seed)``) at every rate
    of ``lrs``, as one stack of ``len(lrs) * members`` networks: member ``(j, i)`` starts from
    network ``i``'s weights, sees the random batches of ``batch_size`` that network ``i`` gets
    (one generator seeded with ``seed``, as :func:`lnbook.ensemble.fit` draws them) and trains
    at ``lrs[j]``, with Adam and each member's gradient norm clipped at 1, for ``epochs``
    epochs on ``fit = (x (N, T, F), y (N,))``.

    Returns the validation accuracy on ``val`` after every epoch ``(len(lrs), members,
    epochs)``, the test accuracy on ``test`` after the last ``(len(lrs), members)``, and
    ``pick(lr)``: the ``members`` networks trained at ``lr``, stacked (on ``device``)."""
    lrs = tuple(lrs)
    if not lrs or len(set(lrs)) != len(lrs):
        raise ValueError(f"lrs must be distinct learning rates, at least one, got {describe(lrs)}")
    for lr in lrs:
        check_number(lr, "lrs", "positive learning rates", lambda v: v > 0)
    members, epochs = check_positive_int(members, "members"), check_positive_int(epochs, "epochs")
    seed_everything(seed)
    x, y = fit
    nets = ensemble.plain_rnns(members, x.shape[-1], hidden_size, n_classes, norm, max_steps=horizon, **options)
    copies = [copy.deepcopy(n) for _ in lrs for n in nets]  # member (j, i): network i, to train at lrs[j]
    model = seeds.stack(copies).to(device)
    lengths, generator = torch.full((len(y),), x.shape[1]), torch.Generator().manual_seed(seed)
    order = lambda: torch.cat([ensemble.batch_order(lengths, members, batch_size, "random", generator)]
                              * len(lrs)).unbind(1)  # every rate's copy of network i gets network i's batches
    runs = seeds.fit(model, (x, lengths, y), val, epochs=epochs, lr=[lr for lr in lrs for _ in nets],
                     batch_size=batch_size, seeds=[seed] * len(lrs) * members, grad_clip=1.0, order=order)
    plain = seeds.unstack(model, copies)  # the trained members, back in plain networks
    pick = lambda lr: seeds.stack(plain[lrs.index(lr) * members:][:members]).to(device)
    return (np.array([h.test_acc for h in runs]).reshape(len(lrs), members, -1),
            seeds.accuracy(model, test).reshape(len(lrs), members), pick)
