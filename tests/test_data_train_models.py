"""lnbook.data, lnbook.train, lnbook.models and lnbook.parallel."""

import pytest
import torch

from lnbook import data, models, parallel, train, utils


def test_digits_sequences_shapes_range_and_determinism():
    (xtr, ytr), (xte, yte) = data.digits_sequences("pixel")
    assert xtr.shape == (1437, 64, 1) and xte.shape == (360, 64, 1)
    assert xtr.dtype == torch.float32 and ytr.dtype == torch.int64
    assert 0.0 <= float(xtr.min()) and float(xtr.max()) == 1.0
    (rtr, _), _ = data.digits_sequences("row")
    assert rtr.shape == (1437, 8, 8)
    torch.testing.assert_close(rtr.reshape(-1, 64), xtr.reshape(-1, 64))  # same images, other order
    (again, _), _ = data.digits_sequences("pixel")
    assert torch.equal(again, xtr)


def test_split_is_stratified_and_fixed():
    (_, ytr), (_, yte) = data.digits_sequences("pixel")
    share = yte.bincount() / (ytr.bincount() + yte.bincount())
    assert ((share - 0.2).abs() < 0.01).all()
    (_, ytr2), _ = data.digits_sequences("pixel", permute=True, seed=5)
    assert torch.equal(ytr, ytr2)


def test_permutation_is_fixed_by_seed_and_a_real_permutation():
    (x, _), _ = data.digits_sequences("pixel")
    (p1, _), _ = data.digits_sequences("pixel", permute=True, seed=1)
    (p1b, _), _ = data.digits_sequences("pixel", permute=True, seed=1)
    (p2, _), _ = data.digits_sequences("pixel", permute=True, seed=2)
    assert torch.equal(p1, p1b) and not torch.equal(p1, p2) and not torch.equal(p1, x)
    torch.testing.assert_close(p1.sort(dim=1).values, x.sort(dim=1).values)


def test_pad_batch():
    seqs = [torch.ones(3, 2), 2 * torch.ones(1, 2), 3 * torch.ones(4, 2)]
    padded, lengths, mask = data.pad_batch(seqs)
    assert padded.shape == (3, 4, 2) and lengths.tolist() == [3, 1, 4]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert (padded[~mask] == 0).all() and (padded[1, 0] == 2).all()
    with pytest.raises(ValueError, match="at least one"):
        data.pad_batch([])
    with pytest.raises(ValueError, match=r"sequences\[1\] must be a \(T_i, F\) tensor"):
        data.pad_batch([torch.ones(3, 2), torch.ones(3)])
    with pytest.raises(ValueError, match=r"sequences\[1\] has 3 features"):
        data.pad_batch([torch.ones(3, 2), torch.ones(3, 3)])


def test_variable_length_holds_every_row_and_pads_with_zeros():
    (x, lengths, y), (xt, lt, yt) = data.variable_length(1, 3, seed=0)
    assert x.shape == (1437, 24, 8) and xt.shape == (360, 24, 8)
    assert 8 <= int(lengths.min()) and int(lengths.max()) <= 24 and len(lengths.unique()) > 8
    mask = torch.arange(24) < lengths[:, None]
    assert (x[~mask] == 0).all()
    (rows, _), _ = data.digits_sequences("row")
    first = x[0, : lengths[0]].unique_consecutive(dim=0)
    assert len(first) <= 8 and set(map(tuple, first.tolist())) <= set(map(tuple, rows[0].tolist()))
    (fixed, fl, _), _ = data.variable_length(2, 2)
    assert (fl == 16).all() and fixed.shape[1] == 16
    with pytest.raises(ValueError, match="min_repeat"):
        data.variable_length(3, 2)


def test_adding_problem():
    x, y = data.adding_problem(50, 20, seed=3)
    assert x.shape == (50, 20, 2) and y.shape == (50,)
    assert (x[..., 1].sum(1) == 2).all()
    assert (x[:, :10, 1].sum(1) == 1).all()  # one marker in each half
    torch.testing.assert_close(y, (x[..., 0] * x[..., 1]).sum(1))
    assert torch.equal(data.adding_problem(50, 20, seed=3)[0], x)
    with pytest.raises(ValueError, match="length must be"):
        data.adding_problem(5, 1)


def small_run(norm="batch", seed=0):
    train_set, test_set = data.digits_sequences("pixel")
    utils.seed_everything(seed)
    model = models.MLP(64, (32,), 10, norm)
    return train.fit(model, train_set, test_set, epochs=2, lr=1e-2, batch_size=64, seed=seed)


def test_fit_learns_and_is_deterministic():
    h1, h2 = small_run(), small_run()
    assert h1.step_loss == h2.step_loss and h1.test_acc == h2.test_acc
    assert len(h1.step_loss) == 2 * h1.steps_per_epoch == 2 * 23
    assert len(h1.train_acc) == len(h1.test_acc) == 2
    assert h1.test_acc[-1] > 0.8  # ten classes: chance is 0.1
    assert small_run(seed=1).step_loss != h1.step_loss


def test_fit_times_training_and_not_evaluation(fake_clock, monkeypatch):
    """One clock reading before and one after each epoch's training (1 s on the fake clock);
    the 100 s that each evaluation "takes" are left out."""
    evaluate = train.accuracy
    monkeypatch.setattr(train, "accuracy", lambda *args: (fake_clock.advance(100.0), evaluate(*args))[1])
    assert small_run().wall_time == [1.0, 2.0]


def test_fit_max_steps_stops_inside_an_epoch():
    train_set, test_set = data.digits_sequences("pixel")
    model = models.MLP(64, (8,), 10)
    h = train.fit(model, train_set, test_set, epochs=100, lr=1e-3, batch_size=64, seed=0, max_steps=30)
    assert len(h.step_loss) == 30 and len(h.test_acc) == 2  # 23 steps, then 7 of the second epoch
    with pytest.raises(ValueError, match="max_steps must be a positive int"):
        train.fit(model, train_set, test_set, epochs=1, lr=1e-3, batch_size=64, seed=0, max_steps=0)


def test_fit_drop_last_skips_the_short_batch():
    train_set, test_set = data.digits_sequences("pixel")  # 1,437 = 22 * 64 + 29
    model = models.MLP(64, (8,), 10, "batch")
    h = train.fit(model, train_set, test_set, epochs=1, lr=1e-3, batch_size=64, seed=0, drop_last=True)
    assert h.steps_per_epoch == len(h.step_loss) == 22
    with pytest.raises(ValueError, match="more than one real position"):  # 1,437 = 718 * 2 + 1
        train.fit(model, train_set, test_set, epochs=1, lr=1e-3, batch_size=2, seed=0)


def test_fit_rejects_bad_arguments():
    train_set, test_set = data.digits_sequences("pixel")
    model = models.MLP(64, (8,), 10)
    for kwargs, match in [
        ({"epochs": 0}, "epochs must be a positive int"),
        ({"batch_size": 2.5}, "batch_size must be a positive int"),
        ({"lr": -1}, "lr must be a positive number"),
        ({"optimizer": "lbfgs"}, "optimizer must be one of"),
    ]:
        args = {"epochs": 1, "lr": 1e-3, "batch_size": 32, "seed": 0} | kwargs
        with pytest.raises(ValueError, match=match):
            train.fit(model, train_set, test_set, **args)
    with pytest.raises(TypeError, match="train must be a tuple of tensors"):
        train.fit(model, [train_set[0]], test_set, epochs=1, lr=1e-3, batch_size=32, seed=0)
    with pytest.raises(ValueError, match="same first dimension"):
        train.fit(model, (train_set[0][:5], train_set[1]), test_set, epochs=1, lr=1e-3, batch_size=32, seed=0)
    with pytest.raises(TypeError, match="int64 class labels"):
        train.fit(model, (train_set[0], train_set[1].float()), test_set, epochs=1, lr=1e-3, batch_size=32, seed=0)


@pytest.mark.parametrize("norm", models.GRUClassifier.NORMS)
def test_gru_classifier_ignores_padding_except_through_unmasked_batchnorm(norm):
    utils.seed_everything(0)
    model = models.GRUClassifier(3, 8, 4, norm)
    x = torch.randn(2, 5, 3)
    lengths = torch.tensor([5, 3])
    x[1, 3:] = 0.0
    garbage = x.clone()
    garbage[1, 3:] = torch.randn(2, 3) * 10
    longer = torch.cat([garbage, torch.randn(2, 4, 3)], dim=1)  # padding beyond the longest
    changed = not torch.allclose(model(x, lengths), model(garbage, lengths))
    assert changed == (norm == "batch_unmasked")  # training mode: padding enters its statistics
    model.eval()  # eval mode: running statistics, so no norm looks at the padding
    torch.testing.assert_close(model(x, lengths), model(longer, lengths))
    with pytest.raises(ValueError, match="lengths must be"):
        model(x, torch.tensor([6, 3]))


@pytest.mark.parametrize("norm", models.NormRNNCell.NORMS)
def test_rnn_classifier_runs_longer_than_trained_in_eval(norm):
    utils.seed_everything(0)
    model = models.RNNClassifier(2, 6, 3, norm, max_steps=4)
    loss = model(torch.randn(8, 4, 2)).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    assert model(torch.randn(1, 9, 2)).shape == (1, 3)
    with pytest.raises(ValueError, match="needs max_steps"):
        models.NormRNNCell(2, 6, "batch_per_step")
    with pytest.raises(ValueError, match="norm must be one of"):
        models.MLP(4, (3,), 2, "group")


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

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{parallel._free_port()}", rank=0, world_size=1)
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
