"""Run `make test` on fresh clones while other processes keep every core busy.

CI shares its machine, and `make test` itself runs two notebooks at a time: a check that holds
only on a quiet machine fails there at random. This script proves the suite green under load:

    python tools/under_load.py [--runs 2] [--busy 2]

It clones the repository's committed HEAD into a temporary folder, starts ``--busy`` CPU-bound
processes (one busy loop each), runs ``make test`` in the clone ``--runs`` times in a row,
then ends the busy processes by their PIDs, and prints each run's wall time, result and the
nbval time of each notebook (from the run's JUnit XML). It exits non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from notebook_times import notebook_times

ROOT = Path(__file__).resolve().parents[1]


def busy_processes(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each spin one core until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="make test runs, one after another")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes kept running meanwhile")
    args = parser.parse_args()
    clone = Path(tempfile.mkdtemp(prefix="lnbook-under-load-"))
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    print(f"fresh clone of {commit} in {clone}", flush=True)
    failed = 0
    busy = busy_processes(args.busy)
    print(f"busy processes: PIDs {', '.join(str(p.pid) for p in busy)}", flush=True)
    try:
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            with open(clone / f"make-test-{run}.log", "w") as log:
                code = subprocess.run(["make", "test"], cwd=clone, stdout=log, stderr=subprocess.STDOUT).returncode
            wall = time.monotonic() - start
            failed += code != 0
            times, nbval_wall = notebook_times(clone / "_build" / "test-logs" / "nbval.xml")
            print(f"run {run}: make test {'passed' if code == 0 else f'FAILED (exit {code})'} in {wall:.0f} s; "
                  f"log {clone / f'make-test-{run}.log'}", flush=True)
            print(f"  nbval, {nbval_wall:.0f} s in all: " + ", ".join(f"{name[:2]} {s:.0f} s" for name, (_, s) in times.items()), flush=True)
            print(f"  still busy: {sum(p.poll() is None for p in busy)} of {len(busy)} processes", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        print(f"ended PIDs {', '.join(str(p.pid) for p in busy)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
