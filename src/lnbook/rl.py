"""Reinforcement learning for chapter 09: DQN on gymnasium's CartPole, many seeds at once, and a
plasticity test (a network refitted to target after target).

:func:`dqn` trains ``S`` agents side by side, one per seed: each has its own CartPole
environment, replay buffer, Q-network and target network (the members of an
:class:`lnbook.models.MLP` stacked by :func:`lnbook.seeds.stack`), so ten seeds cost little
more than one. The norm is the Q-network's (``"none"``, ``"layer"`` or ``"batch"``).
:func:`refit` measures plasticity in the sense of Lyle et al. (2024): one network (again a
stacked MLP, one member per seed) trained on a sequence of regression targets, each
replacing the last, and how well it still fits the latest.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from . import seeds as seed_axis
from ._checks import check_number, check_positive_int, describe
from .models import MLP, mlp_layers

ENV = "CartPole-v1"  # 500 steps at most; reward 1 per step the pole stays up


def _members(model: nn.Module) -> int:
    """How many members a stacked MLP holds; a TypeError for anything else."""
    members = seed_axis.members(model)
    if not isinstance(model, MLP) or members is None:
        kind = "a plain MLP" if isinstance(model, MLP) else type(model).__name__
        raise TypeError("model must be an lnbook.models.MLP stacked by lnbook.seeds.stack (one member per seed), "
                        f"got {kind}")
    return members


@dataclass
class DQNHistory:
    """What :func:`dqn` measured for ``S`` agents: ``episodes[s]``, the ``(steps so far, return)``
    of each training episode agent ``s`` finished; ``greedy (S, len(eval_steps))``, the mean
    return of greedy evaluation episodes after the steps in ``eval_steps``; ``wall_time`` in
    seconds for the whole stack."""

    episodes: list[list[tuple[int, float]]] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    greedy: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    wall_time: float = 0.0


def _q_values(model: MLP, states: torch.Tensor) -> torch.Tensor:
    """Q-values ``(S, B, actions)`` of each agent's ``states (S, B, 4)``, in eval mode (a batch
    norm uses its running statistics), without autograd."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        q = model(states.to(next(model.parameters()).device)).cpu()
    model.train(was_training)
    return q


def greedy_return(model: MLP, episodes: int, seed: int) -> np.ndarray:
    """Each agent's mean return over ``episodes`` CartPole episodes acting greedily (no
    exploration, eval mode), ``(S,)``; agent ``s``'s episode ``e`` starts from
    ``reset(seed=seed + 1000 * e + s)``."""
    import gymnasium as gym  # here, not at the top: `import lnbook` stays fast

    members = _members(model)
    check_positive_int(episodes, "episodes")
    envs = [gym.make(ENV) for _ in range(members)]
    totals = np.zeros(members)
    for e in range(episodes):
        states = np.stack([env.reset(seed=seed + 1000 * e + s)[0] for s, env in enumerate(envs)])
        running = np.ones(members, dtype=bool)
        while running.any():
            actions = _q_values(model, torch.as_tensor(states)[:, None]).argmax(-1)[:, 0].numpy()
            for s, env in enumerate(envs):
                if running[s]:
                    states[s], reward, terminated, truncated, _ = env.step(int(actions[s]))
                    totals[s] += reward
                    running[s] = not (terminated or truncated)
    for env in envs:
        env.close()
    return totals / episodes


def dqn(
    model: MLP,
    *,
    steps: int,
    seeds: Sequence[int],
    lr: float = 1e-3,
    batch_size: int = 64,
    gamma: float = 0.99,
    buffer: int = 10_000,
    learning_starts: int = 500,
    target_every: int = 250,
    explore_steps: int = 3000,
    final_epsilon: float = 0.05,
    train_every: int = 1,
    eval_every: int | None = None,
    eval_episodes: int = 3,
) -> DQNHistory:
    """Train the members of ``model`` (an MLP stacked by :func:`lnbook.seeds.stack`, one per
    seed) as DQN agents (Mnih et al., 2015) on CartPole for ``steps`` environment steps each;
    returns their :class:`DQNHistory`.

    Agent ``s`` acts epsilon-greedily (epsilon falls linearly from 1 to ``final_epsilon`` over
    ``explore_steps``) in its own environment, first reset with ``seeds[s]``, stores every
    transition in its own replay buffer of the latest ``buffer``, and from ``learning_starts``
    on takes one Adam step every ``train_every`` environment steps on ``batch_size`` transitions drawn from its
    buffer: the squared error of ``Q(s, a)`` against ``r + gamma * max_a' Q_target(s', a')``
    (0 after the pole falls; a time-out is not a fall). The target network is a copy of the
    Q-network, refreshed every ``target_every`` steps. Acting and the greedy evaluations run
    in eval mode; the update in training mode, and the target network's forward pass on the
    replayed ``s'`` in training mode too, so that a batch norm normalizes ``s'`` with the
    statistics of its own replayed batch, as it does ``s``. ``seeds`` also seed the draws.
    """
    members = _members(model)
    for name, value in (("steps", steps), ("batch_size", batch_size), ("buffer", buffer),
                        ("target_every", target_every), ("explore_steps", explore_steps),
                        ("train_every", train_every)):
        check_positive_int(value, name)
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_number(gamma, "gamma", "a number in [0, 1]", lambda v: 0 <= v <= 1)
    check_number(final_epsilon, "final_epsilon", "a number in [0, 1]", lambda v: 0 <= v <= 1)
    if len(seeds) != members:
        raise ValueError(f"seeds must have one entry per agent ({members}), got {describe(seeds)}")
    if learning_starts < batch_size:
        raise ValueError(f"learning_starts must be at least batch_size ({batch_size}), got {describe(learning_starts)}")
    import gymnasium as gym

    torch.manual_seed(int(seeds[0]))
    rngs = [np.random.default_rng(int(s)) for s in seeds]
    draws = np.random.default_rng(int(seeds[0]))
    envs = [gym.make(ENV) for _ in range(members)]
    states = np.stack([env.reset(seed=int(s))[0] for s, env in zip(seeds, envs)])
    memory = {"s": np.zeros((members, buffer, 4), np.float32), "a": np.zeros((members, buffer), np.int64),
              "r": np.zeros((members, buffer), np.float32), "s2": np.zeros((members, buffer, 4), np.float32),
              "done": np.zeros((members, buffer), np.float32)}
    target = copy.deepcopy(model)
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = DQNHistory(episodes=[[] for _ in range(members)])
    returns, rows, greedy = np.zeros(members), np.arange(members)[:, None], []
    start = time.perf_counter()
    model.train()
    for t in range(steps):
        epsilon = max(final_epsilon, 1 - (1 - final_epsilon) * t / explore_steps)
        actions = _q_values(model, torch.from_numpy(states)[:, None]).argmax(-1)[:, 0].numpy()
        slot = t % buffer
        memory["s"][:, slot] = states
        for s, env in enumerate(envs):
            action = int(rngs[s].integers(2)) if rngs[s].random() < epsilon else int(actions[s])
            after, reward, terminated, truncated, _ = env.step(action)
            memory["a"][s, slot], memory["r"][s, slot], memory["done"][s, slot] = action, reward, terminated
            memory["s2"][s, slot] = after
            returns[s] += reward
            if terminated or truncated:
                history.episodes[s].append((t + 1, returns[s]))
                returns[s] = 0.0
                after, _ = env.reset()
            states[s] = after
        if t + 1 >= learning_starts and (t + 1) % train_every == 0:
            idx = draws.integers(min(t + 1, buffer), size=(members, batch_size))
            batch = {k: torch.from_numpy(v[rows, idx]).to(device) for k, v in memory.items()}
            with torch.no_grad():
                target.train()
                best = target(batch["s2"]).max(-1).values
            wanted = batch["r"] + gamma * (1 - batch["done"]) * best
            chosen = model(batch["s"]).gather(-1, batch["a"][..., None])[..., 0]
            loss = ((chosen - wanted) ** 2).mean(1).sum()  # each agent's own mean, summed
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if (t + 1) % target_every == 0:
            target.load_state_dict(model.state_dict())
        if eval_every is not None and (t + 1) % eval_every == 0:
            history.eval_steps.append(t + 1)
            greedy.append(greedy_return(model, eval_episodes, seed=10_000 * (t + 1)))
    for env in envs:
        env.close()
    history.wall_time = time.perf_counter() - start
    history.greedy = np.stack(greedy, 1) if greedy else np.zeros((members, 0))
    return history


def mean_return(history: DQNHistory, last: int) -> np.ndarray:
    """Each agent's mean return over the training episodes that ended in its ``last`` steps
    (NaN for an agent that finished none), ``(S,)``."""
    end = max((t for episodes in history.episodes for t, _ in episodes), default=0)
    return np.array([np.mean([r for t, r in episodes if t > end - last]) if any(t > end - last for t, _ in episodes)
                     else np.nan for episodes in history.episodes])


@dataclass
class RefitHistory:
    """What :func:`refit` measured, ``(S, tasks)`` each: ``fit``, the mean squared error on the
    current targets at the end of each task, divided by their variance (0: a perfect fit, 1: no
    better than their mean); ``dead``, the fraction of hidden ReLU units that output 0 on every
    input at the end of each task; ``weight_norm``, the norm of all the weights."""

    fit: np.ndarray
    dead: np.ndarray
    weight_norm: np.ndarray


def shifted_targets(n: int, tasks: int, shift: float, seed: int) -> torch.Tensor:
    """``tasks`` regression targets for ``n`` inputs, ``(tasks, n)``: task ``k`` draws fresh
    standard normal values and adds ``k * shift``, so each task's target has nothing to do with
    the last and its mean moves on."""
    check_positive_int(n, "n")
    check_positive_int(tasks, "tasks")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tasks, n, generator=g) + shift * torch.arange(tasks)[:, None]


def refit(model: MLP, x: torch.Tensor, targets: torch.Tensor, *, steps: int, lr: float,
          batch_size: int, seeds: Sequence[int]) -> RefitHistory:
    """Train every member of ``model`` (an MLP with one output, stacked by
    :func:`lnbook.seeds.stack`) on ``targets[0]``, then ``targets[1]`` and on, ``steps`` Adam steps of mean squared error each, on mini-batches of ``batch_size`` of the
    inputs ``x (n, ...)`` (member ``s``'s drawn by a generator seeded with ``seeds[s]``),
    without resetting the network or the optimizer between tasks: Lyle et al.'s test of
    plasticity. Returns a :class:`RefitHistory`."""
    members = _members(model)
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    if targets.ndim != 2 or targets.shape[1] != len(x):
        raise ValueError(f"targets must be (tasks, {len(x)}), got {describe(targets)}")
    if len(seeds) != members:
        raise ValueError(f"seeds must have one entry per member ({members}), got {describe(seeds)}")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    device = next(model.parameters()).device
    x, targets = x.to(device), targets.to(device)
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    fit, dead, norms = [], [], []
    model.train()
    for y in targets:
        for _ in range(steps):
            idx = torch.stack([torch.randint(len(x), (batch_size,), generator=g) for g in generators]).to(device)
            loss = ((model(x[idx])[..., 0] - y[idx]) ** 2).mean(1).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            every = x.expand(members, *x.shape)  # every member sees all the inputs
            fit.append((((model(every)[..., 0] - y) ** 2).mean(1) / y.var(correction=0)).cpu().numpy())
            h, silent = every, []
            for layer in model.net[:-1]:  # the hidden layers; each ReLU's output is a layer's units
                h = layer(h)
                if isinstance(layer, nn.ReLU):
                    silent.append((h == 0).all(1))  # (S, units)
            dead.append(torch.cat(silent, 1).float().mean(1).cpu().numpy())
            weights = mlp_layers(model)[0]  # seeds.Linear: weight (S, out, in), weight-normalized when the MLP is
            norms.append(torch.stack([lin.weight.flatten(1).pow(2).sum(1) for lin in weights]).sum(0).sqrt().cpu().numpy())
        model.train()
    return RefitHistory(np.stack(fit, 1), np.stack(dead, 1), np.stack(norms, 1))
