"""lnbook.bench: operator counts, interleaved timing on a fake clock, memory traffic and CSV provenance."""

import pytest
import torch

from lnbook import bench


def test_count_ops_counts_forward_and_backward_operators():
    x = torch.randn(4, 3, requires_grad=True)
    forward = bench.count_ops(lambda: torch.tanh(x @ x.T))
    both = bench.count_ops(lambda: torch.tanh(x @ x.T).sum().backward())
    assert forward >= 2  # at least the product and the tanh
    assert both > forward + 2  # the backward adds the tanh's and the product's gradients
    assert bench.count_ops(lambda: None) == 0
    assert bench.count_ops(lambda: x.view(2, 6)[:, :5].T.detach()) == 0  # views compute nothing
    assert bench.count_ops(lambda: x.T.contiguous()) == 1  # a copy does
    assert bench.list_ops(lambda: torch.tanh(x @ x.T)) == ["mm", "tanh"]


def test_median_times_interleaves_and_takes_the_median(fake_clock):
    fake_clock.tick = 0.0
    calls, took = [], {"a": iter([9.0, 1.0, 4.0, 2.0]), "b": iter([0.0, 5.0, 3.0, 7.0])}

    def timed(name):
        calls.append(name)
        fake_clock.advance(next(took[name]))  # this call "takes" the next of its durations

    fns = {"a": lambda: timed("a"), "b": lambda: timed("b")}
    times = bench.median_times(fns, repeat=3, warmup=1)
    assert calls == ["a", "b"] * 4  # one of each per round: warm-up, then 3 timed rounds
    assert times == {"a": 2.0, "b": 5.0}  # medians of (1, 4, 2) and (5, 3, 7); the warm-up is not timed
    with pytest.raises(ValueError, match="repeat must be a positive int"):
        bench.median_times(fns, repeat=0)
    with pytest.raises(ValueError, match="warmup must be a non-negative int"):
        bench.median_times(fns, warmup=-1)


def test_seconds_is_the_median_on_the_cpu(fake_clock):
    fake_clock.tick = 0.0
    took = iter([0.0, 0.0, 0.0, 4.0, 1.0, 3.0, 2.0])  # median_times' warm-up of 3 calls, then 4 timed calls
    assert bench.seconds(lambda: fake_clock.advance(next(took)), "cpu", repeat=4) == 2.5
    assert next(took, None) is None


def test_layernorm_traffic_counts_each_tensor_once():
    fwd = bench.layernorm_traffic(4096, 1024, 2)
    assert fwd["bytes"] == 2 * 4096 * 1024 * 2 + 2 * 1024 * 4 + 2 * 4096 * 4
    assert fwd["flops"] == 7 * 4096 * 1024
    bwd = bench.layernorm_traffic(4096, 1024, 2, backward=True)
    assert bwd["bytes"] > 1.4 * fwd["bytes"]  # x and dy in, dx out
    # RMSNorm moves one float32 vector (the bias) and one per-row statistic (the mean) less
    assert fwd["bytes"] - bench.layernorm_traffic(4096, 1024, 2, rms=True)["bytes"] == 1024 * 4 + 4096 * 4
    assert bwd["bytes"] - bench.layernorm_traffic(4096, 1024, 2, backward=True, rms=True)["bytes"] == 1024 * 4 + 4096 * 4
    # a few flops per byte: far below any processor's flops-per-byte balance, so memory-bound
    assert fwd["flops"] / fwd["bytes"] < 2
    with pytest.raises(ValueError, match="element_size must be a positive int"):
        bench.layernorm_traffic(8, 8, 0)


def test_copy_bandwidth_counts_a_read_and_a_write(fake_clock):
    fake_clock.tick = 0.5  # every copy "takes" 0.5 s
    assert bench.copy_bandwidth(nbytes=8 * 2**20, repeat=3) == 2 * 8 * 2**20 / 0.5


def test_csv_with_provenance(tmp_path):
    path = bench.write_csv([{"n": 1, "gbps": 2.5}, {"n": 2, "gbps": 3.0}], tmp_path / "r" / "x.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "n,gbps,machine,device,torch,triton,date"
    assert lines[1].startswith("1,2.5,") and torch.__version__ in lines[1] and len(lines) == 3
    with pytest.raises(ValueError, match="same keys"):
        bench.write_csv([{"n": 1}, {"m": 2}], tmp_path / "y.csv")


def test_list_op_traffic_counts_each_input_and_output_once():
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    assert bench.list_op_traffic(lambda: a * b) == [bench.OpTraffic("mul", 2 * 128, 128)]
    assert bench.list_op_traffic(lambda: a * a) == [bench.OpTraffic("mul", 128, 128)]  # one tensor, read once
    row = torch.randn(1, 8, dtype=torch.float64)
    # an expanded tensor stores 8 doubles, not 32; the expand itself is a view and computes nothing
    assert bench.list_op_traffic(lambda: row.expand(4, 8) + b.double()) == [
        bench.OpTraffic("_to_copy", 128, 256), bench.OpTraffic("add", 64 + 256, 256)]
    assert bench.list_op_traffic(lambda: torch.empty(100)) == [bench.OpTraffic("empty", 0, 0)]  # allocates only
    assert bench.count_bytes(lambda: a * b + a) == {"read": 256 + 256, "written": 256, "bytes": 768}
    assert bench.count_bytes(lambda: None) == {"read": 0, "written": 0, "bytes": 0}


def test_a_fused_layer_norm_moves_the_least_traffic_and_a_composed_one_far_more():
    m, n = 64, 32
    x, w, b = (torch.randn(*s, requires_grad=True) for s in ((m, n), (n,), (n,)))
    dy = torch.randn(m, n)

    def fwd_bwd(norm):
        torch.autograd.grad(norm(x), (x, w, b), dy)

    fused = bench.count_bytes(lambda: fwd_bwd(lambda v: torch.nn.functional.layer_norm(v, (n,), w, b)))
    least = bench.layernorm_traffic(m, n, 4)["bytes"] + bench.layernorm_traffic(m, n, 4, backward=True)["bytes"]
    # torch's backward kernel is handed the bias too (n floats it does not need to read)
    assert least <= fused["bytes"] <= least + 4 * n

    def composed(v):
        centered = v - v.mean(-1, keepdim=True)
        return centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5) * w + b

    unfused = bench.count_bytes(lambda: fwd_bwd(composed))
    assert unfused["bytes"] > 4 * fused["bytes"]  # every operator writes a full-size tensor and the next reads it


def test_quartile_times_orders_its_quartiles_and_matches_the_median(fake_clock):
    fake_clock.tick = 0.0
    took = iter([0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # one warmup call, then five timed

    def fn():
        fake_clock.advance(next(took))

    q = bench.quartile_times({"a": fn}, repeat=5, warmup=2)["a"]
    assert q == (2.0, 3.0, 4.0)
    with pytest.raises(ValueError, match="repeat"):
        bench.quartile_times({"a": fn}, repeat=1)


def test_new_pages_counts_fresh_memory():
    pytest.importorskip("resource")
    small = bench.new_pages(lambda: None, calls=3)
    big = bench.new_pages(lambda: bytearray(64 * 2**20), calls=3)  # 64 MiB, zeroed: fresh pages
    assert small < 100 < big
    with pytest.raises(ValueError, match="calls"):
        bench.new_pages(lambda: None, calls=0)


def test_saved_bytes_counts_each_kept_storage_once_and_skips_excluded():
    from lnbook import bench

    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    nbytes, out = bench.saved_bytes(lambda: x * w)
    assert nbytes == 2 * 8 * 16 * 4 and out.shape == (8, 16)
    assert bench.saved_bytes(lambda: x * w, exclude=[w])[0] == 8 * 16 * 4
    assert bench.saved_bytes(lambda: x[:4] * x[4:])[0] == 8 * 16 * 4  # two views of one storage
    with pytest.raises(TypeError, match="exclude"):
        bench.saved_bytes(lambda: x * w, exclude=[1.0])


def test_cpu_caches_and_copy_bandwidths_report_per_size():
    caches = bench.cpu_caches()
    assert all(k.startswith("L") and v for k, v in caches.items())
    speeds = bench.copy_bandwidths([0.25, 1], repeat=2)
    assert list(speeds) == [0.25, 1] and all(v > 0 for v in speeds.values())
    with pytest.raises(ValueError, match="sizes_mib"):
        bench.copy_bandwidths([])


def test_time_calls_and_format_quartiles():
    out = bench.time_calls({"a": lambda: None, "b": lambda: sum(range(100))}, {"a": 10, "b": 20}, full_bytes=4096, repeat=3)
    assert set(out) == {"a", "b"} and all(t.gbps > 0 and t.quartiles[0] <= t.quartiles[1] <= t.quartiles[2] for t in out.values())
    assert bench.format_quartiles((0.001, 0.002, 0.003)) == "2.00 ms [1.00, 3.00]"
    with pytest.raises(ValueError, match="nbytes"):
        bench.time_calls({"a": lambda: None}, {"b": 1}, full_bytes=1)


def test_reuse_freed_memory_cuts_fresh_pages():
    # 64 MiB: above the largest mmap threshold glibc's own dynamic rule ever sets (32 MiB on
    # 64-bit), so without the setting each call maps fresh pages even after earlier tests freed
    # big blocks (an 8 MiB block can already come from the heap then, and both counts are 0)
    alloc = lambda: bytearray(64 * 2**20)
    before = bench.new_pages(alloc, calls=3)
    with bench.reuse_freed_memory() as active:
        alloc()
        after = bench.new_pages(alloc, calls=3)
    if active:
        assert before > 0 and after < before
