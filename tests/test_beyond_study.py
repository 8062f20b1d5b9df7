"""Chapter 09's experiment helpers: the settings, the queue at a tiny size, the budgets and the
readers the chapter prints with."""

import numpy as np
import pytest
import torch

from lnbook import beyond_study as bs
from lnbook.compare import compare
from lnbook.train import History
from lnbook.transformer import TinyViT


def test_setup_sizes_follow_full():
    s, f = bs.setup(), bs.setup(full=True)
    assert (len(s.seeds), len(s.vit_seeds), len(s.many)) == (5, 5, 10)
    assert (len(f.seeds), len(f.vit_seeds), len(f.many)) == (10, 10, 10)
    assert f.mlp_fit["epochs"] == 2 * s.mlp_fit["epochs"] == 10
    assert f.targets["re-drawn"].shape == (16, 512) and s.targets["re-drawn"].shape == (8, 512)
    # the budgets the chapter states: 1,437 training digits in batches of 64
    assert len(s.pixels_train[0]) == 1437
    assert bs.dqn_updates(steps=5000, learning_starts=500, train_every=2) == 2251  # steps 500, 502, ..., 5000
    assert bs.budgets(s) == {"graphs": 120, "ViT": 176, "plasticity (per task)": 150,
                             "MLP": 115, "LSTM": 69}
    assert bs.budgets(f)["ViT"] == 352
    with pytest.raises(TypeError, match="full"):
        bs.setup(full=1)


def test_queue_runs_every_section_at_a_tiny_size():
    s = bs.setup(tiny=True)
    q = bs.queue(s)
    assert set(q) == {"lstm", "graphs", "vit", "refit", "mlp"}
    assert bs.jobs_line(q).endswith(f"= {11 + 5 * 2 + 6 + 4 + 13} jobs queued")
    model, history = q["mlp"]["layer"][1].result()
    assert bs.updates([history]) == -(-len(s.pixels_train[0]) // 64)  # one epoch, the last batch kept
    _, vit = q["vit"][2, "BatchNorm"][0].result()
    assert bs.updates([vit]) == len(s.images_train[0]) // 64 == bs.budgets(s)["ViT"]  # drop_last
    assert bs.updates([history]) == bs.budgets(s)["MLP"]
    _, refit = q["refit"]["re-drawn", "no norm"].result()
    assert refit.fit.shape == (2, 2)
    assert "refitting 0.001" in bs.learning_rates(s) and "MLP" not in bs.learning_rates(s)
    assert set(bs.queue(s, sections=("refit",))) == {"refit"}
    with pytest.raises(ValueError, match="sections"):
        bs.queue(s, sections="vit")
    with pytest.raises(TypeError, match="Setup"):
        bs.queue({"graph_fit": {}})


def test_dqn_updates_counts_the_loop():
    assert bs.dqn_updates(steps=10, learning_starts=5, train_every=2) == 3  # steps 6, 8, 10
    assert bs.dqn_updates(steps=10, learning_starts=1, train_every=1) == 10
    with pytest.raises(ValueError, match="train_every"):
        bs.dqn_updates(steps=10, learning_starts=1, train_every=0)


def test_updates_counts_each_runs_updates():
    fast = History(step_loss=[2.0] * 5 + [0.5] * 20)
    slow = History(step_loss=[2.0] * 25)
    assert bs.updates([fast, fast]) == 25
    assert bs.updates([fast, slow]) == 25
    with pytest.raises(ValueError, match="same number"):
        bs.updates([fast, History(step_loss=[1.0])])
    with pytest.raises(TypeError, match="histories"):
        bs.updates([])


def test_mean_and_said():
    assert bs.mean([0.1, 0.2, 0.3]) == "0.200"
    assert bs.mean([1, 2], digits=1) == "1.5"
    with pytest.raises(ValueError, match="values"):
        bs.mean([])
    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, 8)
    result = compare({"A": base + 1.0, "B": base + rng.normal(0, 0.01, 8), "C": base + rng.normal(0, 1, 8)},
                     pairs=[("A", "B"), ("C", "B")])
    assert bs.said(result, "A", "B", "a", "b").startswith("a beats b (a − b +1.0")
    assert bs.said(result, "C", "B", "c", "b").startswith("no difference measured (c − b ")


def test_vit_helpers_tell_layernorm_from_batchnorm():
    torch.manual_seed(0)
    x, y = torch.randn(24, 8, 8), torch.randint(10, (24,))
    ln, bn = TinyViT(norm="layernorm"), TinyViT(norm="batchnorm")
    assert bs.batch_mate_effect(ln, x, images=4, draws=3, mates=3) == (0.0, 0)
    largest, _ = bs.batch_mate_effect(bn, x, images=4, draws=3, mates=3)
    assert largest > 1e-3
    # LayerNorm computes the same served alone, in eval mode or in any batch; BatchNorm does not
    assert bs.vit_accuracy(ln, x, y) == bs.vit_accuracy(ln, x, y, batch_size=2)
    bn.train()
    before = [b.clone() for b in bn.buffers()]
    bs.vit_accuracy(bn, x, y, batch_size=2)
    assert bn.training and all(torch.equal(a, b) for a, b in zip(before, bn.buffers()))  # on a copy
    with pytest.raises(ValueError, match="x and y"):
        bs.vit_accuracy(ln, x, y[:3])
    with pytest.raises(ValueError, match="x must be"):
        bs.batch_mate_effect(ln, x[:3], images=4)


def test_vit_compare_is_one_family():
    rng = np.random.default_rng(1)
    acc = {(p, n): rng.uniform(0.8, 0.9, 5) for p in bs.PATCHES for n in bs.VIT_NORMS}
    result = bs.vit_compare(acc)
    assert len(result) == 6 and all(c.family == 6 for c in result)


def test_dots_and_intervals_draws_a_row_per_group():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    bs.dots_and_intervals(ax, {"a": [1.0, 2.0, 3.0], "b": [2.0, 2.5]}, "x", reference=1.5)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a"]
    assert len(ax.lines) >= 3  # the dots of both rows and the reference line
    with pytest.raises(ValueError, match="groups"):
        bs.dots_and_intervals(ax, {"a": [1.0]}, "x")
    plt.close(fig)


def test_section_5_arms():
    x = torch.randn(32, 64, 1)
    made = {}
    for arm in ("none", "ddi", "weight_ddi"):
        torch.manual_seed(0)  # the same initial weights before the initialization
        made[arm] = bs.make_mlp(arm, x)
    plain, ddi, both = made["none"], made["ddi"], made["weight_ddi"]
    with torch.no_grad():
        first = both.net[1](x.flatten(1))  # net[0] flattens
    assert first.mean(0).abs().max() < 1e-4  # standardized on the batch it saw
    assert torch.allclose(ddi(x), both(x), atol=1e-5)  # the same function at step 0, with and without the weight norm
    assert not torch.allclose(plain(x), both(x))
    assert bs.make_lstm("adanorm_c2") is not None and set(bs.LSTM_ARMS) < set(bs.MLP_ARMS)
    with pytest.raises(ValueError, match="ddi_x"):
        bs.make_mlp("ddi")
    with pytest.raises(ValueError, match="arm"):
        bs.make_lstm("weight_ddi")


def test_train_norm_arm_stacks_rates_and_seeds_and_checks_its_input():
    sets = {k: tuple(t[:96] for t in v) for k, v in bs.norm_sweep_data()["mlp"].items()}
    out = bs.train_norm_arm("mlp", "layer", (0.03, 0.3), [0, 1], 2, sets)
    assert out["val"].shape == out["test"].shape == out["loss"].shape == (4, 2) and int(out["per_epoch"]) == 2
    assert not np.allclose(out["loss"][0], out["loss"][2])  # members 0 and 2: seed 0 at two rates
    again = bs.train_norm_arm("mlp", "layer", (0.03,), [1], 2, sets)  # a member alone trains as inside the stack
    np.testing.assert_allclose(again["loss"][0], out["loss"][1], rtol=1e-4)
    with pytest.raises(ValueError, match="arm"):
        bs.train_norm_arm("lstm", "ddi", (0.01,), [0], 1, sets)
    with pytest.raises(ValueError, match="net"):
        bs.train_norm_arm("cnn", "layer", (0.01,), [0], 1, sets)


def test_norm_questions_tables_and_verdicts():
    rng = np.random.default_rng(0)
    final = {(k, a): rng.normal(0.9 + (0.05 if a == "batch" else 0), 0.01, 6) for k in ("mlp", "lstm")
             for a in (bs.MLP_ARMS if k == "mlp" else bs.LSTM_ARMS)}
    reached = {key: rng.normal(30, 1, 6) for key in final}
    reached["mlp", "layer"] = reached["mlp", "none"] - 10  # LN reaches loss 1.0 ten updates sooner, in every seed
    tables = bs.norm_questions(final)
    assert list(tables) == list(bs.QUESTIONS)
    assert len(tables["weight normalization and its initialization (Salimans and Kingma)"]) == 6  # DDI: MLP only
    assert bs.net_verdicts(tables, "MLP").startswith("BN beats LN")
    speed = bs.norm_speed(reached)  # one family of its own, over every question's pairs
    assert len(speed) == sum(len(t) for t in tables.values())
    assert speed["LayerNorm against no norm"]["LayerNorm (MLP)", "no norm (MLP)"].winner == "LayerNorm (MLP)"
    table = bs.question_table(tables["BatchNorm against the per-example norms"], "BatchNorm against the per-example norms",
                              final, speed)
    assert len(table.rows) == 16 and all(len(r) == 8 for r in table.rows)
    assert max(len(str(table).splitlines()[0]), *(len(line) for line in str(table).splitlines())) <= 150
    with pytest.raises(ValueError, match="net"):
        bs.net_verdicts(tables, "CNN")
    assert bs.cell(tables["LayerNorm against no norm"]["accuracy"]["LayerNorm (MLP)", "no norm (MLP)"])[2] in (
        "no difference measured", "LN beats none", "none beats LN")
    with pytest.raises(TypeError, match="Comparison"):
        bs.cell("0.1")


def test_active_units_counts_the_fewest_active_units():
    from lnbook import models, seeds

    torch.manual_seed(0)
    model = seeds.stack([models.MLP(4, (8, 8), 1, "layer") for _ in range(3)])
    fewest = bs.active_units(model, torch.randn(20, 4))
    assert fewest.shape == (3, 2) and (fewest >= 1).all() and (fewest <= 8).all()  # LayerNorm: at least one unit active
    with pytest.raises(TypeError, match="stacked"):
        bs.active_units(models.MLP(4, (8,), 1, "none"), torch.randn(2, 4))


def test_epochs_to_counts_the_first_epoch_below_and_censors():
    curves = np.array([[0.5, 0.2, 0.05, 0.01], [0.5, 0.4, 0.3, 0.2]])
    np.testing.assert_array_equal(bs.epochs_to(curves, 0.1), [3, 4])  # the second never gets there: its 4 epochs
    with pytest.raises(ValueError, match="level"):
        bs.epochs_to(curves, 0)
    with pytest.raises(ValueError, match="curves"):
        bs.epochs_to(curves[0], 0.1)


def test_learned_alpha_reads_each_graphnorm_layer():
    from lnbook import graphs

    model = graphs.GraphNet(2, 8, 3, "graph")
    assert bs.learned_alpha(model) == [1.0, 1.0, 1.0]  # PyG starts alpha at 1: InstanceNorm
    with pytest.raises(ValueError, match="GraphNorm"):
        bs.learned_alpha(graphs.GraphNet(2, 8, 3, "none"))


def test_at_grid_edge_flags_the_lowest_and_highest_rate():
    assert bs.at_grid_edge({"a": 0.01, "b": 0.1, "c": 1.0}, [0.01, 0.1, 1.0]) == ["a", "c"]
    with pytest.raises(ValueError, match="grid"):
        bs.at_grid_edge({"a": 0.01}, [])


def test_named_table_span_and_q_check():
    from lnbook import rl
    from lnbook.compare import select

    sel = select({"layer_node": {0.1: [0.5, 0.6], 0.3: [0.4, 0.5]}, "none": {0.1: [0.2, 0.3], 0.3: [0.9, 0.9]}},
                 lambda a, lr: [1.0, 2.0], higher=False)
    table = bs.named_table(sel, {"layer_node": "LayerNorm, node", "none": "no norm"}, "validation MSE ÷ 0.5", "test", scale=0.5)
    assert [r[:3] for r in table.rows] == [["LayerNorm, node", "0.3", "0.900"], ["no norm", "0.1", "0.500"]]
    with pytest.raises(ValueError, match="names"):
        bs.named_table(sel, {"none": "no norm"}, "v", "t")
    with pytest.raises(TypeError, match="selection"):
        bs.named_table({}, {}, "v", "t")
    assert bs.span([0.0, 0.002, 0.004]) == "0.002 [0.000, 0.004]"
    with pytest.raises(ValueError, match="values"):
        bs.span([])
    model = rl.stream_agents("none", [0, 1])
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.net[-1].bias[0, 0] = 5.0  # agent 0 prefers action 0 everywhere, with Q = 5
    big, share = bs.q_check(model, torch.randn(8, 4))
    assert big.tolist() == [5.0, 0.0] and share[0] == 1.0
    with pytest.raises(ValueError, match="states"):
        bs.q_check(model, torch.randn(4))
