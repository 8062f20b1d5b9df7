"""lnbook.rnn: normalized LSTM and GRU cells and the padded-sequence classifier."""

import pytest
import torch

from lnbook import seeds, train
from lnbook.rnn import CharLSTM, GRUCell, LSTMCell, SequenceClassifier, lm_loss_population, population_statistics


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


# CharLSTM: the character-level language model of chapter 05's language-modelling experiment

VOCAB = 11


def char_lstm(norm, seed=0, steps=8):
    torch.manual_seed(seed)
    return CharLSTM(VOCAB, 6, norm, embed_size=4, max_steps=steps)


@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
def test_char_lstm_shapes_and_loss_is_the_cross_entropy(norm):
    model = char_lstm(norm)
    idx, targets = torch.randint(0, VOCAB, (3, 8)), torch.randint(0, VOCAB, (3, 8))
    logits = model(idx)
    assert logits.shape == (3, 8, VOCAB)
    by_hand = -logits.log_softmax(-1).gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(model.loss(idx, targets), by_hand)


def test_char_lstm_logits_at_a_step_do_not_depend_on_later_tokens():
    model = char_lstm("layer")
    idx = torch.randint(0, VOCAB, (2, 8))
    changed = idx.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % VOCAB
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("norm", ["none", "layer", "batch"])
def test_char_lstm_stacked_members_compute_what_the_plain_models_do(norm, training):
    plain = [char_lstm(norm, seed) for seed in (1, 2)]
    stacked = seeds.stack(plain).train(training)
    for m in plain:
        m.train(training)
    idx, targets = torch.randint(0, VOCAB, (2, 4, 8)), torch.randint(0, VOCAB, (2, 4, 8))
    logits, losses = stacked(idx), stacked.loss(idx, targets)
    assert logits.shape == (2, 4, 8, VOCAB) and losses.shape == (2,)
    for s, m in enumerate(plain):
        torch.testing.assert_close(logits[s], m(idx[s]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(losses[s], m.loss(idx[s], targets[s]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_char_lstm_trains_stacked_as_alone(norm):
    ids = torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(5))
    options = dict(steps=4, batch_size=4, block_size=8, eval_every=2)
    alone = [train.fit_lm(char_lstm(norm, seed), ids[:300], ids[300:], lr=lr, seed=seed, **options)
             for seed, lr in ((1, 1e-2), (2, 3e-2))]
    stacked = seeds.fit_lm(seeds.stack([char_lstm(norm, 1), char_lstm(norm, 2)]), ids[:300], ids[300:],
                           lr=[1e-2, 3e-2], seeds=[1, 2], **options)
    for a, s in zip(alone, stacked):
        assert len(a.step_loss) == 4 and a.val_steps == s.val_steps == [2, 4]
        torch.testing.assert_close(torch.tensor(s.step_loss), torch.tensor(a.step_loss), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(s.val_loss), torch.tensor(a.val_loss), atol=1e-4, rtol=1e-4)
    assert alone[0].step_loss != alone[1].step_loss


def test_population_statistics_on_a_char_lstm_and_the_population_score():
    ids = torch.randint(0, VOCAB, (600,), generator=torch.Generator().manual_seed(6))
    model = char_lstm("batch")
    train.fit_lm(model, ids[:500], ids[500:], steps=5, lr=3e-2, batch_size=8, block_size=8, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    running = train.lm_loss(model, ids[500:], 8)
    population = lm_loss_population(model, ids[:500], ids[500:], 8, n_windows=40, batch_size=16)
    assert abs(population - running) > 1e-4  # the statistics the two scores use differ
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()) and model.training
    # the same score by hand: population statistics over the windows it documents, then lm_loss
    starts = torch.randint(500 - 8, (40,), generator=torch.Generator().manual_seed(0))
    counts = population_statistics(model, train.windows(ids[:500], starts, 8), batch_size=16)
    assert counts.tolist() == [40] * 8
    assert not torch.equal(model.cell.norm_ih.running_mean, before["cell.norm_ih.running_mean"])
    assert population == pytest.approx(train.lm_loss(model, ids[500:], 8), abs=1e-6)


def test_char_lstm_eval_runs_past_max_steps_but_training_does_not():
    model = char_lstm("batch", steps=4)
    idx = torch.randint(0, VOCAB, (3, 6))
    assert model.eval()(idx).shape == (3, 6, VOCAB)
    with pytest.raises(ValueError, match="idx has 6 steps, beyond max_steps = 4"):
        model.train()(idx)


def test_char_lstm_bad_arguments():
    model = char_lstm("none")
    idx = torch.randint(0, VOCAB, (2, 5))
    with pytest.raises(ValueError, match=r"idx must be a non-empty int64 tensor of shape \(B, T\)"):
        model(idx.float())
    with pytest.raises(ValueError, match=r"idx must be a non-empty int64 tensor of shape \(B, T\)"):
        model(idx[0])
    with pytest.raises(ValueError, match=r"idx must hold token ids in 0..10, got 0..11"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match="targets must have idx's shape"):
        model.loss(idx, idx[:, :4])
    with pytest.raises(ValueError, match="targets must hold token ids"):
        model.loss(idx, idx - 1)
    with pytest.raises(ValueError, match="needs max_steps"):
        CharLSTM(VOCAB, 6, "batch")
    with pytest.raises(ValueError, match="embed_size must be a positive int"):
        CharLSTM(VOCAB, 6, embed_size=0)
    stacked = seeds.stack([char_lstm("batch"), char_lstm("batch", 1)])
    with pytest.raises(ValueError, match=r"shape \(S, B, T\) with S = 2 seeds"):
        stacked(torch.randint(0, VOCAB, (3, 2, 5)))
    ids = torch.randint(0, VOCAB, (100,))
    with pytest.raises(ValueError, match="model must be a plain model"):
        lm_loss_population(stacked, ids, ids, 8)
    with pytest.raises(ValueError, match="n_windows must be an int >= 2"):
        lm_loss_population(char_lstm("batch"), ids, ids, 8, n_windows=1)
    with pytest.raises(TypeError, match="val_ids must be a 1-D int64 tensor"):
        lm_loss_population(char_lstm("batch"), ids, ids.float(), 8)
    with pytest.raises(ValueError, match="no TimeStepBatchNorm"):
        lm_loss_population(model, ids, ids, 8)
