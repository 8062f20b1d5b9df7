"""lnbook.rnn: normalized LSTM and GRU cells and the padded-sequence classifier."""

import pytest
import torch

from lnbook.rnn import GRUCell, LSTMCell, SequenceClassifier, population_statistics


def copy_from(cell, torch_rnn):
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(torch_rnn, f"{name}_l0"))


def run(cell, x):
    b = x.shape[0]
    h = x.new_zeros(b, cell.hidden_size)
    state = (h, h.clone()) if isinstance(cell, LSTMCell) else h
    outs = []
    for t in range(x.shape[1]):
        state = cell(x[:, t], state, t)
        outs.append(state[0] if isinstance(cell, LSTMCell) else state)
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize("cell_type, torch_type", [(LSTMCell, torch.nn.LSTM), (GRUCell, torch.nn.GRU)])
def test_plain_cells_reproduce_torch(cell_type, torch_type):
    ref = torch_type(5, 7, batch_first=True)
    cell = cell_type(5, 7)
    copy_from(cell, ref)
    x = torch.randn(3, 9, 5)
    torch.testing.assert_close(run(cell, x), ref(x)[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("cell_type", [LSTMCell, GRUCell])
def test_layer_normalized_sequence_is_the_same_alone_and_in_a_padded_batch(cell_type):
    torch.manual_seed(0)
    model = SequenceClassifier(cell_type(3, 8, "layer"), 4)
    alone = torch.randn(1, 5, 3)
    others = torch.randn(2, 9, 3) * 5
    batch = torch.cat([torch.cat([alone, torch.zeros(1, 4, 3)], dim=1), others])
    lengths = torch.tensor([5, 9, 7])
    torch.testing.assert_close(model(alone)[0], model(batch, lengths)[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
@pytest.mark.parametrize("cell_type", [LSTMCell, GRUCell])
def test_appending_padding_changes_nothing(norm, cell_type):
    torch.manual_seed(1)
    model = SequenceClassifier(cell_type(3, 6, norm, max_steps=12), 4)
    x = torch.randn(4, 6, 3)
    lengths = torch.tensor([6, 2, 4, 1])
    padded = x.clone()
    for i, n in enumerate(lengths):
        padded[i, n:] = 99.0  # garbage where a sequence has ended
    longer = torch.cat([padded, torch.randn(4, 5, 3)], dim=1)
    base = model(x, lengths)
    for other in (padded, longer):
        torch.testing.assert_close(model(other, lengths), base)


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
def test_gradients_flow_gradcheck(norm):
    torch.manual_seed(2)
    cell = LSTMCell(2, 3, norm, max_steps=4).double()
    x = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    h = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    c = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, h, c: cell(x, (h, c), 1), (x, h, c))


def test_placement_flags_and_batch_gain():
    cell = LSTMCell(3, 4, "layer", norm_input=True, norm_hidden=False, norm_cell=False)
    assert isinstance(cell.norm_ih, torch.nn.LayerNorm)
    assert isinstance(cell.norm_hh, torch.nn.Identity) and isinstance(cell.norm_c, torch.nn.Identity)
    bn = LSTMCell(3, 4, "batch", max_steps=5)
    assert torch.all(bn.norm_ih.weight == 0.1) and torch.all(bn.norm_c.weight == 0.1)
    assert isinstance(GRUCell(3, 4, "layer").norm_c, torch.nn.Identity)


def test_bad_arguments():
    with pytest.raises(ValueError, match="norm must be one of"):
        LSTMCell(3, 4, "group")
    with pytest.raises(ValueError, match="needs max_steps"):
        GRUCell(3, 4, "batch")
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        LSTMCell(3, 0)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 3\)"):
        LSTMCell(3, 4)(torch.randn(2, 5), (torch.zeros(2, 4), torch.zeros(2, 4)))
    with pytest.raises(TypeError, match="cell must be"):
        SequenceClassifier(torch.nn.LSTMCell(3, 4), 2)
    model = SequenceClassifier(GRUCell(3, 4), 2)
    with pytest.raises(ValueError, match="lengths must be"):
        model(torch.randn(2, 5, 3), torch.tensor([6, 1]))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, F\)"):
        model(torch.randn(5, 3))


def test_population_statistics_are_the_training_set_averages():
    torch.manual_seed(3)
    model = SequenceClassifier(LSTMCell(3, 5, "batch", max_steps=4), 2)
    x, y = torch.randn(10, 4, 3), torch.randint(0, 2, (10,))
    inputs = []  # what norm_ih sees at each step, in training mode
    hook = model.cell.norm_ih.register_forward_hook(lambda m, args, kw, out: inputs.append(args[0]), with_kwargs=True)
    with torch.no_grad():
        model.train()(x[:5]), model(x[5:])
    hook.remove()
    weights = {k: v.clone() for k, v in model.named_parameters()}
    model.eval()
    counts = population_statistics(model, (x, y), batch_size=5)
    assert counts.tolist() == [10, 10, 10, 10]
    for t in range(4):
        a, b = inputs[t], inputs[4 + t]  # step t of the first and of the second batch
        torch.testing.assert_close(model.cell.norm_ih.running_mean[t], (a.mean(0) + b.mean(0)) / 2)
        torch.testing.assert_close(model.cell.norm_ih.running_var[t], (a.var(0) + b.var(0)) / 2)
    assert not model.training
    assert all(torch.equal(v, weights[k]) for k, v in model.named_parameters())


def test_population_statistics_at_steps_with_fewer_than_two_sequences():
    torch.manual_seed(4)
    model = SequenceClassifier(LSTMCell(3, 5, "batch", max_steps=6), 2)
    x, lengths, y = torch.randn(6, 6, 3), torch.tensor([6, 3, 4, 3, 2, 5]), torch.zeros(6, dtype=torch.long)
    counts = population_statistics(model, (x, lengths, y), batch_size=3)
    # batches (6, 3, 4) and (3, 2, 5): at step 3 the second has one real sequence, at step 4 each has one
    assert counts.tolist() == [6, 6, 5, 2, 0, 0]
    norm = model.cell.norm_c
    assert torch.equal(norm.running_mean[4], norm.running_mean[3]) and torch.equal(norm.running_var[5], norm.running_var[3])
    assert not torch.equal(norm.running_mean[3], norm.running_mean[2])
    with pytest.raises(ValueError, match="no TimeStepBatchNorm"):
        population_statistics(SequenceClassifier(LSTMCell(3, 5, "layer"), 2), (x, y))
    with pytest.raises(ValueError, match="batch_size must be at least 2"):
        population_statistics(model, (x, lengths, y), batch_size=1)
