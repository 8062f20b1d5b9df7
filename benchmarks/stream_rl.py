"""Chapter 09's streaming reinforcement learning: Stream Q(λ) (Elsayed et al., 2024) on CartPole,
learning from each transition once as it comes (no replay buffer, no target network), with and
without LayerNorm in the Q-network, and BatchNorm where it can run at all.

    PYTHONPATH=src python benchmarks/stream_rl.py                                  # the stored run
    PYTHONPATH=src python benchmarks/stream_rl.py --steps 40 --every 20 --last 20 --val-seeds 2 \\
        --test-seeds 2 --arms none:1 batch:2 --out /tmp/x                         # a smoke run

Each arm is a Q-network (``lnbook.rl.stream_agents``: 4 -> 32 -> 32 -> 2, leaky ReLU, stream-x's
sparse initialization) with no norm (``none``), stream-x's LayerNorm without gain or bias
(``layer_simple``) or BatchNorm (``batch``) before each activation, trained by
``lnbook.rl.stream_q`` (ObGD with eligibility traces, λ = 0.8, κ = 2, observations normalized
and rewards scaled as stream-x does) with updates on batches of 1 or 2 consecutive
transitions of the agent's own stream (BatchNorm needs 2 or more; ``--arms`` takes any batch size). Every arm runs every
learning rate of ``--lrs`` on the validation seeds 100, 101, ... (one stack per arm, rates and
seeds as members); each arm's rate is chosen on validation (the highest mean training return
over the last ``--last`` steps, ``lnbook.compare.select``), and only that rate runs on the test
seeds 0, 1, ... (one stack). Two worker processes of one thread each. It writes, with
provenance as leading ``#`` lines:

- ``stream_rl-final.csv``: split, norm, batch, lr, seed, the mean return of the training episodes
  that ended in the last ``--last`` steps (empty when none ended), and the run's lengths;
- ``stream_rl-curves.csv``: split, norm, batch, lr, seed, step, the mean return of the episodes
  that ended in the ``--every`` steps up to ``step`` (empty when none ended).
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
    parser.add_argument("--steps", type=int, default=15_000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--last", type=int, default=5000)
    parser.add_argument("--explore-steps", type=int, default=1000)
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    parser.add_argument("--val-seeds", type=int, default=5)
    parser.add_argument("--test-seeds", type=int, default=10)
    parser.add_argument("--arms", nargs="+", default=[f"{n}:{b}" for n, b in rl.STREAM_ARMS])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.steps < 1 or args.every < 1 or args.steps % args.every or args.last % args.every or not 0 < args.last <= args.steps:
        parser.error("--steps and --last must be positive multiples of --every, --last at most --steps")
    arms = [(a.split(":")[0], int(a.split(":")[1])) for a in args.arms]
    torch.set_num_threads(1)
    val_seeds, test_seeds = list(range(100, 100 + args.val_seeds)), list(range(args.test_seeds))
    workers = train.cpu_workers(2)
    submit = (lambda f, *a: workers.submit(f, *a)) if workers is not None else None
    finals = ["split,norm,batch,lr,seed,last_return,steps,every,last"]
    curves = ["split,norm,batch,lr,seed,step,mean_return"]

    def record(split: str, arm: tuple[str, int], rates: list[float], members: list[int], history: rl.StreamHistory) -> np.ndarray:
        last = rl.mean_return_window(history, args.steps - args.last, args.steps)
        curve = rl.return_curve(history, args.every, args.steps)
        for i, (lr, seed) in enumerate(zip(rates, members)):
            value = "" if np.isnan(last[i]) else f"{last[i]:.4f}"
            finals.append(f"{split},{arm[0]},{arm[1]},{lr:g},{seed},{value},{args.steps},{args.every},{args.last}")
            for j, v in enumerate(curve[i]):
                curves.append(f"{split},{arm[0]},{arm[1]},{lr:g},{seed},{(j + 1) * args.every},{'' if np.isnan(v) else f'{v:.4f}'}")
        return last

    def run(jobs: list[tuple]) -> list:
        if submit is None:
            return [rl.stream_job(*job) for job in jobs]
        futures = [submit(rl.stream_job, *job) for job in jobs]
        return [f.result() for f in futures]

    start = time.perf_counter()
    validation = {}
    for arm, (rates, members, history) in zip(arms, run([(n, b, args.lrs, val_seeds, args.steps, args.explore_steps)
                                                         for n, b in arms])):
        last = record("val", arm, rates, members, history)
        validation[f"{arm[0]}:{arm[1]}"] = {lr: last[[i for i, r in enumerate(rates) if r == lr]] for lr in args.lrs}
        print(f"validation {arm}: " + ", ".join(f"lr {lr:g} {np.nanmean(v):.1f}" for lr, v in validation[f'{arm[0]}:{arm[1]}'].items()),
              f"({time.perf_counter() - start:.0f} s so far)", flush=True)
    chosen = compare.select(validation, lambda arm, lr: [0.0], higher=True, diverged="worst").setting  # NaN: worst
    tested = run([(n, b, [chosen[f"{n}:{b}"]], test_seeds, args.steps, args.explore_steps) for n, b in arms])
    for arm, (rates, members, history) in zip(arms, tested):
        last = record("test", arm, rates, members, history)
        print(f"test {arm} at lr {rates[0]:g}: {np.nanmean(last):.1f} (mean over seeds)", flush=True)
    wall = time.perf_counter() - start
    print(f"wall time {wall:.0f} s")
    head = provenance(f"Stream Q(lambda) on CartPole-v1; arms (norm:batch) {args.arms}; lrs {args.lrs}; "
                      f"validation seeds {val_seeds}, test seeds {test_seeds}; {args.steps} steps per agent, "
                      f"explore_steps {args.explore_steps}; return over the last {args.last} steps; wall time {wall:.0f} s")
    write_tables(args.out, head, {"stream_rl-final.csv": finals, "stream_rl-curves.csv": curves})
    if workers is not None:
        workers.shutdown()


if __name__ == "__main__":
    main()
