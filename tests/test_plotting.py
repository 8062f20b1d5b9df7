"""lnbook.plotting: the shared figures and show_figure."""

import numpy as np
import pytest

from lnbook import plotting


@pytest.mark.parametrize("kind", ["sequence", "image"])
def test_norm_axes_figure_shades_what_each_norm_averages(kind):
    import matplotlib

    matplotlib.use("Agg")
    fig = plotting.norm_axes_figure(kind)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["BatchNorm", "LayerNorm", "InstanceNorm", "GroupNorm"]
    blue = matplotlib.colors.to_rgba(plotting.HIGHLIGHT)
    n_shaded = [sum(p.get_facecolor() == blue for p in ax.patches) for ax in fig.axes]
    # BatchNorm shades a column through every example; InstanceNorm one example of it.
    assert n_shaded[0] > n_shaded[2] > 0
    with pytest.raises(ValueError, match="kind must be"):
        plotting.norm_axes_figure("video")
    with pytest.raises(ValueError, match="norms must be"):
        plotting.norm_axes_figure(kind, ("WeightNorm",))


def test_mean_and_spread_draws_the_mean_and_the_band():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    runs = np.array([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    plotting.mean_and_spread(ax, [0, 1, 2], runs, "x")
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [2.0, 3.0, 4.0])
    assert ax.lines[0].get_label() == "x (mean of 2)" and len(ax.collections) == 1
    with pytest.raises(ValueError, match="runs must have shape"):
        plotting.mean_and_spread(ax, [0, 1], runs, "x")
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == 1.0 and band.max() == 5.0  # the min-max range
    plotting.mean_and_spread(ax, [0, 1, 2], runs, "ci", band="ci")
    band = ax.collections[1].get_paths()[0].vertices[:, 1]  # mean 4 +- t(0.975, 1) * sqrt(2) / sqrt(2)
    np.testing.assert_allclose([band.min(), band.max()], [2.0 - 12.7062047, 4.0 + 12.7062047])
    with pytest.raises(ValueError, match="band must be one of"):
        plotting.mean_and_spread(ax, [0, 1, 2], runs, "x", band="sd")
    plt.close(fig)


def test_residual_block_diagram_puts_the_norm_where_the_name_says():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = {}
    for position in ("post", "pre"):
        fig, ax = plt.subplots()
        plotting.residual_block_diagram(ax, position)
        labels = {t.get_text(): t.get_position()[1] for t in ax.texts}
        heights[position] = labels["LayerNorm"] - labels["+"]  # norm above (post) or below (pre) the sum
        plt.close(fig)
    assert heights["post"] > 0 > heights["pre"]
    with pytest.raises(ValueError, match="position must be 'post' or 'pre'"):
        plotting.residual_block_diagram(None, "middle")


def test_show_figure_displays_a_named_figure_and_closes_it(monkeypatch):
    import IPython.display
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, metadata=None: shown.append((obj, metadata)))
    fig = plotting.norm_axes_figure("sequence")
    plotting.show_figure(fig, name="norm-axes")
    assert shown == [(fig, {"scrapbook": {"name": "norm-axes"}})] and not plt.fignum_exists(fig.number)
    plotting.show_figure(plotting.norm_axes_figure("image"))
    assert shown[1][1] is None
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        plotting.show_figure(fig, name="")


def test_every_norm_of_chapter_02_has_its_own_colour():
    from lnbook import ensemble

    assert set(ensemble.NORMS) <= set(plotting.NORM_COLORS)
    assert len(set(plotting.NORM_COLORS.values())) == len(plotting.NORM_COLORS)


def test_per_step_batchnorm_is_one_time_step_of_the_pooled_set():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = plotting.NORM_SETS["sequence"]

    def cells(name):
        selected = np.zeros((4, 6, 5), dtype=bool)  # (N, C, T), the block the figure draws
        selected[sets[name]] = True
        return selected

    per_step, pooled = cells("BatchNorm, per step (RNN)"), cells("BatchNorm, pooled over time")
    np.testing.assert_array_equal(pooled, cells("BatchNorm"))  # the default panel, renamed
    assert per_step.sum() == 4 and pooled.sum() == 4 * 5  # every example at one step vs at every step
    assert (per_step & ~pooled).sum() == 0 and per_step[:, 1, 0].all()
    assert (per_step & cells("LayerNorm")).sum() == 1  # they meet in one number: example 0, feature 1, step 0
    # the credited labels draw the same two sets
    np.testing.assert_array_equal(cells("BatchNorm, per step\n(Cooijmans et al.)"), per_step)
    np.testing.assert_array_equal(cells("BatchNorm, pooled over time\n(Laurent et al.)"), pooled)
    names = ("BatchNorm, per step (RNN)", "BatchNorm, pooled over time", "LayerNorm", "InstanceNorm", "GroupNorm")
    fig = plotting.norm_axes_figure("sequence", names, ncols=3)
    assert [ax.get_title() for ax in fig.axes] == list(names)
    assert {ax.get_subplotspec().colspan.start for ax in fig.axes} == {0, 1, 2}  # three panels a row
    blue = matplotlib.colors.to_rgba(plotting.HIGHLIGHT)
    n_shaded = [sum(p.get_facecolor() == blue for p in ax.patches) for ax in fig.axes[:2]]
    assert n_shaded[0] < n_shaded[1]
    plt.close(fig)
    with pytest.raises(ValueError, match="norms must be"):
        plotting.norm_axes_figure("image", ("BatchNorm, per step (RNN)",))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="ncols must be"):
            plotting.norm_axes_figure("sequence", ncols=bad)


def test_outputs_grid_draws_one_annotated_panel_per_row_and_column():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = np.array([[0.04, -2.0], [1.0, 0.5], [0.0, 0.26]])  # (T, F) = (3, 2)
    grid = {"LN": {"x": a, "y": -a}, "BN": {"x": 2 * a, "y": 0 * a}}
    fig = plotting.outputs_grid(grid, "a finding", "output")
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 4 and len(fig.axes) == 5  # four heatmaps and the colour bar
    assert [ax.get_title() for ax in panels] == ["x", "y", "", ""]
    assert panels[0].get_ylabel() == "LN\ntime step t" and panels[2].get_ylabel() == "BN\ntime step t"
    assert [t.get_text() for t in panels[0].texts] == ["0.0", "-2.0", "1.0", "0.5", "0.0", "0.3"]
    assert panels[2].texts[1].get_text() == "-4.0" and panels[1].texts[0].get_text() == "0.0"  # not "-0.0"
    assert all(ax.images[0].get_clim() == (-4.0, 4.0) for ax in panels)  # one symmetric scale
    np.testing.assert_array_equal(panels[1].images[0].get_array(), -a)
    assert fig._suptitle.get_text() == "a finding"
    plt.close(fig)
    with pytest.raises(ValueError, match="must have the columns"):
        plotting.outputs_grid({"LN": {"x": a}, "BN": {"y": a}}, "t", "c")
    with pytest.raises(ValueError, match="2-D of one shape"):
        plotting.outputs_grid({"LN": {"x": a, "y": a[:2]}}, "t", "c")
    with pytest.raises(ValueError, match="non-empty dict"):
        plotting.outputs_grid({}, "t", "c")


def test_layernorm_circle_draws_the_kept_gradient_tangent_to_the_circle():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3)) * 2 + 1
    xhat = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    gradient = np.array([1.0, -0.3, 2.0])
    fig = plotting.layernorm_circle(x, xhat, 4, gradient)
    plane = fig.axes[2]
    arrows = {q.get_label(): np.array([q.U[0], q.V[0]]) for q in plane.collections if hasattr(q, "U")}
    kept = next(v for k, v in arrows.items() if k.startswith("what is left"))
    upstream = next(v for k, v in arrows.items() if k.startswith("upstream"))
    u, w = np.array([1, -1, 0]) / np.sqrt(2), np.array([1, 1, -2]) / np.sqrt(6)
    point = np.array([xhat[4] @ u, xhat[4] @ w])
    assert abs(kept @ point) < 1e-12 * np.linalg.norm(point)  # tangent: orthogonal to the radius
    # the in-plane upstream gradient is kept part + radial part; the part along 1 is not drawn
    np.testing.assert_allclose(upstream, [gradient @ u, gradient @ w])
    assert np.linalg.norm(kept) > 0.1 and not np.allclose(kept, upstream)
    assert any("out of the page" in t.get_text() for t in plane.texts)
    plt.close(fig)
    with pytest.raises(ValueError, match="x must have shape"):
        plotting.layernorm_circle(x[:, :2], xhat[:, :2], 0, gradient)
    with pytest.raises(ValueError, match="xhat must have"):
        plotting.layernorm_circle(x, xhat[:5], 0, gradient)
    with pytest.raises(ValueError, match="gradient must have"):
        plotting.layernorm_circle(x, xhat, 0, gradient[:2])
    with pytest.raises(ValueError, match="point must be"):
        plotting.layernorm_circle(x, xhat, 20, gradient)


def test_step_curves_draws_one_smoothed_line_per_arm_and_panel():
    rng = np.random.default_rng(0)
    runs = {"a": rng.normal(size=(30, 4)), "b": rng.normal(size=(30, 4)) + 5}
    fig = plotting.step_curves([{"runs": runs, "title": "smoothed"}, {"runs": runs, "smooth": False, "steps": slice(0, 10)}],
                               window=5, title="t")
    left, right = fig.axes
    x, y = left.lines[1].get_data()
    assert len(left.lines) == 2 and x[0] == 4 and len(x) == 26  # a 5-step mean, plotted at the window's last step
    assert np.isclose(y[0], runs["b"][:5].mean())
    assert len(right.lines[0].get_xdata()) == 10 and left.get_title() == "smoothed"
    with pytest.raises(ValueError, match="window"):
        plotting.step_curves([{"runs": runs}], window=0)
    with pytest.raises(ValueError, match="panels"):
        plotting.step_curves([])
    with pytest.raises(ValueError, match="fewer than window"):
        plotting.step_curves([{"runs": {"a": np.ones((3, 2))}}], window=5)


def test_draws_on_log_axes_draws_every_draw_and_the_geometric_mean():
    import matplotlib.pyplot as plt

    x = np.array([0.5, 1.0, 2.0])
    arms = {"a": np.array([[1.0, 10.0, 100.0], [100.0, 1000.0, 1e4]]), "b": np.full((3, 3), 2.0)}
    fig = plotting.draws_on_log_axes(x, arms, "delta", "ratio", "t")
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.lines) == 2 + 1 + 3 + 1  # per arm: one thin line per draw, then the thick mean
    np.testing.assert_allclose(ax.lines[2].get_ydata(), [10.0, 100.0, 1000.0])  # geometric, not arithmetic, mean
    assert "2 draws" in ax.lines[2].get_label()
    plt.close(fig)
    with pytest.raises(ValueError, match="positive values of shape"):
        plotting.draws_on_log_axes(x, {"a": np.zeros((2, 3))}, "d", "r", "t")
    with pytest.raises(ValueError, match="x must hold"):
        plotting.draws_on_log_axes([1.0], arms, "d", "r", "t")
    with pytest.raises(ValueError, match="arms must name"):
        plotting.draws_on_log_axes(x, {}, "d", "r", "t")


def test_times_against_bounds_draws_a_dot_bar_and_dash_per_case_and_version():
    import matplotlib.pyplot as plt

    q = {"a": [[1e-3, 2e-3, 3e-3], [2e-3, 4e-3, 5e-3]], "b": [[1e-4, 2e-4, 3e-4], [1e-4, 1e-4, 2e-4]]}
    fig = plotting.times_against_bounds(["s1", "s2"], q, {"a": [1e-3, 1e-3], "b": [5e-5, 5e-5]}, "t")
    ax = fig.axes[0]
    dashes = [line for line in ax.lines if line.get_label().endswith(": bound")]
    assert len(dashes) == 2 and np.allclose(dashes[0].get_ydata(), [1.0, 1.0])  # milliseconds
    assert ax.get_yscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["s1", "s2"]
    plt.close(fig)
    with pytest.raises(ValueError, match="bounds"):
        plotting.times_against_bounds(["s1", "s2"], q, {"a": [1e-3, 1e-3]}, "t")
    with pytest.raises(ValueError, match="increasing"):
        plotting.times_against_bounds(["s1"], {"a": [[3e-3, 2e-3, 1e-3]]}, {"a": [1e-3]}, "t")
