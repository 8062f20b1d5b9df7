"""Chapter 09's DQN on CartPole evaluated through training: greedy return every ``--every`` steps,
averaged over the last ``--last-evals`` evaluations, with and without a target network.

    PYTHONPATH=src python benchmarks/dqn_rl.py                                     # the stored run
    PYTHONPATH=src python benchmarks/dqn_rl.py --steps 200 --every 100 --last-evals 2 --val-seeds 2 \\
        --test-seeds 2 --arms "none:no target network" --out /tmp/x               # a smoke run

Each arm is a norm in the Q-network (``lnbook.models.MLP`` 4 -> 64 -> 64 -> 2, the norm before each
ReLU: none, LayerNorm, BatchNorm) and a regime of ``lnbook.rl.DQN_REGIMES``: DQN as chapter 09
runs it (a target network refreshed every 250 steps, one Adam step on 64 replayed transitions
every second step), or the same without a target network (the target from the Q-network itself,
without gradient: the regime where Gallici et al. (2024, PQN) find LayerNorm makes TD learning
stable). Every arm runs every learning rate of ``--lrs`` on the validation seeds 100, 101, ...
(one stack per arm, ``lnbook.rl.dqn_job``); each arm's rate is chosen on validation (the highest
mean greedy return over the last evaluations), and only that rate runs on the test seeds 0, 1,
... (one stack; ``--test-seeds 0`` runs validation only, as for rates added to a stored grid).
Greedy evaluations: 3 episodes per agent from fixed starts. Two worker processes of one thread
each. It writes, with provenance as leading ``#`` lines:

- ``dqn_rl-final.csv``: split, norm, regime, lr, seed, the mean greedy return over the last
  ``--last-evals`` evaluations, the mean return of the training episodes that ended in the same
  steps, and the run's lengths;
- ``dqn_rl-curves.csv``: split, norm, regime, lr, seed, step, the greedy return evaluated there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from sigmoid_full import RESULTS, provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import compare, rl, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--last-evals", type=int, default=4)
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3])
    parser.add_argument("--val-seeds", type=int, default=5)
    parser.add_argument("--test-seeds", type=int, default=10)
    parser.add_argument("--arms", nargs="+", default=[f"{n}:{r}" for n, r in rl.DQN_ARMS])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.steps < 1 or args.every < 1 or args.steps % args.every or not 0 < args.last_evals <= args.steps // args.every:
        parser.error("--steps must be a positive multiple of --every, and --last-evals at most the evaluations")
    arms = [tuple(a.split(":", 1)) for a in args.arms]
    torch.set_num_threads(1)
    val_seeds, test_seeds = list(range(100, 100 + args.val_seeds)), list(range(args.test_seeds))
    workers = train.cpu_workers(2)
    finals = ["split,norm,regime,lr,seed,greedy_last,training_last,steps,every,last_evals"]
    curves = ["split,norm,regime,lr,seed,step,greedy"]
    window = args.every * args.last_evals

    def record(split: str, arm: tuple[str, str], rates: list[float], members: list[int], history: rl.DQNHistory) -> np.ndarray:
        greedy = rl.last_greedy(history, args.last_evals)
        training = rl.mean_return_window(history, args.steps - window, args.steps)
        for i, (lr, seed) in enumerate(zip(rates, members)):
            trained = "" if np.isnan(training[i]) else f"{training[i]:.4f}"
            finals.append(f"{split},{arm[0]},{arm[1]},{lr:g},{seed},{greedy[i]:.4f},{trained},{args.steps},{args.every},"
                          f"{args.last_evals}")
            for step, v in zip(history.eval_steps, history.greedy[i]):
                curves.append(f"{split},{arm[0]},{arm[1]},{lr:g},{seed},{step},{v:.4f}")
        return greedy

    def run(jobs: list[tuple]) -> list:
        if workers is None:
            return [rl.dqn_job(*job) for job in jobs]
        futures = [workers.submit(rl.dqn_job, *job) for job in jobs]
        return [f.result() for f in futures]

    start = time.perf_counter()
    validation = {}
    for arm, (rates, members, history) in zip(arms, run([(n, r, args.lrs, val_seeds, args.steps, args.every) for n, r in arms])):
        greedy = record("val", arm, rates, members, history)
        validation[":".join(arm)] = {lr: greedy[[i for i, r in enumerate(rates) if r == lr]] for lr in args.lrs}
        print(f"validation {arm}: " + ", ".join(f"lr {lr:g} {v.mean():.1f}" for lr, v in validation[':'.join(arm)].items()),
              f"({time.perf_counter() - start:.0f} s so far)", flush=True)
    chosen = compare.select(validation, lambda arm, lr: [0.0], higher=True).setting
    tested = run([(n, r, [chosen[f"{n}:{r}"]], test_seeds, args.steps, args.every) for n, r in arms]) if test_seeds else []
    for arm, (rates, members, history) in zip(arms, tested):
        greedy = record("test", arm, rates, members, history)
        print(f"test {arm} at lr {rates[0]:g}: greedy {greedy.mean():.1f} (mean over seeds)", flush=True)
    wall = time.perf_counter() - start
    print(f"wall time {wall:.0f} s")
    head = provenance(f"DQN on CartPole-v1; arms (norm:regime) {args.arms}; lrs {args.lrs}; validation seeds {val_seeds}, "
                      f"test seeds {test_seeds}; {args.steps} steps per agent; greedy return (3 episodes) every {args.every} "
                      f"steps, averaged over the last {args.last_evals}; wall time {wall:.0f} s")
    write_tables(args.out, head, {"dqn_rl-final.csv": finals, "dqn_rl-curves.csv": curves})
    if workers is not None:
        workers.shutdown()


if __name__ == "__main__":
    main()
