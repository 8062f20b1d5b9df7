"""Measuring what code costs: operator counts, timings, memory traffic and bandwidth, results with provenance."""

from __future__ import annotations

import csv
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ._checks import check_int, check_positive_int


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def list_ops(fn: Callable[[], object]) -> list[str]:
    """The ATen operators that compute, in the order ``fn()`` runs them, forward and backward.

    Recorded below autograd, so the operators of a ``.backward()`` inside ``fn`` appear too.
    Views (``view``, ``t``, ``detach``, ...) only relabel memory and are left out. On a GPU
    each listed operator is about one kernel launch and one pass over its tensors; on a CPU
    each pays a fixed dispatch cost of microseconds, which dominates when tensors are small.
    """
    with _OpRecorder() as recorder:
        fn()
    return recorder.names


def count_ops(fn: Callable[[], object]) -> int:
    """How many ATen operators that compute ``fn()`` runs, forward and backward (see :func:`list_ops`)."""
    return len(list_ops(fn))


class OpTraffic(NamedTuple):
    """One ATen operator of :func:`list_op_traffic`: its name and the bytes it reads and writes."""

    name: str
    read: int
    written: int


def _stored_bytes(t: torch.Tensor) -> int:
    # the bytes of the elements a tensor really holds: an expanded dimension (stride 0)
    # repeats the same elements, so it adds nothing
    held = math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)
    return held * t.element_size()


def _tensors(tree: object) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _TrafficRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpTraffic] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            name = func.overloadpacket.__name__
            # a tensor passed twice (x * x) is read once; an op named empty* only allocates
            inputs = {(t.data_ptr(), t.shape, t.stride()): t for t in _tensors((args, kwargs))}
            outputs = {(t.data_ptr(), t.shape, t.stride()): t for t in _tensors(out)}
            read = sum(_stored_bytes(t) for t in inputs.values())
            written = 0 if name.startswith("empty") else sum(_stored_bytes(t) for t in outputs.values())
            self.ops.append(OpTraffic(name, read, written))
        return out


def list_op_traffic(fn: Callable[[], object]) -> list[OpTraffic]:
    """The operators of ``fn()`` (as :func:`list_ops`), each with the bytes it reads and writes.

    The model behind the numbers: every operator reads each of its input tensors once and
    writes each of its outputs once, all from and to memory; an unfused chain of operators
    works that way when its tensors are larger than the caches. It ignores the reuse of data
    still in cache from the previous operator, and the re-reads inside one operator (a fused
    kernel that reads a row twice, the second time from cache, counts it once).
    An expanded tensor counts the elements it stores, not the ones it shows.
    """
    with _TrafficRecorder() as recorder:
        fn()
    return recorder.ops


def count_bytes(fn: Callable[[], object]) -> dict[str, int]:
    """Total bytes ``fn()`` reads and writes in :func:`list_op_traffic`'s model:
    ``{"read": ..., "written": ..., "bytes": read + written}``."""
    ops = list_op_traffic(fn)
    read, written = sum(op.read for op in ops), sum(op.written for op in ops)
    return {"read": read, "written": written, "bytes": read + written}


def _interleaved_times(fns: Mapping[str, Callable[[], object]], repeat: int, warmup: int) -> dict[str, list[float]]:
    """Wall-clock seconds of ``repeat`` interleaved calls of each ``fns[name]()``, after ``warmup``."""
    check_positive_int(repeat, "repeat")
    check_int(warmup, "warmup")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def median_times(fns: Mapping[str, Callable[[], object]], repeat: int = 20, warmup: int = 3) -> dict[str, float]:
    """Median wall-clock seconds of each ``fns[name]()`` over ``repeat`` calls, after ``warmup``.

    The calls are interleaved (one of each, ``repeat`` times over), so a slow moment of the
    machine hits every contender alike, and the median ignores the occasional slow call.
    For CPU code; a GPU needs synchronization (``triton.testing.do_bench``).
    """
    times = _interleaved_times(fns, repeat, warmup)
    return {name: statistics.median(t) for name, t in times.items()}


def quartile_times(
    fns: Mapping[str, Callable[[], object]], repeat: int = 20, warmup: int = 3
) -> dict[str, tuple[float, float, float]]:
    """Like :func:`median_times` (interleaved calls), but each entry is the
    ``(first quartile, median, third quartile)`` of the ``repeat`` wall-clock seconds, so that
    a comparison can say how far the calls spread."""
    if isinstance(repeat, int) and not isinstance(repeat, bool) and repeat == 1:
        raise ValueError(f"repeat must be at least 2 for quartiles, got {repeat}")
    times = _interleaved_times(fns, repeat, warmup)
    out = {}
    for name, t in times.items():
        q1, q2, q3 = statistics.quantiles(t, n=4, method="inclusive")
        out[name] = (q1, q2, q3)
    return out


def new_pages(fn: Callable[[], object], calls: int = 5) -> float:
    """Minor page faults per call of ``fn()``: pages the operating system had to map in (and
    zero) for fresh memory, averaged over ``calls`` calls. NaN where the ``resource`` module
    (Unix only) is missing."""
    check_positive_int(calls, "calls")
    try:
        import resource
    except ImportError:  # Windows
        return float("nan")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def layernorm_traffic(m: int, n: int, element_size: int, *, backward: bool = False, rms: bool = False) -> dict[str, int]:
    """The least memory traffic and arithmetic of one LayerNorm (or RMSNorm) over ``(m, n)``.

    ``bytes``: every tensor read or written once, ``element_size`` bytes per element of x, y,
    dy, dx, and float32 weights, biases and per-row statistics. Forward: read x, w, b; write y,
    mean, rstd. Backward: read x, dy, w, mean, rstd; write dx, dw, db. RMSNorm (``rms``) has
    no bias and no mean: forward reads x, w and writes y, rstd; backward reads x, dy, w, rstd
    and writes dx, dw. ``flops``: per element,
    forward 7 (LayerNorm; 5 for RMSNorm: no mean) and backward 11 (9); the per-row work is
    negligible. Their ratio, the arithmetic intensity, decides whether a kernel is memory-bound.
    """
    check_positive_int(m, "m")
    check_positive_int(n, "n")
    check_positive_int(element_size, "element_size")
    params = stats = 1 if rms else 2  # weight and rstd; LayerNorm adds a bias and the mean
    if backward:
        nbytes = 3 * m * n * element_size + (1 + params) * n * 4 + stats * m * 4
        flops = (9 if rms else 11) * m * n
    else:
        nbytes = 2 * m * n * element_size + params * n * 4 + stats * m * 4
        flops = (5 if rms else 7) * m * n
    return {"bytes": nbytes, "flops": flops}


def copy_bandwidth(device: str | torch.device = "cpu", nbytes: int = 256 * 2**20, repeat: int = 10) -> float:
    """Measured bytes per second of a large tensor copy (read plus write): the ceiling for a
    memory-bound kernel on ``device``."""
    check_positive_int(nbytes, "nbytes")
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / seconds(lambda: dst.copy_(src), device, repeat)


def seconds(fn: Callable[[], object], device: str | torch.device = "cpu", repeat: int = 10) -> float:
    """Median seconds of ``fn()`` on ``device``: :func:`gpu_time` on a CUDA GPU, else
    :func:`median_times` over ``repeat`` calls."""
    if torch.device(device).type == "cuda":
        return gpu_time(fn)
    return median_times({"fn": fn}, repeat)["fn"]


def gpu_time(fn: Callable[[], object]) -> float:
    """Median seconds of ``fn()`` on a CUDA GPU, with Triton's ``do_bench`` (warm-up, cache
    flushing, synchronization)."""
    import triton.testing

    return triton.testing.do_bench(fn, return_mode="median") / 1e3


def provenance(device: str | torch.device = "cpu") -> dict[str, str]:
    """Where and when a measurement was made: machine, device name, torch and triton versions, date."""
    import datetime
    import platform

    import triton

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        if os.path.exists("/proc/cpuinfo"):  # Linux names the CPU model there
            models = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
            name = models[0] if models else name
        name = f"{name} ({torch.get_num_threads()} threads)"
    return {
        "machine": platform.node(),
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }


def write_csv(rows: Sequence[Mapping[str, object]], path: str | os.PathLike, device: str | torch.device = "cpu") -> Path:
    """Write result rows (dicts with the same keys) to a CSV file, each with the provenance
    columns filled; returns the path."""
    if not rows:
        raise ValueError("rows must hold at least one result")
    keys = list(rows[0])
    if any(list(r) != keys for r in rows):
        raise ValueError("every row must have the same keys, in the same order")
    stamp = provenance(device)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys + list(stamp))
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, **stamp})
    return path


class GpuRun(NamedTuple):
    """One run of ``benchmarks/layernorm_gpu.py``: its timing rows (the CSV, as strings) and its
    checks (the ``-checks.json`` written beside it, or None when it is missing)."""

    csv: Path
    rows: list[dict[str, str]]
    checks: dict | None


def gpu_results(folder: str | os.PathLike) -> list[GpuRun]:
    """Every run of ``benchmarks/layernorm_gpu.py`` stored in ``folder`` (the CSVs that time
    lnbook's kernel), in the order of their file names; an empty list when there is none."""
    import json

    runs = []
    for path in sorted(Path(folder).glob("*.csv")):
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if not any(r.get("implementation") == "triton (lnbook)" for r in rows):
            continue  # another benchmark's table
        checks = path.with_name(path.stem + "-checks.json")
        runs.append(GpuRun(path, rows, json.loads(checks.read_text()) if checks.exists() else None))
    return runs


def saved_bytes(fn: Callable[[], torch.Tensor], exclude: Sequence[torch.Tensor] = ()) -> tuple[int, torch.Tensor]:
    """Run ``fn()`` and count the bytes of the tensors autograd saves for its backward pass,
    each storage once (a view of a kept storage adds nothing), leaving out the storages of
    ``exclude`` (parameters, which the model keeps anyway). Returns the bytes and ``fn()``'s output."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    skip = set()
    for t in exclude:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"exclude must hold tensors, got {type(t).__name__}")
        skip.add(t.untyped_storage().data_ptr())
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(kept.values()), out


def cpu_caches(cpu: int = 0) -> dict[str, str]:
    """The cache sizes the operating system reports for one CPU, e.g. ``{"L1d": "48K", "L3u": "32768K"}``
    (Linux ``/sys``; empty elsewhere). A shared L3 is the socket's, not what one thread gets."""
    check_int(cpu, "cpu")
    out = {}
    for d in sorted(Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*")):
        try:
            level, kind = (d / "level").read_text().strip(), (d / "type").read_text().strip()[0].lower()
            out[f"L{level}{kind}"] = (d / "size").read_text().strip()
        except OSError:
            continue
    return out


def copy_bandwidths(sizes_mib: Sequence[float], repeat: int = 5) -> dict[float, float]:
    """Bytes per second of a one-tensor copy at each size in MiB (CPU): the speed falls where
    the copy stops fitting the caches a thread can use."""
    if not sizes_mib:
        raise ValueError("sizes_mib must name at least one size")
    return {s: copy_bandwidth(nbytes=max(4, int(s * 2**20)), repeat=repeat) for s in sizes_mib}


class TimedCall(NamedTuple):
    """One function's timing: quartiles of the seconds per call, bandwidth at the median for
    the bytes it moves, and the fresh memory it maps per call, in tensors of ``full_bytes``."""

    quartiles: tuple[float, float, float]
    gbps: float
    fresh_tensors: float


def time_calls(fns: Mapping[str, Callable[[], object]], nbytes: Mapping[str, int], full_bytes: int,
               repeat: int = 15) -> dict[str, TimedCall]:
    """Time ``fns`` interleaved (:func:`quartile_times`) and turn each median into GB/s for the
    ``nbytes`` it moves; ``full_bytes`` is the size of one full-size tensor, the unit of fresh memory."""
    check_positive_int(full_bytes, "full_bytes")
    if set(nbytes) != set(fns):
        raise ValueError(f"nbytes must have the keys of fns {sorted(fns)}, got {sorted(nbytes)}")
    q = quartile_times(fns, repeat=repeat)
    return {name: TimedCall(q[name], nbytes[name] / q[name][1] / 1e9, new_pages(fn) * 4096 / full_bytes)
            for name, fn in fns.items()}


def format_quartiles(q: tuple[float, float, float]) -> str:
    """``"median ms [first quartile, third quartile]"`` for seconds ``(q1, median, q3)``."""
    if len(q) != 3:
        raise ValueError(f"q must be (q1, median, q3), got {q!r}")
    return f"{q[1] * 1e3:.2f} ms [{q[0] * 1e3:.2f}, {q[2] * 1e3:.2f}]"


class reuse_freed_memory:
    """Context manager: glibc keeps freed memory for reuse (``mallopt`` raises
    ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``), so tensors freed by one call are reused by
    the next instead of mapped afresh. On exit both thresholds go back to glibc's default
    values, but glibc's automatic raising of the mmap threshold stays off for the rest of the
    process (any ``mallopt`` of it turns that off). ``as`` gives whether the setting took
    (False where glibc's ``mallopt`` is missing)."""

    _TRIM, _MMAP, _DEFAULT = -1, -3, 128 * 1024

    def __enter__(self) -> bool:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        self._libc = ctypes.CDLL(name) if name else None
        if self._libc is None or not hasattr(self._libc, "mallopt"):
            self.active = False
        else:
            self.active = bool(self._libc.mallopt(self._MMAP, 2**30) and self._libc.mallopt(self._TRIM, 2**31))
        return self.active

    def __exit__(self, *exc: object) -> None:
        if self.active:
            self._libc.mallopt(self._MMAP, self._DEFAULT)
            self._libc.mallopt(self._TRIM, self._DEFAULT)
