"""lnbook.transformer_study: chapter 06's baselines, probes and batch-norm scores."""

import math

import numpy as np
import pytest
import torch

from lnbook import data, train, transformer_study
from lnbook.transformer import GPTConfig, TinyGPT, preset
from lnbook.utils import seed_everything

CORPUS = data.char_corpus()
V, BLOCK = CORPUS.vocab_size, 16


def gpt(**settings) -> TinyGPT:
    seed_everything(0)
    return TinyGPT(GPTConfig(V, BLOCK, n_layer=2, n_head=2, d_model=16, **settings))


def test_frequencies_scores_the_cross_entropy_of_the_unigram_distribution():
    model = transformer_study.Frequencies(CORPUS.train, V)
    p = torch.bincount(CORPUS.train, minlength=V).double()
    p /= p.sum()
    targets = CORPUS.val[:500]
    expected = -(p[targets].log()).mean().item()
    assert model.loss(None, targets[None]).item() == pytest.approx(expected, rel=1e-5)
    assert train.lm_loss(model, CORPUS.val, BLOCK) > 2  # the baseline every model must beat


def test_wiring_reads_the_built_model():
    assert transformer_study.wiring(TinyGPT(preset("bert", V, BLOCK, n_layer=2, d_model=16))) == [
        "LayerNorm", "LayerNorm", "post", "—", "yes", "both directions", "bert", "tied"]
    assert transformer_study.wiring(gpt(norm="dyt", final_norm="layernorm", bias=False)) == [
        "—", "DyT", "pre", "LayerNorm", "no", "causal", "gpt2", "tied"]


def test_untying_the_head_rescales_post_ln_gradients():
    cfg = GPTConfig(V, BLOCK, n_layer=2, n_head=2, d_model=64, norm_position="post", final_norm=False)
    tied, _ = transformer_study.w2_gradients(cfg, CORPUS.train, range(3))
    same, _ = transformer_study.w2_gradients(cfg, CORPUS.train, range(3), head_std=0.02)
    larger, _ = transformer_study.w2_gradients(cfg, CORPUS.train, range(3), head_std=64**-0.5)
    assert tied.shape == (3, 2)
    ratio = larger[:, -1] / same[:, -1]
    assert np.all(ratio > 2)  # the head's scale, 0.125 against 0.02, sets the gradient's
    assert np.all(np.abs(same[:, -1] / tied[:, -1] - 1) < 0.5)
    model = gpt()
    transformer_study.untie_head(model, 0.5)
    assert model.head.weight is not model.tok.weight and abs(model.head.weight.std().item() - 0.5) < 0.05


def test_padding_gap_is_rounding_for_layernorm_and_large_for_batchnorm_in_training():
    seqs = [CORPUS.val[:9], CORPUS.val[50:66], CORPUS.val[100:104]]
    assert transformer_study.padding_gap(gpt().eval(), seqs, BLOCK) < 1e-5
    assert transformer_study.padding_gap(gpt(norm="batchnorm").train(), seqs, BLOCK) > 1e-2
    encoder = TinyGPT(preset("bert", V, BLOCK, n_layer=2, d_model=16)).eval()
    assert transformer_study.padding_gap(encoder, seqs, BLOCK) < 1e-6  # a fresh encoder's logits are small (0.02 head)
    assert transformer_study.padding_gap(encoder, seqs, BLOCK, masked=False) > 1e-4


def test_dyt_inputs_and_the_head_input_scale():
    idx = CORPUS.train[: 4 * BLOCK].view(4, BLOCK)
    stats = transformer_study.dyt_inputs(gpt(norm="dyt"), idx)
    assert stats.shape == (5, 3)  # two per block and the final one
    np.testing.assert_allclose(stats[:, 1], 0.5 * stats[:, 0], rtol=0.05)  # tanh(0.5 x) ~ 0.5 x for a small stream
    assert transformer_study.head_input_std(gpt(), idx) == pytest.approx(stats[-1, 0], rel=0.5)
    with pytest.raises(ValueError, match="no DyT layer"):
        transformer_study.dyt_inputs(gpt(), idx)


def test_batch_statistics_scores_see_the_batch_and_population_statistics_average_it():
    model = gpt(norm="batchnorm")
    train.fit_lm(model, CORPUS.train, CORPUS.val, steps=20, lr=3e-3, batch_size=8, block_size=BLOCK, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    leaky = transformer_study.lm_loss_batch_statistics(model, CORPUS.val, BLOCK)
    population = transformer_study.with_population_statistics(model, CORPUS.train, BLOCK, batches=8)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the model is left alone
    assert not population.training
    running = train.lm_loss(model, CORPUS.val, BLOCK)
    assert math.isfinite(leaky) and leaky != pytest.approx(running, abs=1e-4)
    stats = [m for m in population.modules() if hasattr(m, "running_mean")]
    original = [m for m in model.modules() if hasattr(m, "running_mean")]
    assert not torch.allclose(stats[0].running_mean, original[0].running_mean)
    assert stats[0].momentum == original[0].momentum
    with pytest.raises(ValueError, match="no batch norm"):
        transformer_study.lm_loss_batch_statistics(gpt(), CORPUS.val, BLOCK)


def test_training_step_updates_the_weights():
    model = gpt()
    idx, targets = train.windows(CORPUS.train, torch.arange(4) * 100, BLOCK)
    before = model.tok.weight.detach().clone()
    transformer_study.training_step(model, idx, targets)()
    assert not torch.equal(before, model.tok.weight)


def test_foreign_statistics_score_with_another_batchs_statistics():
    model = gpt(norm="batchnorm")
    train.fit_lm(model, CORPUS.train, CORPUS.val, steps=20, lr=3e-3, batch_size=8, block_size=BLOCK, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    own = transformer_study.lm_loss_batch_statistics(model, CORPUS.val, BLOCK, batches=2, batch_size=16, group=8)
    foreign = transformer_study.lm_loss_foreign_statistics(model, CORPUS.val, BLOCK, batches=2, batch_size=16, group=8)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert math.isfinite(foreign) and foreign != pytest.approx(own, abs=1e-5)
    with pytest.raises(ValueError, match="group must divide batch_size"):
        transformer_study.lm_loss_foreign_statistics(model, CORPUS.val, BLOCK, batch_size=16, group=5)


def test_an_untied_head_has_its_own_weights():
    model = gpt(tie_head=False)
    assert model.head.weight is not model.tok.weight and abs(model.head.weight.std().item() / 16**-0.5 - 1) < 0.1
    assert transformer_study.wiring(model)[-1] == "own"
