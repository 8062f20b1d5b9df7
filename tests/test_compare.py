"""lnbook.compare: the statistics of every verdict, tested as statistics (error rates, power,
Holm by hand), and selection on validation that cannot see the test split."""

import math

import numpy as np
import pytest
from scipy import stats

from lnbook import data
from lnbook.compare import compare, holm, select
from lnbook.utils import interval


def test_paired_interval_and_p_are_student_t_over_the_differences():
    a = np.array([0.91, 0.93, 0.90, 0.94, 0.92])
    b = np.array([0.90, 0.91, 0.90, 0.92, 0.90])
    c = compare({"LN": a, "BN": b})[0]
    mean, low, high = interval(a - b)
    assert (c.diff, c.low, c.high) == pytest.approx((mean, low, high))
    assert c.p == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert c.p_holm == c.p and c.winner == "LN"
    assert c.sentence == "LN beats BN by 0.014 [0.003, 0.025]"


def test_smaller_is_better_names_the_winner_and_a_positive_margin():
    loss = compare({"Pre-LN": [2.0, 2.1, 1.9, 2.05], "Post-LN": [2.5, 2.6, 2.4, 2.5]}, higher=False)
    assert loss[0].winner == "Pre-LN"
    assert loss.verdict("Post-LN", "Pre-LN").startswith("Pre-LN beats Post-LN by 0.487 [0.448, 0.527]")


def test_a_planted_paired_effect_the_overlap_rule_misses_is_found():
    # a large seed-to-seed spread shared by both arms, and a small, consistent gain
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0.9, 0.03, size=10)
    a, b = seed_effect + 0.008 + rng.normal(0, 0.002, 10), seed_effect + rng.normal(0, 0.002, 10)
    (_, la, ha), (_, lb, hb) = interval(a), interval(b)
    assert la < hb and lb < ha  # the two intervals of the means overlap: the old rule saw nothing
    c = compare({"BN": a, "none": b})[0]
    assert c.winner == "BN" and c.low > 0 and c.p < 1e-4


def test_null_arms_are_called_different_in_about_5_percent_of_families():
    rng = np.random.default_rng(1)
    families, calls = 2000, 0
    for _ in range(families):
        seed_effect = rng.normal(0, 1, size=(1, 5))
        arms = seed_effect + rng.normal(0, 0.3, size=(3, 5))  # three arms, one distribution
        result = compare({"a": arms[0], "b": arms[1], "c": arms[2]})
        calls += any(c.winner is not None for c in result)
    rate = calls / families
    assert 0.02 <= rate <= 0.065, rate  # Holm keeps the family-wise rate at or below 5%


def test_without_holm_a_family_of_nulls_would_be_called_more_often():
    rng = np.random.default_rng(2)
    raw = adjusted = 0
    for _ in range(2000):
        x = rng.normal(0, 1, size=(4, 6))
        result = compare({"base": x[0], "b": x[1], "c": x[2], "d": x[3]}, baseline="base")
        raw += any(c.p < 0.05 for c in result)
        adjusted += any(c.p_holm < 0.05 for c in result)
    assert raw / 2000 > 0.09 and adjusted / 2000 < 0.065


def test_holm_against_a_hand_computation():
    # sorted: 0.01 * 4 = 0.04; 0.02 * 3 = 0.06; 0.03 * 2 = 0.06; 0.5 * 1 = 0.5 (running max kept)
    np.testing.assert_allclose(holm([0.03, 0.5, 0.01, 0.02]), [0.06, 0.5, 0.04, 0.06])
    np.testing.assert_allclose(holm([0.001, 0.04]), [0.002, 0.04])
    np.testing.assert_allclose(holm([0.3, 0.04]), [0.3, 0.08])
    np.testing.assert_allclose(holm([0.9, 0.8]), [1.0, 1.0])  # 0.8 * 2 capped at 1, and 0.9 carries the maximum
    np.testing.assert_allclose(holm([0.6, 0.7, 0.8]), [1.0, 1.0, 1.0])


def test_the_adjustment_is_applied_within_one_call():
    x = {"base": [0.0, 0.0, 0.0, 0.0], "b": [0.1, 0.3, 0.2, 0.25], "c": [0.5, -0.1, 0.4, 0.3]}
    result = compare(x, baseline="base")
    np.testing.assert_allclose([c.p_holm for c in result], holm([c.p for c in result]))
    assert [(c.a, c.b) for c in result] == [("b", "base"), ("c", "base")]
    assert result[0].family == 2


def test_no_difference_names_the_effect_still_allowed():
    c = compare({"LN": [0.50, 0.52, 0.49, 0.51], "RMS": [0.51, 0.50, 0.50, 0.52]})[0]
    assert c.winner is None
    allowed = max(abs(c.low), abs(c.high))
    assert c.sentence == (f"no difference measured: LN − RMS = {c.interval}, "
                          f"a difference up to {allowed:.3f} not excluded")


def test_an_interval_off_zero_that_holm_does_not_pass_says_so():
    x = {"base": [0, 0, 0, 0, 0], "b": [0.1, 0.3, 0.2, 0.0, 0.25], "c": [0.5, -0.4, 0.1, -0.3, 0.2],
         "d": [0.01, -0.02, 0.03, 0, 0.01]}
    b = compare(x, baseline="base")["b", "base"]
    assert b.low > 0 and b.p < 0.05 and b.p_holm == pytest.approx(3 * b.p) and b.winner is None
    assert b.sentence.endswith("(the interval excludes 0, but not after Holm's correction for 3 comparisons)")
    assert compare({"base": x["base"], "b": x["b"]})[0].winner == "b"  # alone, the same data are a verdict


def test_unpaired_is_welch_and_labelled():
    a, b = [1.0, 1.2, 0.9, 1.1, 1.3, 1.0], [0.8, 0.7, 0.9, 0.6]
    c = compare({"A": a, "B": b}, paired=False)[0]
    assert c.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert c.sentence.endswith("(unpaired)") and "unpaired" in repr(compare({"A": a, "B": b}, paired=False))


def test_bootstrap_agrees_with_t_on_normal_differences_and_is_deterministic():
    rng = np.random.default_rng(3)
    a, b = rng.normal(2, 1, 20), rng.normal(0, 1, 20)
    t, boot = compare({"a": a, "b": b})[0], compare({"a": a, "b": b}, method="bootstrap")[0]
    assert boot.low == pytest.approx(t.low, abs=0.15) and boot.high == pytest.approx(t.high, abs=0.15)
    assert boot.diff == t.diff and boot.winner == t.winner == "a"
    assert compare({"a": a, "b": b}, method="bootstrap")[0] == boot


def test_diverged_runs_must_be_counted_explicitly_and_are_reported():
    x = {"LN": [2.0, 2.1, 2.2], "none": [2.5, float("nan"), float("inf")]}
    with pytest.raises(ValueError, match=r"diverged \(NaN or infinite\) runs, \{'none': 2\}.*diverged='worst'"):
        compare(x, higher=False)
    worst = compare(x, higher=False, diverged="worst")
    assert worst[0].diverged == {"LN": 0, "none": 2}
    assert worst[0].diff == pytest.approx(2.1 - 2.5)  # both counted as the worst finite loss, 2.5
    assert "none 2" in repr(worst)
    assert compare(x, higher=False, diverged=10.0)[0].diff == pytest.approx(2.1 - (2.5 + 20) / 3)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(results={"a": [1, 2, 3], "b": [1, 2]}), ValueError, "aligned by seed"),
        (dict(results={"a": [1], "b": [2]}), ValueError, "at least 2 seeds"),
        (dict(results={"a": [1, 2]}), ValueError, "at least 2 names"),
        (dict(results={"a": [1, 2], "b": [2, 3]}, baseline="c"), ValueError, "baseline must be one of"),
        (dict(results={"a": [1, 2], "b": [2, 3]}, pairs=[("a", "a")]), ValueError, "two different arms"),
        (dict(results={"a": [1, 2], "b": [2, 3]}, method="wilcoxon"), ValueError, "method must be one of"),
        (dict(results={"a": [1, 2], "b": [2, 3]}, higher="yes"), TypeError, "higher must be a bool"),
        (dict(results={"a": [1, 2], "b": ["x", 3]}), TypeError, r"results\['b'\] must be a 1-D sequence"),
        (dict(results={"a": [1, 2], "b": [2, 3]}, diverged="drop"), None, None),
        (dict(results={"a": [1, np.nan], "b": [2, 3]}, diverged="drop"), ValueError, "diverged must be 'worst'"),
    ],
)
def test_bad_input_gets_a_clear_error(kwargs, error, match):
    if error is None:
        compare(**kwargs)  # nothing diverged, so the rule is never needed
        return
    with pytest.raises(error, match=match):
        compare(**kwargs)


def test_the_table_renders_for_the_book_and_for_nbval():
    result = compare({"LN": [0.9, 0.92, 0.91], "BN": [0.8, 0.83, 0.82], "none": [0.7, 0.72, 0.69]}, baseline="none")
    assert repr(result).splitlines() == [
        "comparison | seeds | difference [95% CI]     | p (Holm) | verdict",
        "-----------+-------+-------------------------+----------+--------------",
        "LN − none  | 3     | +0.207 [+0.178, +0.235] | 0.002    | LN beats none",
        "BN − none  | 3     | +0.113 [+0.075, +0.151] | 0.006    | BN beats none",
    ]
    assert result._repr_markdown_().splitlines()[2] == "| LN − none | 3 | +0.207 [+0.178, +0.235] | 0.002 | LN beats none |"


def select_grid(seeds=5):
    rng = np.random.default_rng(4)
    val = {arm: {lr: rng.normal(lr_mean, 0.01, seeds) for lr, lr_mean in zip((0.01, 0.1, 1.0), means)}
           for arm, means in {"LN": (0.80, 0.95, 0.60), "none": (0.90, 0.70, np.nan)}.items()}
    val["none"][1.0] = np.full(seeds, np.nan)  # lr 1.0 diverged for every seed
    return val


def test_select_picks_on_validation_and_reads_test_only_there():
    val, read = select_grid(), []

    def test_result(arm, lr):
        read.append((arm, lr))
        return np.full(5, {"LN": 0.9, "none": 0.85}[arm])

    chosen = select(val, test_result)
    assert chosen.setting == {"LN": 0.1, "none": 0.01}
    assert read == [("LN", 0.1), ("none", 0.01)]  # the test split was read at the chosen settings only
    assert chosen.test["LN"].mean() == 0.9
    assert "setting chosen on validation" in repr(chosen.table())


def test_select_is_blind_to_the_test_results():
    val = select_grid()
    # test results that would favour other settings (the best test lr of LN is 1.0) change nothing
    lying = {"LN": {0.01: [1.0] * 5, 0.1: [0.5] * 5, 1.0: [1.0] * 5}, "none": {0.01: [0.1] * 5, 0.1: [1.0] * 5}}
    honest = {arm: {lr: [0.5] * 5 for lr in grid} for arm, grid in val.items()}
    assert select(val, lying).setting == select(val, honest).setting == {"LN": 0.1, "none": 0.01}
    with pytest.raises(ValueError, match="no results for arm 'none' at its chosen setting 0.01"):
        select(val, {"LN": {0.1: [0.5] * 5}, "none": {0.1: [0.5] * 5}})


def test_validation_split_comes_from_training_only_and_is_stratified():
    train, test = data.digits_sequences("row")
    fit, val = data.validation_split(train)
    assert len(fit[0]) + len(val[0]) == len(train[0]) and len(val[0]) == math.ceil(0.2 * len(train[0]))
    rows = lambda d: {tuple(r.flatten().tolist()) for r in d[0]}  # noqa: E731
    assert not rows(val) & rows(fit)
    assert rows(val) <= rows(train) and rows(fit) <= rows(train)
    assert set(val[1].tolist()) == set(range(10))
    assert all(torch_equal(a, b) for a, b in zip(data.validation_split(train)[1], val))  # fixed
    with pytest.raises(ValueError, match="fraction must be a number in"):
        data.validation_split(train, fraction=1.0)
    with pytest.raises(TypeError, match="train must be a dataset tuple"):
        data.validation_split(train[0])


def torch_equal(a, b):
    return bool((a == b).all())


def test_no_better_side_says_which_is_larger():
    result = compare({"with": [1.0, 1.1, 1.2], "without": [3.0, 3.3, 3.1]}, higher=None)
    assert result[0].winner == "without" and result[0].short == "without > with"
    assert result[0].sentence == "without is larger than with by 2.033 [1.654, 2.413]"
    with pytest.raises(ValueError, match="diverged='worst' needs a better side"):
        compare({"a": [1.0, np.nan], "b": [2.0, 3.0]}, higher=None, diverged="worst")


def test_by_measure_is_one_table_and_one_family():
    from lnbook.compare import by_measure

    loss = compare({"LN": [2.0, 2.1, 2.2, 2.0], "BN": [2.5, 2.4, 2.6, 2.5], "none": [2.6, 2.8, 2.7, 2.9]}, higher=False)
    rms = compare({"LN": [1.0, 1.1, 0.9, 1.0], "BN": [1.0, 1.2, 1.0, 0.9]}, higher=None)
    table = by_measure({"loss": loss, "RMS": rms}, label="question")
    assert repr(table).splitlines()[0].startswith("question | comparison | seeds |") and len(table) == 4
    raw = [c.p for c in loss] + [c.p for c in rms]
    np.testing.assert_allclose([c.p_holm for c in table], holm(raw))  # Holm over the whole table
    assert all(c.family == 4 for c in table) and loss[0].family == 3  # the separate calls are left as they were
    assert [c.p_holm for c in table["loss"]] == [c.p_holm for c in table][:3]
    assert table["RMS"][0].short == "no difference measured" and table["RMS"].verdict("LN", "BN").startswith("no difference")
    with pytest.raises(KeyError, match="no measure 'speed'"):
        table["speed"]
    with pytest.raises(TypeError, match="families must map measure names to compare"):
        by_measure({"loss": [1, 2]})


def test_by_measure_can_undo_a_verdict_that_a_smaller_family_made():
    from lnbook.compare import by_measure

    small = compare({"base": [0, 0, 0, 0, 0], "b": [0.1, 0.3, 0.2, 0.0, 0.25]})  # alone: b beats base, p = 0.034
    others = compare({"x": [0.1, -0.2, 0.3, 0.0, -0.1], "y": [0.0, 0.1, -0.1, 0.2, 0.0]})
    assert small[0].winner == "b"
    joint = by_measure({"first": small, "second": others})
    assert joint["first"][0].winner is None and "Holm's correction for 2 comparisons" in joint["first"][0].sentence


def test_compare_items_counts_the_test_items():
    from lnbook.compare import compare_items

    rng = np.random.default_rng(0)
    # 10 seeds that agree exactly: a seed-only interval would have zero width, but the 200 items are a sample
    hard = rng.random(200) < 0.1  # items arm b gets wrong on every seed
    a = np.ones((10, 200))
    b = np.tile(~hard, (10, 1)).astype(float)
    seed_only = compare({"a": a.mean(1), "b": b.mean(1)})["a", "b"]
    assert seed_only.low == seed_only.high
    c = compare_items({"a": a, "b": b})["a", "b"]
    assert np.isclose(c.diff, hard.mean())
    k = hard.mean()
    half = 1.96 * np.sqrt(k * (1 - k) / 200)  # the binomial half-width over the items
    assert c.low < k < c.high and 0.7 * half < (c.high - c.low) / 2 < 1.3 * half
    assert c.winner == "a" and c.n == 10


def test_compare_items_no_effect_and_holm():
    from lnbook.compare import compare_items

    rng = np.random.default_rng(1)
    arms = {k: (rng.random((8, 300)) < 0.9).astype(float) for k in ("a", "b", "c")}
    out = compare_items(arms)
    assert len(out) == 3 and all(c.family == 3 and c.p_holm >= c.p for c in out)
    assert all(c.low < 0 < c.high and c.winner is None for c in out)


def test_compare_items_pairs_share_one_resample():
    from lnbook.compare import compare_items

    rng = np.random.default_rng(2)
    arms = {k: (rng.random((6, 150)) < p).astype(float) for k, p in (("a", 0.9), ("b", 0.8), ("c", 0.85))}
    alone = compare_items(arms, pairs=[("a", "b")])["a", "b"]
    joint = compare_items(arms, pairs=[("a", "c"), ("a", "b")])["a", "b"]
    # the same draws for every pair: a pair's interval and raw p do not depend on the others in the call
    assert (alone.low, alone.high, alone.p) == (joint.low, joint.high, joint.p) and joint.p_holm >= alone.p_holm
    other_seed = compare_items(arms, pairs=[("a", "b")], seed=1)["a", "b"]
    assert (other_seed.low, other_seed.high) != (alone.low, alone.high)


def test_compare_items_bad_input():
    from lnbook.compare import compare_items

    with pytest.raises(ValueError, match="results"):
        compare_items({"a": np.ones((5, 10))})
    with pytest.raises(ValueError, match=r"results\['b'\]"):
        compare_items({"a": np.ones((5, 10)), "b": np.ones(5)})
    with pytest.raises(ValueError, match="share"):
        compare_items({"a": np.ones((5, 10)), "b": np.ones((5, 11))})


def test_rms_ratio_gives_the_ratio_and_a_bootstrap_interval_around_it():
    from lnbook.compare import rms_ratio

    e, t = np.array([1.0, 4.0, 9.0, 16.0]), np.array([4.0, 4.0, 4.0, 4.0])
    ratio, low, high = rms_ratio(e, t, np.random.default_rng(0), draws=500)
    assert ratio == pytest.approx(np.sqrt(7.5 / 4)) and low < ratio < high
    assert rms_ratio(t, t, np.random.default_rng(0), draws=50) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="true_sq"):
        rms_ratio(e, np.zeros(4), np.random.default_rng(0))
