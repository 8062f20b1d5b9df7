"""Chapter 01's sigmoid networks (Ioffe and Szegedy's MNIST setting on the 8x8 digits) for the
paper's full 50,000 updates, once, outside the notebook (which trains them for 1,600).

    PYTHONPATH=src python benchmarks/sigmoid_full.py --lr-none 0.3 --lr-batch 0.03 0.1
    PYTHONPATH=src python benchmarks/sigmoid_full.py --updates 400 --out /tmp/x      # a smoke run

Both arms (no norm, BatchNorm before each sigmoid), ten seeds each, trained as one stack per
arm exactly as the notebook's sigmoid cell trains them (``lnbook.batchnorm_study.SigmoidMLP``,
weights N(0, 0.1^2), SGD with momentum 0.9, batches of 60 of the training split, the same seeds
and batch order), each arm at the learning rates given (every rate x every seed in one stack):
the notebook uses the rows at the rate its validation grid chose at 1,600 updates (the script
does not choose rates itself). It writes, with provenance (machine,
commit, date, command, versions) as leading ``#`` lines:

- ``sigmoid_full-curves.csv``: arm, lr, seed, update, validation accuracy, and the mean training
  loss over the 500 updates before it, every 500 updates;
- ``sigmoid_full-test.csv``: arm, lr, seed, and whether each of the 360 test digits is classified
  right after the last update (a string of 0/1 in test-set order), for a paired verdict over
  seeds and digits (``lnbook.compare.compare_items``).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lnbook import batchnorm_study as study
from lnbook import data, seeds

RESULTS = Path(__file__).resolve().parents[1] / "src" / "lnbook" / "results"  # shipped with the package
UPDATES_PER_EPOCH = 20  # 1,149 training digits in batches of 60


def provenance(setting: str) -> list[str]:
    """The leading lines of a result file: machine, commit, date, command, versions, and ``setting``."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [f"machine: {platform.node()}, {cpu}, 1 torch thread", f"commit: {commit}",
            f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
            f"command: python {' '.join(sys.argv)}", f"versions: python {platform.python_version()}, torch {torch.__version__}",
            setting]


def add_step_arguments(parser: argparse.ArgumentParser, every: int) -> None:
    """The options every character-model run shares: --steps, --every (evaluations), --seeds, --out."""
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=every)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)


def check_step_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject --steps, --every and --seeds that :func:`add_step_arguments`' runs cannot use."""
    if args.steps < 1 or args.every < 1 or args.steps % args.every:
        parser.error("--steps and --every must be positive, and --steps a multiple of --every")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")


def merged(out: Path, head: list[str], tables: dict[str, list[str]], rerun: set[tuple[str, ...]]) -> tuple[list[str], list[list[str]]]:
    """The stored files in ``out`` (``tables``' names) with the rows whose leading columns are one
    of the ``rerun`` keys (study and arm, say) replaced by ``tables``' new rows (the column names
    first); the stored provenance first, then this run's, marked as a rerun of those keys. A
    column added since is left empty in the kept rows."""
    width = len(next(iter(rerun)))
    merged_tables = []
    for name, new in tables.items():
        lines = (out / name).read_text().splitlines()
        old_head = [line[2:] for line in lines if line.startswith("# ")]
        columns, *rows = [line for line in lines if line and not line.startswith("#")]
        if columns != new[0]:
            added = [c for c in new[0].split(",") if c not in columns.split(",")]
            rows = [",".join(dict(zip(columns.split(","), r.split(","))).get(c, "") for c in new[0].split(",")) for r in rows]
            print(f"{name}: added the empty column(s) {added} to the kept rows")
        kept = [r for r in rows if tuple(r.split(",")[:width]) not in rerun]
        merged_tables.append([new[0], *kept, *new[1:]])
    keys = "; ".join(": ".join(k) for k in sorted(rerun))
    return old_head + [f"rerun of {keys}:"] + head, merged_tables


def write_tables(out: Path, head: list[str], tables: dict[str, list[str]]) -> None:
    """Write each table of ``tables`` (file name -> its rows, the column names first) to ``out``,
    after ``head``'s provenance lines as ``# `` lines."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        (out / name).write_text("".join(f"# {line}\n" for line in head) + "\n".join(rows) + "\n")
        print(f"wrote {out / name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr-none", type=float, nargs="+", default=[0.3])
    parser.add_argument("--lr-batch", type=float, nargs="+", default=[0.03, 0.1])
    parser.add_argument("--updates", type=int, default=50_000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.updates % UPDATES_PER_EPOCH or args.every % UPDATES_PER_EPOCH:
        parser.error(f"--updates and --every must be multiples of {UPDATES_PER_EPOCH} (updates per epoch)")
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as the notebook: subnormal gradients of the plain network are slow on a CPU
    (x_train, y_train), (x_test, y_test) = data.digits_sequences("pixel")
    fit_set, val_set = data.validation_split((x_train.flatten(1), y_train))
    test_set = (x_test.flatten(1), y_test)
    head = provenance(f"arms: no norm at lr {args.lr_none}, BatchNorm at lr {args.lr_batch}; seeds 0-{args.seeds - 1}; "
                      f"{args.updates} updates of batches of 60")
    curves, tests = ["arm,lr,seed,update,val_acc,train_loss"], ["arm,lr,seed,right"]
    seed_list = list(range(args.seeds))
    for norm, rates in (("none", args.lr_none), ("batch", args.lr_batch)):
        start = time.perf_counter()
        members = seed_list * len(rates)
        model = seeds.stack([study.SigmoidMLP(64, (100, 100, 100), 10, norm, std=0.1, seed=s) for s in members])
        hist, scored = study.fit_scored(model, fit_set, val_set, test_set, epochs=args.updates // UPDATES_PER_EPOCH,
                                        batch_size=60, lr=[lr for lr in rates for _ in seed_list], seeds=members,
                                        eval_every=args.every, items=True)
        for m, h in enumerate(hist):
            lr, s = rates[m // len(seed_list)], members[m]
            loss = np.asarray(h.step_loss)
            for k, acc in enumerate(h.test_acc):
                stop = (k + 1) * args.every
                curves.append(f"{norm},{lr},{s},{stop},{acc:.6f},{loss[stop - args.every:stop].mean():.6g}")
            tests.append(f"{norm},{lr},{s}," + "".join(str(int(v)) for v in scored[args.updates // UPDATES_PER_EPOCH][m]))
        print(f"{norm}: {args.updates} updates in {time.perf_counter() - start:.0f} s; final validation accuracy "
              f"{np.mean([h.test_acc[-1] for h in hist]):.4f}", flush=True)
    write_tables(args.out, head, {"sigmoid_full-curves.csv": curves, "sigmoid_full-test.csv": tests})


if __name__ == "__main__":
    main()
