"""lnbook._checks: describe, the shared checks, and bad input in every module raising an error that names the argument."""

import numpy as np
import pytest
import torch
from torch import nn

from lnbook import bench, data, ensemble, graphs, models, norms, parallel, plotting, reference, rl, rnn, seeds, train, transformer, utils
from lnbook._checks import describe
from lnbook.functional import layer_norm
from lnbook.norms import LayerNorm
from lnbook.utils import seed_everything, show_source

X = torch.randn(2, 3, 4)
ONES, ZEROS = np.ones(4), np.zeros(4)


# normalized_shape that does not match the trailing dimensions
@pytest.mark.parametrize("shape", [3, (3,), (2, 4), (5, 2, 3, 4)])
def test_normalized_shape_mismatch(shape):
    with pytest.raises(ValueError, match=r"normalized_shape .* does not match the trailing dimensions of x"):
        layer_norm(X, shape)


def test_normalized_shape_mismatch_in_module():
    with pytest.raises(ValueError, match="normalized_shape"):
        LayerNorm(5)(X)


@pytest.mark.parametrize("shape", ["4", 4.0, (4.0,), (), None, (True,)])
def test_normalized_shape_not_ints(shape):
    with pytest.raises(TypeError, match="normalized_shape must be an int"):
        LayerNorm(shape)


# eps <= 0
@pytest.mark.parametrize("eps", [0, 0.0, -1e-5, float("nan"), float("inf")])
def test_eps_not_positive(eps):
    with pytest.raises(ValueError, match="eps must be a positive"):
        layer_norm(X, 4, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive"):
        LayerNorm(4, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive"):
        reference.layernorm_forward(np.ones((2, 4)), ONES, ZEROS, eps=eps)
    with pytest.raises(ValueError, match="eps must be a positive"):
        reference.batchnorm_forward(np.ones((2, 4)), ONES, ZEROS, eps=eps)


@pytest.mark.parametrize("eps", ["1e-5", None, True])
def test_eps_not_a_number(eps):
    with pytest.raises(TypeError, match="eps must be a positive real number"):
        layer_norm(X, 4, eps=eps)


# integer or boolean tensors
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_tensors(dtype):
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got dtype torch\."):
        layer_norm(torch.ones(2, 4, dtype=dtype), 4)
    with pytest.raises(TypeError, match="weight must be a floating-point tensor"):
        layer_norm(torch.ones(2, 4), 4, weight=torch.ones(4, dtype=dtype))


def test_not_a_tensor():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        layer_norm(np.ones((2, 4)), 4)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_integer_and_bool_arrays(dtype):
    with pytest.raises(TypeError, match="x must be an array of floating-point numbers"):
        reference.layernorm_forward(np.ones((2, 4), dtype=dtype), ONES, ZEROS)
    with pytest.raises(TypeError, match="x must be an array of floating-point numbers"):
        reference.batchnorm_forward(np.ones((2, 4), dtype=dtype), ONES, ZEROS)
    with pytest.raises(TypeError, match="gamma must be an array of floating-point numbers"):
        reference.layernorm_forward(np.ones((2, 4)), np.ones(4, dtype=dtype), ZEROS)


# zero-size normalized dimensions
def test_zero_size_normalized_dimension():
    with pytest.raises(ValueError, match="normalized_shape must contain only positive sizes"):
        layer_norm(torch.ones(2, 0), 0)
    with pytest.raises(ValueError, match="normalized_shape must contain only positive sizes"):
        LayerNorm((3, 0))
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        reference.layernorm_forward(np.ones((2, 0)), np.ones(0), np.zeros(0))
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        reference.batchnorm_forward(np.ones((2, 0)), np.ones(0), np.zeros(0))


# mismatched weight/bias shapes
def test_weight_and_bias_shapes():
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\) \(the normalized shape\), got \(3,\)"):
        layer_norm(X, 4, weight=torch.ones(3))
    with pytest.raises(ValueError, match=r"bias must have shape \(3, 4\)"):
        layer_norm(X, (3, 4), torch.ones(3, 4), torch.ones(4))
    with pytest.raises(ValueError, match=r"gamma must have shape \(4,\)"):
        reference.layernorm_forward(np.ones((2, 4)), np.ones(5), ZEROS)
    with pytest.raises(ValueError, match=r"beta must have shape \(4,\)"):
        reference.batchnorm_forward(np.ones((2, 4)), ONES, np.zeros((1, 4)))


def test_dy_shape():
    _, cache = reference.layernorm_forward(np.ones((2, 4)), ONES, ZEROS)
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 4\)"):
        reference.layernorm_backward(np.ones((4, 2)), cache)


# a mask of the wrong shape, or one that leaves a feature with no real positions
@pytest.mark.parametrize("mask_shape", [(2, 3, 4), (3, 2), (2,), (6,)])
def test_mask_wrong_shape(mask_shape):
    with pytest.raises(ValueError, match=r"mask must have x's shape without the feature axis, \(2, 3\)"):
        reference.batchnorm_forward(np.ones((2, 3, 4)), ONES, ZEROS, mask=np.ones(mask_shape, dtype=bool))


def test_mask_not_boolean():
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        reference.batchnorm_forward(np.ones((2, 3, 4)), ONES, ZEROS, mask=np.ones((2, 3)))


def test_mask_with_no_real_positions():
    with pytest.raises(ValueError, match="mask .* no real positions"):
        reference.batchnorm_forward(np.ones((2, 3, 4)), ONES, ZEROS, mask=np.zeros((2, 3), dtype=bool))


def test_seed_and_show_source():
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(1.5)
    with pytest.raises(ValueError, match="seed must be in"):
        seed_everything(-1)
    with pytest.raises(TypeError, match="show_source needs a Python function"):
        show_source(len)


@pytest.mark.parametrize("value", [0, -3, 2.0, True, "4", None])
def test_positive_int_check_is_shared(value):
    from lnbook._checks import check_positive_int
    from lnbook.data import adding_problem
    from lnbook.norms import TimeStepBatchNorm

    with pytest.raises(ValueError, match="steps must be a positive int"):
        check_positive_int(value, "steps")
    with pytest.raises(ValueError, match="max_steps must be a positive int"):
        TimeStepBatchNorm(3, value)
    with pytest.raises(ValueError, match="n must be a positive int"):
        adding_problem(value, 4)


# error messages describe tensors and arrays by type, shape and dtype, and never dump long values
BIG = torch.randn(1000)  # torch and NumPy print up to 1000 elements in full
BIG_ARRAY = np.random.default_rng(0).standard_normal(1000)


def test_describe():
    assert describe(torch.ones(256)) == "Tensor of shape (256,) and dtype torch.float32"
    assert describe(np.zeros((2, 4))) == "ndarray of shape (2, 4) and dtype float64"
    assert describe(torch.tensor(1.5)) == "Tensor of shape () and dtype torch.float32"
    assert describe(np.float64(-1.0)) == repr(np.float64(-1.0))  # a NumPy scalar is a number
    assert [describe(v) for v in (0.5, "row", (2, 4), None)] == ["0.5", "'row'", "(2, 4)", "None"]
    assert describe(list(range(1000))) == "list [0, 1, 2, 3, 4, 5, ...]"
    text = describe("x" * 10_000)
    assert text.startswith("str 'xxx") and len(text) < 80


def assert_no_dump(message: str, name: str) -> None:
    assert name in message
    assert "tensor(" not in message and "array(" not in message and len(message) < 300, message


def test_weight_passed_as_normalized_shape():
    with pytest.raises(TypeError, match="normalized_shape") as info:
        layer_norm(torch.randn(4, 256), torch.randn(256), torch.randn(256))
    assert "(256,)" in str(info.value)
    assert_no_dump(str(info.value), "normalized_shape")


def _kernel_max_block():
    kernels = pytest.importorskip("lnbook.kernels")
    kernels.layer_norm(torch.randn(2, 4), torch.ones(4), max_block=torch.tensor([1000]))


def _fused_layer_norm_shape():
    pytest.importorskip("lnbook.kernels").FusedLayerNorm(np.ones(1000, dtype=np.int64))


CLASSES = (torch.randn(8, 3), torch.zeros(8, dtype=torch.int64))
TOKENS = torch.zeros(20, dtype=torch.int64)
GPT = dict(vocab_size=10, block_size=8, n_layer=1, n_head=2, d_model=8)


def _agents(out: int = 2) -> models.MLP:
    """Two MLPs stacked (lnbook.rl's agents and refitted networks)."""
    return seeds.stack([models.MLP(4, (4,), out), models.MLP(4, (4,), out)])


CLASSES4 = (torch.randn(4, 4), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize(
    "call, error, name",
    [
        pytest.param(lambda: layer_norm(X, BIG), TypeError, "normalized_shape", id="functional.normalized_shape"),
        pytest.param(lambda: layer_norm(X, 4, eps=BIG), TypeError, "eps", id="functional.eps"),
        pytest.param(lambda: norms.LayerNorm(BIG_ARRAY), TypeError, "normalized_shape", id="norms.LayerNorm"),
        pytest.param(lambda: norms.DyT(4, alpha_init=BIG), ValueError, "alpha_init", id="norms.DyT"),
        pytest.param(lambda: norms.AdaNorm(4, C=BIG), ValueError, "C must", id="norms.AdaNorm"),
        pytest.param(lambda: norms.MaskedBatchNorm1d(4, momentum=BIG), ValueError, "momentum", id="norms.momentum"),
        pytest.param(lambda: norms.TimeStepBatchNorm(4, BIG_ARRAY), ValueError, "max_steps", id="norms.max_steps"),
        pytest.param(lambda: norms.TimeStepBatchNorm(4, 3)(torch.randn(2, 4), BIG), ValueError, "t must", id="norms.t"),
        pytest.param(lambda: reference.round_to(ONES, BIG), ValueError, "precision", id="reference.round_to"),
        pytest.param(lambda: reference.variance(ONES, method=BIG), ValueError, "method", id="reference.variance"),
        pytest.param(lambda: reference.layernorm_variant(ONES, eps=BIG_ARRAY), TypeError, "eps", id="reference.eps"),
        pytest.param(lambda: data.adding_problem(4, BIG), ValueError, "length", id="data.length"),
        pytest.param(lambda: data.adding_problem(BIG_ARRAY, 4), ValueError, "n must", id="data.n"),
        pytest.param(lambda: data.digits_sequences(BIG), ValueError, "order", id="data.order"),
        pytest.param(lambda: data.variable_length(BIG, 3), ValueError, "min_repeat", id="data.variable_length"),
        pytest.param(lambda: data.char_corpus(BIG), ValueError, "val_fraction", id="data.char_corpus"),
        pytest.param(
            lambda: data.CharCorpus(TOKENS, TOKENS, "ab").encode("".join(map(chr, range(0x4E00, 0x5200)))),
            ValueError, "vocabulary", id="data.encode",
        ),
        pytest.param(lambda: train.fit(nn.Linear(3, 2), CLASSES, CLASSES, epochs=1, lr=BIG, batch_size=4, seed=0),
                     ValueError, "lr", id="train.fit.lr"),
        pytest.param(lambda: train.fit(nn.Linear(3, 2), CLASSES, CLASSES, epochs=1, lr=0.1, batch_size=4, seed=0,
                                       optimizer=BIG), ValueError, "optimizer", id="train.fit.optimizer"),
        pytest.param(lambda: train.fit_lm(nn.Linear(3, 2), TOKENS, TOKENS, steps=1, lr=0.1, batch_size=2, block_size=4,
                                          seed=0, warmup=BIG), ValueError, "warmup", id="train.fit_lm"),
        pytest.param(lambda: models.MLP(4, (8,), 3, norm=BIG), ValueError, "norm", id="models.MLP"),
        pytest.param(lambda: ensemble.stacked_rnn(2, 3, 4, 2, "batch_per_step", max_steps=BIG), ValueError, "max_steps",
                     id="ensemble.stacked_rnn"),
        pytest.param(lambda: ensemble.fit(ensemble.stacked_rnn(2, 3, 4, 2), (torch.randn(6, 2, 3), torch.zeros(6, dtype=torch.long)),
                                          (torch.randn(6, 2, 3), torch.zeros(6, dtype=torch.long)), epochs=1, lr=0.1,
                                          batch_size=4, seed=0, order=BIG), ValueError, "order", id="ensemble.fit.order"),
        pytest.param(lambda: data.stretched_digits(max_repeat=BIG), ValueError, "max_repeat", id="data.stretched_digits"),
        pytest.param(lambda: utils.interval([BIG]), ValueError, "values", id="utils.interval"),
        pytest.param(lambda: rnn.LSTMCell(3, BIG), ValueError, "hidden_size", id="rnn.LSTMCell"),
        pytest.param(lambda: rnn.GRUCell(3, 4)(torch.randn(2, 3), torch.zeros(2, 4), BIG), ValueError, "t must",
                     id="rnn.GRUCell.t"),
        pytest.param(lambda: rnn.SequenceClassifier(rnn.GRUCell(3, 4), BIG), ValueError, "n_classes",
                     id="rnn.SequenceClassifier"),
        pytest.param(lambda: transformer.GPTConfig(BIG, 8), ValueError, "vocab_size", id="transformer.vocab_size"),
        pytest.param(lambda: transformer.GPTConfig(10, 8, dropout=BIG), ValueError, "dropout", id="transformer.dropout"),
        pytest.param(lambda: transformer.GPTConfig(10, 8, norm=BIG), ValueError, "norm", id="transformer.norm"),
        pytest.param(lambda: transformer.GPTConfig(10, 8, causal=BIG), TypeError, "causal", id="transformer.causal"),
        pytest.param(lambda: transformer.TinyGPT(transformer.GPTConfig(**GPT))(BIG), ValueError, "idx",
                     id="transformer.TinyGPT.idx"),
        pytest.param(lambda: transformer.TinyGPT(transformer.GPTConfig(**GPT)).generate(TOKENS[None, :2], 1, BIG),
                     ValueError, "temperature", id="transformer.generate"),
        pytest.param(lambda: transformer.TinyViT().patches(BIG_ARRAY), ValueError, "images", id="transformer.TinyViT"),
        pytest.param(lambda: graphs.random_graphs(2, BIG, 10, 0), ValueError, "min_nodes", id="graphs.min_nodes"),
        pytest.param(lambda: graphs.random_graphs(2, 3, 10, 0, BIG), ValueError, "mean_degree", id="graphs.mean_degree"),
        pytest.param(lambda: graphs.GraphNet(BIG, 8, 1), ValueError, "in_features", id="graphs.GraphNet"),
        pytest.param(lambda: graphs.GraphNet(3, 8, 1, norm=BIG), ValueError, "norm", id="graphs.norm"),
        pytest.param(lambda: rl.dqn(_agents(), steps=10, seeds=BIG), ValueError, "seeds", id="rl.dqn.seeds"),
        pytest.param(lambda: rl.dqn(_agents(), steps=10, seeds=[0, 1], lr=BIG), ValueError, "lr", id="rl.dqn.lr"),
        pytest.param(lambda: rl.shifted_targets(BIG, 2, 0.0, 0), ValueError, "n must", id="rl.shifted_targets"),
        pytest.param(lambda: rl.refit(_agents(out=1), torch.randn(4, 4), BIG, steps=1, lr=0.1, batch_size=2, seeds=[0, 1]),
                     ValueError, "targets", id="rl.refit"),
        pytest.param(lambda: seeds.fit(_agents(), CLASSES4, CLASSES4, epochs=1, lr=BIG, batch_size=2, seeds=[0, 1]),
                     ValueError, "lr", id="seeds.fit.lr"),
        pytest.param(lambda: bench.median_times({}, warmup=BIG), ValueError, "warmup", id="bench.median_times"),
        pytest.param(lambda: bench.layernorm_traffic(4, 4, BIG), ValueError, "element_size", id="bench.traffic"),
        pytest.param(lambda: utils.seed_everything(BIG), TypeError, "seed", id="utils.seed_everything"),
        pytest.param(lambda: utils.spread(np.ones((1000, 2))), ValueError, "values", id="utils.spread"),
        pytest.param(lambda: plotting.norm_axes_figure(BIG), ValueError, "kind", id="plotting.kind"),
        pytest.param(lambda: plotting.residual_block_diagram(None, BIG), ValueError, "position", id="plotting.position"),
        pytest.param(lambda: parallel.data_parallel_run(world_size=BIG), ValueError, "world_size", id="parallel"),
        pytest.param(_kernel_max_block, ValueError, "max_block", id="kernels.max_block"),
        pytest.param(_fused_layer_norm_shape, ValueError, "normalized_shape", id="kernels.FusedLayerNorm"),
    ],
)
def test_large_values_are_described_not_dumped(call, error, name):
    with pytest.raises(error) as info:
        call()
    assert_no_dump(str(info.value), name)


def test_the_shared_checks():
    from lnbook._checks import check_bool, check_choice, check_int, check_number

    assert check_int(3, "n") == 3 and check_number(0.5, "p", "a number in [0, 1]", lambda v: 0 <= v <= 1) == 0.5
    for bad, match in [(lambda: check_int(True, "n"), "n must be a non-negative int, got True"),
                       (lambda: check_int(1, "n", 2), "n must be an int >= 2, got 1"),
                       (lambda: check_int(0, "n", 1), "n must be a positive int, got 0"),
                       (lambda: check_number(float("nan"), "p", "a finite number"), "p must be a finite number, got nan"),
                       (lambda: check_number(2, "p", "a number in [0, 1]", lambda v: v <= 1), r"p must be a number in \[0, 1\], got 2"),
                       (lambda: check_choice("c", ("a", "b"), "kind"), r"kind must be one of \('a', 'b'\), got 'c'")]:
        with pytest.raises(ValueError, match=match):
            bad()
    with pytest.raises(TypeError, match="flag must be a bool, got int"):
        check_bool(1, "flag")
