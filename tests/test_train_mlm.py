"""lnbook.train's masked-token pieces: mlm_batch, mlm_loss and fit_mlm (chapter 06's encoder)."""

import numpy as np
import pytest
import torch

from lnbook import data, train
from lnbook.transformer import TinyGPT, preset

CORPUS = data.char_corpus()
MASK = CORPUS.vocab_size  # one id past the corpus's: the [MASK] token


def test_mlm_batch_pads_masks_and_hides_only_real_tokens():
    g = torch.Generator().manual_seed(0)
    idx, targets, mask = train.mlm_batch(CORPUS.train, 64, 24, MASK, g, min_len=5, mask_rate=0.2)
    assert idx.shape == targets.shape == mask.shape == (64, 24) and mask.dtype == torch.bool
    lengths = mask.sum(1)
    assert lengths.min() >= 5 and lengths.max() <= 24 and len(set(lengths.tolist())) > 5
    assert torch.equal(mask, torch.arange(24) < lengths[:, None])  # right padding
    hidden = targets != -100
    assert not (hidden & ~mask).any() and hidden.sum(1).min() >= 1  # only real tokens, at least one each
    assert torch.equal(hidden, idx == MASK)  # the input shows [MASK] exactly where a target is
    assert (idx[~mask] == 0).all()
    assert 0.15 < hidden.sum() / mask.sum() < 0.3  # about mask_rate, plus the one forced per row
    # the hidden targets are the characters that were there: unmasking gives a window of the text
    restored = torch.where(hidden, targets, idx)
    text = CORPUS.decode(CORPUS.train)
    assert CORPUS.decode(restored[0, : lengths[0]]) in text
    again = train.mlm_batch(CORPUS.train, 64, 24, MASK, torch.Generator().manual_seed(0), min_len=5, mask_rate=0.2)
    assert all(torch.equal(a, b) for a, b in zip(again, (idx, targets, mask)))


def test_mlm_batch_rejects_bad_arguments():
    g = torch.Generator()
    with pytest.raises(ValueError, match="min_len must be at most block_size"):
        train.mlm_batch(CORPUS.train, 4, 8, MASK, g, min_len=9)
    with pytest.raises(ValueError, match="mask_rate must be a number in"):
        train.mlm_batch(CORPUS.train, 4, 8, MASK, g, mask_rate=0.0)


def encoder(position="post"):
    torch.manual_seed(0)
    return TinyGPT(preset("bert", CORPUS.vocab_size + 1, 16, n_layer=1, n_head=2, d_model=16, norm_position=position))


def test_fit_mlm_learns_and_is_deterministic():
    args = dict(steps=40, lr=1e-2, batch_size=16, block_size=16, seed=0, mask_id=MASK, min_len=4, mask_rate=0.3,
                eval_every=20)
    h = train.fit_mlm(encoder(), CORPUS.train, CORPUS.val, **args)
    assert h.val_steps == [20, 40] and len(h.step_loss) == 40 and not h.diverged
    assert h.val_loss[-1] < np.log(CORPUS.vocab_size) and np.mean(h.step_loss[-10:]) < np.mean(h.step_loss[:10])
    assert train.fit_mlm(encoder(), CORPUS.train, CORPUS.val, **args).step_loss == h.step_loss
    fresh = encoder()  # the validation batches are fixed: the same model scores the same
    assert train.mlm_loss(fresh, CORPUS.val, 16, MASK) == train.mlm_loss(fresh, CORPUS.val, 16, MASK)
    with pytest.raises(ValueError, match="mask_id must be a token id no stream uses"):
        train.fit_mlm(encoder(), CORPUS.train, CORPUS.val, **{**args, "mask_id": 3})
