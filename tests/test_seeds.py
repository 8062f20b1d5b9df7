"""lnbook.seeds: S plain models as one, member by member what each computes and how each trains alone."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from lnbook import data, models, rnn, seeds, train, utils
from lnbook.transformer import GPTConfig, TinyGPT, TinyViT

CORPUS = data.char_corpus()


def _plain(make, seed_list=(0, 1, 2)):
    out = []
    for seed in seed_list:
        utils.seed_everything(seed)
        out.append(make())
    return out


def _gpt(**settings):
    return TinyGPT(GPTConfig(CORPUS.vocab_size + 1, 16, n_layer=2, n_head=2, d_model=16, **settings))


FAMILIES = {  # name: (make a plain model, inputs for S = 3 members)
    **{f"mlp-{n}": (lambda n=n: models.MLP(6, (8, 8), 3, n), lambda: (torch.randn(3, 5, 6),)) for n in models.MLP.NORMS},
    **{f"{cell.__name__}-{n}": (lambda n=n, cell=cell: rnn.SequenceClassifier(cell(4, 8, n, max_steps=5), 3),
                                lambda: (torch.randn(3, 6, 5, 4), torch.tensor([[5, 5, 2, 3, 4, 1]] * 3)))
       for n in rnn.NORMS for cell in (rnn.LSTMCell, rnn.GRUCell)},
    **{f"gpt-{n}": (lambda n=n: _gpt(norm=n), lambda: (torch.randint(30, (3, 4, 16)),)) for n in ("layernorm", "rms", "dyt", "batch")},
    "gpt-post-qk": (lambda: _gpt(norm_position="post", final_norm=False, qk_norm="rmsnorm"), lambda: (torch.randint(30, (3, 4, 16)),)),
    "gpt-encoder-padded": (lambda: _gpt(causal=False, norm="batch"),
                           lambda: (torch.randint(30, (3, 4, 16)), torch.arange(16).expand(3, 4, 16) < torch.tensor([16, 9, 12, 5])[:, None])),
    **{f"vit-{n}": (lambda n=n: TinyViT(norm=n), lambda: (torch.randn(3, 5, 8, 8),)) for n in ("layernorm", "batchnorm", "rms")},
}
FAMILIES.update({  # chapter 02's Elman networks: RecurrentBatchNorm's buffers gain the seed axis too (stacks_buffers)
    f"elman-{n}": (lambda n=n: rnn.ElmanClassifier(4, 8, 3, n, **({"max_steps": 6} if n == "batch_per_step" else {})),
                   lambda: (torch.randn(3, 6, 6, 4), torch.tensor([[6, 6, 2, 3, 4, 1]] * 3)))
    for n in rnn.ELMAN_NORMS})


@pytest.mark.parametrize("family", FAMILIES)
def test_each_member_computes_what_its_plain_model_computes(family):
    make, inputs = FAMILIES[family]
    torch.manual_seed(10)
    plain, x = _plain(make), inputs()
    stacked = seeds.stack(plain)
    assert seeds.members(stacked) == 3 and seeds.members(plain[0]) is None
    for training in (True, False):  # a batch norm: each member's own batch statistics, then its own running ones
        stacked.train(training)
        expected = torch.stack([m.train(training)(*(t[i] for t in x)) for i, m in enumerate(plain)])
        torch.testing.assert_close(stacked(*x), expected, rtol=1e-5, atol=2e-5)
    back = seeds.unstack(stacked, _plain(make, (7, 8, 9)))
    for a, b in zip(back, plain):  # the running statistics moved in training mode, the same in both
        for (name, u), v in zip(a.state_dict().items(), b.state_dict().values()):
            torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-6, msg=name)


def test_tied_weights_stay_tied_and_a_stacked_model_pickles():
    stacked = seeds.stack(_plain(_gpt))
    assert stacked.head.weight is stacked.tok.weight
    assert len(list(stacked.parameters())) == len(list(_gpt().parameters()))
    weight_normed = seeds.stack(_plain(lambda: rnn.SequenceClassifier(rnn.LSTMCell(4, 8, "weight"), 3)))
    for model in (stacked, weight_normed):
        copy = pickle.loads(pickle.dumps(model))
        assert seeds.members(copy) == 3
        for (name, u), v in zip(model.state_dict().items(), copy.state_dict().values()):
            assert torch.equal(u, v), name


@pytest.mark.parametrize("norm", ["layer", "batch", "weight"])
def test_fit_trains_each_member_as_train_fit_trains_it_alone(norm):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 6, generator=g), torch.randint(3, (100,), generator=g)
    seed_list, lrs = [0, 1], [0.05, 0.02]
    make = lambda: models.MLP(6, (8,), 3, norm)  # noqa: E731
    results = seeds.runs(make, seed_list, fit=seeds.fit, train=(x, y), test=(x, y), epochs=2, lr=lrs, batch_size=32,
                         optimizer="sgd", drop_last=True, max_steps=5)
    for seed, lr, (model, h) in zip(seed_list, lrs, results):
        utils.seed_everything(seed)
        alone_model = make()
        alone = train.fit(alone_model, (x, y), (x, y), epochs=2, lr=lr, batch_size=32, seed=seed, optimizer="sgd",
                          drop_last=True, max_steps=5)
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h.train_acc, alone.train_acc)
        np.testing.assert_allclose(h.test_acc, alone.test_acc)
        assert h.steps_per_epoch == alone.steps_per_epoch == 3
        for u, v in zip(model.state_dict().values(), alone_model.state_dict().values()):
            torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-5)
    assert results[0][1].step_loss != results[1][1].step_loss


def test_fit_takes_the_batches_it_is_given_and_evaluates_every_so_many_updates():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 6, generator=g), torch.randint(3, (40,), generator=g)
    make = lambda: models.MLP(6, (8,), 3, "batch")  # noqa: E731
    batches = [torch.stack([torch.arange(i, i + 8), torch.arange(39 - i, 31 - i, -1)]) for i in (0, 8, 16)]  # (S=2, 8)
    histories = seeds.fit(seeds.stack(_plain(make, (0, 1))), (x, y), (x, y), epochs=2, lr=0.05, batch_size=8,
                          seeds=[0, 0], optimizer="sgd", order=lambda: batches, eval_every=4)
    for s, (h, m) in enumerate(zip(histories, _plain(make, (0, 1)))):  # member s alone on row s of each batch
        assert h.steps_per_epoch == 3 and len(h.step_loss) == 6 and len(h.test_acc) == 2  # after updates 4 and 6
        opt, losses = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), []
        for idx in batches * 2:
            loss = torch.nn.functional.cross_entropy(m(x[idx[s]]), y[idx[s]])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        np.testing.assert_allclose(h.step_loss, losses, rtol=1e-5, atol=1e-6)
        assert abs(h.test_acc[-1] - train.accuracy(m, (x, y))) <= 1 / 40
    with pytest.raises(ValueError, match="order"):
        seeds.fit(seeds.stack(_plain(make, (0, 1))), (x, y), (x, y), epochs=1, lr=0.05, batch_size=8, seeds=[0, 0],
                  order=lambda: [torch.zeros(3, 8, dtype=torch.long)])


def test_fit_on_padded_sequences_clips_each_member_on_its_own():
    (x, lengths, y), _ = data.variable_length(1, 2)
    d = (x[:80], lengths[:80], y[:80])
    make = lambda: rnn.SequenceClassifier(rnn.LSTMCell(8, 8, "batch", max_steps=16), 10)  # noqa: E731
    results = seeds.runs(make, [0, 1], fit=seeds.fit, train=d, test=d, epochs=1, lr=0.01, batch_size=20, grad_clip=0.01)
    for seed, (_, h) in zip([0, 1], results):
        utils.seed_everything(seed)
        alone = train.fit(make(), d, d, epochs=1, lr=0.01, batch_size=20, seed=seed, grad_clip=0.01)
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-5, atol=1e-6)


FIT_LM = dict(steps=12, batch_size=4, block_size=16, eval_every=5, warmup=3)


@pytest.mark.parametrize("options", [dict(), dict(record_logits=True, z_loss=1e-2), dict(optimizer="radam")],
                         ids=["plain", "recorded", "radam"])
def test_fit_lm_trains_each_member_as_train_fit_lm_trains_it_alone(options):
    seed_list, lrs = [0, 1, 0], [3e-3, 1e-3, 1e-3]  # seed 0 twice: one start at two learning rates
    results = seeds.runs(_gpt, seed_list, train_ids=CORPUS.train, val_ids=CORPUS.val, lr=lrs, **FIT_LM, **options)
    for seed, lr, (_, h) in zip(seed_list, lrs, results):
        utils.seed_everything(seed)
        alone = train.fit_lm(_gpt(), CORPUS.train, CORPUS.val, lr=lr, seed=seed, **FIT_LM, **options)
        assert h.val_steps == alone.val_steps == [5, 10, 12]
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-5)
        np.testing.assert_allclose(h.val_loss, alone.val_loss, rtol=1e-5)
        for name in ("attn_logit_max", "attn_entropy", "log_z"):
            np.testing.assert_allclose(getattr(h, name), getattr(alone, name), rtol=1e-4, atol=1e-5, err_msg=name)
    assert results[0][1].step_loss != results[2][1].step_loss


def test_a_diverged_member_stops_alone():
    seed_list, lrs = [0, 1], [1e20, 1e-3]  # member 0 blows up at its second step
    results = seeds.runs(_gpt, seed_list, train_ids=CORPUS.train, val_ids=CORPUS.val, lr=lrs, grad_clip=None, **FIT_LM)
    for seed, lr, (_, h) in zip(seed_list, lrs, results):
        utils.seed_everything(seed)
        alone = train.fit_lm(_gpt(), CORPUS.train, CORPUS.val, lr=lr, seed=seed, grad_clip=None, **FIT_LM)
        assert h.diverged == alone.diverged and len(h.step_loss) == len(alone.step_loss)
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-4)
        assert h.val_steps == alone.val_steps
    assert results[0][1].diverged and not results[1][1].diverged


def test_fit_mlm_trains_each_member_as_train_fit_mlm_trains_it_alone():
    options = dict(steps=8, batch_size=4, block_size=16, mask_id=CORPUS.vocab_size, min_len=6, eval_every=4)
    make = lambda: _gpt(causal=False, norm_position="post", final_norm=False)  # noqa: E731
    results = seeds.runs(make, [0, 1], fit=seeds.fit_mlm, train_ids=CORPUS.train, val_ids=CORPUS.val, lr=1e-3, **options)
    for seed, (_, h) in zip([0, 1], results):
        utils.seed_everything(seed)
        alone = train.fit_mlm(make(), CORPUS.train, CORPUS.val, lr=1e-3, seed=seed, **options)
        np.testing.assert_allclose(h.step_loss, alone.step_loss, rtol=1e-5)
        np.testing.assert_allclose(h.val_loss, alone.val_loss, rtol=1e-5)


def test_start_runs_on_a_worker_process_gives_what_it_gives_here():
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    options = dict(train_ids=CORPUS.train, val_ids=CORPUS.val, lr=1e-3, steps=3, batch_size=4, block_size=16, eval_every=3)
    here = seeds.runs(_gpt, [0, 1], **options)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=train._init_worker) as pool:
        there = train.finish_runs({"runs": seeds.start_runs(_gpt, [0, 1], pool, **options)})["runs"]
    for (m1, h1), (m2, h2) in zip(here, there):
        assert h1.step_loss == h2.step_loss and h1.val_loss == h2.val_loss
        assert seeds.members(m2) is None and isinstance(m2, TinyGPT)


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="one architecture"):
        seeds.stack([models.MLP(4, (3,), 2), models.MLP(4, (5,), 2)])
    with pytest.raises(ValueError, match="one architecture"):
        seeds.stack([models.MLP(4, (3,), 2, "layer"), models.MLP(4, (3,), 2, "rms")])
    with pytest.raises(TypeError, match="Conv1d"):
        seeds.stack([torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3))] * 2)
    stacked = seeds.stack(_plain(lambda: models.MLP(4, (3,), 2)))
    with pytest.raises(ValueError, match="already holds a seed axis"):
        seeds.stack([stacked, stacked])
    with pytest.raises(ValueError, match="3 plain models"):
        seeds.unstack(stacked, [models.MLP(4, (3,), 2)])
    d = (torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="made by lnbook.seeds.stack"):
        seeds.fit(models.MLP(4, (3,), 2), d, d, epochs=1, lr=0.1, batch_size=2, seeds=[0])
    with pytest.raises(ValueError, match="one entry per member"):
        seeds.fit(stacked, d, d, epochs=1, lr=0.1, batch_size=2, seeds=[0])
    with pytest.raises(ValueError, match="lr must be one number or one per member"):
        seeds.fit(stacked, d, d, epochs=1, lr=[0.1, 0.2], batch_size=2, seeds=[0, 1, 2])
    with pytest.raises(ValueError, match="idx must be an int64 tensor of shape \\(S, B, T\\)"):
        seeds.stack(_plain(_gpt))(torch.zeros(4, 16, dtype=torch.long))


def test_a_dyt_recipe_gpt_stacks_with_its_embedding_scale_and_per_site_alphas():
    cfg = dict(vocab_size=CORPUS.vocab_size, block_size=16, n_layer=2, n_head=2, d_model=16, norm="dyt", bias=False,
               embed_scale=True, dyt_alpha=(0.8, 0.2, 0.3), final_norm="layernorm")
    make = lambda: TinyGPT(GPTConfig(**cfg))  # noqa: E731
    results = seeds.runs(make, [0, 1], train_ids=CORPUS.train, val_ids=CORPUS.val, lr=3e-3, **FIT_LM)
    for seed, (trained, h) in zip([0, 1], results):
        utils.seed_everything(seed)
        alone = make()
        history = train.fit_lm(alone, CORPUS.train, CORPUS.val, lr=3e-3, seed=seed, **FIT_LM)
        np.testing.assert_allclose(h.step_loss, history.step_loss, rtol=1e-5)
        torch.testing.assert_close(trained.embed_scale, alone.embed_scale, rtol=1e-5, atol=1e-6)
        assert trained.embed_scale.item() != 4.0  # it learned, from sqrt(16)


def test_a_warmup_schedule_is_a_function_of_the_step():
    options = {k: v for k, v in FIT_LM.items() if k != "warmup"}
    steps = seeds.runs(_gpt, [0], train_ids=CORPUS.train, val_ids=CORPUS.val, lr=3e-3, warmup=3, **options)
    schedule = seeds.runs(_gpt, [0], train_ids=CORPUS.train, val_ids=CORPUS.val, lr=3e-3,
                          warmup=lambda t: min(1.0, t / 3), **options)
    np.testing.assert_allclose(steps[0][1].step_loss, schedule[0][1].step_loss, rtol=1e-6)
    frozen = seeds.runs(_gpt, [0], train_ids=CORPUS.train, val_ids=CORPUS.val, lr=3e-3, warmup=lambda t: 0.0, **options)
    assert len(set(np.round(frozen[0][1].val_loss, 6))) == 1  # a zero factor never moves the weights
