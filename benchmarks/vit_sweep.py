"""Chapter 09's ViT question, BatchNorm over patches against LayerNorm and no norm, with each norm
at its own best learning rate of a 3-point grid under a linear warm-up and a cosine decay, at the
notebook's depth (2 blocks) and deeper (6 blocks): the regime the notebook cannot afford, a step
towards Yao et al.'s (BN in ViTs crashes) and Shen et al.'s (BN fails in NLP Transformers).

    PYTHONPATH=src python benchmarks/vit_sweep.py
    PYTHONPATH=src python benchmarks/vit_sweep.py --depths 1 --steps 6 --seeds 2 --lrs 0.003 --out /tmp/x   # a smoke run

The digits as 8x8 images in 2x2 patches (16 tokens), ``TinyViT(patch_size=2, n_layer=depth,
norm=...)`` 32 wide with 4 heads, for norm in none, Pre-LN LayerNorm, BatchNorm over every patch
of every image of the batch. The training digits split into a fit part and a validation part
(``lnbook.data.validation_split``); ``lnbook.transformer.fit_vit``: Adam, batches of 64 of the fit
part, ``--steps`` updates, a linear warm-up over the first tenth, then a cosine decay to 0. Every
rate x seed of one (norm, depth) is one stacked model (``lnbook.seeds``; members with the same
seed start from the same weights and see the same batches), one job, on two worker processes
of one thread each. Scored after the last update on the test digits in eval mode (running
statistics, as a BatchNorm model is served); for BatchNorm also after "precise BN"
(``lnbook.transformer.precise_bn``: running statistics recomputed in one pass over the fit
part at the final weights) and with the statistics of the whole test set (one batch of 360).

Writes, with provenance (machine, commit, date, command, versions, setting) as leading ``#``
lines, into ``--out`` (by default ``src/lnbook/results/``, shipped with the package):
``vit_sweep-curves.csv``, per (norm, depth, lr, seed, step) the mean training loss since the
last evaluation and the validation accuracy; ``vit_sweep-final.csv``, per (norm, depth, lr, seed)
the final validation accuracy, test accuracy in eval mode, after precise BN and in one test
batch (the last two empty without BatchNorm), and whether the run diverged.
Reader: ``lnbook.transformer.stored_vit_sweep``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from sigmoid_full import provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import data, seeds, train
from lnbook.transformer import TinyViT, fit_vit, precise_bn

RESULTS = Path(__file__).resolve().parents[1] / "src" / "lnbook" / "results"
NORMS = ("none", "layernorm", "batchnorm")


def run(job: dict) -> dict:
    """One (norm, depth): every rate x seed in one stack; trained, then scored. A worker's unit."""
    torch.set_num_threads(1)
    norm, depth, lrs, seed_list, steps = job["norm"], job["depth"], job["lrs"], job["seeds"], job["steps"]
    fit_set, val_set, test_set = job["fit"], job["val"], job["test"]
    start = time.perf_counter()
    members = []
    for _ in lrs:
        for s in seed_list:
            torch.manual_seed(s)
            np.random.seed(s)
            members.append(TinyViT(patch_size=2, n_layer=depth, norm=norm))
    model = seeds.stack(members)
    hist = fit_vit(model, fit_set, val_set, steps=steps, lr=[lr for lr in lrs for _ in seed_list],
                   seeds=list(seed_list) * len(lrs), batch_size=64, warmup=max(1, steps // 10) if steps > 1 else 0,
                   eval_every=job["eval_every"])
    out = {"hist": hist, "test": seeds.accuracy(model, test_set)}
    if norm == "batchnorm":
        x, y = test_set
        with torch.no_grad():  # the statistics of the whole test set: one batch, in training mode (on the model, then reset)
            model.train()
            state = {k: v.clone() for k, v in model.state_dict().items()}
            logits = model(x.expand(len(members), *x.shape))
            model.load_state_dict(state)
            model.eval()
        out["batch"] = (logits.argmax(-1) == y).double().mean(1).numpy()
        precise_bn(model, fit_set[0], batch_size=64)
        out["precise"] = seeds.accuracy(model, test_set)
    out["seconds"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--norms", nargs="+", default=list(NORMS), choices=NORMS)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 6])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.003, 0.01, 0.03])
    parser.add_argument("--steps", type=int, default=176)  # the notebook's budget (8 epochs of 22 batches)
    parser.add_argument("--eval-every", type=int, default=22)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    (x_train, y_train), test_set = data.digits_sequences("row")  # x: (N, 8, 8)
    fit_set, val_set = data.validation_split((x_train, y_train))
    seed_list = list(range(args.seeds))
    head = provenance(f"TinyViT(patch_size=2, n_layer=depth, d_model=32, n_head=4); norms {args.norms}; depths {args.depths}; "
                      f"lr {args.lrs}; seeds 0-{args.seeds - 1}; {args.steps} Adam updates, batches of 64 of the fit split "
                      f"({len(fit_set[1])} digits; validation {len(val_set[1])}), linear warm-up over the first tenth, "
                      "cosine decay to 0; test digits scored in eval mode, after precise BN, and in one batch of 360")
    jobs = [dict(norm=n, depth=d, lrs=args.lrs, seeds=seed_list, steps=args.steps, eval_every=args.eval_every,
                 fit=fit_set, val=val_set, test=test_set) for d in sorted(args.depths, reverse=True) for n in args.norms]
    workers = train.cpu_workers(2)
    start = time.perf_counter()
    futures = [workers.submit(run, job) for job in jobs] if workers is not None else None
    curves = ["norm,depth,lr,seed,step,train_loss,val_acc"]
    final = ["norm,depth,lr,seed,val_acc,test_acc,precise_acc,batch_acc,diverged"]
    for i, job in enumerate(jobs):
        out = futures[i].result() if futures is not None else run(job)
        for m, h in enumerate(out["hist"]):
            lr, s = args.lrs[m // len(seed_list)], seed_list[m % len(seed_list)]
            last = 0
            for step, acc in zip(h.eval_steps, h.val_acc):
                losses = h.step_loss[last:step]
                loss = float(np.mean(losses)) if losses else float("nan")
                curves.append(f"{job['norm']},{job['depth']},{lr},{s},{step},{loss:.6g},{acc:.6f}")
                last = step
            extra = [f"{out[k][m]:.6f}" if k in out else "" for k in ("precise", "batch")]
            final.append(f"{job['norm']},{job['depth']},{lr},{s},{h.val_acc[-1]:.6f},{out['test'][m]:.6f},"
                         f"{','.join(extra)},{int(h.diverged)}")
        print(f"{job['norm']}, depth {job['depth']}: {out['seconds']:.0f} s in its worker, "
              f"{time.perf_counter() - start:.0f} s since the start", flush=True)
    if workers is not None:
        workers.shutdown()
    write_tables(args.out, head, {"vit_sweep-curves.csv": curves, "vit_sweep-final.csv": final})


if __name__ == "__main__":
    main()
