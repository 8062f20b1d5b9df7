"""Online value prediction on a random-walk chain: semi-gradient TD(0), one update per transition.

An agent walks a chain, one state left or right at random, and a value network learns from
the transitions as they arrive. Consecutive transitions lie next to each other on the chain,
so a batch of the most recent ones covers a small stretch of it: the data BatchNorm's batch
statistics then see are not a sample of the states, while per-example LayerNorm needs none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ._checks import check_int, check_number, check_positive_int, describe
from .norms import batch_statistics
from .train import evaluating, optimizer_step, prepare

BATCHES = ("recent", "replay")


@dataclass(frozen=True)
class RandomWalk:
    """A random walk on a chain of ``n_states`` states, with discount ``gamma``.

    Each step moves one state left or right with probability 1/2; a step off either end
    stays put. Leaving state ``s`` pays ``(1 - gamma) * x(s)``, where ``x(s)`` in [-1, 1] is
    the position of ``s`` along the chain, so the value of ``s`` is the discounted average of
    the positions the walk will visit, in [-1, 1]: it rises along the chain and flattens
    near the ends. The network sees a state as ``features`` Gaussian bumps spaced evenly along
    the chain (coarse coding, :meth:`encode`): neighbouring states look alike, and the
    network has to generalize from the states it visits to the others.
    """

    n_states: int = 20
    gamma: float = 0.9
    features: int = 8

    def __post_init__(self) -> None:
        check_int(self.n_states, "n_states", 2)
        check_number(self.gamma, "gamma", "a number in [0, 1)", lambda v: 0 <= v < 1)
        check_int(self.features, "features", 2, "an int >= 2 (one bump cannot tell states apart)")

    def _along(self, positions: torch.Tensor) -> torch.Tensor:
        """How far along the chain each state lies, from 0 to 1, float64."""
        if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64:
            raise TypeError("positions must be an int64 tensor of states")
        if positions.numel() and not (0 <= int(positions.min()) and int(positions.max()) < self.n_states):
            raise ValueError(f"positions must lie in 0 .. {self.n_states - 1}, got {int(positions.min())} .. {int(positions.max())}")
        return positions.double() / (self.n_states - 1)

    def _reward64(self, positions: torch.Tensor) -> torch.Tensor:
        return (1 - self.gamma) * (2 * self._along(positions) - 1)

    def reward(self, positions: torch.Tensor) -> torch.Tensor:
        """The reward for leaving each state: ``positions (*)`` int64 -> ``(*)`` float32."""
        return self._reward64(positions).float()

    def encode(self, positions: torch.Tensor) -> torch.Tensor:
        """Network input: ``positions (*)`` int64 -> ``(*, features)`` float32, Gaussian bumps of
        width one bump spacing, each 1 at its centre."""
        centres = torch.linspace(0, 1, self.features, dtype=torch.float64)
        return torch.exp(-0.5 * ((self._along(positions).unsqueeze(-1) - centres) * (self.features - 1)) ** 2).float()

    def true_values(self) -> torch.Tensor:
        """``v (n_states,)`` float64, the exact solution of ``v = r + gamma * P v``."""
        n = self.n_states
        step = torch.zeros(n, n, dtype=torch.float64)  # P, the transition matrix
        i = torch.arange(n - 1)
        step[i, i + 1] = step[i + 1, i] = 0.5
        step[0, 0] = step[-1, -1] = 0.5
        return torch.linalg.solve(torch.eye(n, dtype=torch.float64) - self.gamma * step, self._reward64(torch.arange(n)))

    def walk(self, steps: int, seed: int) -> torch.Tensor:
        """The states of ``steps`` transitions, ``(steps + 1,)`` int64, from the middle of the
        chain: transition ``t`` goes from state ``t`` to state ``t + 1``."""
        check_positive_int(steps, "steps")
        moves = torch.randint(0, 2, (steps,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
        positions = [self.n_states // 2]
        for move in moves.tolist():
            positions.append(min(max(positions[-1] + move, 0), self.n_states - 1))
        return torch.tensor(positions)


def training_batches(steps: int, batch_size: int, batch: str, seed: int) -> Iterator[tuple[int, torch.Tensor]]:
    """For each arriving transition ``t`` from the ``batch_size``-th on: ``(t, indices of its batch)``.

    ``"recent"``: the ``batch_size`` latest transitions ``t - batch_size + 1 .. t`` (with 1, the
    new transition alone: purely online learning). ``"replay"``: ``batch_size`` transitions
    drawn uniformly, with replacement, from all those seen so far, ``0 .. t`` (a replay buffer).
    The draws come from NumPy's generator seeded with ``seed``: a stream apart from the walk's,
    which torch's generator draws with the same seed.
    """
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    if batch not in BATCHES:
        raise ValueError(f"batch must be one of {BATCHES}, got {describe(batch)}")
    rng = np.random.default_rng(seed)
    for t in range(batch_size - 1, steps):
        if batch == "recent":
            yield t, torch.arange(t - batch_size + 1, t + 1)
        else:
            yield t, torch.from_numpy(rng.integers(0, t + 1, batch_size))


def batch_spread(chain: RandomWalk, steps: int, batch_size: int, batch: str, seed: int) -> torch.Tensor:
    """How much of the chain each batch of :func:`td_learn` (same arguments) covers: for every
    update, the standard deviation (biased, as BatchNorm's) of the positions of the
    ``2 * batch_size`` states ``[s; s']`` it normalizes over, in states; shape ``(updates,)``."""
    positions = chain.walk(steps, seed).double()
    return torch.stack([torch.cat([positions[idx], positions[idx + 1]]).std(correction=0)
                        for _, idx in training_batches(steps, batch_size, batch, seed)])


@dataclass
class TDHistory:
    """What :func:`td_learn` measured: the mean squared TD error of every update's batch
    (``step_loss``, training mode); the RMS error of the values over all states, in eval mode,
    ``value_error[i]``, after ``steps[i]`` transitions; and the seconds of learning so far,
    ``wall_time[i]`` (evaluation excluded)."""

    step_loss: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    value_error: list[float] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)


def value_error(model: nn.Module, chain: RandomWalk) -> float:
    """RMS difference between ``model``'s values, in eval mode (a BatchNorm uses its running
    statistics), and the true values, over all ``n_states`` states."""
    with evaluating(model) as device:
        values = model(chain.encode(torch.arange(chain.n_states)).to(device)).reshape(-1).double().cpu()
    return float((values - chain.true_values()).pow(2).mean().sqrt())


def td_learn(
    model: nn.Module,
    *,
    chain: RandomWalk,
    steps: int,
    lr: float,
    seed: int,
    batch_size: int = 1,
    batch: str = "recent",
    eval_every: int = 100,
) -> TDHistory:
    """Learn the chain's values online with semi-gradient TD(0) and Adam: one update per transition.

    When transition ``t`` of the walk arrives, the network takes one Adam step on the batch
    :func:`training_batches` gives for it, on the mean of ``(V(s) - r - gamma * V(s'))^2`` with
    the target held fixed. ``V(s)`` and ``V(s')`` come from one forward pass in training mode
    over the ``2 * batch_size`` states ``[s; s']``, so a BatchNorm normalizes both with the
    same batch statistics (as CrossQ does). A job for :func:`lnbook.train.fit_many` with
    ``"fit": td_learn``.

    Args:
        model: maps encoded states ``(B, chain.features)`` to values ``(B, 1)``, e.g.
            ``lnbook.models.MLP(chain.features, (32, 32), 1, norm)``.
        chain: the :class:`RandomWalk`; ``steps`` transitions of it are learned from.
        lr: Adam's learning rate.
        seed: seeds the walk and the replay draws (the initialization is the caller's: seed
            before building the model).
        batch_size, batch: see :func:`training_batches`. BatchNorm needs ``batch_size >= 2``.
        eval_every: measure :func:`value_error` every this many transitions, and after the last.
    """
    if not isinstance(chain, RandomWalk):
        raise TypeError(f"chain must be a RandomWalk, got {type(chain).__name__}")
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(eval_every, "eval_every")
    if steps < batch_size:
        raise ValueError(f"steps must be at least batch_size = {batch_size} (the first batch), got {steps}")
    if batch_size < 2 and batch_statistics(model):
        raise ValueError(
            "batch_size must be at least 2 for a model with BatchNorm: in training it normalizes each feature "
            "with the mean and variance of the batch, and one transition (s and s') is no sample of the states"
        )
    run = prepare(model, lr, seed)
    positions = chain.walk(steps, seed)
    x, r = chain.encode(positions).to(run.device), chain.reward(positions).to(run.device)
    history, elapsed = TDHistory(), 0.0
    for t, idx in training_batches(steps, batch_size, batch, seed):
        start = time.perf_counter()
        out = model(torch.cat([x[idx], x[idx + 1]]))
        if out.shape != (2 * len(idx), 1):
            raise ValueError(f"model must map (B, {chain.features}) states to (B, 1) values, got {tuple(out.shape)}")
        v, v_next = out.reshape(2, -1)
        loss = (v - r[idx] - chain.gamma * v_next.detach()).pow(2).mean()
        history.step_loss.append(optimizer_step(run.optimizer, loss))
        elapsed += time.perf_counter() - start
        if (t + 1) % eval_every == 0 or t + 1 == steps:
            history.steps.append(t + 1)
            history.value_error.append(value_error(model, chain))
            history.wall_time.append(elapsed)
    return history
