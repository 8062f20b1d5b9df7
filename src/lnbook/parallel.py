"""Data-parallel training on the CPU with ``torch.distributed`` (gloo), to measure what
BatchNorm and LayerNorm cost when a batch is split across replicas.

Synchronized BatchNorm sums its statistics with :func:`lnbook.functional.all_reduce_sum`,
which counts its calls; the runs here report those counts per step.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist

from . import data, utils
from ._checks import check_int, describe
from .functional import COLLECTIVES
from .models import MLP
from .norms import MaskedBatchNorm1d

RUNS = ("batch", "sync_batch", "layer")  # norm "batch", the same with synchronized statistics, "layer"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no process listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, norms: tuple[str, ...], steps: int, out_dir: str) -> None:
    sys.stdout = sys.stderr = open(os.devnull, "w")  # keep the workers quiet in a notebook
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    (x, y), _ = data.digits_sequences("pixel")
    # Shards that differ, as they do when data is partitioned by source: replica r gets
    # the digits whose label is r modulo world_size. Every replica also sees one probe example.
    shard = (y % world_size) == rank
    xs, ys = x[shard].flatten(1), y[shard]
    probe = x[:1].flatten(1)
    results = {}
    for norm in norms:
        utils.seed_everything(0)  # the same initial weights on every replica
        model = MLP(64, (32,), 10, "batch" if norm in ("batch", "sync_batch") else "layer")
        bns = [m for m in model.modules() if isinstance(m, MaskedBatchNorm1d)]
        for bn in bns:
            bn.process_group = dist.group.WORLD if norm == "sync_batch" else None
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        COLLECTIVES.clear()
        means, probe_out = [], []
        for _ in range(steps):
            idx = torch.randperm(len(ys), generator=g)[:31]
            xb, yb = torch.cat([probe, xs[idx]]), torch.cat([y[:1], ys[idx]])
            out = model(xb)
            probe_out.append(out[0].detach())
            means.append(bns[0].running_mean.clone() if bns else torch.zeros(0))
            loss = torch.nn.functional.cross_entropy(out, yb)
            opt.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            COLLECTIVES["gradients"] += 1
            dist.all_reduce(flat)  # average the gradients: one bucket, as DDP would
            flat /= world_size
            torch.nn.utils.vector_to_parameters(flat, [p.grad for p in model.parameters()])
            opt.step()
        results[norm] = {
            "calls_per_step": {k: v / steps for k, v in COLLECTIVES.items()},
            "running_mean": means[-1],
            "probe_output": torch.stack(probe_out),
            "params": torch.nn.utils.parameters_to_vector(model.parameters()).detach(),
        }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def data_parallel_run(
    norms: tuple[str, ...] = ("batch", "sync_batch", "layer"), world_size: int = 2, steps: int = 5
) -> list[dict]:
    """Train a small digits MLP data-parallel on ``world_size`` CPU processes (gloo).

    For each norm in ``norms`` (``"batch"``: each replica's own batch statistics;
    ``"sync_batch"``: statistics all-reduced across replicas; ``"layer"``), every replica
    takes ``steps`` SGD steps on its own shard with gradients averaged by all-reduce. One
    probe example rides in every replica's batch.

    Returns one dict per rank, keyed by norm: ``calls_per_step`` (collectives by kind),
    ``running_mean`` (first norm layer, ``(32,)``; empty for LayerNorm), ``probe_output``
    (``(steps, 10)`` logits of the probe example) and ``params`` (final, flattened).
    """
    if not norms or not set(norms) <= set(RUNS):
        raise ValueError(f"norms must be drawn from {RUNS}, got {describe(norms)}")
    check_int(world_size, "world_size", 2)
    with tempfile.TemporaryDirectory() as out_dir:
        torch.multiprocessing.spawn(_worker, args=(world_size, free_port(), tuple(norms), steps, out_dir), nprocs=world_size)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world_size)]
