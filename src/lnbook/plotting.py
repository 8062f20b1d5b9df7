"""One figure style for the whole book, and the diagrams the chapters share."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from numpy.typing import ArrayLike
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Polygon

from ._checks import check_choice, describe
from .utils import interval

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "figure.figsize": (7.0, 4.0),
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
}

HIGHLIGHT = "#3b75af"  # cells that share one mean and variance
PLAIN = "#f2f2f2"

ALL = slice(None)
# The elements one mean and variance are computed over, as (batch, feature, depth) index ranges
# into a block of N examples x C features x D positions (time steps T, or pixels H*W), drawn
# for example 0 and feature (or group) 1. On a sequence, LayerNorm normalizes each token over
# its features alone; on an image it normalizes each example over channels and pixels.
NORM_SETS = {
    "sequence": {
        "BatchNorm": (ALL, slice(1, 2), ALL),
        "LayerNorm": (slice(0, 1), ALL, slice(0, 1)),
        "InstanceNorm": (slice(0, 1), slice(1, 2), ALL),
        "GroupNorm": (slice(0, 1), slice(2, 4), ALL),
        # The two BatchNorms of a sequence, named for the landing figure: a recurrent network sees
        # one step at a time, so its BatchNorm pools the batch at that step only (Cooijmans et
        # al.'s per-step statistics); a layer that sees the whole (N, C, L) block at once, like
        # torch.nn.BatchNorm1d, pools the batch and every step ("BatchNorm" above, renamed).
        "BatchNorm, per step (RNN)": (ALL, slice(1, 2), slice(0, 1)),
        "BatchNorm, pooled over time": (ALL, slice(1, 2), ALL),
        # The same two sets credited to their sources: per step as Cooijmans et al. keep it, and
        # pooled over the batch and time ("sequence-wise") as Laurent et al. and Deep Speech 2
        # apply it inside recurrent networks, so neither label reads as the only RNN form.
        "BatchNorm, per step\n(Cooijmans et al.)": (ALL, slice(1, 2), slice(0, 1)),
        "BatchNorm, pooled over time\n(Laurent et al.)": (ALL, slice(1, 2), ALL),
    },
    "image": {
        "BatchNorm": (ALL, slice(1, 2), ALL),
        "LayerNorm": (slice(0, 1), ALL, ALL),
        "InstanceNorm": (slice(0, 1), slice(1, 2), ALL),
        "GroupNorm": (slice(0, 1), slice(2, 4), ALL),
    },
}


NORM_COLORS = {"none": "C0", "batch_per_step": "C1", "layer": "C2", "batch": "C3", "batch_unmasked": "C4"}
"""One colour per norm, so that a norm looks the same in every figure of a chapter."""


def use_style() -> None:
    """Apply the book's matplotlib style (call once per notebook)."""
    mpl.rcParams.update(STYLE)


def show_figure(fig: Figure, name: str | None = None) -> None:
    """Display ``fig`` as a notebook output and close it. With a ``name``, the output is
    labelled so that another page of the book can show the same figure (myst-nb's
    ``{glue}`` directive finds it by that name)."""
    from IPython.display import display

    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be a non-empty string or None, got {describe(name)}")
    display(fig, metadata={"scrapbook": {"name": name}} if name else None)
    plt.close(fig)


def _block(ax: Axes, selected: np.ndarray, depth_label: str, title: str) -> None:
    """Draw an (N, C, D) block in oblique projection, shading the ``selected`` cells."""
    n, c, d = selected.shape
    dx, dy = 0.45, 0.35  # how far one step in depth moves a point right and up

    def cell(corners, on: bool) -> None:
        ax.add_patch(Polygon(corners, closed=True, facecolor=HIGHLIGHT if on else PLAIN, edgecolor="0.35", lw=0.7))

    for i in range(n):  # front face: features across, examples down, depth 0
        for j in range(c):
            y0 = n - 1 - i
            cell([(j, y0), (j + 1, y0), (j + 1, y0 + 1), (j, y0 + 1)], selected[i, j, 0])
    for k in range(d):  # top face: example 0
        for j in range(c):
            cell([(j + k * dx, n + k * dy), (j + 1 + k * dx, n + k * dy),
                  (j + 1 + (k + 1) * dx, n + (k + 1) * dy), (j + (k + 1) * dx, n + (k + 1) * dy)],
                 selected[0, j, k])
    for k in range(d):  # right face: the last feature
        for i in range(n):
            y0 = n - 1 - i
            cell([(c + k * dx, y0 + k * dy), (c + (k + 1) * dx, y0 + (k + 1) * dy),
                  (c + (k + 1) * dx, y0 + 1 + (k + 1) * dy), (c + k * dx, y0 + 1 + k * dy)],
                 selected[i, c - 1, k])
    ax.annotate("", xy=(-0.4, 0), xytext=(-0.4, n), arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax.text(-0.6, n / 2, "batch N", rotation=90, ha="right", va="center")
    ax.annotate("", xy=(c, -0.4), xytext=(0, -0.4), arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax.text(c / 2, -0.6, "features C", ha="center", va="top")
    ax.text(c + d * dx + 0.15, n + d * dy / 2 - 0.3, depth_label, ha="left", va="center", rotation=37)
    ax.set_title(title)
    ax.set_xlim(-1.6, c + d * dx + 1.6)
    ax.set_ylim(-1.6, n + d * dy + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")


def norm_axes_figure(
    kind: str = "sequence",
    norms: tuple[str, ...] = ("BatchNorm", "LayerNorm", "InstanceNorm", "GroupNorm"),
    ncols: int | None = None,
) -> Figure:
    """Which elements one mean and variance are computed over, for each norm in ``norms``.

    Args:
        kind: ``"sequence"`` for an ``(N, T, C)`` batch (depth = time steps T) or ``"image"`` for
            an ``(N, C, H, W)`` batch (depth = pixels H·W).
        norms: any of ``BatchNorm``, ``LayerNorm``, ``InstanceNorm``, ``GroupNorm``; for a
            sequence also ``"BatchNorm, per step (RNN)"`` (the batch at one time step) and
            ``"BatchNorm, pooled over time"`` (the same set as ``BatchNorm``), or the same two
            credited to their sources, ``"BatchNorm, per step\\n(Cooijmans et al.)"`` and
            ``"BatchNorm, pooled over time\\n(Laurent et al.)"``. Each panel is titled with its name.
        ncols: panels per row; ``None`` puts at most two in a row.
    """
    depth = {"sequence": "time T", "image": "pixels H·W"}
    if kind not in depth:
        raise ValueError(f"kind must be 'sequence' or 'image', got {describe(kind)}")
    sets = NORM_SETS[kind]
    if not norms or any(name not in sets for name in norms):
        raise ValueError(f"norms must be a non-empty tuple drawn from {tuple(sets)}, got {describe(norms)}")
    if ncols is None:
        ncols = min(len(norms), 2)
    elif isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be a positive int or None, got {describe(ncols)}")
    ncols = min(ncols, len(norms))
    nrows = -(-len(norms) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.5 * ncols, 2.6 * nrows), squeeze=False)
    for ax in axes.flat[len(norms) :]:
        ax.remove()
    for ax, name in zip(axes.flat, norms):
        selected = np.zeros((4, 6, 5), dtype=bool)
        selected[sets[name]] = True
        _block(ax, selected, depth[kind], name)
    fig.suptitle("Blue cells share one mean and variance", y=0.98)
    fig.tight_layout()
    return fig


def mean_and_spread(ax: Axes, x: ArrayLike, runs: ArrayLike, label: str, band: str = "range", **kwargs) -> None:
    """Plot the mean over runs as a line and a band: the min-max spread (``band="range"``) or
    the 95% confidence interval of the mean (``band="ci"``, :func:`lnbook.utils.interval`).

    ``runs`` is ``(n_runs, len(x))``, one row per seed; ``kwargs`` go to the line.
    """
    check_choice(band, ("range", "ci"), "band")
    runs = np.asarray(runs, dtype=float)
    x = np.asarray(x, dtype=float)
    if runs.ndim != 2 or runs.shape[1] != len(x):
        raise ValueError(f"runs must have shape (n_runs, {len(x)}), got {runs.shape}")
    (line,) = ax.plot(x, runs.mean(0), label=f"{label} (mean of {len(runs)})", **kwargs)
    if band == "range":
        low, high = runs.min(0), runs.max(0)
    else:
        low, high = np.array([interval(col)[1:] for col in runs.T]).T
    ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, lw=0)


def residual_block_diagram(ax: Axes, position: str) -> None:
    """Draw one Transformer sublayer with its residual path, Post-LN or Pre-LN, bottom to top.

    ``position``: ``"post"`` (``x -> x + f(x) -> norm``) or ``"pre"`` (``x -> x + f(norm(x))``).
    In Pre-LN the residual path from input to output passes through no norm.
    """
    if position not in ("post", "pre"):
        raise ValueError(f"position must be 'post' or 'pre', got {describe(position)}")
    ax.set(xlim=(0, 4), ylim=(0, 10.8), aspect="equal")
    ax.axis("off")

    def box(y: float, text: str, color: str, x: float = 2.0) -> None:
        ax.add_patch(mpl.patches.FancyBboxPatch((x - 0.9, y - 0.4), 1.8, 0.8, boxstyle="round,pad=0.05", fc=color, ec="0.3"))
        ax.text(x, y, text, ha="center", va="center", fontsize=9)

    def arrow(y0: float, y1: float, x0: float = 2.0, x1: float = 2.0) -> None:
        ax.annotate("", (x1, y1), (x0, y0), arrowprops={"arrowstyle": "->", "color": "0.3"})

    norm_color, f_color = "#f3c98b", "#cfe2f3"
    ax.text(2, 0.3, "x", ha="center", fontsize=10)
    if position == "post":
        box(3.5, "attention\nor MLP", f_color)
        ax.text(2, 5.6, "+", ha="center", va="center", fontsize=14)
        box(7.3, "LayerNorm", norm_color)
        arrow(0.7, 3.0), arrow(4.0, 5.3), arrow(5.9, 6.8), arrow(7.8, 9.5)
        ax.plot([2, 3.5, 3.5], [1.5, 1.5, 5.6], color="0.3", lw=1)
        arrow(5.6, 5.6, 3.5, 2.25)
        ax.set_title("Post-LN: norm(x + f(x))", fontsize=10)
    else:
        box(3.0, "LayerNorm", norm_color)
        box(5.3, "attention\nor MLP", f_color)
        ax.text(2, 7.4, "+", ha="center", va="center", fontsize=14)
        arrow(0.7, 2.5), arrow(3.5, 4.8), arrow(5.8, 7.1), arrow(7.7, 9.5)
        ax.plot([2, 3.5, 3.5], [1.5, 1.5, 7.4], color="0.3", lw=1)
        arrow(7.4, 7.4, 3.5, 2.25)
        ax.set_title("Pre-LN: x + f(norm(x))", fontsize=10)
    ax.text(2, 9.7, "out", ha="center", fontsize=10)


def outputs_grid(
    grid: dict[str, dict[str, ArrayLike]],
    title: str,
    colorbar_label: str,
    xlabel: str = "feature",
    ylabel: str = "time step t",
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """A grid of annotated heatmaps: one row per entry of ``grid``, one column per entry of
    each row (every row must name the same columns, in the same order).

    Each value is a 2-D array, for example ``(T, F)``: one sequence's normalized outputs, time
    steps down and features across; every array must have the same shape. All panels share one
    colour scale, symmetric about 0, and each cell is labelled with its value to one decimal.
    Row names label the first column's y axes, column names title the first row.
    """
    if not isinstance(grid, dict) or not grid or not all(isinstance(row, dict) and row for row in grid.values()):
        raise ValueError(f"grid must be a non-empty dict of non-empty dicts of 2-D arrays, got {describe(grid)}")
    columns = list(next(iter(grid.values())))
    arrays = {}
    for row, panels in grid.items():
        if list(panels) != columns:
            raise ValueError(f"grid[{row!r}] must have the columns {columns}, got {list(panels)}")
        for col, values in panels.items():
            arrays[row, col] = np.asarray(values, dtype=float)
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"grid's arrays must all be 2-D of one shape, got shapes {sorted(shapes)}")
    n_steps, n_features = next(iter(shapes))
    top = max(float(np.abs(a).max()) for a in arrays.values()) or 1.0
    if figsize is None:
        figsize = (2.3 * len(columns) + 0.6, 2.5 * len(grid))
    fig, axes = plt.subplots(len(grid), len(columns), figsize=figsize, sharex=True, sharey=True, squeeze=False, layout="constrained")
    for i, row in enumerate(grid):
        for j, col in enumerate(columns):
            ax, values = axes[i, j], arrays[row, col]
            image = ax.imshow(values, cmap="RdBu_r", vmin=-top, vmax=top)
            for (t, f), v in np.ndenumerate(values.round(1) + 0.0):
                ax.text(f, t, f"{v:.1f}", ha="center", va="center", fontsize=7)
            if i == 0:
                ax.set_title(col, fontsize=9)
            ax.grid(False)
            ax.set_xticks(range(n_features))
            ax.set_yticks(range(n_steps))
        axes[i, 0].set_ylabel(f"{row}\n{ylabel}")
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    fig.colorbar(image, ax=axes, shrink=0.8, label=colorbar_label)
    fig.suptitle(title)
    return fig


def _plane_basis() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit vectors for H = 3: ``one`` = (1, 1, 1)/sqrt(3), and ``u``, ``w``, an orthonormal basis of
    the plane sum(v) = 0 orthogonal to it."""
    one = np.ones(3) / np.sqrt(3)
    u = np.array([1.0, -1.0, 0.0]) / np.sqrt(2)
    w = np.array([1.0, 1.0, -2.0]) / np.sqrt(6)
    return one, u, w


def layernorm_circle(x: ArrayLike, xhat: ArrayLike, point: int, gradient: ArrayLike) -> Figure:
    """LayerNorm with H = 3 drawn on its circle, in three panels.

    Left (3-D): the raw inputs ``x`` ``(N, 3)`` and their normalized images ``xhat`` ``(N, 3)``
    (one colour per input, by its angle on the circle), the circle sum = 0, norm = sqrt(3), and
    the direction 1 that the mean removes. Middle (3-D): at the image ``xhat[point]``, the upstream
    ``gradient`` ``(3,)`` split into its part along 1, its part along ``xhat[point]`` (both removed
    by the backward pass) and what is left, the part tangent to the circle. Right (2-D): the same
    split seen in the plane sum = 0 itself (coordinates along ``u`` = (1, -1, 0)/sqrt(2) and
    ``w`` = (1, 1, -2)/sqrt(6)), where the part along 1 points out of the page and is printed
    instead of drawn. ``xhat`` should be normalized with a tiny eps, so that it lies on the circle.
    """
    x, xhat, gradient = (np.asarray(a, dtype=float) for a in (x, xhat, gradient))
    if x.ndim != 2 or x.shape[1] != 3 or len(x) == 0:
        raise ValueError(f"x must have shape (N, 3) with N >= 1, got {x.shape}")
    if xhat.shape != x.shape:
        raise ValueError(f"xhat must have the shape of x, {x.shape}, got {xhat.shape}")
    if gradient.shape != (3,):
        raise ValueError(f"gradient must have shape (3,), got {gradient.shape}")
    if isinstance(point, bool) or not isinstance(point, (int, np.integer)) or not 0 <= point < len(x):
        raise ValueError(f"point must be an int in [0, {len(x)}), got {describe(point)}")
    one, u, w = _plane_basis()
    t = np.linspace(0, 2 * np.pi, 200)
    circle = np.sqrt(3) * (np.outer(np.cos(t), u) + np.outer(np.sin(t), w))
    angle = np.arctan2(xhat @ w, xhat @ u)  # where each input lands on the circle, as a colour
    p = xhat[point]
    e = p / np.linalg.norm(p)
    parts = {  # the upstream gradient split three ways: along 1, along xhat, and what is left
        "one": (gradient @ one) * one,
        "xhat": (gradient @ e) * e,
    }
    parts["kept"] = gradient - parts["one"] - parts["xhat"]
    styles = [
        ("gradient", gradient, "C1", "-", r"upstream gradient $\hat{g}$"),
        ("one", parts["one"], "C3", "--", r"its part along $\mathbf{1}$: removed"),
        ("xhat", parts["xhat"], "C4", "--", r"its part along $\hat{x}$: removed"),
        ("kept", parts["kept"], "C2", "-", r"what is left (times r: $\partial L/\partial x$)"),
    ]

    fig = plt.figure(figsize=(15, 5.0))
    ax = fig.add_subplot(1, 3, 1, projection="3d")
    ax.scatter(*x.T, s=5, c=angle, cmap="twilight", alpha=0.6, label=f"{len(x)} raw inputs x")
    ax.scatter(*xhat.T, s=12, c=angle, cmap="twilight", marker="D", label=r"their images $\hat{x}$ (same colour)")
    ax.plot(*circle.T, "k-", lw=1, label=r"circle: $\sum_i \hat{x}_i = 0$, $\|\hat{x}\| = \sqrt{3}$")
    ax.plot(*np.outer([-5, 5], one).T, "C3--", lw=1, label=r"the direction $\mathbf{1}$ (the mean, removed)")
    ax.set(title="forward: raw inputs anywhere,\nimages on one circle", xlim=(-5, 5), ylim=(-5, 5), zlim=(-5, 5))

    ax3 = fig.add_subplot(1, 3, 2, projection="3d")
    rr, tt = np.meshgrid([0, 2.4], t)
    disk = rr[..., None] * (np.cos(tt)[..., None] * u + np.sin(tt)[..., None] * w)
    ax3.plot_surface(*disk.transpose(2, 0, 1), color="C0", alpha=0.08, linewidth=0)
    ax3.plot(*circle.T, "k-", lw=1)
    ax3.scatter(*p, color="k", s=25, label=r"a normalized point $\hat{x}$")
    for _, vec, colour, style, label in styles:
        ax3.quiver(*p, *vec, color=colour, linestyle=style, arrow_length_ratio=0.15, lw=2, label=label)
    ax3.set(title="backward, in 3-D: only the part\nalong the circle survives", xlim=(-2.5, 2.5), ylim=(-2.5, 2.5),
            zlim=(-2.5, 2.5), xticks=[-2, 0, 2], yticks=[-2, 0, 2], zticks=[-2, 0, 2])
    for a in (ax, ax3):
        a.set(xlabel="unit 1", ylabel="unit 2", zlabel="unit 3")
        a.view_init(elev=12, azim=-5)  # 50 degrees off the plane's normal (1, 1, 1): circle and normal both visible
        a.legend(loc="upper left", fontsize=7)

    ax2 = fig.add_subplot(1, 3, 3)
    to_plane = lambda v: np.array([v @ u, v @ w])  # noqa: E731 -- coordinates in the plane sum(v) = 0
    ax2.plot(*(circle @ np.stack([u, w]).T).T, "k-", lw=1, label=r"the circle of $\hat{x}$")
    p2 = to_plane(p)
    ax2.plot(*p2, "ko", ms=5)
    ax2.plot(*np.outer([0, 1.25], p2).T, "k:", lw=0.8)  # the ray through xhat: the direction the length changes along
    for name, vec, colour, style, label in styles:
        if name == "one":
            continue  # out of the page: printed, not drawn
        v2 = to_plane(vec)
        ax2.quiver(*p2, *v2, color=colour, angles="xy", scale_units="xy", scale=1, width=0.008, label=label,
                   linestyle=style)
    ax2.text(0.02, 0.02, f"part along $\\mathbf{{1}}$ (out of the page, removed): {gradient @ one:+.2f}",
             transform=ax2.transAxes, fontsize=8, color="C3")
    ax2.set(xlabel=r"coordinate along $u = (1, -1, 0)/\sqrt{2}$", ylabel=r"coordinate along $w = (1, 1, -2)/\sqrt{6}$",
            title="backward, seen in the circle's plane:\nthe kept part is tangent to the circle", aspect="equal",
            xlim=(-3.2, 3.2), ylim=(-3.2, 3.2))
    ax2.legend(loc="upper left", fontsize=7)
    fig.suptitle("LayerNorm with H = 3 maps every input onto one circle, and its backward pass keeps only "
                 "the gradient's part along that circle")
    fig.tight_layout(rect=(0, 0, 1, 0.95))  # room for the suptitle
    return fig


def step_curves(
    panels: list[dict],
    window: int = 10,
    colours: tuple[str, ...] = ("C0", "C1", "C2", "C3", "C4"),
    title: str | None = None,
    width: float = 4.3,
) -> Figure:
    """One panel per training quantity, one line per arm: the mean over runs of a ``window``-step
    moving average, with its 95% interval as a band (:func:`mean_and_spread`).

    Each panel is a dict with ``"runs"``, arm name -> ``(steps, n_runs)`` values per step (the
    first arm gets the first colour, and so on); ``"smooth"`` (default True) to average over
    ``window`` steps, plotted at the window's last step; ``"steps"``, a slice of the steps to
    show (default all); and anything else for ``Axes.set`` (``title``, ``xlabel``, ``ylabel``, ``ylim``).
    """
    if not panels or not all(isinstance(p, dict) and p.get("runs") for p in panels):
        raise ValueError("panels must be a non-empty list of dicts, each with a non-empty 'runs' mapping")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {describe(window)}")
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.6), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        options = {k: v for k, v in panel.items() if k not in ("runs", "smooth", "steps")}
        for (arm, values), colour in zip(panel["runs"].items(), colours):
            values = np.asarray(values, dtype=float)
            if values.ndim != 2:
                raise ValueError(f"runs[{arm!r}] must have shape (steps, n_runs), got {values.shape}")
            steps = np.arange(len(values))[panel.get("steps", slice(None))]
            values = values[steps]
            if panel.get("smooth", True):
                if len(values) < window:
                    raise ValueError(f"runs[{arm!r}] has {len(values)} steps, fewer than window = {window}")
                values = np.array([np.convolve(v, np.ones(window) / window, mode="valid") for v in values.T]).T
                steps = steps[window - 1:]
            mean_and_spread(ax, steps, values.T, arm, band="ci", color=colour)
        ax.set(**options)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draws_on_log_axes(
    x: ArrayLike,
    arms: dict[str, ArrayLike],
    xlabel: str,
    ylabel: str,
    title: str,
    colours: tuple[str, ...] = ("C0", "C1", "C2", "C3", "C4"),
) -> Figure:
    """One panel, both axes logarithmic: for each arm, a thin line per random draw and a thick
    line through the geometric mean over the draws, labelled with the number of draws.

    ``arms`` maps an arm's name to positive values ``(n_draws, len(x))`` (the first arm gets the
    first colour, and so on); ``x`` holds positive values ``(n,)``.
    """
    x = np.asarray(x, dtype=float)
    if x.ndim != 1 or len(x) < 2 or np.any(x <= 0):
        raise ValueError(f"x must hold at least 2 positive values in one dimension, got {describe(x)}")
    if not arms or len(arms) > len(colours):
        raise ValueError(f"arms must name 1 to {len(colours)} arms (one colour each), got {len(arms)}")
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for (arm, values), colour in zip(arms.items(), colours):
        values = np.asarray(values, dtype=float)
        if values.ndim != 2 or values.shape[1] != len(x) or not np.all(values > 0):
            raise ValueError(f"arms[{arm!r}] must hold positive values of shape (n_draws, {len(x)}), got {describe(values)}")
        for row in values:
            ax.plot(x, row, color=colour, lw=0.6, alpha=0.4)
        ax.plot(x, np.exp(np.log(values).mean(0)), color=colour, lw=2, marker="o", ms=4,
                label=f"{arm} (geometric mean of {len(values)} draws; thin: each draw)")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def times_against_bounds(
    labels: list[str],
    quartiles: dict[str, ArrayLike],
    bounds: dict[str, ArrayLike],
    title: str,
    colours: tuple[str, ...] = ("C0", "C1", "C2", "C3", "C4"),
) -> Figure:
    """Measured times against a lower bound, one column per case on a log axis: for each
    version a dot at the median with bars to the quartiles, and a dash at its bound.

    ``quartiles`` maps a version to seconds ``(len(labels), 3)`` (first quartile, median, third
    quartile); ``bounds`` maps the same versions to seconds ``(len(labels),)``; both are drawn
    in milliseconds, the versions side by side within each case.
    """
    if not labels or not quartiles or set(bounds) != set(quartiles) or len(quartiles) > len(colours):
        raise ValueError(f"labels and quartiles must be non-empty, bounds must have the keys of quartiles "
                         f"{sorted(quartiles)}, and at most {len(colours)} versions; got bounds {sorted(bounds)}")
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.6 / len(quartiles)
    for j, ((name, q), colour) in enumerate(zip(quartiles.items(), colours)):
        q, b = np.asarray(q, dtype=float) * 1e3, np.asarray(bounds[name], dtype=float) * 1e3
        if q.shape != (len(labels), 3) or b.shape != (len(labels),) or np.any(q <= 0) or np.any(b <= 0):
            raise ValueError(f"{name!r}: quartiles must be positive ({len(labels)}, 3) and bounds positive "
                             f"({len(labels)},), got {q.shape} and {b.shape}")
        if np.any(np.diff(q, axis=1) < 0):
            raise ValueError(f"{name!r}: each row of quartiles must be (q1, median, q3) in increasing order")
        x = np.arange(len(labels)) + (j - (len(quartiles) - 1) / 2) * width
        ax.errorbar(x, q[:, 1], yerr=[q[:, 1] - q[:, 0], q[:, 2] - q[:, 1]], fmt="o", color=colour, capsize=3,
                    label=f"{name}: median and quartiles")
        ax.plot(x, b, "_", color=colour, ms=14, mew=2, label=f"{name}: bound")
    ax.set(xticks=range(len(labels)), xticklabels=labels, yscale="log", ylabel="ms", title=title,
           xlim=(-0.6, len(labels) - 0.4))
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
