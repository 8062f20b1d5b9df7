"""Execute notebooks top to bottom (on the GPU when there is one) without comparing outputs.

    python benchmarks/run_notebooks.py notebooks/*.ipynb     # what `make gpu-check` runs

Each notebook runs in a fresh kernel with notebooks/ as its working directory, in memory: the
committed notebooks (and their CPU outputs) are left as they are. It prints one line per
notebook, writes ``benchmarks/results/notebooks-<device>-<date>.csv`` (notebook, status,
seconds, the error's last line, with provenance) and exits 1 if any notebook failed.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

RESULTS = Path(__file__).parent / "results"


def run(path: Path, timeout: int) -> tuple[str, float, str]:
    """("ok" or "failed", seconds, the error's last line) for one notebook."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    try:
        NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    except Exception as error:  # noqa: BLE001 - report it and go on with the next notebook
        last = (str(error).strip().splitlines() or [type(error).__name__])[-1]
        return "failed", time.perf_counter() - start, last[:300]
    return "ok", time.perf_counter() - start, ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the CSV")
    args = parser.parse_args(argv)
    import torch

    from lnbook import bench

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for path in args.notebooks:
        status, seconds, error = run(path, args.timeout)
        print(f"{path}: {status} in {seconds:.1f} s {error}", flush=True)
        rows.append({"notebook": path.name, "status": status, "seconds": round(seconds, 1), "error": error})
    stamp = bench.provenance(device)
    name = "notebooks-" + re.sub(r"[^A-Za-z0-9]+", "-", stamp["device"]).strip("-") + f"-{stamp['date']}"
    print(f"wrote {bench.write_csv(rows, args.out / f'{name}.csv', device)}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
