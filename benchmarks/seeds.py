"""Seeds x training steps per second: a loop over plain models, one stacked model, torch.func.

    python benchmarks/seeds.py                 # about a minute on one CPU thread
    python benchmarks/seeds.py --seeds 3 10 --steps 10 --out DIR

For each model family at the size a chapter trains it, ``S`` seeds take one Adam step each
(forward, backward, update) on a batch of their own, three ways:

- **loop**: ``S`` plain models, one after the other, each with its own optimizer;
- **stacked**: one model made by ``lnbook.seeds.stack`` (every weight with a seed axis);
- **torch.func**: ``stack_module_state`` and ``vmap(functional_call)`` over the plain model.

It prints a table and writes ``benchmarks/results/seeds-<cpu>-<date>.csv`` with provenance.
One thread, as the notebooks train; the median of ``--steps`` timed steps after two untimed.
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from lnbook import bench, seeds
from lnbook.models import MLP
from lnbook.rnn import LSTMCell, SequenceClassifier
from lnbook.transformer import GPTConfig, TinyGPT, TinyViT

RESULTS = Path(__file__).parent / "results"
VOCAB = 65  # the character corpus's alphabet

# family: (make one plain model, make one member's batch (inputs..., targets), loss(outputs, targets))
FAMILIES: dict[str, tuple[Callable, Callable]] = {
    "MLP 64-64-64-10, LayerNorm, batch 32 (ch01, ch09)": (
        lambda: MLP(64, (64, 64), 10, "layer"), lambda g: (torch.randn(32, 64, generator=g), torch.randint(10, (32,), generator=g))),
    "MLP 64-64-64-10, BatchNorm, batch 32 (ch01, ch09)": (
        lambda: MLP(64, (64, 64), 10, "batch"), lambda g: (torch.randn(32, 64, generator=g), torch.randint(10, (32,), generator=g))),
    "LSTM, LayerNorm, 16 steps of 4, hidden 64, batch 64 (ch05)": (
        lambda: SequenceClassifier(LSTMCell(4, 64, "layer"), 10),
        lambda g: (torch.randn(64, 16, 4, generator=g), torch.randint(10, (64,), generator=g))),
    "LSTM, BatchNorm per step, 16 steps of 4, hidden 64, batch 64 (ch05)": (
        lambda: SequenceClassifier(LSTMCell(4, 64, "batch", max_steps=16), 10),
        lambda g: (torch.randn(64, 16, 4, generator=g), torch.randint(10, (64,), generator=g))),
    "TinyGPT 4 layers, d 64, 32 tokens, batch 16 (ch06)": (
        lambda: TinyGPT(GPTConfig(VOCAB, 32, n_layer=4, n_head=4, d_model=64)),
        lambda g: (torch.randint(VOCAB, (16, 32), generator=g), torch.randint(VOCAB, (16, 32), generator=g))),
    "TinyGPT 2 layers, d 64, 32 tokens, batch 8 (ch07)": (
        lambda: TinyGPT(GPTConfig(VOCAB, 32, n_layer=2, n_head=4, d_model=64)),
        lambda g: (torch.randint(VOCAB, (8, 32), generator=g), torch.randint(VOCAB, (8, 32), generator=g))),
    "TinyGPT 24 layers, d 32, 32 tokens, batch 8 (ch07)": (
        lambda: TinyGPT(GPTConfig(VOCAB, 32, n_layer=24, n_head=2, d_model=32, init="xavier")),
        lambda g: (torch.randint(VOCAB, (8, 32), generator=g), torch.randint(VOCAB, (8, 32), generator=g))),
    "TinyViT 8x8, patches 2, 2 layers, d 32, batch 64 (ch09)": (
        lambda: TinyViT(), lambda g: (torch.randn(64, 8, 8, generator=g), torch.randint(10, (64,), generator=g))),
}


def steppers(make: Callable, batch: Callable, s: int) -> dict[str, Callable[[], None]]:
    """One Adam step of ``s`` seeds, three ways."""
    g = torch.Generator().manual_seed(0)
    data = [batch(g) for _ in range(s)]
    plain = []
    for seed in range(s):
        torch.manual_seed(seed)
        plain.append(make())
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in plain]

    def loop() -> None:
        for model, opt, (x, y) in zip(plain, opts, data):
            loss = F.cross_entropy(model(x).flatten(0, -2), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()

    stacked = seeds.stack(plain)
    xs, ys = (torch.stack(parts) for parts in zip(*data))
    stacked_opt = torch.optim.Adam(stacked.parameters(), lr=1e-3)

    def stack() -> None:
        out = stacked(xs)
        loss = F.cross_entropy(out.flatten(0, -2), ys.flatten(), reduction="none").view(ys.shape).flatten(1).mean(1).sum()
        stacked_opt.zero_grad()
        loss.backward()
        stacked_opt.step()

    params, buffers = stack_module_state(plain)
    base = copy.deepcopy(plain[0])
    func_opt = torch.optim.Adam(params.values(), lr=1e-3)

    def one(p: dict, b: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(base, (p, b), (x,)).flatten(0, -2), y.flatten())

    batched = vmap(one, randomness="different")

    def func() -> None:
        loss = batched(params, buffers, xs, ys).sum()
        func_opt.zero_grad()
        loss.backward()
        func_opt.step()

    return {"loop": loop, "stacked": stack, "torch.func": func}


def median_ms(step: Callable[[], None], steps: int) -> float:
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 10], help="members per stack")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the CSV")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"{'family':58} {'S':>3} {'loop':>9} {'stacked':>9} {'torch.func':>11}  seed-steps/s: loop, stacked, func; stacked/loop")
    for family, (make, batch) in FAMILIES.items():
        for s in args.seeds:
            ms = {}
            for way, step in steppers(make, batch, s).items():
                try:
                    ms[way] = median_ms(step, args.steps)
                except Exception as error:  # noqa: BLE001 - a way that cannot run this family is a result
                    print(f"  {way} fails on {family}: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
                    ms[way] = float("nan")
            rate = {way: 1e3 * s / t for way, t in ms.items()}
            speedup = ms["loop"] / ms["stacked"]
            print(f"{family:58} {s:3d} {ms['loop']:7.1f}ms {ms['stacked']:7.1f}ms {ms['torch.func']:9.1f}ms  "
                  f"{rate['loop']:6.0f} {rate['stacked']:6.0f} {rate['torch.func']:6.0f}; {speedup:.1f}x")
            rows.append({"family": family, "seeds": s, "loop_ms": round(ms["loop"], 2), "stacked_ms": round(ms["stacked"], 2),
                         "torch_func_ms": round(ms["torch.func"], 2), "stacked_over_loop": round(speedup, 2),
                         "torch_func_over_loop": round(ms["loop"] / ms["torch.func"], 2)})
    stamp = bench.provenance("cpu")
    name = "seeds-" + re.sub(r"[^A-Za-z0-9]+", "-", stamp["device"]).strip("-") + f"-{stamp['date']}"
    print(f"wrote {bench.write_csv(rows, args.out / f'{name}.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
