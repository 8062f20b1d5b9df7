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
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import seeds as seed_axis
from ._checks import check_int, check_number, check_positive_int, describe
from .models import MLP, mlp_layers
from .progress import progress
from .seeds import BATCH_NORMS

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


def greedy_return(model: MLP, episodes: int, seed: int,
                  obs_stats: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Each agent's mean return over ``episodes`` CartPole episodes acting greedily (no
    exploration, eval mode), ``(S,)``; agent ``s``'s episode ``e`` starts from
    ``reset(seed=seed + 1000 * e + s)``. ``obs_stats``: each agent's observation mean and
    standard deviation ``((S, 4), (S, 4))``, frozen, that its network's inputs are normalized
    with (a :func:`stream_q` agent's); None: raw observations."""
    import gymnasium as gym  # here, not at the top: `import lnbook` stays fast

    members = _members(model)
    check_positive_int(episodes, "episodes")
    if obs_stats is not None:
        mean, std = (np.asarray(v, dtype=np.float64) for v in obs_stats)
        if mean.shape != (members, 4) or std.shape != (members, 4) or not (std > 0).all():
            raise ValueError(f"obs_stats must be (mean, std), each ({members}, 4) with std > 0, got {describe(obs_stats)}")
    envs = [gym.make(ENV) for _ in range(members)]
    totals = np.zeros(members)
    for e in range(episodes):
        states = np.stack([env.reset(seed=seed + 1000 * e + s)[0] for s, env in enumerate(envs)])
        running = np.ones(members, dtype=bool)
        while running.any():
            seen = states if obs_stats is None else ((states - mean) / std).astype(np.float32)
            actions = _q_values(model, torch.as_tensor(seen)[:, None]).argmax(-1)[:, 0].numpy()
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
    lr: float | Sequence[float] = 1e-3,
    batch_size: int = 64,
    gamma: float = 0.99,
    buffer: int = 10_000,
    learning_starts: int = 500,
    target_every: int | None = 250,
    explore_steps: int = 3000,
    final_epsilon: float = 0.05,
    train_every: int = 1,
    updates: int = 1,
    eval_every: int | None = None,
    eval_episodes: int = 3,
    own_draws: bool = False,
) -> DQNHistory:
    """Train the members of ``model`` (an MLP stacked by :func:`lnbook.seeds.stack`, one per
    seed) as DQN agents (Mnih et al., 2015) on CartPole for ``steps`` environment steps each;
    returns their :class:`DQNHistory`.

    Agent ``s`` acts epsilon-greedily (epsilon falls linearly from 1 to ``final_epsilon`` over
    ``explore_steps``) in its own environment, first reset with ``seeds[s]``, stores every
    transition in its own replay buffer of the latest ``buffer``, and from ``learning_starts``
    on takes ``updates`` Adam steps every ``train_every`` environment steps (an update-to-data
    ratio of ``updates / train_every``), each on ``batch_size`` transitions drawn from its
    buffer: the squared error of ``Q(s, a)`` against ``r + gamma * max_a' Q_target(s', a')``
    (0 after the pole falls; a time-out is not a fall). The target network is a copy of the
    Q-network, refreshed every ``target_every`` steps; ``target_every=None``: no target
    network, the target comes from the Q-network itself (without gradient), as in PQN
    (Gallici et al., 2024). Acting and the greedy evaluations run
    in eval mode; the update in training mode, and the target's forward pass on the
    replayed ``s'`` in training mode too, so that a batch norm normalizes ``s'`` with the
    statistics of its own replayed batch, as it does ``s``. Agent ``s`` explores with a
    generator seeded with ``seeds[s]``; its replay draws come, with ``own_draws``, from its own
    generator too (seeded with ``[seeds[s], 1]``), so that an agent in a stack is the agent
    trained alone, and otherwise (the default, as chapter 09 first ran it) from one generator
    seeded with ``seeds[0]`` for the whole stack. Every ``eval_every`` steps, ``eval_episodes`` greedy episodes
    (:func:`greedy_return`, seeded by the step) give ``greedy``; :func:`last_greedy` averages
    the last few. ``lr``: one for every agent, or one per agent (a learning-rate grid in one stack:
    Adam's step is the rate times a direction that does not depend on it, so each agent's step
    is scaled to its own rate).
    """
    members = _members(model)
    for name, value in (("steps", steps), ("batch_size", batch_size), ("buffer", buffer),
                        ("explore_steps", explore_steps), ("train_every", train_every), ("updates", updates)):
        check_positive_int(value, name)
    if target_every is not None:
        check_positive_int(target_every, "target_every")
    if eval_every is not None:
        check_positive_int(eval_every, "eval_every")
    rates = seed_axis.member_lrs(lr, members, "agent")
    check_number(gamma, "gamma", "a number in [0, 1]", lambda v: 0 <= v <= 1)
    check_number(final_epsilon, "final_epsilon", "a number in [0, 1]", lambda v: 0 <= v <= 1)
    seeds = seed_axis.check_seeds(seeds, members, "agent")
    if learning_starts < batch_size:
        raise ValueError(f"learning_starts must be at least batch_size ({batch_size}), got {describe(learning_starts)}")
    import gymnasium as gym

    torch.manual_seed(int(seeds[0]))
    rngs = [np.random.default_rng(int(s)) for s in seeds]
    if not isinstance(own_draws, bool):
        raise TypeError(f"own_draws must be True or False, got {describe(own_draws)}")
    if own_draws:
        draws = [np.random.default_rng([int(s), 1]) for s in seeds]  # each agent's replay draws, its own
    else:
        shared = np.random.default_rng(int(seeds[0]))
    envs = [gym.make(ENV) for _ in range(members)]
    states = np.stack([env.reset(seed=int(s))[0] for s, env in zip(seeds, envs)])
    memory = {"s": np.zeros((members, buffer, 4), np.float32), "a": np.zeros((members, buffer), np.int64),
              "r": np.zeros((members, buffer), np.float32), "s2": np.zeros((members, buffer, 4), np.float32),
              "done": np.zeros((members, buffer), np.float32)}
    target = model if target_every is None else copy.deepcopy(model)
    device = next(model.parameters()).device
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=max(rates))
    scale = torch.tensor(rates, device=device) / max(rates)  # each agent's share of the step at the largest rate
    history = DQNHistory(episodes=[[] for _ in range(members)])
    returns, rows, greedy = np.zeros(members), np.arange(members)[:, None], []
    start = time.perf_counter()
    model.train()
    for t in progress(range(steps), "DQN steps"):
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
        for _ in range(updates) if t + 1 >= learning_starts and (t + 1) % train_every == 0 else ():
            if own_draws:
                idx = np.stack([g.integers(min(t + 1, buffer), size=batch_size) for g in draws])
            else:
                idx = shared.integers(min(t + 1, buffer), size=(members, batch_size))
            batch = {k: torch.from_numpy(v[rows, idx]).to(device) for k, v in memory.items()}
            with torch.no_grad():
                target.train()
                best = target(batch["s2"]).max(-1).values
            wanted = batch["r"] + gamma * (1 - batch["done"]) * best
            chosen = model(batch["s"]).gather(-1, batch["a"][..., None])[..., 0]
            loss = ((chosen - wanted) ** 2).mean(1).sum()  # each agent's own mean, summed
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if bool((scale == 1).all()):
                optimizer.step()
            else:
                before = [p.detach().clone() for p in params]
                optimizer.step()
                with torch.no_grad():
                    for p, b in zip(params, before):
                        p.copy_(b + scale.view(-1, *[1] * (p.ndim - 1)) * (p - b))
        if target_every is not None and (t + 1) % target_every == 0:
            target.load_state_dict(model.state_dict())
        if eval_every is not None and (t + 1) % eval_every == 0:
            history.eval_steps.append(t + 1)
            greedy.append(greedy_return(model, eval_episodes, seed=10_000 * (t + 1)))
    for env in envs:
        env.close()
    history.wall_time = time.perf_counter() - start
    history.greedy = np.stack(greedy, 1) if greedy else np.zeros((members, 0))
    return history


DQN_REGIMES = {  # benchmarks/dqn_rl.py's regimes: chapter 09's DQN, and one where the literature says LN helps
    "target network": dict(target_every=250, train_every=2, updates=1),  # DQN as chapter 09 first ran it
    "no target network": dict(target_every=None, train_every=2, updates=1),  # the target from the Q-network (PQN)
}
DQN_ARMS = (("none", "target network"), ("layer", "target network"), ("batch", "target network"),
            ("none", "no target network"), ("layer", "no target network"), ("batch", "no target network"))


def dqn_job(norm: str, regime: str, lrs: Sequence[float], seeds: Sequence[int], steps: int, eval_every: int,
            eval_episodes: int = 3, hidden: tuple[int, ...] = (64, 64)) -> tuple[list[float], list[int], DQNHistory]:
    """One stack of DQN agents (:class:`~lnbook.models.MLP` 4 -> ``hidden`` -> 2 with ``norm``, each
    built after ``seed_everything(seed)``) trained by :func:`dqn` (``own_draws=True``) in one of :data:`DQN_REGIMES`:
    every rate of ``lrs`` times every seed of ``seeds`` (member ``i`` at ``lrs[i // len(seeds)]``,
    seed ``seeds[i % len(seeds)]``), greedy return every ``eval_every`` steps. Returns the
    members' rates, seeds and history (``benchmarks/dqn_rl.py`` runs these on workers)."""
    from .utils import seed_everything

    if regime not in DQN_REGIMES:
        raise ValueError(f"regime must be one of {tuple(DQN_REGIMES)}, got {describe(regime)}")
    rates = [float(lr) for lr in lrs for _ in seeds]
    members_seeds = [int(s) for _ in lrs for s in seeds]
    nets = []
    for seed in members_seeds:
        seed_everything(seed)
        nets.append(MLP(4, hidden, 2, norm))
    model = seed_axis.stack(nets)
    history = dqn(model, steps=steps, seeds=members_seeds, lr=rates, eval_every=eval_every,
                  eval_episodes=eval_episodes, own_draws=True, **DQN_REGIMES[regime])
    return rates, members_seeds, history


@dataclass
class StoredDQNRun:
    """The stored DQN run of ``benchmarks/dqn_rl.py``, per arm ``(norm, regime)``: ``val[arm][lr]``
    each validation seed's greedy return averaged over the last ``last_evals`` evaluations
    ``(S_val,)``; ``test[arm, lr]`` the same for the test seeds, and ``test_training[arm, lr]``
    their training episodes' mean return over the same steps, at each arm's rate chosen on
    validation; ``curves[split, arm, lr]`` the greedy return at every evaluation
    ``(S, steps // every)``; the seeds in ascending order; ``provenance`` the file's ``#`` lines."""

    provenance: list[str]
    steps: int
    every: int
    last_evals: int
    val_seeds: list[int]
    test_seeds: list[int]
    val: dict[tuple[str, str], dict[float, np.ndarray]]
    test: dict[tuple[tuple[str, str], float], np.ndarray]
    test_training: dict[tuple[tuple[str, str], float], np.ndarray]
    curves: dict[tuple[str, tuple[str, str], float], np.ndarray]


def stored_dqn_run(folder: Path | None = None) -> StoredDQNRun:
    """Read ``dqn_rl-final.csv`` and ``dqn_rl-curves.csv`` that ``benchmarks/dqn_rl.py`` writes
    into ``lnbook/results/`` (or ``folder``), checked: every run with every seed of its split and
    every evaluation."""
    from importlib.resources import files

    from .utils import stored_number, stored_rows

    where = files("lnbook") / "results" if folder is None else folder
    script = "dqn_rl.py"
    head, finals = stored_rows(where, "dqn_rl-final.csv", ["split", "norm", "regime", "lr", "seed", "greedy_last",
                                                            "training_last", "steps", "every", "last_evals"], script)
    _, curve_rows = stored_rows(where, "dqn_rl-curves.csv", ["split", "norm", "regime", "lr", "seed", "step", "greedy"],
                                script)
    sizes = {(r["steps"], r["every"], r["last_evals"]) for r in finals}
    if len(sizes) != 1:
        raise ValueError(f"the stored run of benchmarks/{script} mixes run lengths: {sorted(sizes)}")
    steps, every, last_evals = (int(v) for v in sizes.pop())
    seeds = {split: sorted({int(r["seed"]) for r in finals if r["split"] == split}) for split in ("val", "test")}
    groups: dict[tuple, dict[int, tuple[float, float]]] = {}
    for r in finals:
        key = (r["split"], (r["norm"], r["regime"]), float(r["lr"]))
        groups.setdefault(key, {})[int(r["seed"])] = (stored_number(r["greedy_last"], "greedy_last", script),
                                                      stored_number(r["training_last"], "training_last", script))
    val: dict[tuple[str, str], dict[float, np.ndarray]] = {}
    test, training = {}, {}
    for (split, arm, lr), by_seed in sorted(groups.items()):
        if sorted(by_seed) != seeds[split]:
            raise ValueError(f"the stored run of benchmarks/{script} lacks seeds of {split} {arm} at lr {lr}")
        values = np.array([by_seed[s] for s in seeds[split]])
        if split == "val":
            val.setdefault(arm, {})[lr] = values[:, 0]
        else:
            test[arm, lr], training[arm, lr] = values[:, 0], values[:, 1]
    bins: dict[tuple, dict[int, dict[int, float]]] = {}
    for r in curve_rows:
        key = (r["split"], (r["norm"], r["regime"]), float(r["lr"]))
        bins.setdefault(key, {}).setdefault(int(r["seed"]), {})[int(r["step"])] = stored_number(r["greedy"], "greedy", script)
    if set(bins) != set(groups):
        raise ValueError(f"the stored run of benchmarks/{script} has curves for other runs than its final results")
    wanted = list(range(every, steps + 1, every))
    curves = {}
    for key, by_seed in sorted(bins.items()):
        if sorted(by_seed) != seeds[key[0]] or any(sorted(b) != wanted for b in by_seed.values()):
            raise ValueError(f"the stored run of benchmarks/{script} has an incomplete curve for {key}")
        curves[key] = np.array([[by_seed[s][step] for step in wanted] for s in seeds[key[0]]])
    return StoredDQNRun(head, steps, every, last_evals, seeds["val"], seeds["test"], val, test, training, curves)


def last_greedy(history: DQNHistory, k: int) -> np.ndarray:
    """Each agent's greedy return averaged over its last ``k`` evaluations, ``(S,)`` (CartPole's
    greedy return swings from one checkpoint to the next; one evaluation is a noisy measure)."""
    check_positive_int(k, "k")
    if history.greedy.ndim != 2 or history.greedy.shape[1] < k:
        raise ValueError(f"k must be at most the evaluations made ({history.greedy.shape[-1]}), got {describe(k)}")
    return history.greedy[:, -k:].mean(1)


def mean_return_window(history: DQNHistory, start: int, stop: int) -> np.ndarray:
    """Each agent's mean return of the training episodes that ended in steps ``(start, stop]``
    (NaN for an agent that finished none), ``(S,)``."""
    check_int(start, "start")
    check_positive_int(stop, "stop")
    if stop <= start:
        raise ValueError(f"stop must be after start ({start}), got {describe(stop)}")
    return np.array([np.mean([r for t, r in agent if start < t <= stop]) if any(start < t <= stop for t, _ in agent)
                     else np.nan for agent in history.episodes])


def mean_return(history: DQNHistory, last: int) -> np.ndarray:
    """Each agent's mean return over the training episodes that ended in its ``last`` steps
    (NaN for an agent that finished none), ``(S,)``."""
    end = max((t for episodes in history.episodes for t, _ in episodes), default=0)
    return np.array([np.mean([r for t, r in episodes if t > end - last]) if any(t > end - last for t, _ in episodes)
                     else np.nan for episodes in history.episodes])


# --- Streaming Q(lambda): learning from each transition as it comes (Elsayed et al., 2024) ---


def stream_agents(norm: str, seeds: Sequence[int], hidden: tuple[int, ...] = (32, 32),
                  sparsity: float = 0.9) -> MLP:
    """Stream Q(λ)'s Q-networks, one per seed, stacked (:func:`lnbook.seeds.stack`): an
    :class:`~lnbook.models.MLP` 4 -> ``hidden`` -> 2 with ``norm`` before each activation
    (``"layer_simple"`` is stream-x's LayerNorm, without gain or bias), leaky ReLU (slope 0.01)
    as in stream-x, and stream-x's sparse initialization: every weight uniform in
    ``±1/sqrt(fan_in)``, then a share ``sparsity`` of each unit's inputs set to 0 (rounded up, but
    at least one input kept: CartPole has 4), biases 0. Member ``s`` is built from ``seeds[s]``."""
    check_number(sparsity, "sparsity", "a number in [0, 1)", lambda v: 0 <= v < 1)
    if not isinstance(seeds, Sequence) or len(seeds) < 1:
        raise ValueError(f"seeds must be a non-empty sequence of ints, got {describe(seeds)}")
    members = []
    for seed in seeds:
        g = torch.Generator().manual_seed(int(seed))
        net = MLP(4, hidden, 2, norm)
        for i, layer in enumerate(net.net):
            if isinstance(layer, nn.ReLU):
                net.net[i] = nn.LeakyReLU(0.01)
            elif isinstance(layer, nn.Linear):
                with torch.no_grad():
                    fan_out, fan_in = layer.weight.shape
                    bound = fan_in ** -0.5
                    layer.weight.copy_(torch.rand(fan_out, fan_in, generator=g) * 2 * bound - bound)
                    zeros = min(math.ceil(sparsity * fan_in), fan_in - 1)
                    for row in layer.weight:
                        row[torch.randperm(fan_in, generator=g)[:zeros]] = 0.0
                    layer.bias.zero_()
        members.append(net)
    return seed_axis.stack(members)


class _Welford:
    """Each member's running mean and variance of a stream of values ``(S, *shape)`` (Welford's
    method; the variance is 1 until two values have come, as stream-x's ``SampleMeanStd``)."""

    def __init__(self, members: int, shape: tuple[int, ...] = ()) -> None:
        self.n = np.zeros((members, *[1] * len(shape)))
        self.mean, self.p = np.zeros((members, *shape)), np.zeros((members, *shape))

    def update(self, x: np.ndarray, which: np.ndarray | None = None) -> None:
        """Add ``x (S, *shape)``'s rows to the members' streams (only the members ``which`` (S,) marks)."""
        add = np.ones(self.n.shape, bool) if which is None else which.reshape(self.n.shape)
        n = self.n + add
        mean = np.where(add, self.mean + (x - self.mean) / np.maximum(n, 1), self.mean)
        self.p = np.where(add, self.p + (x - self.mean) * (x - mean), self.p)
        self.n, self.mean = n, mean

    @property
    def var(self) -> np.ndarray:
        return np.where(self.n >= 2, self.p / np.maximum(self.n - 1, 1), 1.0)


@dataclass
class StreamHistory(DQNHistory):
    """What :func:`stream_q` measured: :class:`DQNHistory`'s ``episodes``, ``eval_steps``,
    ``greedy`` and ``wall_time``, and each agent's observation statistics at the end,
    ``obs_mean`` and ``obs_std`` ``(S, 4)`` (what its network's inputs are normalized with;
    :func:`greedy_return` takes them)."""

    obs_mean: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    obs_std: np.ndarray = field(default_factory=lambda: np.ones((0, 4)))


def stream_q(
    model: MLP,
    *,
    steps: int,
    seeds: Sequence[int],
    lr: float | Sequence[float] = 1.0,
    batch_size: int = 1,
    lam: float = 0.8,
    gamma: float = 0.99,
    kappa: float = 2.0,
    explore_steps: int = 2000,
    final_epsilon: float = 0.01,
    normalize: bool = True,
    eval_every: int | None = None,
    eval_episodes: int = 3,
) -> StreamHistory:
    """Stream Q(λ) (Elsayed et al., 2024) for the members of ``model`` (stacked, one per seed, e.g.
    :func:`stream_agents`) on CartPole: no replay buffer, no target network, each transition
    used once, ``steps`` environment steps per agent; returns their :class:`StreamHistory`.

    Agent ``s`` acts epsilon-greedily in its own environment (first reset with ``seeds[s]``;
    epsilon falls linearly from 1 to ``final_epsilon`` over ``explore_steps``; its own generator)
    with the network in eval mode. With ``normalize`` (stream-x's recipe) it normalizes each
    observation with the running mean and variance of the observations so far (this one
    included), and divides each reward by the running standard deviation of the discounted
    return. Every ``batch_size`` steps, one update on the ``batch_size`` transitions just seen
    (1: stream-x's algorithm exactly; 2 to 4: the small batches of one stream that a batch norm
    would need): one training-mode forward pass on their states ``s`` (a batch norm normalizes
    them with their own statistics), the TD errors ``δ_i = r_i + gamma max_a' Q(s'_i, a') -
    Q(s_i, a_i)`` (``Q(s')`` in eval mode, without gradient; 0 after the pole falls, a time-out
    is not a fall), and for each transition in turn Watkins's trace ``e <- gamma λ e + ∇Q(s_i,
    a_i)`` and the ObGD step ``θ += α δ_i e`` with ``α = lr / max(1, lr κ max(|δ_i|, 1) ||e||_1)``
    (stream-x's overshooting bound, per agent), summed and applied at the end of the batch; the
    trace is reset after an episode ends or an exploratory (non-greedy) action. ``lr``: one for
    every agent, or one per agent (a learning-rate grid in one stack). A batch norm needs
    ``batch_size >= 2``: training-mode BatchNorm cannot normalize one example.
    """
    members = _members(model)
    for name, value in (("steps", steps), ("batch_size", batch_size), ("explore_steps", explore_steps),
                        ("eval_episodes", eval_episodes)):
        check_positive_int(value, name)
    if eval_every is not None:
        check_positive_int(eval_every, "eval_every")
    rates = seed_axis.member_lrs(lr, members, "agent")
    check_number(kappa, "kappa", "a positive number", lambda v: v > 0)
    for name, value in (("lam", lam), ("gamma", gamma), ("final_epsilon", final_epsilon)):
        check_number(value, name, "a number in [0, 1]", lambda v: 0 <= v <= 1)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be True or False, got {describe(normalize)}")
    seeds = seed_axis.check_seeds(seeds, members, "agent")
    batch_norm = any(isinstance(m, seed_axis.Norm) and issubclass(m.plain, BATCH_NORMS) for m in model.modules())
    if batch_size < 2 and batch_norm:
        raise ValueError("batch_size must be at least 2 for a Q-network with a batch norm: training-mode "
                         f"BatchNorm cannot normalize a batch of one example, got {describe(batch_size)}")
    import gymnasium as gym

    rngs = [np.random.default_rng(int(s)) for s in seeds]
    envs = [gym.make(ENV) for _ in range(members)]
    obs_stats, return_stats = _Welford(members, (4,)), _Welford(members)
    discounted = np.zeros(members)

    def seen(raw: np.ndarray, which: np.ndarray | None = None) -> np.ndarray:  # (S, 4) -> what the network sees
        if not normalize:
            return raw.astype(np.float32)
        obs_stats.update(raw.astype(np.float64), which)
        return ((raw - obs_stats.mean) / np.sqrt(obs_stats.var + 1e-8)).astype(np.float32)

    states = seen(np.stack([env.reset(seed=int(s))[0] for s, env in zip(seeds, envs)]))
    params = [p for p in model.parameters() if p.requires_grad]
    traces = [torch.zeros_like(p) for p in params]
    device = params[0].device
    rates_t = torch.tensor(rates, dtype=params[0].dtype, device=device)
    history = StreamHistory(episodes=[[] for _ in range(members)])
    returns, greedy, batch = np.zeros(members), [], []
    start = time.perf_counter()
    for t in progress(range(steps), "Stream Q steps"):
        epsilon = max(final_epsilon, 1 - (1 - final_epsilon) * t / explore_steps)
        if batch_norm:  # acting in eval mode: the running statistics
            best = _q_values(model, torch.from_numpy(states)[:, None]).argmax(-1)[:, 0].numpy()
        else:  # no batch statistics: train and eval mode compute the same (and switching costs time)
            with torch.no_grad():
                best = model(torch.from_numpy(states)[:, None].to(device)).argmax(-1)[:, 0].cpu().numpy()
        actions = np.array([int(rngs[s].integers(2)) if rngs[s].random() < epsilon else int(best[s])
                            for s in range(members)])
        after, rewards = np.zeros((members, 4)), np.zeros(members)
        fell, ended = np.zeros(members, bool), np.zeros(members, bool)
        for s, env in enumerate(envs):
            after[s], rewards[s], fell[s], truncated, _ = env.step(int(actions[s]))
            ended[s] = fell[s] or truncated
        discounted = discounted * gamma * (1 - ended) + rewards
        if normalize:
            return_stats.update(discounted)
            scaled = rewards / np.sqrt(return_stats.var + 1e-8)
        else:
            scaled = rewards
        returns += rewards
        nxt = seen(after)
        batch.append((states, actions, scaled, nxt, fell, ended | (actions != best)))
        if ended.any():
            raw = after.copy()
            for s in np.flatnonzero(ended):
                history.episodes[s].append((t + 1, returns[s]))
                returns[s] = 0.0
                raw[s] = envs[s].reset()[0]
            nxt = np.where(ended[:, None], seen(raw, ended), nxt)  # the first state of the next episode
        states = nxt
        if len(batch) == batch_size:
            _stream_update(model, params, traces, batch, lr=rates_t, lam=lam, gamma=gamma, kappa=kappa, device=device,
                           switch=batch_norm)
            batch = []
        if eval_every is not None and (t + 1) % eval_every == 0:
            history.eval_steps.append(t + 1)
            stats = None if not normalize else (obs_stats.mean, np.sqrt(obs_stats.var + 1e-8))
            greedy.append(greedy_return(model, eval_episodes, seed=10_000 * (t + 1), obs_stats=stats))
    for env in envs:
        env.close()
    history.wall_time = time.perf_counter() - start
    history.greedy = np.stack(greedy, 1) if greedy else np.zeros((members, 0))
    history.obs_mean = obs_stats.mean.copy() if normalize else np.zeros((members, 4))
    history.obs_std = np.sqrt(obs_stats.var + 1e-8) if normalize else np.ones((members, 4))
    return history


def _stream_update(model: MLP, params: list[torch.Tensor], traces: list[torch.Tensor], batch: list[tuple],
                   *, lr: torch.Tensor, lam: float, gamma: float, kappa: float, device: torch.device, switch: bool) -> None:
    """One ObGD Q(λ) update of every agent on the transitions of ``batch`` (k tuples of ``(s (S, 4),
    a (S,), r (S,), s' (S, 4), fell (S,), reset (S,))``), as :func:`stream_q` describes, ``lr (S,)``
    each agent's. ``switch``:
    the network has batch norms, so ``Q(s')`` is computed in eval mode and ``Q(s)`` in training mode."""
    s, a, r, s2, fell, reset = (torch.from_numpy(np.stack(v, 1)).to(device) for v in zip(*batch))  # (S, k, ...)
    members, k = a.shape
    model.train(not switch)
    with torch.no_grad():
        after = model(s2.float()).max(-1).values  # (S, k)
    model.train()
    q = model(s.float()).gather(-1, a[..., None].long())[..., 0]  # (S, k)
    delta = (r.float() + gamma * (1 - fell.float()) * after - q.detach())  # (S, k)
    steps = [torch.zeros_like(p) for p in params]
    shape = lambda v, p: v.view(members, *[1] * (p.ndim - 1))  # noqa: E731  (S,) against a parameter (S, ...)
    for i in range(k):
        grads = torch.autograd.grad(q[:, i].sum(), params, retain_graph=i < k - 1)  # members independent: each its own
        for e, g in zip(traces, grads):
            e.mul_(gamma * lam).add_(g)
        z = sum(e.abs().flatten(1).sum(1) for e in traces)  # (S,) ||e||_1
        bound = lr * kappa * delta[:, i].abs().clamp_min(1.0) * z
        alpha = torch.where(bound > 1, lr / bound, lr)
        for u, e in zip(steps, traces):
            u.add_(shape(alpha * delta[:, i], e) * e)
            e.mul_(shape(1 - reset[:, i].float(), e))
    with torch.no_grad():
        for p, u in zip(params, steps):
            p.add_(u)


def return_curve(history: DQNHistory, every: int, steps: int) -> np.ndarray:
    """Each agent's mean return of the training episodes that ended in each ``every`` steps up to
    ``steps`` (NaN where none ended), ``(S, steps // every)``: column ``j`` covers steps
    ``(j every, (j + 1) every]``."""
    check_positive_int(every, "every")
    check_positive_int(steps, "steps")
    if steps % every:
        raise ValueError(f"steps must be a multiple of every ({every}), got {describe(steps)}")
    edges = np.arange(0, steps + 1, every)
    return np.array([[np.mean([r for t, r in agent if lo < t <= hi]) if any(lo < t <= hi for t, _ in agent) else np.nan
                      for lo, hi in zip(edges[:-1], edges[1:])] for agent in history.episodes])


STREAM_ARMS = (("none", 1), ("layer_simple", 1), ("none", 2), ("layer_simple", 2),
               ("batch", 2))  # (norm, batch size): benchmarks/stream_rl.py's arms


def stream_job(norm: str, batch_size: int, lrs: Sequence[float], seeds: Sequence[int], steps: int,
               explore_steps: int = 1000) -> tuple[list[float], list[int], StreamHistory]:
    """One stack of Stream Q(λ) agents (:func:`stream_agents` with ``norm``, :func:`stream_q` with
    ``batch_size``): every rate of ``lrs`` times every seed of ``seeds``, member ``i`` at
    ``lrs[i // len(seeds)]`` with seed ``seeds[i % len(seeds)]``. Returns the members' rates,
    seeds and history; a job for :mod:`concurrent.futures` workers (``benchmarks/stream_rl.py``)."""
    rates = [float(lr) for lr in lrs for _ in seeds]
    members = [int(s) for _ in lrs for s in seeds]
    model = stream_agents(norm, members)
    return rates, members, stream_q(model, steps=steps, seeds=members, lr=rates, batch_size=batch_size,
                                    explore_steps=explore_steps)


@dataclass
class StoredStreamRun:
    """The stored Stream Q(λ) run of ``benchmarks/stream_rl.py``, per arm ``(norm, batch size)``:
    ``val[arm][lr]`` each validation seed's mean training return over the last ``last`` steps
    ``(S_val,)``; ``test[arm, lr]`` the same for the test seeds ``(S_test,)``, at the rates the
    script ran them (each arm's rate chosen on validation); ``curves[split, arm, lr]``, the mean
    return of the episodes ending in each ``every`` steps ``(S, steps // every)``; the seeds in
    ascending order; ``provenance`` the file's ``#`` lines."""

    provenance: list[str]
    steps: int
    every: int
    last: int
    val_seeds: list[int]
    test_seeds: list[int]
    val: dict[tuple[str, int], dict[float, np.ndarray]]
    test: dict[tuple[tuple[str, int], float], np.ndarray]
    curves: dict[tuple[str, tuple[str, int], float], np.ndarray]


def stored_stream_run(folder: Path | None = None) -> StoredStreamRun:
    """Read the stored Stream Q(λ) run (``stream_rl-final.csv``, ``stream_rl-curves.csv`` that
    ``benchmarks/stream_rl.py`` writes into ``lnbook/results/``, or ``folder``), checked for
    completeness: every arm and rate with every seed of its split, every curve with every bin."""
    from importlib.resources import files

    from .utils import stored_number, stored_rows

    where = files("lnbook") / "results" if folder is None else folder
    script = "stream_rl.py"
    head, finals = stored_rows(where, "stream_rl-final.csv", ["split", "norm", "batch", "lr", "seed", "last_return",
                                                              "steps", "every", "last"], script)
    _, curve_rows = stored_rows(where, "stream_rl-curves.csv", ["split", "norm", "batch", "lr", "seed", "step",
                                                                 "mean_return"], script)
    sizes = {(r["steps"], r["every"], r["last"]) for r in finals}
    if len(sizes) != 1:
        raise ValueError(f"the stored run of benchmarks/{script} mixes run lengths: {sorted(sizes)}")
    steps, every, last = (int(v) for v in sizes.pop())
    seeds = {split: sorted({int(r["seed"]) for r in finals if r["split"] == split}) for split in ("val", "test")}
    if not seeds["val"] or not seeds["test"]:
        raise ValueError(f"the stored run of benchmarks/{script} needs validation and test rows")
    groups: dict[tuple[str, tuple[str, int], float], dict[int, float]] = {}
    for r in finals:
        key = (r["split"], (r["norm"], int(r["batch"])), float(r["lr"]))
        groups.setdefault(key, {})[int(r["seed"])] = stored_number(r["last_return"], "last_return", script)
    val: dict[tuple[str, int], dict[float, np.ndarray]] = {}
    test: dict[tuple[tuple[str, int], float], np.ndarray] = {}
    for (split, arm, lr), by_seed in sorted(groups.items()):
        if sorted(by_seed) != seeds[split]:
            raise ValueError(f"the stored run of benchmarks/{script} lacks seeds of {split} {arm} at lr {lr}")
        values = np.array([by_seed[s] for s in seeds[split]])
        if split == "val":
            val.setdefault(arm, {})[lr] = values
        else:
            test[arm, lr] = values
    bins: dict[tuple[str, tuple[str, int], float], dict[int, dict[int, float]]] = {}
    for r in curve_rows:
        key = (r["split"], (r["norm"], int(r["batch"])), float(r["lr"]))
        bins.setdefault(key, {}).setdefault(int(r["seed"]), {})[int(r["step"])] = stored_number(r["mean_return"],
                                                                                               "mean_return", script)
    if set(bins) != set(groups):
        raise ValueError(f"the stored run of benchmarks/{script} has curves for other runs than its final results")
    curves = {}
    wanted = list(range(every, steps + 1, every))
    for key, by_seed in sorted(bins.items()):
        if sorted(by_seed) != seeds[key[0]] or any(sorted(b) != wanted for b in by_seed.values()):
            raise ValueError(f"the stored run of benchmarks/{script} has an incomplete curve for {key}")
        curves[key] = np.array([[by_seed[s][step] for step in wanted] for s in seeds[key[0]]])
    return StoredStreamRun(head, steps, every, last, seeds["val"], seeds["test"], val, test, curves)


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
          batch_size: int, seeds: Sequence[int], weight_decay: float = 0.0, fresh: bool = False) -> RefitHistory:
    """Train every member of ``model`` (an MLP with one output, stacked by
    :func:`lnbook.seeds.stack`) on ``targets[0]``, then ``targets[1]`` and on, ``steps`` Adam steps of mean squared error each, on mini-batches of ``batch_size`` of the
    inputs ``x (n, ...)`` (member ``s``'s drawn by a generator seeded with ``seeds[s]``),
    without resetting the network or the optimizer between tasks: Lyle et al.'s test of
    plasticity. Returns a :class:`RefitHistory`.

    ``weight_decay > 0``: AdamW (decoupled weight decay, Loshchilov and Hutter) on every
    parameter, LayerNorm's gain and bias included: Lyle et al.'s LayerNorm *with* weight decay.
    ``fresh``: the control: before every task the network returns to its initial weights and
    the optimizer starts afresh, so task ``k``'s fit is what a new network reaches on task
    ``k``'s targets (with the same batches); a trained network's fit minus this one is its loss
    of plasticity, free of how hard each task's targets are."""
    members = _members(model)
    check_positive_int(steps, "steps")
    check_positive_int(batch_size, "batch_size")
    check_number(lr, "lr", "a positive number", lambda v: v > 0)
    check_number(weight_decay, "weight_decay", "a number >= 0", lambda v: v >= 0)
    if not isinstance(fresh, bool):
        raise TypeError(f"fresh must be True or False, got {describe(fresh)}")
    if targets.ndim != 2 or targets.shape[1] != len(x):
        raise ValueError(f"targets must be (tasks, {len(x)}), got {describe(targets)}")
    if len(seeds) != members:
        raise ValueError(f"seeds must have one entry per member ({members}), got {describe(seeds)}")
    def new_optimizer() -> torch.optim.Optimizer:
        if weight_decay > 0:
            return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        return torch.optim.Adam(model.parameters(), lr=lr)

    optimizer = new_optimizer()
    initial = copy.deepcopy(model.state_dict()) if fresh else None
    device = next(model.parameters()).device
    x, targets = x.to(device), targets.to(device)
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    fit, dead, norms = [], [], []
    model.train()
    for k, y in progress(enumerate(targets), "tasks", total=len(targets)):
        if fresh and k > 0:
            model.load_state_dict(initial)
            optimizer = new_optimizer()
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


PLASTICITY_TARGETS = {"re-drawn": 0.0, "moving mean": 1.0}  # each task's targets: fresh N(0, 1) + shift * task


def refit_job(norm: str, targets: str, weight_decay: float, fresh: bool, seeds: Sequence[int], *, steps: int,
              tasks: int, lr: float = 1e-3, n: int = 512, hidden: tuple[int, ...] = (128, 128)) -> RefitHistory:
    """Chapter 09's plasticity test as one stack: an :class:`~lnbook.models.MLP` 64 -> ``hidden``
    -> 1 with ``norm`` (one member per seed, each built after ``seed_everything(seed)``) refitted
    by :func:`refit` to ``tasks`` targets of ``n`` training digits' 64 pixels, ``steps`` steps of
    batches of 64 each, the targets :func:`shifted_targets` with the shift
    ``PLASTICITY_TARGETS[targets]`` (seed 0); ``weight_decay`` and ``fresh`` as :func:`refit`
    takes them (``benchmarks/plasticity.py`` runs these on workers)."""
    from .data import digits_sequences
    from .utils import seed_everything

    if targets not in PLASTICITY_TARGETS:
        raise ValueError(f"targets must be one of {tuple(PLASTICITY_TARGETS)}, got {describe(targets)}")
    (x, _), _ = digits_sequences("pixel")
    x = x[:n].flatten(1)
    nets = []
    for seed in seeds:
        seed_everything(int(seed))
        nets.append(MLP(x.shape[1], hidden, 1, norm))
    model = seed_axis.stack(nets)
    y = shifted_targets(n, tasks, PLASTICITY_TARGETS[targets], seed=0)
    return refit(model, x, y, steps=steps, lr=lr, batch_size=64, seeds=[int(s) for s in seeds],
                 weight_decay=weight_decay, fresh=fresh)


@dataclass
class StoredPlasticity:
    """The stored plasticity run of ``benchmarks/plasticity.py``. Per ``(split, norm, weight
    decay, targets, mode)`` (mode ``"continual"``: one network through every task; ``"fresh"``:
    the control, a new network per task), ``fit``, ``dead`` and ``weight_norm`` as
    :class:`RefitHistory` holds them, ``(S, tasks)``; ``chosen[norm, targets]`` the weight decay
    chosen on validation for the weight-decay arms; the seeds of each split in ascending order."""

    provenance: list[str]
    steps: int
    tasks: int
    val_seeds: list[int]
    test_seeds: list[int]
    fit: dict[tuple[str, str, float, str, str], np.ndarray]
    dead: dict[tuple[str, str, float, str, str], np.ndarray]
    weight_norm: dict[tuple[str, str, float, str, str], np.ndarray]


def stored_plasticity(folder: Path | None = None) -> StoredPlasticity:
    """Read ``plasticity-tasks.csv`` that ``benchmarks/plasticity.py`` writes into
    ``lnbook/results/`` (or ``folder``), checked: every run with every seed of its split and
    every task."""
    from importlib.resources import files

    from .utils import stored_number, stored_rows

    where = files("lnbook") / "results" if folder is None else folder
    script = "plasticity.py"
    head, rows = stored_rows(where, "plasticity-tasks.csv", ["split", "norm", "weight_decay", "targets", "mode", "seed",
                                                              "task", "fit", "dead", "weight_norm", "steps"], script)
    steps = {int(r["steps"]) for r in rows}
    if len(steps) != 1:
        raise ValueError(f"the stored run of benchmarks/{script} mixes task lengths: {sorted(steps)}")
    seeds = {split: sorted({int(r["seed"]) for r in rows if r["split"] == split}) for split in ("val", "test")}
    tasks = max(int(r["task"]) for r in rows)
    cells: dict[tuple, dict[int, dict[int, tuple[float, float, float]]]] = {}
    for r in rows:
        key = (r["split"], r["norm"], float(r["weight_decay"]), r["targets"], r["mode"])
        cells.setdefault(key, {}).setdefault(int(r["seed"]), {})[int(r["task"])] = tuple(
            stored_number(r[c], c, script) for c in ("fit", "dead", "weight_norm"))
    out: dict[str, dict] = {"fit": {}, "dead": {}, "weight_norm": {}}
    for key, by_seed in sorted(cells.items()):
        if sorted(by_seed) != seeds[key[0]] or any(sorted(t) != list(range(1, tasks + 1)) for t in by_seed.values()):
            raise ValueError(f"the stored run of benchmarks/{script} is incomplete for {key}")
        values = np.array([[by_seed[s][t] for t in range(1, tasks + 1)] for s in seeds[key[0]]])  # (S, tasks, 3)
        for i, name in enumerate(("fit", "dead", "weight_norm")):
            out[name][key] = values[..., i]
    return StoredPlasticity(head, steps.pop(), tasks, seeds["val"], seeds["test"], out["fit"], out["dead"],
                            out["weight_norm"])
