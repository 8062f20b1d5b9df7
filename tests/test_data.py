"""lnbook.data: the digits sequences, padded batches, the adding problem and the character corpus."""

import pytest
import torch

from lnbook import data


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


def test_as_steps_reads_a_few_pixels_a_step():
    train_set, _ = data.digits_sequences("pixel")
    x, y = data.as_steps(train_set, 4)
    assert x.shape == (len(y), 16, 4) and torch.equal(x.reshape(len(y), 64), train_set[0].reshape(len(y), 64))
    with pytest.raises(ValueError, match="pixels_per_step dividing 64"):
        data.as_steps(train_set, 5)


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


def test_stretched_digits_have_heavy_tailed_lengths_and_hold_every_row():
    (x, lengths, y), (xt, lt, yt) = data.stretched_digits()
    assert x.shape == (1437, 40, 8) and xt.shape == (360, 40, 8) and lengths.dtype == torch.int64
    counts = torch.bincount(lengths)[8::8]
    assert set(lengths.tolist()) <= {8, 16, 24, 32, 40} and (counts[:-1] > counts[1:]).all()  # fewer at every length
    (rows, labels), _ = data.digits_sequences("row")
    assert torch.equal(y, labels)
    for i in (0, int(lengths.argmax())):
        k = int(lengths[i]) // 8
        assert torch.equal(x[i, : 8 * k], rows[i].repeat_interleave(k, dim=0)) and x[i, 8 * k :].abs().sum() == 0
    assert torch.equal(data.stretched_digits(tail=0.0, seed=1)[0][1], data.stretched_digits(tail=0.0, seed=1)[0][1])
    with pytest.raises(ValueError, match="tail"):
        data.stretched_digits(tail=-1.0)


def test_adding_problem():
    x, y = data.adding_problem(50, 20, seed=3)
    assert x.shape == (50, 20, 2) and y.shape == (50,)
    assert (x[..., 1].sum(1) == 2).all()
    assert (x[:, :10, 1].sum(1) == 1).all()  # one marker in each half
    torch.testing.assert_close(y, (x[..., 0] * x[..., 1]).sum(1))
    assert torch.equal(data.adding_problem(50, 20, seed=3)[0], x)
    with pytest.raises(ValueError, match="length must be"):
        data.adding_problem(5, 1)


def test_char_corpus_splits_and_round_trips():
    c = data.char_corpus()
    assert len(c.train) > 400_000 and len(c.val) > 40_000
    assert abs(len(c.val) / (len(c.train) + len(c.val)) - 0.1) < 1e-4
    assert c.vocab == "".join(sorted(set(c.vocab))) and c.vocab_size == len(c.vocab)
    assert int(c.train.max()) < c.vocab_size and c.train.dtype == torch.int64
    assert c.decode(c.encode("def f(x):\n    return x")) == "def f(x):\n    return x"
    assert torch.equal(data.char_corpus().val, c.val)  # deterministic
    with pytest.raises(ValueError, match="outside the vocabulary"):
        c.encode("λ")
    with pytest.raises(ValueError, match="ids must be in"):
        c.decode([0, c.vocab_size])
    with pytest.raises(ValueError, match="val_fraction"):
        data.char_corpus(1.5)
