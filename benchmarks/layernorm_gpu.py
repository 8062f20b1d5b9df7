"""LayerNorm on a CUDA GPU: the naive composition, F.layer_norm, torch.compile and our Triton kernel.

    python benchmarks/layernorm_gpu.py            # on a machine with a CUDA GPU

For bfloat16 and float16, M = 4096 rows and N from 512 to 16384, it first checks every
implementation against a float64 reference, then times forward and forward+backward with
Triton's do_bench (medians), and writes

    benchmarks/results/<device>-<date>.csv   (one row per measurement, with provenance)
    benchmarks/results/<device>-<date>.png   (GB/s against N, with the measured copy ceiling)

GB/s counts each tensor read or written once (lnbook.bench.layernorm_traffic), so it can be
compared with the copy bandwidth. ``--smoke`` runs two tiny sizes and writes into a
temporary folder: a check that the script works, not a measurement. ``--cpu`` measures this
machine's CPU instead, in float32 and without the Triton kernel (on a CPU it runs through
Triton's interpreter, which is for correctness, not speed).
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from lnbook import bench
from lnbook.kernels import layer_norm

RESULTS = Path(__file__).parent / "results"


def naive(x, w, b, eps=1e-5):
    """LayerNorm as separate operators, each a pass over memory."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + eps) * w + b).to(x.dtype)


def implementations():
    """Fresh each time it is called: the torch.compile entry then compiles for one shape only
    (a static-shape kernel) instead of recompiling into a dynamic-shape one."""
    return {
        "naive": naive,
        "F.layer_norm": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w.to(x.dtype), b.to(x.dtype)),
        "torch.compile": torch.compile(naive, dynamic=False),
        "triton (lnbook)": layer_norm,
    }


def check(impls, device, dtype):
    """Every implementation's output and gradients against float64, before anything is timed."""
    g = torch.Generator().manual_seed(0)
    x, dy = torch.randn(33, 1151, generator=g), torch.randn(33, 1151, generator=g)
    w, b = torch.randn(1151, generator=g), torch.randn(1151, generator=g)
    xr, wr, br = (t.to(dtype).double().requires_grad_() for t in (x, w, b))
    F.layer_norm(xr, (1151,), wr, br).backward(dy.to(dtype).double())
    for name, fn in impls.items():
        xs = x.to(dtype).to(device).requires_grad_()
        ws, bs = (t.to(device).clone().requires_grad_() for t in (w, b))  # fresh leaves for each implementation
        y = fn(xs, ws, bs)
        y.backward(dy.to(dtype).to(device))
        for what, got, want in (("y", y, None), ("dx", xs.grad, xr.grad), ("dw", ws.grad, wr.grad), ("db", bs.grad, br.grad)):
            want = F.layer_norm(xr.detach(), (1151,), wr.detach(), br.detach()) if want is None else want
            scale = float(want.abs().max())  # half-precision results: compare at the scale of the values
            torch.testing.assert_close(got.double().cpu(), want, rtol=5e-2, atol=2e-2 * scale, msg=f"{name} {what} {dtype}")


def measure(names, device, dtypes, m, ns, copy_bytes=256 * 2**20):
    rows = []
    copy = bench.copy_bandwidth(device, copy_bytes)
    for dtype in dtypes:
        check({k: v for k, v in implementations().items() if k in names}, device, dtype)
        for n in ns:
            impls = {k: v for k, v in implementations().items() if k in names}
            x = torch.randn(m, n, device=device, dtype=dtype, requires_grad=True)
            w = torch.ones(n, device=device, requires_grad=True)
            b = torch.zeros(n, device=device, requires_grad=True)
            dy = torch.randn_like(x)
            for name, fn in impls.items():
                for mode in ("forward", "forward+backward"):
                    if mode == "forward":  # inference: no graph recorded for a backward pass
                        with torch.no_grad():
                            seconds = bench.seconds(lambda: fn(x, w, b), device)
                        nbytes = bench.layernorm_traffic(m, n, x.element_size())["bytes"]
                    else:
                        seconds = bench.seconds(lambda: torch.autograd.grad(fn(x, w, b), (x, w, b), dy), device)
                        nbytes = sum(bench.layernorm_traffic(m, n, x.element_size(), backward=bwd)["bytes"] for bwd in (False, True))
                    rows.append({"dtype": str(dtype).removeprefix("torch."), "m": m, "n": n, "implementation": name,
                                 "mode": mode, "ms": round(seconds * 1e3, 4), "gb_per_s": round(nbytes / seconds / 1e9, 1),
                                 "copy_gb_per_s": round(copy / 1e9, 1)})
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ("forward", "forward+backward")
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(11, 4 * len(dtypes)), squeeze=False)
    for row_axes, dtype in zip(axes, dtypes):
        for ax, mode in zip(row_axes, modes):
            sel = [r for r in rows if r["dtype"] == dtype and r["mode"] == mode]
            for name in dict.fromkeys(r["implementation"] for r in sel):
                pts = [r for r in sel if r["implementation"] == name]
                ax.plot([r["n"] for r in pts], [r["gb_per_s"] for r in pts], "o-", label=name)
            ax.axhline(sel[0]["copy_gb_per_s"], color="0.4", ls="--", label="copy (measured)")
            ax.set(xscale="log", xlabel="N (features per row)", ylabel="GB/s", title=f"{dtype}, {mode}, M = {sel[0]['m']}")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="two tiny sizes into a temporary folder, on any device")
    parser.add_argument("--cpu", action="store_true", help="measure the CPU: float32, no Triton kernel")
    args = parser.parse_args()
    if args.cpu:
        torch.set_num_threads(torch.get_num_threads())  # all cores, as torch uses them by default
        device, dtypes, m, ns, out = "cpu", (torch.float32,), 4096, (512, 1024, 2048, 4096), RESULTS
        names = ("naive", "F.layer_norm", "torch.compile")
    elif args.smoke:
        device, dtypes, m, ns, out = ("cuda" if torch.cuda.is_available() else "cpu"), (torch.bfloat16,), 8, (64, 256), Path(tempfile.mkdtemp())
        names = ("naive", "F.layer_norm", "triton (lnbook)")  # compiling takes minutes on a CPU
    else:
        if not torch.cuda.is_available():
            raise SystemExit("layernorm_gpu.py measures a CUDA GPU and found none; use --smoke to check the script")
        device, dtypes, m, ns, out = "cuda", (torch.bfloat16, torch.float16), 4096, (512, 1024, 2048, 4096, 8192, 16384), RESULTS
        names = tuple(implementations())
    rows = measure(names, device, dtypes, m, ns, 16 * 2**20 if args.smoke else 256 * 2**20)
    stamp = bench.provenance(device)
    name = re.sub(r"[^A-Za-z0-9]+", "-", stamp["device"]).strip("-") + f"-{stamp['date']}"
    csv_path = bench.write_csv(rows, out / f"{name}.csv", device)
    plot(rows, out / f"{name}.png")
    print(f"wrote {csv_path} and {out / name}.png")


if __name__ == "__main__":
    main()
