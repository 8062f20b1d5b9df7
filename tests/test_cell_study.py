"""Chapter 05's helpers: the rate grid, BatchNorm scored two ways, the probes."""

import copy

import numpy as np
import pytest
import torch

from lnbook import cell_study, rnn, seeds, train
from lnbook.utils import seed_everything


def _data(n=24, steps=5, features=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, steps, features, generator=g), torch.randint(0, 4, (n,), generator=g)


def _model(norm="batch", steps=5, seed=0):
    seed_everything(seed)
    return rnn.SequenceClassifier(rnn.LSTMCell(3, 8, norm, max_steps=steps), 4)


def _trained(norm="batch"):
    model, data = _model(norm), _data()
    train.fit(model, data, data, epochs=2, lr=1e-2, batch_size=8, seed=0)
    return model, data


def test_grid_orders_members_rate_major_and_by_rate_splits_them_back():
    member_seeds, lrs = cell_study.grid([0.1, 0.2], [3, 4, 5])
    assert member_seeds == [3, 4, 5, 3, 4, 5] and lrs == [0.1] * 3 + [0.2] * 3
    assert cell_study.by_rate(list("abcdef"), [0.1, 0.2]) == {0.1: list("abc"), 0.2: list("def")}


@pytest.mark.parametrize("lrs, seeds_, match", [([], [0], "lrs"), ([0.1, 0.1], [0], "distinct"), ([-1.0], [0], "positive"),
                                                ([0.1], [], "seeds")])
def test_grid_rejects_bad_input(lrs, seeds_, match):
    with pytest.raises(ValueError, match=match):
        cell_study.grid(lrs, seeds_)


def test_by_rate_rejects_a_count_that_does_not_split():
    with pytest.raises(ValueError, match="multiple of the 2 rates"):
        cell_study.by_rate([1, 2, 3], [0.1, 0.2])


def test_a_stacked_grid_trains_each_member_as_its_own_run():
    data = _data()
    member_seeds, lrs = cell_study.grid([1e-2, 3e-2], [0, 1])
    runs = seeds.runs(lambda: rnn.SequenceClassifier(rnn.LSTMCell(3, 8, "layer"), 4), member_seeds, fit=seeds.fit, train=data, test=data, epochs=1, lr=lrs,
                      batch_size=8)
    alone = _model("layer", seed=1)
    history = train.fit(alone, data, data, epochs=1, lr=3e-2, batch_size=8, seed=1)
    np.testing.assert_allclose(cell_study.by_rate(runs, [1e-2, 3e-2])[3e-2][1][1].step_loss, history.step_loss, rtol=1e-4)


def test_population_statistics_leave_the_model_alone_and_change_the_score():
    model, data = _trained()
    before = copy.deepcopy(model.state_dict())
    estimated = cell_study.with_population_statistics(model, data)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(estimated.cell.norm_ih.running_var, model.cell.norm_ih.running_var)
    assert train.accuracy(estimated, data) != train.accuracy(model, data)


def test_has_steps_tells_per_step_batchnorm_apart():
    assert cell_study.has_steps(_model("batch")) and not cell_study.has_steps(_model("layer"))


def test_with_steps_adds_steps_that_answer_as_the_last_trained_one():
    model, data = _trained()
    longer = cell_study.with_steps(model, 9)
    norm = longer.cell.norm_ih
    assert norm.max_steps == 9 and norm.running_var.shape[0] == 9
    assert torch.equal(norm.running_var[5:], model.cell.norm_ih.running_var[4].expand(4, -1))
    x = torch.randn(6, 9, 3)
    with torch.no_grad():
        assert torch.equal(longer.eval()(x), model.eval()(x))
    with pytest.raises(ValueError, match="at least the model's 5"):
        cell_study.with_steps(model, 3)
    with pytest.raises(ValueError, match="no TimeStepBatchNorm"):
        cell_study.with_steps(_model("layer"), 9)


def test_batch_accuracy_normalizes_with_each_test_batch():
    model, data = _trained()
    whole = cell_study.batch_accuracy(model, data, len(data[1]))
    with torch.no_grad():
        expected = (copy.deepcopy(model).train()(data[0]).argmax(-1) == data[1]).double().mean().item()
    assert whole == expected
    with pytest.raises(ValueError, match="one value"):  # a batch of one has no batch variance
        cell_study.batch_accuracy(model, data, 1)


def test_term_sizes_match_a_hand_computation_and_layernorm_sets_the_size():
    seed_everything(0)
    model = rnn.SequenceClassifier(rnn.LSTMCell(3, 8, "none"), 4)
    x = _data()[0]
    a, r = cell_study.term_sizes(model, x)
    cell, h, c, sizes = model.cell, torch.zeros(len(x), 8), torch.zeros(len(x), 8), []
    with torch.no_grad():
        for t in range(x.shape[1]):
            if t:
                sizes.append([(x[:, t] @ cell.weight_ih.T).pow(2).mean().sqrt().item(),
                              (h @ cell.weight_hh.T).pow(2).mean().sqrt().item()])
            h, c = cell(x[:, t], (h, c), t)
    np.testing.assert_allclose([a, r], np.mean(sizes, axis=0))
    a, r = cell_study.term_sizes(_model("layer"), x)
    assert abs(a - 1) < 0.05 and abs(r - 1) < 0.05
    with pytest.raises(TypeError, match="LSTMCell"):
        cell_study.term_sizes(rnn.SequenceClassifier(rnn.GRUCell(3, 8), 4), x)


def test_dynamics_measure_every_step_and_leave_the_model_alone():
    model, data = _trained()
    before = copy.deepcopy(model.state_dict())
    out = cell_study.dynamics(model, *data)
    assert out.shape == (2, 5) and np.all(out > 0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_set_gain_sets_one_placement():
    model = cell_study.set_gain(_model("layer"), "recurrent", 0.07)
    assert torch.all(model.cell.norm_hh.weight == 0.07) and torch.all(model.cell.norm_ih.weight == 1)
    with pytest.raises(ValueError, match="placement must be one of"):
        cell_study.set_gain(model, "output", 1.0)
    with pytest.raises(ValueError, match="gain"):
        cell_study.set_gain(model, "input", 0.0)
    off = rnn.SequenceClassifier(rnn.LSTMCell(3, 8, "layer", norm_hidden=False), 4)
    with pytest.raises(ValueError, match="no norm with a gain"):
        cell_study.set_gain(off, "recurrent", 1.0)


def test_splice_statistics_takes_the_donors_later_steps_only():
    model, data = _trained()
    donor = cell_study.with_population_statistics(cell_study.with_steps(model, 8), (torch.randn(24, 8, 3), data[1]))
    spliced = cell_study.splice_statistics(model, donor, 5)
    got, kept = spliced.cell.norm_ih.running_var, model.cell.norm_ih.running_var
    assert got.shape[0] == 8 and torch.equal(got[:5], kept) and torch.equal(got[5:], donor.cell.norm_ih.running_var[5:])
    with pytest.raises(ValueError, match="below the donor's 8 steps"):
        cell_study.splice_statistics(model, donor, 8)
    with pytest.raises(ValueError, match="no TimeStepBatchNorm"):
        cell_study.splice_statistics(model, _model("layer"), 2)
