"""Data the chapters train on, generated or shipped with an installed package: no downloads.

Datasets are tuples of tensors ``(inputs..., targets)``, the form :func:`lnbook.train.fit`
takes: ``(x, y)`` for fixed-length data, ``(x, lengths, y)`` for padded variable-length data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ._checks import check_choice, check_int, check_number, check_positive_int, describe

Dataset = tuple[torch.Tensor, ...]

SPLIT_SEED = 0  # the train/test split is the same for every experiment in the book
TEST_FRACTION = 0.2


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits: images (1797, 8, 8) scaled to [0, 1], labels (1797,)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def _split(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fixed, stratified train/test indices."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    train, test = train_test_split(idx, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED)
    return np.sort(train), np.sort(test)


def validation_split(train: Dataset, fraction: float = 0.2, seed: int = SPLIT_SEED) -> tuple[Dataset, Dataset]:
    """Split a training set ``(inputs..., y)`` into ``(fit, validation)``, stratified by the
    integer targets ``y``: ``fraction`` of the examples (at least one per class) become the
    validation part, on which settings are chosen. It is drawn from the training set only; the
    test set is never an argument, so a choice made on validation cannot have seen it.
    """
    from sklearn.model_selection import train_test_split

    if not isinstance(train, tuple) or len(train) < 2 or not all(isinstance(t, torch.Tensor) for t in train):
        raise TypeError(f"train must be a dataset tuple of tensors (inputs..., y), got {describe(train)}")
    n, y = len(train[-1]), train[-1]
    if any(len(t) != n for t in train):
        raise ValueError(f"train's tensors must have one row per example, got lengths {[len(t) for t in train]}")
    check_number(fraction, "fraction", "a number in (0, 1)", lambda f: 0 < f < 1)
    if y.dtype.is_floating_point:
        raise ValueError(f"train's last tensor must hold integer class targets to stratify by, got dtype {y.dtype}")
    fit, val = train_test_split(np.arange(n), test_size=fraction, stratify=y.numpy(), random_state=seed)
    fit, val = torch.from_numpy(np.sort(fit)), torch.from_numpy(np.sort(val))
    return tuple(t[fit] for t in train), tuple(t[val] for t in train)


def digits_sequences(order: str = "pixel", permute: bool = False, seed: int = 0) -> tuple[Dataset, Dataset]:
    """The 1,797 digits as sequences: ``(train, test)``, each ``(x, y)``.

    Args:
        order: ``"pixel"``: 64 steps of 1 feature (x is ``(N, 64, 1)``); ``"row"``: 8 steps
            of 8 features, one image row per step (x is ``(N, 8, 8)``).
        permute: apply one fixed permutation of the 64 pixels (chosen by ``seed``) before
            forming the sequence: the digits analogue of permuted MNIST.
        seed: seeds the permutation. The stratified 1,437/360 train/test split never changes.

    Pixel values are in [0, 1]; labels ``y`` are int64 in 0..9.
    """
    check_choice(order, ("pixel", "row"), "order")
    images, labels = _digits()
    flat = images.reshape(len(images), 64)
    if permute:
        flat = flat[:, np.random.default_rng(seed).permutation(64)]
    x = flat.reshape(-1, 64, 1) if order == "pixel" else flat.reshape(-1, 8, 8)
    train, test = _split(labels)
    x, y = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(labels)
    return (x[train], y[train]), (x[test], y[test])


def as_steps(dataset: Dataset, pixels_per_step: int) -> Dataset:
    """Pixel sequences read ``pixels_per_step`` pixels a step: ``(x (N, 64, 1), y)`` from
    :func:`digits_sequences` -> ``(x (N, 64 / pixels_per_step, pixels_per_step), y)``."""
    x, y = dataset
    check_positive_int(pixels_per_step, "pixels_per_step")
    if x.ndim != 3 or x.shape[1:] != (64, 1) or 64 % pixels_per_step:
        raise ValueError(f"need pixel sequences (N, 64, 1) and pixels_per_step dividing 64, got {tuple(x.shape)} "
                         f"and {pixels_per_step}")
    return x.reshape(len(x), 64 // pixels_per_step, pixels_per_step), y


def pad_batch(sequences: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad ``(T_i, F)`` tensors with zeros to ``(B, T_max, F)``.

    Returns ``(padded, lengths, mask)``: lengths ``(B,)`` int64, mask ``(B, T_max)`` bool,
    True on real steps.
    """
    if len(sequences) == 0:
        raise ValueError("sequences must hold at least one (T_i, F) tensor")
    for i, s in enumerate(sequences):
        if not isinstance(s, torch.Tensor) or s.ndim != 2:
            got = tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
            raise ValueError(f"sequences[{i}] must be a (T_i, F) tensor, got {got}")
        if s.shape[1] != sequences[0].shape[1] or s.dtype != sequences[0].dtype:
            raise ValueError(
                f"sequences[{i}] has {s.shape[1]} features of {s.dtype}; sequences[0] has "
                f"{sequences[0].shape[1]} of {sequences[0].dtype}; all must match"
            )
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
    padded = torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True)
    mask = torch.arange(padded.shape[1]) < lengths[:, None]
    return padded, lengths, mask


def variable_length(min_repeat: int = 1, max_repeat: int = 3, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Digits as row sequences of different lengths, for padding experiments.

    Each image is read row by row (8 features a step), and each row is held for a random
    number of steps in ``[min_repeat, max_repeat]``, like a word spoken at different speeds:
    the lengths vary from ``8 * min_repeat`` to ``8 * max_repeat`` and no information is lost.
    With ``min_repeat == max_repeat`` all sequences have length ``8 * min_repeat``.

    Returns ``(train, test)``, each ``(x, lengths, y)``: x ``(N, 8 * max_repeat, 8)``
    zero-padded, lengths ``(N,)`` int64, y ``(N,)``; the split is ``digits_sequences``'s.
    """
    if not (isinstance(min_repeat, int) and isinstance(max_repeat, int) and 1 <= min_repeat <= max_repeat):
        raise ValueError(f"need integers 1 <= min_repeat <= max_repeat, got {describe(min_repeat)}, {describe(max_repeat)}")
    images, labels = _digits()
    repeats = np.random.default_rng(seed).integers(min_repeat, max_repeat + 1, size=(len(images), 8))
    seqs = [torch.from_numpy(np.repeat(img, r, axis=0)) for img, r in zip(images, repeats)]
    padded, lengths, _ = pad_batch(seqs)
    if padded.shape[1] < 8 * max_repeat:  # pad to the documented length even if no row drew max_repeat
        padded = torch.nn.functional.pad(padded, (0, 0, 0, 8 * max_repeat - padded.shape[1]))
    y = torch.from_numpy(labels)
    train, test = _split(labels)
    return (padded[train], lengths[train], y[train]), (padded[test], lengths[test], y[test])


def stretched_digits(max_repeat: int = 5, tail: float = 2.0, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Digits as row sequences whose lengths have a heavy tail, for padding experiments.

    Each image is read row by row (8 features a step) at its own speed: every row is held for
    ``k`` steps, with ``k`` in ``1..max_repeat`` drawn with probability proportional to
    ``k ** -tail``. Most sequences are short (8 or 16 steps) and a few are long (up to
    ``8 * max_repeat``), so a random batch is padded to a length far above its average.

    Returns ``(train, test)``, each ``(x, lengths, y)``: x ``(N, 8 * max_repeat, 8)`` zero-padded,
    lengths ``(N,)`` int64, y ``(N,)``; the split is ``digits_sequences``'s.
    """
    check_positive_int(max_repeat, "max_repeat")
    check_number(tail, "tail", "a non-negative number", lambda v: v >= 0)
    images, labels = _digits()
    k = np.arange(1, max_repeat + 1)
    speeds = np.random.default_rng(seed).choice(k, size=len(images), p=k**-tail / (k**-tail).sum())
    padded = torch.zeros(len(images), 8 * max_repeat, 8)
    for i, (img, r) in enumerate(zip(images, speeds)):
        padded[i, : 8 * r] = torch.from_numpy(np.repeat(img, r, axis=0))
    lengths, y = torch.from_numpy(8 * speeds).long(), torch.from_numpy(labels)
    train, test = _split(labels)
    return (padded[train], lengths[train], y[train]), (padded[test], lengths[test], y[test])


def adding_problem(n: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The adding problem (Hochreiter & Schmidhuber, 1997): a classic long-range task.

    Each sequence has ``length`` steps of 2 features: a value drawn uniformly from [0, 1],
    and a marker that is 1 at exactly two steps (one in each half) and 0 elsewhere. The
    target is the sum of the two marked values; always predicting 1 gives an MSE of about 1/6.

    Returns ``x`` of shape ``(n, length, 2)`` and ``y`` of shape ``(n,)``, float32.
    """
    check_positive_int(n, "n")
    check_int(length, "length", 2, "an int >= 2 (one marker in each half)")
    g = torch.Generator().manual_seed(seed)
    values = torch.rand(n, length, generator=g)
    half = length // 2
    first = torch.randint(0, half, (n,), generator=g)
    second = torch.randint(half, length, (n,), generator=g)
    marker = torch.zeros(n, length)
    rows = torch.arange(n)
    marker[rows, first] = 1.0
    marker[rows, second] = 1.0
    return torch.stack([values, marker], dim=-1), values[rows, first] + values[rows, second]


@dataclass(frozen=True)
class CharCorpus:
    """A character-level corpus: ``train`` and ``val`` are int64 token ids ``(N,)``, and
    ``vocab`` holds one character per id, in sorted order."""

    train: torch.Tensor
    val: torch.Tensor
    vocab: str

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> torch.Tensor:
        """Token ids ``(len(text),)`` of a string; every character must be in the vocabulary."""
        index = {c: i for i, c in enumerate(self.vocab)}
        unknown = sorted(set(text) - index.keys())
        if unknown:
            raise ValueError(f"text has characters outside the vocabulary: {describe(''.join(unknown))}")
        return torch.tensor([index[c] for c in text], dtype=torch.int64)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """The string a 1-D sequence of token ids stands for."""
        ids = torch.as_tensor(ids)
        if ids.ndim != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"ids must be a 1-D sequence of integers, got {ids.dtype} of shape {tuple(ids.shape)}")
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"ids must be in 0..{self.vocab_size - 1}, got {int(ids.min())}..{int(ids.max())}")
        return "".join(self.vocab[i] for i in ids.tolist())


def char_corpus(val_fraction: float = 0.1) -> CharCorpus:
    """Python's own documentation as a character-level corpus: no download needed.

    The text is the standard library's ``pydoc_data.topics`` (the help pages of the
    language reference, about 465,000 characters in Python 3.11; it differs a little between
    Python versions), its entries joined in sorted order. The last ``val_fraction`` of the
    characters is the validation split, the rest the training split.
    """
    check_number(val_fraction, "val_fraction", "a number in (0, 1)", lambda v: 0 < v < 1)
    from pydoc_data.topics import topics

    text = "".join(topics[k] for k in sorted(topics))
    vocab = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
    cut = round(len(ids) * (1 - val_fraction))
    return CharCorpus(ids[:cut], ids[cut:], vocab)
