"""lnbook.train: the training loops, their pieces and runs side by side."""

import math
import copy
import os

import numpy as np
import pytest
import torch

from lnbook import data, models, rnn, train, utils
from lnbook.transformer import GPTConfig, TinyGPT


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


def test_fit_lm_learns_is_deterministic_and_warms_up():
    c = data.char_corpus()

    def run(**kw):
        torch.manual_seed(0)
        m = TinyGPT(GPTConfig(c.vocab_size, 16, n_layer=1, n_head=2, d_model=16))
        args = {"steps": 30, "lr": 1e-2, "batch_size": 8, "block_size": 16, "seed": 0, "eval_every": 10} | kw
        return train.fit_lm(m, c.train, c.val, **args)

    h = run()
    assert h.val_steps == [10, 20, 30] and len(h.step_loss) == 30 and not h.diverged
    assert h.val_loss[-1] < h.val_loss[0] < np.log(c.vocab_size)
    assert run().step_loss == h.step_loss
    assert run(warmup=30).step_loss[1:] != h.step_loss[1:]  # a smaller first step changes the rest
    assert run(lr=1e6, grad_clip=None).diverged or run(lr=1e6, grad_clip=None).val_loss[-1] > h.val_loss[-1]
    with pytest.raises(ValueError, match="warmup must be a non-negative int"):
        run(warmup=-1)
    with pytest.raises(TypeError, match="train_ids must be a 1-D int64"):
        train.fit_lm(None, c.train.float(), c.val, steps=1, lr=1.0, batch_size=1, block_size=4, seed=0)


def test_smoothed_and_updates_to():
    assert train.smoothed([4.0, 2.0, 0.0, 2.0], window=2).tolist() == [3.0, 1.0, 1.0]
    history = train.History(step_loss=[3.0, 2.0, 1.5, 0.5, 0.3, 0.2])
    assert train.updates_to(history, level=1.0, window=2) == 5  # means of 2 updates: 2.5, 1.75, 1.0, then 0.4 after update 5
    assert train.updates_to(history, level=0.1, window=2) is None


def test_evaluating_restores_the_mode_and_records_no_graph():
    model = models.MLP(4, (4,), 2, "batch")
    with train.evaluating(model) as device:
        assert not model.training and device == torch.device("cpu")
        assert not model(torch.randn(3, 4)).requires_grad
    assert model.training
    model.eval()
    with pytest.raises(RuntimeError, match="inside"):
        with train.evaluating(model):
            raise RuntimeError("inside")
    assert not model.training


def test_prepare_and_optimizer_step_clip_the_gradient():
    model = torch.nn.Linear(3, 1)
    run = train.prepare(model, lr=0.1, seed=0, optimizer="sgd")
    assert isinstance(run.optimizer, torch.optim.SGD) and model.training and run.device == torch.device("cpu")
    before = model.weight.detach().clone()
    loss = (model(torch.full((2, 3), 100.0)) ** 2).mean()
    assert train.optimizer_step(run.optimizer, loss, grad_clip=1.0) == loss.item()
    assert (model.weight - before).norm() <= 0.1 + 1e-6  # lr times a gradient clipped to norm 1
    with pytest.raises(ValueError, match="lr must be a positive number"):
        train.prepare(model, lr=0, seed=0)


def test_start_runs_equals_building_the_jobs_by_hand():
    train_set, test_set = data.digits_sequences("pixel")
    job = dict(train=train_set, test=test_set, epochs=1, lr=0.05, batch_size=256)
    ours = train.finish_runs({"mlp": train.start_runs(lambda: models.MLP(64, (8,), 10), [0, 1], **job)})["mlp"]
    for seed, (_, history) in zip([0, 1], ours):
        utils.seed_everything(seed)
        assert train.fit(models.MLP(64, (8,), 10), seed=seed, **job).step_loss == history.step_loss


def jobs(n_seeds=2):
    (x, y), (xt, yt) = data.digits_sequences("row")
    out = []
    for seed in range(n_seeds):
        utils.seed_everything(seed)
        model = rnn.SequenceClassifier(rnn.LSTMCell(8, 8, "layer"), 10)
        out.append(dict(model=model, train=(x[:128], y[:128]), test=(xt[:64], yt[:64]), epochs=1, lr=1e-2,
                        batch_size=32, seed=seed))
    return out


def test_fit_many_in_workers_equals_running_here(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")  # a pool even where the tests run side by side
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    here_jobs, worker_jobs = jobs(), jobs()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the workers: a different thread count may round differently
    try:
        here = [f.result() for f in train.fit_many(here_jobs)]
    finally:
        torch.set_num_threads(threads)
    workers = train.cpu_workers(2)
    try:
        there = [f.result() for f in train.fit_many(worker_jobs, workers)]
    finally:
        workers.shutdown()
    for (m1, h1), (m2, h2), job in zip(here, there, worker_jobs):
        assert h1.step_loss == h2.step_loss and h1.test_acc == h2.test_acc
        for p, q in zip(m1.state_dict().values(), m2.state_dict().values()):
            assert torch.equal(p, q)
        assert m2 is not job["model"]  # a worker's model comes back as a trained copy
    assert here[0][0] is here_jobs[0]["model"]  # here, the given model itself is trained
    assert here[0][1].step_loss != here[1][1].step_loss  # the seeds differ


@pytest.mark.parametrize(("cores", "side_by_side", "expected"), [(2, 2, None), (2, 1, 2), (8, 2, 2), (3, 1, 2), (1, 1, None)])
def test_cpu_workers_take_only_the_cores_left_to_them(monkeypatch, cores, side_by_side, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(side_by_side))
    workers = train.cpu_workers(2)
    try:
        assert (workers if workers is None else workers._max_workers) == expected
    finally:
        if workers is not None:
            workers.shutdown()


def test_fit_many_and_cpu_workers_reject_bad_input():
    with pytest.raises(TypeError, match=r"jobs\[1\] must be a dict"):
        train.fit_many([jobs(1)[0], {"lr": 1.0}])
    with pytest.raises(ValueError, match="processes must be a positive int"):
        train.cpu_workers(0)
    job = copy.copy(jobs(1)[0]) | {"epochs": 0}
    with pytest.raises(ValueError, match="epochs must be a positive int"):
        train.fit_many([job])


def _lm_run(**kw):
    c = data.char_corpus()
    torch.manual_seed(0)
    m = TinyGPT(GPTConfig(c.vocab_size, 16, n_layer=2, n_head=2, d_model=16))
    args = {"steps": 12, "lr": 1e-2, "batch_size": 4, "block_size": 16, "seed": 0, "eval_every": 6} | kw
    return m, train.fit_lm(m, c.train, c.val, **args)


def test_fit_lm_recording_changes_nothing_but_records():
    _, plain = _lm_run()
    model, rec = _lm_run(record_logits=True)
    assert plain.attn_logit_max == plain.attn_entropy == plain.log_z == []
    np.testing.assert_allclose(rec.step_loss, plain.step_loss, rtol=1e-4)  # explicit attention: same up to rounding
    assert len(rec.attn_logit_max) == len(rec.attn_entropy) == len(rec.log_z) == 12
    assert 0 < min(rec.attn_entropy) and max(rec.attn_entropy) < np.log(16)
    assert all(not block.attn.record_logits for block in model.blocks)  # switched off after training
    # the first step's records, by hand: the model as it was before the first update
    c = data.char_corpus()
    torch.manual_seed(0)
    fresh = TinyGPT(GPTConfig(c.vocab_size, 16, n_layer=2, n_head=2, d_model=16))
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(len(c.train) - 16, (4,), generator=gen)
    idx = c.train[starts[:, None] + torch.arange(16)]
    for block in fresh.blocks:
        block.attn.record_logits = True
    with torch.no_grad():
        logits = fresh(idx)
    assert rec.log_z[0] == pytest.approx(logits.logsumexp(-1).mean().item(), rel=1e-5)
    assert rec.attn_logit_max[0] == pytest.approx(max(b.attn.logit_max for b in fresh.blocks), rel=1e-5)
    with pytest.raises(ValueError, match="record_logits=True needs attention layers"):
        train.fit_lm(torch.nn.Linear(2, 2), c.train, c.val, steps=1, lr=1e-3, batch_size=1, block_size=4, seed=0,
                     record_logits=True)
    with pytest.raises(TypeError, match="record_logits must be a bool"):
        _lm_run(record_logits=1)
    with pytest.raises(ValueError, match="z_loss must be a number >= 0"):
        _lm_run(z_loss=-1.0)


def test_z_loss_adds_its_gradient_and_pulls_log_z_to_zero():
    """The step with z-loss equals Adam on cross-entropy + w * mean(logsumexp(logits)**2), whose
    gradient with respect to the logits is softmax - onehot (over N positions) plus 2 w log Z softmax / N."""
    c = data.char_corpus()
    w = 0.5
    torch.manual_seed(0)
    m = TinyGPT(GPTConfig(c.vocab_size, 16, n_layer=1, n_head=2, d_model=16)).double()
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(len(c.train) - 16, (4,), generator=gen)
    window = c.train[starts[:, None] + torch.arange(17)]
    idx, targets = window[:, :-1], window[:, 1:]
    logits = m(idx).detach().requires_grad_()
    (torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()) + w * logits.logsumexp(-1).pow(2).mean()).backward()
    n = targets.numel()
    p = logits.detach().softmax(-1)
    by_hand = (p - torch.nn.functional.one_hot(targets, c.vocab_size)) / n + 2 * w * logits.detach().logsumexp(-1, keepdim=True) * p / n
    torch.testing.assert_close(logits.grad, by_hand, rtol=1e-10, atol=1e-14)
    # fit_lm with z_loss minimizes exactly that: one step by hand equals fit_lm's first step
    def fresh():
        torch.manual_seed(0)
        return TinyGPT(GPTConfig(c.vocab_size, 16, n_layer=1, n_head=2, d_model=16)).double()

    a = fresh()
    train.fit_lm(a, c.train, c.val, steps=1, lr=1e-2, batch_size=4, block_size=16, seed=0, z_loss=w, grad_clip=None)
    b = fresh()
    opt = torch.optim.Adam(b.parameters(), lr=1e-2)
    out = b(idx)
    (torch.nn.functional.cross_entropy(out.flatten(0, 1), targets.flatten()) + w * out.logsumexp(-1).pow(2).mean()).backward()
    opt.step()
    for p_a, p_b in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p_a, p_b, rtol=1e-12, atol=1e-12)
    # and over a few steps a large weight pulls log Z toward 0 while the reported loss is the cross-entropy alone
    _, plain = _lm_run(steps=30, record_logits=True)
    _, held = _lm_run(steps=30, record_logits=True, z_loss=1.0)
    assert abs(held.log_z[-1]) < 0.5 * abs(plain.log_z[-1])
    assert held.step_loss[0] == pytest.approx(plain.step_loss[0], rel=1e-6)  # the first step: same model, z-loss not reported


def test_radam_factor_is_the_step_size_ratio_of_radam_to_adam():
    """With a constant gradient, Adam's step is lr and RAdam's is lr times its rectification factor
    (0 while the variance is intractable, when RAdam steps by the un-adapted momentum instead)."""
    assert [train.radam_factor(t) for t in range(1, 6)] == [0.0] * 5
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.RAdam([p], lr=0.1)
    for t in range(1, 40):
        before = p.item()
        p.grad = torch.ones(1)
        opt.step()
        if t > 5:
            assert before - p.item() == pytest.approx(0.1 * train.radam_factor(t), rel=1e-4)
    assert 0 < train.radam_factor(300) < train.radam_factor(2000) < 1
    with pytest.raises(ValueError, match="step must be a positive int"):
        train.radam_factor(0)


def test_warmup_cosine_rises_linearly_then_decays_to_zero():
    factor = [train.warmup_cosine(t, warmup=10, steps=110) for t in range(1, 111)]
    assert factor[:10] == pytest.approx([t / 10 for t in range(1, 11)])
    assert factor[59] == pytest.approx(0.5) and factor[-1] == pytest.approx(0.0, abs=1e-12)  # half-way down; 0 at the end
    assert all(a >= b for a, b in zip(factor[9:], factor[10:]))
    assert train.warmup_cosine(1, warmup=0, steps=5) == pytest.approx(0.5 * (1 + math.cos(math.pi / 5)))
    for kw, match in (({"warmup": 5, "steps": 5}, "warmup must be in 0..steps-1"), ({"warmup": -1, "steps": 5}, "warmup"),
                      ({"warmup": 1, "steps": 0}, "steps")):
        with pytest.raises(ValueError, match=match):
            train.warmup_cosine(1, **kw)


def test_make_optimizer_takes_adams_beta2_and_refuses_it_for_sgd():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert train.make_optimizer(p, 0.1, "adam", beta2=0.95).param_groups[0]["betas"] == (0.9, 0.95)
    assert train.make_optimizer(p, 0.1, "radam").param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="beta2 is Adam's"):
        train.make_optimizer(p, 0.1, "sgd", beta2=0.95)
    with pytest.raises(ValueError, match="beta2 must be a number in"):
        train.make_optimizer(p, 0.1, "adam", beta2=1.0)
