"""Progress of long loops (training many seeds, sweeps), shown where a reader is watching.

``progress(range(steps), "steps")`` yields what the range yields and, while it runs, keeps one
line up to date: in a notebook a reader opened (JupyterLab, Jupyter Notebook, Colab) an output
line under the cell; in a terminal, when asked, a line on stderr. Loops inside loops share their
outermost loop's line (``runs 3/20 › epochs 12/40``). Anywhere else (nbval, nbclient, scripts,
tests) nothing is shown, so stored outputs and the built book never contain a bar.

Who decides, first to last: ``with showing(True or False):``, then the environment variable
``LNBOOK_PROGRESS`` (``1`` or ``0``), then whether this is a Jupyter kernel opened from a
Jupyter server (it sets ``JPY_SESSION_NAME`` for the kernels it starts) or Colab's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from ._checks import check_bool, check_choice, check_int

T = TypeVar("T")
WIDTH = 20  # characters of a bar
EVERY = 0.25  # seconds between two updates of the line


@dataclass(eq=False)
class _Loop:
    what: str
    total: int | None
    cell: int | None  # the notebook cell (execution count) it started in; None outside a kernel
    done: int = 0
    start: float = field(default_factory=time.monotonic)


_forced: bool | None = None
_active: list[_Loop] = []  # the running loops, outermost first
_line: dict = {"handle": None, "shown": 0.0}  # the outermost loop's display in a notebook; its last update


def _kernel_shell():
    """The IPython shell of the Jupyter kernel this runs in, or None."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if getattr(shell, "kernel", None) is not None else None


def shown() -> bool:
    """Whether a loop wrapped in :func:`progress` shows its progress here and now."""
    if _forced is not None:
        return _forced
    setting = os.environ.get("LNBOOK_PROGRESS")
    if setting is not None:
        return check_choice(setting, ("0", "1"), "the environment variable LNBOOK_PROGRESS") == "1"
    return _kernel_shell() is not None and ("JPY_SESSION_NAME" in os.environ or "google.colab" in sys.modules)


@contextmanager
def showing(on: bool = True) -> Iterator[None]:
    """Show (``on=True``) or hide every progress line inside the ``with`` block, wherever it runs."""
    global _forced
    before, _forced = _forced, check_bool(on, "on")
    try:
        yield
    finally:
        _forced = before


def _text(now: float) -> str:
    parts = []
    for loop in _active:
        if loop.total:
            filled = WIDTH * loop.done // loop.total
            parts.append(f"{loop.what} {'█' * filled}{'░' * (WIDTH - filled)} {loop.done}/{loop.total}")
        else:
            parts.append(f"{loop.what} {loop.done}")
    return " › ".join(parts) + f" · {now - _active[0].start:.0f} s"


def _show(force: bool = False, end: bool = False) -> None:
    """Update the line, at most every EVERY seconds unless ``force``; ``end``: the outermost loop is done."""
    now = time.monotonic()
    if not force and now - _line["shown"] < EVERY:
        return
    _line["shown"] = now
    text = _text(now)
    if _kernel_shell() is None:  # a terminal: one line on stderr, rewritten in place (ESC [K clears its old tail)
        sys.stderr.write(f"\r{text}\x1b[K" + ("\n" if end else ""))
        sys.stderr.flush()
        return
    from IPython.display import display

    if _line["handle"] is None:  # a new outermost loop: a line of its own under the cell
        _line["handle"] = display({"text/plain": text}, raw=True, display_id=True)
    else:
        _line["handle"].update({"text/plain": text}, raw=True)
    if end:
        _line["handle"] = None


def progress(iterable: Iterable[T], what: str, total: int | None = None) -> Iterator[T]:
    """Yield from ``iterable`` and show how far it has got, as ``what done/total`` (``total``
    defaults to ``len(iterable)`` where it has one); silent where :func:`shown` is False."""
    if total is not None:
        check_int(total, "total")
    if not shown():
        return iter(iterable)
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    shell = _kernel_shell()
    return _shown_loop(iterable, _Loop(what, total, shell.execution_count if shell is not None else None))


def _shown_loop(iterable: Iterable[T], loop: _Loop) -> Iterator[T]:
    if any(other.cell != loop.cell for other in _active):  # a loop an earlier cell left unfinished (held, not closed)
        _active.clear()
        _line["handle"] = None
    _active.append(loop)  # an exception in the loop's body closes this generator, and its finally removes it
    try:
        _show(force=len(_active) == 1)
        for item in iterable:
            yield item
            loop.done += 1
            _show()
    finally:
        if _active[:1] == [loop]:
            _show(force=True, end=True)
        _active[:] = [other for other in _active if other is not loop]
