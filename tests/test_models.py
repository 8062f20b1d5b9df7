"""lnbook.models: the GRU and RNN classifiers over padded and longer-than-trained sequences."""

import pytest
import torch

from lnbook import models, utils


@pytest.mark.parametrize("norm", models.GRUClassifier.NORMS)
def test_gru_classifier_ignores_padding_except_through_unmasked_batchnorm(norm):
    utils.seed_everything(0)
    model = models.GRUClassifier(3, 8, 4, norm)
    x = torch.randn(2, 5, 3)
    lengths = torch.tensor([5, 3])
    x[1, 3:] = 0.0
    garbage = x.clone()
    garbage[1, 3:] = torch.randn(2, 3) * 10
    longer = torch.cat([garbage, torch.randn(2, 4, 3)], dim=1)  # padding beyond the longest
    changed = not torch.allclose(model(x, lengths), model(garbage, lengths))
    assert changed == (norm == "batch_unmasked")  # training mode: padding enters its statistics
    model.eval()  # eval mode: running statistics, so no norm looks at the padding
    torch.testing.assert_close(model(x, lengths), model(longer, lengths))
    with pytest.raises(ValueError, match="lengths must be"):
        model(x, torch.tensor([6, 3]))


@pytest.mark.parametrize("norm", models.NormRNNCell.NORMS)
def test_rnn_classifier_runs_longer_than_trained_in_eval(norm):
    utils.seed_everything(0)
    model = models.RNNClassifier(2, 8, 3, norm, max_steps=4)
    loss = model(torch.randn(8, 4, 2)).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    assert model(torch.randn(1, 9, 2)).shape == (1, 3)
    with pytest.raises(ValueError, match="needs max_steps"):
        models.NormRNNCell(2, 6, "batch_per_step")
    with pytest.raises(ValueError, match="norm must be one of"):
        models.MLP(4, (3,), 2, "group")
