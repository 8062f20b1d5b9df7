"""Chapter 09's section 5, the ten norms on one MLP and one LSTM, with each arm at its own best
learning rate of a grid (``lnbook.beyond_study.SWEEP_RATES``: SGD 0.003 to 0.3 for the MLP, Adam
0.001 to 0.1 for the LSTM) chosen on validation, and trained four times the epochs the chapter
could afford.

    PYTHONPATH=src python benchmarks/norm_sweep.py
    PYTHONPATH=src python benchmarks/norm_sweep.py --arms none layer --mlp-epochs 2 --lstm-epochs 2 --seeds 2 --out /tmp/x  # smoke

Every arm of ``lnbook.beyond_study.MLP_ARMS`` (MLP, 64 pixels, 3 hidden layers of 64, SGD with
momentum 0.9) and ``LSTM_ARMS`` (16 steps of 4 pixels, hidden size 64, Adam, gradient norm
clipped at 1), built by ``beyond_study.make_mlp`` / ``make_lstm`` (the data-dependent
initialization sees the first 512 digits of the fit part). The training digits split into a fit
part and a validation part (``lnbook.data.validation_split``); the test digits are scored, never
used to choose. ``beyond_study.train_norm_arm``: every rate x seed of one arm is one stacked
model (members with the same seed start from the same weights and see the same batches of 64),
one job, on two worker processes of one thread each; after every epoch the validation and test
accuracy (eval mode) and the epoch's mean training loss.

Writes, with provenance (machine, commit, date, command, versions, setting) as leading ``#``
lines, into ``--out`` (by default ``src/lnbook/results/``, shipped with the package):
``norm_sweep-curves.csv``, per (net, arm, lr, seed, epoch) the updates so far, the epoch's mean
training loss, and the validation and test accuracy after it; ``norm_sweep-final.csv``, per
(net, arm, lr, seed) the update at which the 10-update mean of the training loss first fell
below 1.0 (empty: never). Reader: ``lnbook.beyond_study.stored_norm_sweep``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from sigmoid_full import provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import beyond_study, train

RESULTS = Path(__file__).resolve().parents[1] / "src" / "lnbook" / "results"
ARMS = {"mlp": beyond_study.MLP_ARMS, "lstm": beyond_study.LSTM_ARMS}


def run(job: dict) -> dict:
    """One (net, arm): every rate x seed in one stack. A worker's unit."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    sets = beyond_study.norm_sweep_data()[job["net"]]
    out = beyond_study.train_norm_arm(job["net"], job["arm"], job["lrs"], job["seeds"], job["epochs"], sets)
    out["seconds"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nets", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--arms", nargs="+", default=None, help="only these arms (default: every arm of each net)")
    parser.add_argument("--mlp-epochs", type=int, default=20)  # the chapter's 5, four times over
    parser.add_argument("--lstm-epochs", type=int, default=12)  # the chapter's 3, four times over
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    epochs = {"mlp": args.mlp_epochs, "lstm": args.lstm_epochs}
    seed_list = list(range(args.seeds))
    jobs = [dict(net=net, arm=arm, lrs=beyond_study.SWEEP_RATES[net], seeds=seed_list, epochs=epochs[net])
            for net in sorted(args.nets) for arm in ARMS[net] if args.arms is None or arm in args.arms]
    sizes = beyond_study.norm_sweep_data()["mlp"]
    head = provenance(f"section 5's MLP (SGD, momentum 0.9) and LSTM (Adam, grad clip 1); arms {[(j['net'], j['arm']) for j in jobs]}; "
                      f"lr {dict((n, beyond_study.SWEEP_RATES[n]) for n in args.nets)}; seeds 0-{args.seeds - 1}; epochs {dict((n, epochs[n]) for n in args.nets)}; "
                      f"batches of 64 of the fit split ({len(sizes['fit'][1])} digits; validation {len(sizes['val'][1])}, "
                      f"test {len(sizes['test'][1])}); accuracy in eval mode after every epoch")
    workers = train.cpu_workers(2)
    start = time.perf_counter()
    futures = [workers.submit(run, job) for job in jobs] if workers is not None else None
    curves = ["net,arm,lr,seed,epoch,updates,train_loss,val_acc,test_acc"]
    final = ["net,arm,lr,seed,to_loss_1"]
    for i, job in enumerate(jobs):
        out = futures[i].result() if futures is not None else run(job)
        per_epoch = int(out["per_epoch"])
        for m in range(len(job["lrs"]) * len(seed_list)):
            lr, s = job["lrs"][m // len(seed_list)], seed_list[m % len(seed_list)]
            curves += [f"{job['net']},{job['arm']},{lr},{s},{e + 1},{(e + 1) * per_epoch},{out['loss'][m, e]:.6g},"
                       f"{out['val'][m, e]:.6f},{out['test'][m, e]:.6f}" for e in range(job["epochs"])]
            reached = out["to_loss_1"][m]
            final.append(f"{job['net']},{job['arm']},{lr},{s},{'' if np.isnan(reached) else int(reached)}")
        print(f"{job['net']} {job['arm']}: {out['seconds']:.0f} s in its worker, {time.perf_counter() - start:.0f} s since the start",
              flush=True)
    if workers is not None:
        workers.shutdown()
    write_tables(args.out, head, {"norm_sweep-curves.csv": curves, "norm_sweep-final.csv": final})
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
