"""Chapter 05's digits runs (LSTM, BN-LSTM, LN-LSTM; GRU, BN-GRU, LN-GRU) for 20 epochs over a
wider learning-rate grid, once, outside the notebook (which trains them for 5 epochs at three rates).

    PYTHONPATH=src python benchmarks/digits_long.py
    PYTHONPATH=src python benchmarks/digits_long.py --epochs 2 --seeds 2 --out /tmp/x   # a smoke run

Exactly the chapter's setup otherwise: the 8x8 digits as 16 steps of 4 pixels
(``lnbook.data.digits_sequences("pixel", permute=...)``, ``lnbook.data.as_steps(d, 4)``), the
training split cut by ``lnbook.data.validation_split`` into a fit part (trained on) and a
validation part (it chooses the rate), the test split for the final score; a
``lnbook.rnn.SequenceClassifier`` over ``lnbook.rnn.LSTMCell(4, 64, norm, max_steps=16)`` or
``lnbook.rnn.GRUCell(...)`` with norm "none", "batch" and "layer"; Adam, batches of 64,
gradients clipped to norm 1.0, one CPU thread per job. Each arm is ONE stacked job of every seed
at every rate (``lnbook.cell_study.grid``, ``lnbook.seeds.start_runs``), two jobs at a time:

- LSTM arms, sequential digits: rates 0.001, 0.003, 0.01, 0.03, 0.1, seeds 0 to ``--seeds`` - 1;
- LSTM arms, permuted digits: the same rates, seeds 0 to min(``--seeds``, 5) - 1;
- GRU arms, sequential digits: rates 0.003, 0.01, 0.03, seeds 0 to min(``--seeds``, 5) - 1.

It writes, with provenance (machine, commit, date, command, versions) as leading ``#`` lines:

- ``digits_long-curves.csv``: task, arm, lr, seed, epoch, val_acc: the validation accuracy after
  every epoch (BatchNorm with its moving averages);
- ``digits_long-final.csv``: task, arm, lr, seed, val_acc, test_acc after the last epoch
  (BatchNorm with its moving averages), val_acc_population, test_acc_population: the BN arms'
  with population statistics estimated over the fit part
  (``lnbook.cell_study.with_population_statistics``; empty for the other arms), and
  updates_to_1: the updates until the 10-update mean training loss is below 1.0
  (``lnbook.train.updates_to``; empty if never). A diverged member (a non-finite training loss)
  has nan scores.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from sigmoid_full import RESULTS, provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import cell_study, data, rnn, seeds, train

NORMS = {"": "none", "BN-": "batch", "LN-": "layer"}  # arm prefix -> norm
CELLS = {"LSTM": rnn.LSTMCell, "GRU": rnn.GRUCell}
PIXELS, STEPS, HIDDEN, BATCH = 4, 16, 64, 64
WIDE_LRS, GRU_LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1), (3e-3, 1e-2, 3e-2)
SMALL = 5  # the permuted task's and the GRUs' seeds, at most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.epochs < 1 or args.seeds < 1:
        parser.error("--epochs and --seeds must be at least 1")
    torch.set_num_threads(1)
    tasks = {}  # name: (fit, validation, test)
    for name, permute in (("sequential", False), ("permuted", True)):
        train_set, test_set = (data.as_steps(d, PIXELS) for d in data.digits_sequences("pixel", permute=permute))
        tasks[name] = (*data.validation_split(train_set), test_set)
    many, few = range(args.seeds), range(min(args.seeds, SMALL))
    runs = [("sequential", "LSTM", WIDE_LRS, many), ("permuted", "LSTM", WIDE_LRS, few), ("sequential", "GRU", GRU_LRS, few)]
    fit_set, val_set, test_set = tasks["sequential"]
    head = provenance(
        f"{args.epochs} epochs of {-(-len(fit_set[1]) // BATCH)} updates; " + "; ".join(
            f"{cell} arms on {task} digits: lr {list(lrs)}, seeds 0-{len(s) - 1}" for task, cell, lrs, s in runs)
        + f"; {STEPS} steps of {PIXELS} pixels, hidden {HIDDEN}, batches of {BATCH}, Adam, grad clip 1.0; "
        f"{len(fit_set[1])} fit, {len(val_set[1])} validation, {len(test_set[1])} test digits")
    workers = train.cpu_workers(2)
    start = time.perf_counter()
    queued = {}  # (task, arm, lrs): one future per member
    for task, cell, lrs, member_range in runs:
        member_seeds, rates = cell_study.grid(lrs, member_range)
        for prefix, norm in NORMS.items():
            queued[task, prefix + cell, norm, tuple(rates), tuple(member_seeds)] = seeds.start_runs(
                lambda c=CELLS[cell], n=norm: rnn.SequenceClassifier(c(PIXELS, HIDDEN, n, max_steps=STEPS), 10),
                member_seeds, workers, fit=seeds.fit, train=tasks[task][0], test=tasks[task][1], lr=rates,
                epochs=args.epochs, batch_size=BATCH, grad_clip=1.0)
    curves = ["task,arm,lr,seed,epoch,val_acc"]
    final = ["task,arm,lr,seed,val_acc,test_acc,val_acc_population,test_acc_population,updates_to_1"]
    for (task, arm, norm, rates, member_seeds), futures in queued.items():
        fit, val, test = tasks[task]
        out = [f.result() for f in futures]
        diverged = 0
        for (model, hist), lr, s in zip(out, rates, member_seeds):
            curves += [f"{task},{arm},{lr},{s},{e},{acc:.6f}" for e, acc in enumerate(hist.test_acc, 1)]
            scores = [math.nan] * (4 if norm == "batch" else 2)
            reached = None
            if all(math.isfinite(v) for v in hist.step_loss):
                scores = [train.accuracy(model, split) for split in (val, test)]
                if norm == "batch":
                    pop = cell_study.with_population_statistics(model, fit)
                    scores += [train.accuracy(pop, split) for split in (val, test)]
                reached = train.updates_to(hist)
            else:
                diverged += 1
            final.append(f"{task},{arm},{lr},{s}," + ",".join(f"{v:.6f}" for v in scores)
                         + ("" if norm == "batch" else ",,") + f",{'' if reached is None else reached}")
        print(f"{task} {arm}: {len(out)} members done at {time.perf_counter() - start:.0f} s; diverged: {diverged}",
              flush=True)
    if workers is not None:
        workers.shutdown()
    write_tables(args.out, head, {"digits_long-curves.csv": curves, "digits_long-final.csv": final})


if __name__ == "__main__":
    main()
