"""LayerNorm and RMSNorm on a CUDA GPU: PyTorch, torch.compile, lnbook's Triton kernels, Liger.

    python benchmarks/layernorm_gpu.py            # on a machine with a CUDA GPU (a few minutes)
    python benchmarks/layernorm_gpu.py --smoke    # any machine, seconds: checks the script works

For bfloat16 and float16, M in {4096, 16384} rows and N from 512 to 16384, it first checks every
implementation against a float64 reference, then times forward and forward+backward with
Triton's do_bench (medians):

    LayerNorm: the naive composition, F.layer_norm, torch.compile of the composition,
               lnbook.kernels.layer_norm ("triton (lnbook)"), Liger's layer norm
    RMSNorm:   F.rms_norm, torch.compile of the composition, lnbook.kernels.rms_norm, Liger's rms norm

Liger (``pip install liger-kernel``, or ``pip install lnbook[bench]``) is used when it imports and
skipped with a message otherwise. Every implementation gets the same tensors, weights already
in the input's dtype: nothing is cast inside the timed region.

Then an end-to-end block shaped like GPT-2 small (d = 768, 12 heads, T = 1024, B = 8,
bfloat16), forward and backward, three ways: with nn.LayerNorm, after lnbook's fuse_norms
(fused kernels and the fused residual add), and with Liger's LayerNorm.

It writes, with provenance (machine, device, torch and triton versions, date) in every row:

    benchmarks/results/<device>-<date>.csv   (one row per measurement)
    benchmarks/results/<device>-<date>.png   (GB/s against N, with the measured copy ceiling)

GB/s counts each tensor read or written once (lnbook.bench.layernorm_traffic), so it can be
compared with the copy bandwidth. ``--smoke`` runs tiny sizes on whatever device there is
(the CPU: lnbook's kernels through Triton's interpreter, no torch.compile) and writes into a
temporary folder: a check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from lnbook import bench
from lnbook.kernels import fuse_norms, layer_norm, rms_norm

RESULTS = Path(__file__).parent / "results"
REPEAT = 10  # timed calls per measurement on a CPU (a GPU uses do_bench's own count)
FIELDS = ("kind", "norm", "dtype", "m", "n", "implementation", "mode", "ms", "gb_per_s", "copy_gb_per_s")


@functools.cache
def liger():
    """Liger's functional layer_norm and rms_norm, or None (with the reason printed)."""
    try:
        from liger_kernel.transformers.functional import liger_layer_norm, liger_rms_norm
    except Exception as error:  # noqa: BLE001 - any import failure means: skip it
        print(f"liger-kernel not importable ({type(error).__name__}: {error}); skipping Liger", file=sys.stderr)
        return None
    return liger_layer_norm, liger_rms_norm


def naive_layer_norm(x, w, b, eps=1e-5):
    """LayerNorm as separate operators, each a pass over memory (statistics in float32)."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + eps) * w + b).to(x.dtype)


def naive_rms_norm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


def implementations(norm: str, compiled: bool) -> dict:
    """name -> fn(x, w, b) (b is ignored by RMSNorm). Fresh each call: a torch.compile entry
    then compiles for one shape (a static-shape kernel) instead of a dynamic-shape one."""
    found = liger()
    if norm == "layer":
        impls = {
            "naive": naive_layer_norm,
            "F.layer_norm": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
            "torch.compile": torch.compile(naive_layer_norm, dynamic=False) if compiled else None,
            "triton (lnbook)": layer_norm,
            "liger": (lambda x, w, b: found[0](x, w, b, 1e-5)) if found else None,
        }
    else:
        impls = {
            "F.rms_norm": lambda x, w, b: F.rms_norm(x, x.shape[-1:], w, 1e-6),
            "torch.compile": torch.compile(lambda x, w, b: naive_rms_norm(x, w), dynamic=False) if compiled else None,
            "triton (lnbook)": lambda x, w, b: rms_norm(x, w),
            "liger": (lambda x, w, b: found[1](x, w, 1e-6)) if found else None,
        }
    return {k: v for k, v in impls.items() if v is not None}


def check(norm: str, impls: dict, device, dtype) -> None:
    """Every implementation's output and gradients against float64, before anything is timed."""
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(33, 1151, generator=g), torch.randn(33, 1151, generator=g)
    w, b = torch.randn(1151, generator=g), torch.randn(1151, generator=g)
    xr, wr, br = (t.to(dtype).double().requires_grad_() for t in (x, w, b))
    if norm == "layer":
        want_y = F.layer_norm(xr, (1151,), wr, br)
    else:
        want_y = F.rms_norm(xr, (1151,), wr, 1e-6)
    want_y.backward(dy.to(dtype).double())
    for name, fn in impls.items():
        xs = x.to(dtype).to(device).requires_grad_()
        ws, bs = (t.to(dtype).to(device).requires_grad_() for t in (w, b))
        y = fn(xs, ws, bs)
        y.backward(dy.to(dtype).to(device))
        pairs = [("y", y, want_y.detach()), ("dx", xs.grad, xr.grad), ("dw", ws.grad, wr.grad)]
        if norm == "layer":
            pairs.append(("db", bs.grad, br.grad))
        for what, got, want in pairs:
            scale = float(want.abs().max())  # half-precision results: compare at the scale of the values
            torch.testing.assert_close(got.double().cpu(), want, rtol=5e-2, atol=2e-2 * scale, msg=f"{norm} {name} {what} {dtype}")


def measure_norms(norm, device, dtypes, ms, ns, copy, compiled) -> list[dict]:
    rows = []
    for dtype in dtypes:
        check(norm, implementations(norm, compiled), device, dtype)
        for m in ms:
            for n in ns:
                impls = implementations(norm, compiled)
                x = torch.randn(m, n, device=device, dtype=dtype, requires_grad=True)
                w = torch.ones(n, device=device, dtype=dtype, requires_grad=True)  # in x's dtype: no cast when timed
                b = torch.zeros(n, device=device, dtype=dtype, requires_grad=True)
                dy = torch.randn_like(x)
                inputs = (x, w, b) if norm == "layer" else (x, w)
                for name, fn in impls.items():
                    for mode in ("forward", "forward+backward"):
                        if mode == "forward":  # inference: no graph recorded for a backward pass
                            with torch.no_grad():
                                seconds = bench.seconds(lambda: fn(x, w, b), device, REPEAT)
                            nbytes = bench.layernorm_traffic(m, n, x.element_size(), rms=norm == "rms")["bytes"]
                        else:
                            seconds = bench.seconds(lambda: torch.autograd.grad(fn(x, w, b), inputs, dy), device, REPEAT)
                            nbytes = sum(bench.layernorm_traffic(m, n, x.element_size(), backward=bwd, rms=norm == "rms")["bytes"]
                                         for bwd in (False, True))
                        rows.append(dict(kind="norm", norm=norm, dtype=str(dtype).removeprefix("torch."), m=m, n=n,
                                         implementation=name, mode=mode, ms=round(seconds * 1e3, 4),
                                         gb_per_s=round(nbytes / seconds / 1e9, 1), copy_gb_per_s=round(copy / 1e9, 1)))
    return rows


class _LigerLayerNorm(torch.nn.LayerNorm):
    """nn.LayerNorm (same parameters) computed by Liger's kernel."""

    def forward(self, x):
        return liger()[0](x, self.weight, self.bias, self.eps)


def measure_block(device, dtype, batch, t, d, heads) -> list[dict]:
    """Forward+backward of one Pre-LN block, with nn.LayerNorm, fuse_norms and Liger."""
    from lnbook.norms import swap_modules
    from lnbook.transformer import Block, GPTConfig

    cfg = GPTConfig(vocab_size=64, block_size=t, n_layer=1, n_head=heads, d_model=d, norm="layernorm", dropout=0.0)
    torch.manual_seed(0)
    reference = Block(cfg).to(device=device, dtype=dtype)
    variants = {"nn.LayerNorm": reference}
    fused = Block(cfg).to(device=device, dtype=dtype)
    fused.load_state_dict(reference.state_dict())
    fuse_norms(fused)
    variants["fuse_norms (lnbook)"] = fused
    if liger() is not None:
        with_liger = Block(cfg).to(device=device, dtype=dtype)
        with_liger.load_state_dict(reference.state_dict())

        def swap(child):
            if type(child) is torch.nn.LayerNorm:
                return _LigerLayerNorm(child.normalized_shape[0], child.eps, bias=child.bias is not None)
            return None

        swap_modules(with_liger, swap)
        variants["liger"] = with_liger
    x = torch.randn(batch, t, d, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    want = torch.autograd.grad(reference(x), x, dy)[0]
    rows = []
    for name, block in variants.items():
        got = torch.autograd.grad(block(x), x, dy)[0]  # the same model: the same gradient, to rounding
        torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2 * float(want.abs().max()))
        params = tuple(block.parameters())
        seconds = bench.seconds(lambda: torch.autograd.grad(block(x), (x, *params), dy), device, REPEAT)
        rows.append(dict(kind="block", norm="layer", dtype=str(dtype).removeprefix("torch."), m=batch * t, n=d,
                         implementation=name, mode="forward+backward", ms=round(seconds * 1e3, 4), gb_per_s="", copy_gb_per_s=""))
    return rows


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    norm_rows = [r for r in rows if r["kind"] == "norm"]
    panels = sorted({(r["norm"], r["dtype"], r["m"]) for r in norm_rows})
    modes = ("forward", "forward+backward")
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for row_axes, (norm, dtype, m) in zip(axes, panels):
        for ax, mode in zip(row_axes, modes):
            sel = [r for r in norm_rows if (r["norm"], r["dtype"], r["m"], r["mode"]) == (norm, dtype, m, mode)]
            for name in dict.fromkeys(r["implementation"] for r in sel):
                pts = [r for r in sel if r["implementation"] == name]
                ax.plot([r["n"] for r in pts], [r["gb_per_s"] for r in pts], "o-", label=name)
            ax.axhline(sel[0]["copy_gb_per_s"], color="0.4", ls="--", label="copy (measured)")
            ax.set(xscale="log", xlabel="N (features per row)", ylabel="GB/s", title=f"{norm} norm, {dtype}, {mode}, M = {m}")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes into a temporary folder, on any device, in seconds")
    parser.add_argument("--out", type=Path, default=None, help="folder for the CSV and PNG (default benchmarks/results)")
    args = parser.parse_args(argv)
    global REPEAT
    if args.smoke:
        REPEAT = 2
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtypes, ms, ns, copy_bytes = (torch.bfloat16,), (8,), (64, 256), 16 * 2**20
        block_shape = dict(batch=2, t=16, d=64, heads=2)
        out = args.out or Path(tempfile.mkdtemp())
        compiled = False  # compiling takes minutes on a CPU
    else:
        if not torch.cuda.is_available():
            raise SystemExit("layernorm_gpu.py measures a CUDA GPU and found none; use --smoke to check the script")
        device, dtypes, ms, ns, copy_bytes = "cuda", (torch.bfloat16, torch.float16), (4096, 16384), (512, 1024, 2048, 4096, 8192, 16384), 256 * 2**20
        block_shape = dict(batch=8, t=1024, d=768, heads=12)
        out = args.out or RESULTS
        compiled = True
    copy = bench.copy_bandwidth(device, copy_bytes)
    rows = []
    for norm in ("layer", "rms"):
        rows += measure_norms(norm, device, dtypes, ms, ns, copy, compiled)
    rows += measure_block(device, torch.bfloat16, **block_shape)
    rows = [{key: r[key] for key in FIELDS} for r in rows]
    stamp = bench.provenance(device)
    name = re.sub(r"[^A-Za-z0-9]+", "-", stamp["device"]).strip("-") + f"-{stamp['date']}"
    csv_path = bench.write_csv(rows, out / f"{name}.csv", device)
    plot(rows, out / f"{name}.png")
    for r in rows:
        if r["kind"] == "block":
            print(f"block B*T={r['m']} d={r['n']} {r['dtype']}: {r['implementation']}: {r['ms']} ms")
    print(f"wrote {csv_path} and {out / name}.png")


if __name__ == "__main__":
    main()
