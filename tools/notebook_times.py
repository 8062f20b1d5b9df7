"""How long each notebook took to re-execute under nbval, as a Markdown table for the book.

    python tools/notebook_times.py _build/test-logs/nbval.xml > _build/test-logs/notebook-times.md

Reads the JUnit XML that ``pytest --nbval --junitxml=...`` writes (one test case per cell),
adds up each notebook's cells and states the machine they ran on. `make test` writes the
table and book/reproducibility.md includes it, so the page shows the times of the last run.
"""

from __future__ import annotations

import platform
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

BUDGET_S = 180  # per notebook, on a 2-core CPU (the book guide's budget)


def notebook_times(junit_xml: str | Path) -> tuple[dict[str, tuple[int, float]], float]:
    """``({notebook stem: (cells, seconds)}, wall seconds of the whole run)`` from nbval's
    JUnit XML; a cell's time includes starting the kernel, for the first cell."""
    root = ET.parse(junit_xml).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    cells: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        name = case.get("classname", "")
        if not name.endswith(".ipynb"):
            raise ValueError(f"junit_xml: test case {name!r} is not a notebook cell; pass the XML of an nbval run")
        stem = name.removesuffix(".ipynb").rsplit(".", 1)[-1]
        cells[stem] += 1
        seconds[stem] += float(case.get("time", 0))
    if not cells:
        raise ValueError(f"junit_xml: {junit_xml} holds no test cases")
    return {s: (cells[s], seconds[s]) for s in sorted(cells)}, sum(float(s.get("time", 0)) for s in suites)


def markdown(times: dict[str, tuple[int, float]], wall: float, machine: dict[str, str]) -> str:
    """The table, one row per notebook, with the machine and versions underneath."""
    rows = ["| chapter | cells | seconds |", "|---|---:|---:|"]
    rows += [f"| {{doc}}`/notebooks/{stem}` | {n} | {s:.0f}{f' (over {BUDGET_S} s)' if s > BUDGET_S else ''} |"
             for stem, (n, s) in times.items()]
    return "\n".join(rows + [
        "",
        f"All {len(times)} notebooks, two at a time: {wall:.0f} s of wall time. Measured on "
        f"{machine['date']} on {machine['device']}, Python {platform.python_version()}, "
        f"torch {machine['torch']}, triton {machine['triton']}.",
        "",
    ])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    from lnbook.bench import provenance

    times, wall = notebook_times(argv[0])
    print(markdown(times, wall, provenance()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
