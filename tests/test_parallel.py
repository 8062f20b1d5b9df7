"""lnbook.parallel: data-parallel training, where BatchNorm needs synchronized statistics and LayerNorm does not."""

import pytest
import torch

from lnbook import parallel


def test_data_parallel_batchnorm_needs_sync_and_layernorm_does_not():
    ranks = parallel.data_parallel_run(("batch", "sync_batch", "layer"), steps=2)
    r0, r1 = ranks
    assert r0["batch"]["calls_per_step"] == {"gradients": 1.0}
    assert r0["sync_batch"]["calls_per_step"] == {"forward": 1.0, "backward": 1.0, "gradients": 1.0}
    assert not torch.allclose(r0["batch"]["running_mean"], r1["batch"]["running_mean"])
    torch.testing.assert_close(r0["sync_batch"]["running_mean"], r1["sync_batch"]["running_mean"])
    torch.testing.assert_close(r0["layer"]["probe_output"], r1["layer"]["probe_output"])
    assert not torch.allclose(r0["batch"]["probe_output"], r1["batch"]["probe_output"])
    for norm in ("batch", "sync_batch", "layer"):  # averaged gradients keep the weights in step
        torch.testing.assert_close(r0[norm]["params"], r1[norm]["params"])


def test_synchronized_statistics_on_one_process_equal_the_local_ones():
    import torch.distributed as dist

    from lnbook.norms import MaskedBatchNorm1d

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{parallel.free_port()}", rank=0, world_size=1)
    try:
        x = torch.randn(3, 6, 4, dtype=torch.float64) * 3 + 2
        mask = torch.rand(3, 6) > 0.3
        local, synced = MaskedBatchNorm1d(4).double(), MaskedBatchNorm1d(4, process_group=dist.group.WORLD).double()
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = local(xa, mask), synced(xb, mask)
        (ya.sin().sum()).backward(), (yb.sin().sum()).backward()
        torch.testing.assert_close(ya, yb)
        torch.testing.assert_close(xa.grad, xb.grad)
        torch.testing.assert_close(local.running_var, synced.running_var)
        # float32 features with a large mean: the synchronized sums must not cancel
        big = torch.randn(64, 4) + 1000.0
        a, b = MaskedBatchNorm1d(4)(big), MaskedBatchNorm1d(4, process_group=dist.group.WORLD)(big)
        torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="world_size"):
        parallel.data_parallel_run(world_size=1)
