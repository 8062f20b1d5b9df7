"""Re-execute chapter notebooks in place, top to bottom in a fresh kernel, the way nbval will
re-run them: the CPU kernels pinned to AVX2 as the Makefile pins them, notebooks/ as the working
directory. Then commit the notebook with its outputs.

    .venv/bin/python tools/execute_notebook.py notebooks/01_batchnorm_recap.ipynb [...]

Prints each notebook's wall time; a cell that raises stops that notebook and leaves the file as
it was. Consecutive prints to one stream are merged into one output, as the book expects.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# the same pins as the Makefile's exports, so that the stored outputs are the ones nbval makes,
# and no progress line (lnbook.progress) in them
ENVIRONMENT = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2", "LNBOOK_PROGRESS": "0"}


def execute(path: Path, timeout: int = 3600) -> float:
    """Execute ``path`` in place and return the seconds it took."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, kernel_name="python3", timeout=timeout, record_timing=False,
                   resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def merge_streams(outputs: list) -> list:
    """One output per run of same-stream prints: the book shows each stream output as a box."""
    merged = []
    for out in outputs:
        if merged and out.get("output_type") == "stream" == merged[-1].get("output_type") and out.get("name") == merged[-1].get("name"):
            merged[-1]["text"] += out["text"]
        else:
            merged.append(out)
    return merged


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__)
        return 2
    os.environ.update(ENVIRONMENT)
    for p in map(Path, paths):
        print(f"{p}: {execute(p):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
