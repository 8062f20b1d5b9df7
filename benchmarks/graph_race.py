"""Chapter 09's graph race trained until the networks beat the degree lookup, each norm at its own
best learning rate: Cai et al.'s GraphNorm claim (faster training convergence than BatchNorm,
LayerNorm and InstanceNorm) in the setting the notebook cannot afford.

    PYTHONPATH=src python benchmarks/graph_race.py
    PYTHONPATH=src python benchmarks/graph_race.py --epochs 2 --seeds 2 --lrs 0.003 --norms none graph --out /tmp/x  # smoke

The notebook's graphs (``lnbook.graphs.random_graphs``: 320 training graphs of 5-100 nodes,
seed 0; 200 test graphs of 5-100 nodes, seed 1; 200 larger test graphs of 101-200 nodes, seed 2)
and a validation set of 100 graphs of 5-100 nodes (seed 3) to choose each norm's rate on.
``GraphNet(2, 32, 3, norm, placement="main")``: the norm on the main path as in Cai et al.'s
GIN/GCN, every PyG norm of ``lnbook.graphs.NORMS`` (none, BatchNorm, LayerNorm per node and
per graph, InstanceNorm, GraphNorm); Adam, batches of 16 graphs, a cosine decay of the rate to
0 over ``--epochs`` epochs, every rate of ``--lrs`` and every seed (the seed fixes the initial
weights and the batch order, so arms are paired). PyG's layers do not stack, so one job per run,
on two worker processes of one thread each.

Writes into ``--out`` (by default ``src/lnbook/results/``, shipped with the package), each
with provenance (machine, commit, date, command, versions, setting) as leading ``#`` lines:
``graph_race-curves.csv``, per (norm, lr, seed, epoch) the epoch's mean training loss
(training mode) and the validation MSE after it (eval mode); ``graph_race-final.csv``, per
(norm, lr, seed) the final validation, test and large-graph MSE; ``graph_race-baselines.csv``,
per set the degree lookup's MSE, the training mean's and the target variance.
Reader: ``lnbook.graphs.stored_graph_race``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch

from sigmoid_full import provenance, write_tables  # this script's folder is on the path when it runs

from lnbook import graphs, train

warnings.filterwarnings("ignore", message="IProgress not found")
RESULTS = Path(__file__).resolve().parents[1] / "src" / "lnbook" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--norms", nargs="+", default=list(graphs.NORMS), choices=graphs.NORMS)
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.001, 0.003, 0.01])
    parser.add_argument("--epochs", type=int, default=80)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sets = {"train": graphs.random_graphs(320, 5, 100, seed=0), "val": graphs.random_graphs(100, 5, 100, seed=3),
            "test": graphs.random_graphs(200, 5, 100, seed=1), "large": graphs.random_graphs(200, 101, 200, seed=2)}
    lookup = graphs.degree_lookup(sets["train"])
    mean = graphs.targets(sets["train"]).mean()
    seed_list = list(range(args.seeds))
    head = provenance(f"GraphNet(2, 32, 3, norm, placement='main'); norms {args.norms}; lr {args.lrs}; seeds 0-{args.seeds - 1}; "
                      f"{args.epochs} epochs of Adam, batches of 16 graphs, cosine decay to 0; "
                      "train 320 graphs (seed 0), val 100 (seed 3), test 200 (seed 1), large 200 of 101-200 nodes (seed 2)")
    start = time.perf_counter()
    workers = train.cpu_workers(2)
    queued = {(norm, lr): train.start_runs(lambda n=norm: graphs.GraphNet(2, 32, 3, n, placement="main"), seed_list, workers,
                                           fit=graphs.fit_graphs, train=sets["train"], test=sets["val"], epochs=args.epochs,
                                           lr=lr, batch_size=16, decay=True)
              for norm in args.norms for lr in args.lrs}
    curves = ["norm,lr,seed,epoch,train_loss,val_mse"]
    final = ["norm,lr,seed,val_mse,test_mse,large_mse"]
    for (norm, lr), runs in train.finish_runs(queued).items():
        for seed, (model, h) in zip(seed_list, runs):
            curves += [f"{norm},{lr},{seed},{e + 1},{t:.6g},{v:.6g}" for e, (t, v) in enumerate(zip(h.train_loss, h.test_loss))]
            final.append(f"{norm},{lr},{seed},{h.test_loss[-1]:.6g},{graphs.mse(model, sets['test']):.6g},"
                         f"{graphs.mse(model, sets['large']):.6g}")
        print(f"{norm} at lr {lr}: done after {time.perf_counter() - start:.0f} s", flush=True)
    baselines = ["set,lookup_mse,mean_mse,variance"] + [
        f"{name},{graphs.baseline_mse(lookup, sets[name]):.6g},{graphs.baseline_mse(lambda g: mean, sets[name]):.6g},"
        f"{graphs.target_variance(sets[name]):.6g}" for name in ("val", "test", "large")]
    if workers is not None:
        workers.shutdown()
    write_tables(args.out, head, {"graph_race-curves.csv": curves, "graph_race-final.csv": final,
                                  "graph_race-baselines.csv": baselines})
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
