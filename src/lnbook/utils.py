"""Seeding, device choice, showing source and result tables in a notebook, and reading a stored result file."""

from __future__ import annotations

import csv
import inspect
import math
import random
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every GPU)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def default_device() -> torch.device:
    """The first CUDA GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def spread(values: Sequence[float], digits: int = 3) -> str:
    """Per-seed results as ``"mean [min, max]"``, each rounded to ``digits`` decimals."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or len(v) == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence of numbers, got shape {v.shape}")
    return f"{v.mean():.{digits}f} [{v.min():.{digits}f}, {v.max():.{digits}f}]"


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of per-seed results and its Student-t confidence interval
    at ``level`` (seeds as independent draws). Needs at least two values."""
    from scipy.stats import t as student_t

    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or len(v) < 2:
        raise ValueError(f"values must be a 1-D sequence of at least 2 numbers, got shape {v.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    half = student_t.ppf((1 + level) / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def ci(values: Sequence[float], digits: int = 3) -> str:
    """Per-seed results as ``"mean [low, high]"``: the 95% confidence interval of the mean."""
    mean, low, high = interval(values)
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


class Table:
    """Rows of results that a notebook renders as a Markdown table and a terminal (or nbval,
    which compares text) sees as aligned plain text."""

    def __init__(self, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        self.header = [str(h) for h in header]
        self.rows = [[str(c) for c in row] for row in rows]
        for i, row in enumerate(self.rows):
            if len(row) != len(self.header):
                raise ValueError(f"rows[{i}] has {len(row)} cells, the header has {len(self.header)}")

    def __repr__(self) -> str:
        widths = [max(len(r[j]) for r in [self.header, *self.rows]) for j in range(len(self.header))]
        line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        return "\n".join([line(self.header), "-+-".join("-" * w for w in widths), *map(line, self.rows)])

    def _repr_markdown_(self) -> str:
        esc = lambda c: c.replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(map(esc, self.header)) + " |", "|" + "---|" * len(self.header)]
        return "\n".join(lines + ["| " + " | ".join(map(esc, r)) + " |" for r in self.rows])


class Source:
    """Python source that a notebook shows syntax-highlighted and a terminal shows as text."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __repr__(self) -> str:
        return self.code.rstrip("\n")

    def _repr_html_(self) -> str:
        # Inline styles (no CSS classes) so the rendered book needs no extra stylesheet.
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        return highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True, style="default"))


def show_source(obj: object) -> Source:
    """Return the source of a function, class, method or module for display in a notebook.

    The book shows the code it runs from one place, the package, instead of pasting copies.
    A Triton kernel (compiled or interpreted) shows the Python function it was made from.
    """
    if callable(getattr(obj, "fn", None)) and type(obj).__module__.startswith("triton"):
        obj = obj.fn
    try:
        code = inspect.getsource(obj)
    except (TypeError, OSError):
        raise TypeError(
            f"show_source needs a Python function, class, method or module with source code, "
            f"got {type(obj).__name__}"
        ) from None
    return Source(textwrap.dedent(code))


def stored_number(text: str, where: str, script: str) -> float:
    """One cell of a stored run's table as a number: empty is ``nan``; anything else must be a
    finite number or ``nan`` (a ValueError names ``benchmarks/<script>``'s run and the column)."""
    try:
        value = float(text) if text else math.nan
    except ValueError:
        raise ValueError(f"the stored run of benchmarks/{script} holds {text!r} in {where}, expected a number") from None
    if math.isinf(value):
        raise ValueError(f"the stored run of benchmarks/{script} holds {text!r} in {where}, expected a finite number or nan")
    return value


def stored_rows(folder: Path | Traversable, name: str, columns: list[str], script: str) -> tuple[list[str], list[dict[str, str]]]:
    """One file of a stored run that ``benchmarks/<script>`` writes: (its provenance lines, its
    rows), checked for its columns."""
    file = folder / name
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: benchmarks/{script} writes it (with --out for another folder)")
    lines = file.read_text().splitlines()
    head = [line[2:] for line in lines if line.startswith("# ")]
    body = [line for line in lines if line and not line.startswith("#")]
    if not head or not body or body[0].split(",") != columns:
        raise ValueError(f"{file} is malformed: expected '# ' provenance lines, then the columns {','.join(columns)}, "
                         f"got {body[0] if body else 'no table'!r}")
    rows = list(csv.DictReader(body))
    if len(rows) < 1 or any(None in r or None in r.values() for r in rows):
        raise ValueError(f"{file} is malformed: every row must hold the {len(columns)} columns {','.join(columns)}")
    return head, rows
