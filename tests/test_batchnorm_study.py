"""lnbook.batchnorm_study: chapter 01's sigmoid network, scored training, verdict grids and probes."""

import numpy as np
import pytest
import torch

from lnbook import batchnorm_study as study
from lnbook import models, seeds, train


def digits_like(n=120, features=8, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = torch.randn(n, features, generator=g) + y[:, None].float()
    return x, y


def mlps(norm, seed_list, width=8, features=8):
    nets = []
    for s in seed_list:
        torch.manual_seed(s)
        nets.append(models.MLP(features, (width, width), 3, norm))
    return nets


def test_sigmoid_mlp_init_and_stacking():
    net = study.SigmoidMLP(8, (20, 20), 3, "batch", std=0.1, seed=3)
    linears = [m for m in net.net if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 3 and len(net.sigmoids()) == 2
    assert all((lin.bias == 0).all() for lin in linears)
    assert abs(linears[0].weight.std().item() - 0.1) < 0.02
    same = study.SigmoidMLP(8, (20, 20), 3, "batch", std=0.1, seed=3)
    other = study.SigmoidMLP(8, (20, 20), 3, "batch", std=0.1, seed=4)
    assert torch.equal(linears[0].weight, same.net[0].weight) and not torch.equal(linears[0].weight, other.net[0].weight)
    plain = [study.SigmoidMLP(8, (20,), 3, "none", seed=s) for s in range(3)]
    stacked = seeds.stack(plain)
    x = torch.randn(5, 8)
    out = stacked(x.expand(3, 5, 8))
    for s, m in enumerate(plain):
        torch.testing.assert_close(out[s], m(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [dict(norm="layer"), dict(std=0.0), dict(hidden=())])
def test_sigmoid_mlp_rejects_bad_arguments(bad):
    args = dict(in_features=8, hidden=(4,), n_classes=3, norm="none", std=0.1)
    args.update(bad)
    with pytest.raises(ValueError):
        study.SigmoidMLP(**args)


def test_fit_scored_matches_seeds_fit_and_scores_test_when_asked():
    x, y = digits_like()
    data, val, test = (x[:80], y[:80]), (x[80:100], y[80:100]), (x[100:], y[100:])
    ref = seeds.fit(seeds.stack(mlps("batch", [0, 1])), data, val, epochs=3, lr=0.05, batch_size=16, seeds=[0, 1],
                    optimizer="sgd")
    model = seeds.stack(mlps("batch", [0, 1]))
    hist, scored = study.fit_scored(model, data, val, test, epochs=3, lr=0.05, batch_size=16, seeds=[0, 1], test_at=(1,))
    assert all(a.step_loss == b.step_loss and a.test_acc == b.test_acc for a, b in zip(hist, ref))
    assert sorted(scored) == [1, 3]
    np.testing.assert_allclose(scored[3], seeds.accuracy(model, test))
    with pytest.raises(ValueError, match="test_at"):
        study.fit_scored(model, data, val, test, epochs=3, lr=0.05, batch_size=16, seeds=[0, 1], test_at=(4,))


def test_recording_inputs_and_percentiles():
    net = study.SigmoidMLP(8, (6,), 3, "none", seed=0).eval()
    x = torch.randn(50, 8)
    with study.recording_inputs(net.sigmoids()[0], unit=2, rows=50) as seen:
        net(x)
        net(x[:10])  # another size: not recorded
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], net.net[0](x)[:, 2].detach())
    pct = study.percentiles([torch.arange(101.0).expand(2, 101)])
    np.testing.assert_allclose(pct, [[[15, 50, 85], [15, 50, 85]]])
    with study.recording_inputs(net.sigmoids()[0], unit=None, rows=50) as every:
        net(x)
    torch.testing.assert_close(every[0], net.net[0](x).detach().T)  # (units, examples)
    torch.testing.assert_close(every[0][2], seen[0])
    units = torch.stack([torch.arange(101.0), 2 * torch.arange(101.0)])  # (U=2, B=101)
    np.testing.assert_allclose(study.percentiles([units.expand(3, 2, 101)]).shape, (1, 3, 2, 3))
    np.testing.assert_allclose(study.percentiles([units.expand(3, 2, 101)])[0, 1], [[15, 50, 85], [30, 100, 170]])
    with pytest.raises(ValueError, match="unit"):
        with study.recording_inputs(net.sigmoids()[0], unit=-1):
            pass


def test_grid_cells_say_what_the_verdict_says():
    rng = np.random.default_rng(0)
    values = {("a", 1): 1 + rng.normal(0, 0.1, 10), ("b", 1): rng.normal(0, 0.1, 10),
              ("a", 2): np.full(10, 0.1), ("b", 2): np.full(10, 0.1),
              ("a", 3): rng.normal(0, 1, 10), ("b", 3): rng.normal(0, 1, 10)}
    g = study.grid_compare(lambda arm, s: values[arm, s], [("a", "b")], [1, 2, 3], {"a": "A", "b": "B"}, chance=0.1)
    assert len(g) == 2
    assert g.cell(1, "a", "b").endswith("A beats B")
    assert g.cell(2, "a", "b") == "both at chance; not compared"
    assert g.cell(3, "a", "b").endswith("no difference measured")
    assert g.get(2, "a", "b") is None


def test_grid_marks_an_interval_that_excludes_zero_without_a_verdict():
    base = np.linspace(0.5, 0.9, 10)
    lift = np.array([0.1, 0.3, -0.05, 0.2, 0.15, 0.05, 0.25, -0.1, 0.2, 0.1])  # t about 3: p about 0.013 alone
    even = np.array([0.1, -0.1] * 5)  # mean 0
    values = {("b", s): base for s in range(6)}
    values.update({("a", s): base + (lift if s == 0 else even) for s in range(6)})
    g = study.grid_compare(lambda arm, s: values[arm, s], [("a", "b")], list(range(6)), {"a": "A", "b": "B"})
    c = g.get(0, "a", "b")
    assert c.low > 0 and c.p < 0.05 and c.winner is None  # excluded unadjusted, not after Holm over 6
    assert g.cell(0, "a", "b") == f"{c.interval}, not separated after Holm (p {c.p_holm:.2f})"
    joint = study.jointly({"x": g, "y": g})
    assert joint["x"].get(0, "a", "b").family == 2 * len(g)


def test_dead_fraction_counts_units_that_never_fire():
    net = mlps("none", [0])[0]
    with torch.no_grad():
        net.net[1].weight.zero_()
        net.net[1].bias.fill_(-1.0)  # first hidden layer: every unit dead
    x, _ = digits_like()
    dead = study.dead_fraction(net, x)
    assert dead.shape == (1, 2) and dead[0, 0] == 1.0
    stacked = seeds.stack([net, mlps("none", [1])[0]])
    both = study.dead_fraction(stacked, x)
    assert both.shape == (2, 2) and both[0, 0] == 1.0 and both[1, 0] < 1.0


def test_bn_projection_matches_the_formula():
    net = mlps("batch", [0])[0]
    x, y = digits_like(n=40)
    ratio = study.bn_projection(net, x, y)
    assert ratio.shape == (2,) and np.all(ratio > 0) and np.all(ratio <= 1 + 1e-6)
    with pytest.raises(TypeError):
        study.bn_projection(mlps("none", [0])[0], x, y)


def test_fold_batchnorm_is_exact_in_eval_mode():
    net = mlps("batch", [0])[0]
    x, y = digits_like()
    train.fit(net, (x, y), (x, y), epochs=2, lr=0.05, batch_size=16, seed=0, optimizer="sgd")
    net.eval()
    folded = study.fold_batchnorm(net)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) or "BatchNorm" in type(m).__name__
                   for m in folded.modules())
    with torch.no_grad():
        torch.testing.assert_close(folded(x), net(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError):
        study.fold_batchnorm(mlps("layer", [0])[0])


def test_batch_answers_depend_on_the_batch_only_in_training_mode():
    stacked = seeds.stack(mlps("batch", [0, 1]))
    x, y = digits_like(n=30)
    p_eval, right = study.batch_answers(stacked.eval(), x, y, batch_size=8, draws=2)
    assert p_eval.shape == (2, 2, 30) and np.allclose(p_eval[0], p_eval[1])
    p_train, _ = study.batch_answers(stacked.train(), x, y, batch_size=8, draws=2)
    assert not np.allclose(p_train[0], p_train[1])
    with pytest.raises(ValueError, match="batch_size"):
        study.batch_answers(stacked, x, y, batch_size=1)


def test_default_init_std_recursion_matches_a_wide_network():
    pred = study.default_init_std(0.3, 4, 64)
    np.testing.assert_allclose(pred[1], np.sqrt(0.09 / 6 + 1 / 192))
    assert study.default_init_std(0.3, 3, 64, normalized=True)[2] == pytest.approx(np.sqrt(1 / 6 + 1 / 192))
    torch.manual_seed(0)  # a measurement: wide layers of PyTorch's default init
    width, x = 2048, torch.randn(4096, 2048) * 0.3
    lin = torch.nn.Linear(width, width)
    h = lin(torch.relu(x))
    measured = h.std().item()
    expected = study.default_init_std(0.3, 2, width)[1]
    assert abs(measured - expected) / expected < 0.05


def test_fit_scored_items_rows_are_the_accuracy():
    x, y = digits_like()
    data = (x, y)
    stack_a, stack_b = seeds.stack(mlps("batch", [0, 1])), seeds.stack(mlps("batch", [0, 1]))
    _, acc = study.fit_scored(stack_a, data, data, data, epochs=2, lr=0.05, batch_size=30, seeds=[0, 1], test_at=(1,))
    _, items = study.fit_scored(stack_b, data, data, data, epochs=2, lr=0.05, batch_size=30, seeds=[0, 1],
                                test_at=(1,), items=True)
    for e in (1, 2):
        assert items[e].shape == (2, len(y)) and set(np.unique(items[e])) <= {0.0, 1.0}
        np.testing.assert_array_equal(items[e].mean(1), acc[e])
    np.testing.assert_array_equal(study.correct(stack_b, data).mean(1), seeds.accuracy(stack_b, data))
    with pytest.raises(ValueError, match="stacked"):
        study.correct(mlps("none", [0])[0], data)


def test_validation_accuracy_and_train_until():
    x, y = digits_like()
    hist, _ = study.fit_scored(seeds.stack(mlps("none", [0, 1])), (x, y), (x[:30], y[:30]), (x, y), epochs=3, lr=0.05,
                               batch_size=30, seeds=[0, 1])
    val = study.validation_accuracy(hist)
    assert val.shape == (2, 3)
    np.testing.assert_array_equal(val[1], hist[1].test_acc)
    m = mlps("none", [0])[0]
    before = [p.clone() for p in m.parameters()]
    study.train_until(m, (x, y), (x, y), steps=3, lr=0.05, seed=0, batch_size=30)
    alone = mlps("none", [0])[0]
    h = train.fit(alone, (x, y), (x, y), epochs=1, lr=0.05, batch_size=30, seed=0, optimizer="sgd", max_steps=3)
    assert len(h.step_loss) == 3
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), alone.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
    with pytest.raises(ValueError, match="steps"):
        study.train_until(m, (x, y), (x, y), steps=None, lr=0.05, seed=0)


def test_drift():
    pct = np.zeros((4, 2, 3))
    pct[:, :, 0], pct[:, :, 2] = -1.0, 1.0  # spread 2 everywhere
    pct[2:, 0, :] += 1.0  # member 0's whole distribution moves up by 1 at evaluation 2
    np.testing.assert_allclose(study.drift(pct, 0), [0.5, 0.0])
    np.testing.assert_allclose(study.drift(pct, 2), [0.0, 0.0])
    np.testing.assert_allclose(study.drift(pct, [0, 1], [1, 3]), [0.0, 0.0])  # per-member windows
    np.testing.assert_allclose(study.drift(pct, [1, 0], [2, 3]), [0.5, 0.0])
    with pytest.raises(ValueError, match="start and stop"):
        study.drift(pct, 7)
    with pytest.raises(ValueError, match="pct"):
        study.drift(pct[0], 0)
    units = np.stack([pct, pct * 2, pct + 5], axis=2)  # (E, S, U=3, Q): unit 1 twice as wide, unit 2 shifted
    units[3, 1, 2] += 1.0  # member 1's unit 2 moves up by 1 at the last evaluation only
    got = study.drift(units, 0)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, [[0.5, 0.5, 0.5], [0.0, 0.0, 0.5]])
    np.testing.assert_allclose(got[:, 0], study.drift(pct, 0))


def test_largest_trained_needs_every_seed():
    acc = {0.1: [0.9, 0.95], 0.3: [0.97, 0.4], 1.0: [0.1, 0.1]}  # 0.3: mean 0.685 > 0.5, one seed below
    assert study.largest_trained(acc) == 0.1
    assert study.largest_trained(acc, floor=0.3) == 0.3
    assert study.largest_trained({0.1: [0.2, 0.3]}) is None
    with pytest.raises(ValueError, match="accuracy"):
        study.largest_trained({})


def test_tally_and_heatmap_colour():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    base = rng.normal(size=10)
    values = {("a", 1): base + 5, ("b", 1): base, ("a", 2): base, ("b", 2): base + 5, ("a", 3): base + rng.normal(size=10) * 0.01,
              ("b", 3): base}
    g = study.grid_compare(lambda n, s: values[n, s], [("a", "b")], [1, 2, 3], {"a": "A", "b": "B"}, higher=False)
    won, lost, tied = study.tally(g, "a", "b")
    assert won == [2] and lost == [1] and tied == [3]
    fig, ax = plt.subplots()
    image = g.heatmap(ax, [("a", "b")])
    colour = image.get_array()
    assert colour[1, 0] > 0 > colour[0, 0]  # fewer is better: a's smaller value at setting 2 is coloured positive
    plt.close(fig)
    with pytest.raises(TypeError, match="grid"):
        study.tally({}, "a", "b")


def test_grid_compare_items_counts_test_items():
    rng = np.random.default_rng(0)
    hard = rng.random(100) < 0.2
    right = {"a": np.ones((10, 100)), "b": np.tile(~hard, (10, 1)).astype(float)}
    g = study.grid_compare(lambda n, s: right[n], [("a", "b")], [1], {"a": "A", "b": "B"})
    c = g.get(1, "a", "b")
    assert np.isclose(c.diff, hard.mean()) and c.high - c.low > 0.05  # a seed-only interval would be 0 wide


def test_log_band_stays_positive():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = np.array([[1e-4, 1e-3], [1.0, 1.0], [1e-2, 1e-1]])
    fig, ax = plt.subplots()
    study.log_band(ax, [0, 1], runs, "x")
    band = ax.collections[0].get_paths()[0].vertices
    assert (band[:, 1] > 0).all()
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.exp(np.log(runs).mean(0)))
    with pytest.raises(ValueError, match="positive"):
        study.log_band(ax, [0, 1], -runs, "x")
    plt.close(fig)


def test_seeded_mlp_is_reproducible_and_he_redraws_the_weights():
    a, b = study.seeded_mlp("batch", 3), study.seeded_mlp("batch", 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(study.seeded_mlp("batch", 4).net[1].weight, a.net[1].weight)
    deep = study.seeded_mlp("none", 0, depth=10, init="he")
    linears = models.mlp_layers(deep)[0]
    assert len(linears) == 11 and all(torch.count_nonzero(layer.bias) == 0 for layer in linears)
    stds = torch.tensor([layer.weight.std().item() for layer in linears[:-1]])
    assert torch.allclose(stds, torch.full_like(stds, (2 / 64) ** 0.5), rtol=0.1)  # He: sqrt(2 / 64), about 0.177
    assert study.seeded_mlp("none", 0).net[1].weight.std() < 0.1  # PyTorch's default: about 0.072
    with pytest.raises(ValueError, match="init"):
        study.seeded_mlp("none", 0, init="xavier")
    with pytest.raises(ValueError, match="depth"):
        study.seeded_mlp("none", 0, depth=0)
