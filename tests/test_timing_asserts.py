"""No notebook cell, test, tool or benchmark asserts on a wall-clock time (tools/timing_asserts.py)."""

from pathlib import Path

import pytest

from timing_asserts import timing_asserts

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path for folder in ("tests", "tools", "benchmarks") for path in (ROOT / folder).glob("*.py"))

# The two cells that made `make test` fail about one run in two (chapters 05 and 06, first edition).
CHAPTER_05 = '''\
updates = {name: training_update(make) for name, make in contenders.items()}
seconds = bench.median_times(updates, repeat=10)
ops = {name: bench.count_ops(update) for name, update in updates.items()}
ratio = {name: seconds[name] / seconds["LSTM cell"] for name in contenders}
assert ratio["torch.nn.LSTM"] < 1 < ratio["LN-LSTM"] < ratio["BN-LSTM"] < ratio["LN-LSTM, composed"], ratio
'''
CHAPTER_06 = '''\
norm_seconds = bench.median_times(calls, repeat=30)
step_seconds = bench.median_times({n: training_step(n) for n in NORM_VARIANTS}, repeat=10)
assert norm_seconds["LayerNorm (torch, fused)"] < min(norm_seconds["RMSNorm (torch)"], norm_seconds["RMSNorm (lnbook)"])
assert step_seconds["rmsnorm"] > 0.9 * step_seconds["layernorm"] and step_seconds["none"] < step_seconds["layernorm"]
'''


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.relative_to(ROOT).as_posix() for p in SCRIPTS])
def test_no_script_asserts_on_a_time(path):
    assert timing_asserts([path.read_text()]) == []


def test_the_cells_that_failed_under_load_are_caught():
    assert [line for _, line, _ in timing_asserts([CHAPTER_05])] == [5]
    assert [line for _, line, _ in timing_asserts([CHAPTER_06])] == [3, 4]


@pytest.mark.parametrize("cells", [
    ["t = time.perf_counter()\nassert t > 0"],
    ["start = time.perf_counter()\nf()\nelapsed = time.perf_counter() - start", "assert elapsed < 1"],  # a later cell
    ["gbps = {}\nfor n in (1, 2):\n    gbps[n] = nbytes / bench.seconds(f, device)", "assert all(v > 0 for v in gbps.values())"],
    ["times = []\nfor _ in range(3):\n    times.append(timeit.timeit(f))\nbest = min(times)\nassert best > 0"],
    ["def fwd_seconds(fn):\n    s = time.perf_counter()\n    fn()\n    return time.perf_counter() - s\n\nr = fwd_seconds(a) / fwd_seconds(b)", "assert r > 1"],
    ["h = fit(model)\nassert h.wall_time[-1] < 60"],
    ["for name, t in bench.median_times(fns).items():\n    assert t < 1e-3, name"],
    ["%timeit f()\nt = bench.gpu_time(f)\nassert t"],
], ids=["perf_counter", "next cell", "subscript", "append", "function", "wall_time", "loop", "magic"])
def test_planted_timing_asserts_are_caught(cells):
    assert len(timing_asserts(cells)) == 1


def test_asserts_on_counts_bytes_and_a_fake_clock_pass():
    cells = [
        "seconds = bench.median_times(updates)\nops = {n: bench.count_ops(u) for n, u in updates.items()}\n"
        "print({n: f'{1e3 * s:.1f} ms' for n, s in seconds.items()})\nassert ops['LN'] < ops['composed']",
        "traffic = bench.layernorm_traffic(4096, 4096, 2)\nassert traffic['flops'] / traffic['bytes'] < 2",
        "def test_median(fake_clock):\n    assert bench.median_times({'a': f}, repeat=3) == {'a': 1.0}",
    ]
    assert timing_asserts(cells) == []
