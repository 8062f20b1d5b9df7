"""Measuring what code costs: operator counts and robust timings."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

from torch.utils._python_dispatch import TorchDispatchMode

from ._checks import check_positive_int


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """How many ATen operators that compute ``fn()`` runs, forward and backward.

    Counted below autograd, so the operators of a ``.backward()`` inside ``fn`` count too.
    Views (``view``, ``t``, ``detach``, ...) only relabel memory and are not counted. On a
    GPU each counted operator is about one kernel launch; on a CPU each pays a fixed
    dispatch cost of microseconds, which dominates when tensors are small.
    """
    with _OpCounter() as counter:
        fn()
    return counter.count


def median_times(fns: Mapping[str, Callable[[], object]], repeat: int = 20, warmup: int = 3) -> dict[str, float]:
    """Median wall-clock seconds of each ``fns[name]()`` over ``repeat`` calls, after ``warmup``.

    The calls are interleaved (one of each, ``repeat`` times over), so a slow moment of the
    machine hits every contender alike, and the median ignores the occasional slow call.
    For CPU code; a GPU needs synchronization (``triton.testing.do_bench``).
    """
    check_positive_int(repeat, "repeat")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
