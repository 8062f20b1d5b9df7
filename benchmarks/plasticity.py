"""Chapter 09's plasticity test as Lyle et al. (2024) state their claim: LayerNorm *with weight
decay* keeps a network able to fit new targets. One MLP (64 pixels of 512 training digits in,
two hidden layers of 128, the norm before each ReLU, one output) is refitted to a new regression
target per task, ``--tasks`` tasks of ``--steps`` Adam steps (batches of 64, lr 1e-3) each,
without resetting the network or the optimizer.

    PYTHONPATH=src python benchmarks/plasticity.py                                 # the stored run
    PYTHONPATH=src python benchmarks/plasticity.py --steps 20 --tasks 2 --val-seeds 2 --test-seeds 2 \\
        --wds 0.1 --out /tmp/x                                                    # a smoke run

Arms: no norm and LayerNorm, each without weight decay (Adam) and with it (AdamW, decoupled,
every parameter), on two kinds of targets (``lnbook.rl.PLASTICITY_TARGETS``: re-drawn N(0, 1)
values per task, or the same with the mean moving up by 1 per task). Each arm runs twice:
``continual`` (one network through every task) and ``fresh`` (the control: back to the initial
weights and a new optimizer before every task, so that each task's fit is what a new network
reaches on that task's targets). The weight decay of each weight-decay arm is chosen from
``--wds`` on the validation seeds 100, 101, ... (the lowest mean fit over all tasks of the
continual run, per norm and kind of targets); the test seeds 0, 1, ... run every arm at that
value. One stack of seeds per run (``lnbook.rl.refit_job``), two worker processes of one thread
each. It writes ``plasticity-tasks.csv``, with provenance as leading ``#`` lines: split, norm,
weight decay, targets, mode, seed, task (from 1), the fit after the task (MSE over the variance
of its targets), the share of dead ReLU units, the norm of the weights, and the task length.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from sigmoid_full import RESULTS, provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import compare, rl, train

NORMS = ("none", "layer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--wds", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--val-seeds", type=int, default=3)
    parser.add_argument("--test-seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.steps < 1 or args.tasks < 1 or min(args.wds) <= 0:
        parser.error("--steps and --tasks must be positive, --wds positive")
    torch.set_num_threads(1)
    val_seeds, test_seeds = list(range(100, 100 + args.val_seeds)), list(range(args.test_seeds))
    workers = train.cpu_workers(2)
    rows = ["split,norm,weight_decay,targets,mode,seed,task,fit,dead,weight_norm,steps"]

    def run(jobs: list[tuple]) -> list[rl.RefitHistory]:
        kw = dict(steps=args.steps, tasks=args.tasks)
        if workers is None:
            return [rl.refit_job(*job, **kw) for job in jobs]
        futures = [workers.submit(rl.refit_job, *job, **kw) for job in jobs]
        return [f.result() for f in futures]

    def record(split: str, job: tuple, history: rl.RefitHistory) -> None:
        norm, targets, wd, fresh, seeds = job
        for i, seed in enumerate(seeds):
            for k in range(args.tasks):
                rows.append(f"{split},{norm},{wd:g},{targets},{'fresh' if fresh else 'continual'},{seed},{k + 1},"
                            f"{history.fit[i, k]:.6f},{history.dead[i, k]:.6f},{history.weight_norm[i, k]:.6f},{args.steps}")

    start = time.perf_counter()
    val_jobs = [(norm, targets, wd, False, val_seeds) for norm in NORMS for targets in rl.PLASTICITY_TARGETS
                for wd in args.wds]
    validation: dict[str, dict[float, np.ndarray]] = {}
    for job, history in zip(val_jobs, run(val_jobs)):
        record("val", job, history)
        validation.setdefault(f"{job[0]}:{job[1]}", {})[job[2]] = history.fit.mean(1)
    chosen = compare.select(validation, lambda arm, wd: [0.0], higher=False).setting
    print("weight decay chosen on validation:", chosen, f"({time.perf_counter() - start:.0f} s so far)", flush=True)
    test_jobs = [(norm, targets, wd, fresh, test_seeds) for norm in NORMS for targets in rl.PLASTICITY_TARGETS
                 for wd in (0.0, chosen[f"{norm}:{targets}"]) for fresh in (False, True)]
    for job, history in zip(test_jobs, run(test_jobs)):
        record("test", job, history)
        print(f"test {job[:4]}: fit per task {np.round(history.fit.mean(0), 3).tolist()}", flush=True)
    wall = time.perf_counter() - start
    print(f"wall time {wall:.0f} s")
    head = provenance(f"plasticity: MLP 64-128-128-1 (none, layer) refitted to {args.tasks} tasks of {args.steps} Adam/AdamW "
                      f"steps, lr 1e-3, batches of 64, 512 digits; weight decays {args.wds} chosen on validation seeds "
                      f"{val_seeds}; test seeds {test_seeds}; continual and fresh runs; wall time {wall:.0f} s")
    write_tables(args.out, head, {"plasticity-tasks.csv": rows})
    if workers is not None:
        workers.shutdown()


if __name__ == "__main__":
    main()
