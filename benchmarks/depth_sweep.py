"""Chapter 01's ReLU MLP at depth 3, 10 and 20 (hidden layers of 64): the depth claim the seed
texts credit BatchNorm with ("deeper networks train more reliably"), outside the notebook, which
cannot afford it.

    PYTHONPATH=src python benchmarks/depth_sweep.py
    PYTHONPATH=src python benchmarks/depth_sweep.py --depths 3 --epochs 2 --seeds 2 --out /tmp/x   # a smoke run

Four arms at every depth, exactly as the notebook's sweep builds and trains them: no norm with
PyTorch's default initialization, no norm with He initialization, BatchNorm and LayerNorm before
each ReLU (``lnbook.models.MLP``); ten seeds each, every learning rate x seed of an (arm, depth)
in one stack (``lnbook.seeds``); SGD with momentum 0.9, batches of 64 of the training split,
validation accuracy after every epoch, the test digits scored after the last. One CPU thread.
It writes ``depth_sweep.csv`` with provenance (machine, commit, date, command, versions) as
leading ``#`` lines, one row per (depth, arm, lr, seed): the validation accuracy after the last
epoch (to choose each arm's rate on), the updates to a training loss of 0.5 (empty: never), the
last epoch's mean training loss, the weight-gradient norm of every linear layer at
initialization (``lnbook.models.layer_stats`` on 256 training digits, ``;``-separated), and
whether each test digit is classified right after the last epoch (0/1 in test-set order).
By default into ``src/lnbook/results/``, which ships with the package.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from sigmoid_full import provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import batchnorm_study as study
from lnbook import data, models, seeds, train

RESULTS = Path(__file__).resolve().parents[1] / "src" / "lnbook" / "results"
ARMS = {"none": ("none", "default"), "none_he": ("none", "he"), "batch": ("batch", "default"), "layer": ("layer", "default")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[3, 10, 20])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    (x_train, y_train), (x_test, y_test) = data.digits_sequences("pixel")
    fit_set, val_set = data.validation_split((x_train.flatten(1), y_train))
    test_set = (x_test.flatten(1), y_test)
    probe = (fit_set[0][:256], fit_set[1][:256])
    seed_list = list(range(args.seeds))
    head = provenance(f"depths {args.depths}; arms {list(ARMS)}; lr {args.lrs}; seeds 0-{args.seeds - 1}; "
                      f"{args.epochs} epochs of batches of 64")
    rows = ["depth,arm,lr,seed,val_acc,updates_to_0.5,last_loss,init_grad,right"]
    for depth in args.depths:
        for arm, (norm, init) in ARMS.items():
            start = time.perf_counter()
            nets = [study.seeded_mlp(norm, s, depth, init) for s in seed_list]
            grads = [models.layer_stats(net, *probe)["grad"] for net in nets]
            members = seed_list * len(args.lrs)
            model = seeds.stack([study.seeded_mlp(norm, s, depth, init) for s in members])
            hist, scored = study.fit_scored(model, fit_set, val_set, test_set, epochs=args.epochs, batch_size=64,
                                            lr=[lr for lr in args.lrs for _ in seed_list], seeds=members, items=True)
            for m, h in enumerate(hist):
                lr, s = args.lrs[m // len(seed_list)], members[m]
                reached = train.updates_to(h, 0.5)
                last = np.mean(h.step_loss[-h.steps_per_epoch:])
                rows.append(f"{depth},{arm},{lr},{s},{h.test_acc[-1]:.6f},{'' if reached is None else reached},{last:.6g},"
                            + ";".join(f"{g:.6g}" for g in grads[s]) + ","
                            + "".join(str(int(v)) for v in scored[args.epochs][m]))
            print(f"depth {depth}, {arm}: {time.perf_counter() - start:.0f} s", flush=True)
    write_tables(args.out, head, {"depth_sweep.csv": rows})


if __name__ == "__main__":
    main()
