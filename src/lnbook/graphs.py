"""Graphs of different sizes as PyTorch Geometric data, and a message-passing network whose norm
is one of PyG's (chapter 09).

A batch of graphs is PyG's :class:`~torch_geometric.data.Batch`: the nodes of all its graphs
stacked into one ``x (N, F)``, the edges of all of them in ``edge_index (2, E)``, and
``batch (N,)``, the graph each node belongs to. Nothing is padded; message passing is sparse.
The norms, named by what one mean and variance are taken over (:data:`NORMS`):

- ``"none"``;
- ``"batch"``: PyG's ``BatchNorm``, each feature over every node of every graph in the batch,
  so large graphs weigh most and a graph's output depends on its batch-mates in training;
- ``"layer_node"``: PyG's ``LayerNorm(mode="node")``, each node over its own features (the
  book's LayerNorm);
- ``"layer_graph"``: PyG's ``LayerNorm(mode="graph")``, each graph over all its nodes and
  features together;
- ``"instance"``: PyG's ``InstanceNorm`` (with a gain and a bias, ``affine=True``), each
  feature over the nodes of its own graph: the norm Cai et al. found faster than BatchNorm
  and LayerNorm, and which GraphNorm modifies;
- ``"graph"``: PyG's ``GraphNorm`` (Cai et al., 2021), each feature over the nodes of its own
  graph, after subtracting a learned share ``alpha`` of that graph's mean; its scale is the
  root mean square of the shifted features, ``sqrt(mean((h - alpha * mean)**2))``.

:class:`GraphNet` puts the norm on a residual branch (``"residual"``) or, as Cai et al.'s
GIN and GCN do, on the main path (``"main"``). :func:`degree_lookup` is the baseline a
network must beat: it sees only degrees. :func:`relative_mse` puts MSEs of test sets with
different spreads on one scale.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from ._checks import check_choice, check_positive_int, describe
from .progress import progress
from .train import evaluating, optimizer_step, prepare, warmup_cosine

if TYPE_CHECKING:
    from torch_geometric.data import Batch, Data

# PyG is imported where it is used: importing it takes seconds, and `import lnbook` should not.

NORMS = ("none", "batch", "layer_node", "layer_graph", "instance", "graph")
PLACEMENTS = ("residual", "main")


def on_triangle(adj: torch.Tensor) -> torch.Tensor:
    """``(n,)`` bool: whether each node of the dense 0/1 adjacency ``adj (n, n)`` lies on a
    triangle (two of its neighbours are adjacent)."""
    return ((adj @ adj) * adj).sum(1) > 0


def random_graphs(
    n_graphs: int, min_nodes: int, max_nodes: int, seed: int, mean_degree: tuple[float, float] = (1.0, 6.0)
) -> list[Data]:
    """Random geometric graphs whose target ``y`` (shape ``(1,)``) is the fraction of nodes that
    lie on a triangle, as PyG ``Data``.

    Each graph draws its size ``n`` uniformly from ``min_nodes..max_nodes`` and a mean degree
    ``d`` uniformly from ``mean_degree``, places ``n`` points uniformly in the unit square and
    joins two points closer than ``r``, with ``pi r^2 (n - 1) = d`` (nodes near the border
    have fewer neighbours, so the realized mean degree is a little below ``d``). ``x (n, 2)``
    holds a constant 1 and the node's degree; ``edge_index (2, E)`` lists each undirected edge
    both ways; ``triangle (n,)`` says which nodes lie on a triangle. The same arguments give
    the same graphs.

    Why this task: the target depends on how the edges are wired, not on the graph's size,
    and it spreads widely because ``d`` varies. In a geometric graph triangles are local, so
    the same rule links degrees to triangles in a graph of 10 nodes and of 200, and a model
    can be tested on sizes it never saw. A mean-aggregation network sees degrees, not
    triangles, so it learns the strong link between the two.
    """
    from torch_geometric.data import Data

    check_positive_int(n_graphs, "n_graphs")
    if not (isinstance(min_nodes, int) and isinstance(max_nodes, int) and 3 <= min_nodes <= max_nodes):
        raise ValueError(f"need integers 3 <= min_nodes <= max_nodes, got {describe(min_nodes)}, {describe(max_nodes)}")
    if not (
        isinstance(mean_degree, tuple)
        and len(mean_degree) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in mean_degree)
        and 0 < mean_degree[0] <= mean_degree[1] < math.inf
    ):
        raise ValueError(f"mean_degree must be a range (lo, hi) of numbers with 0 < lo <= hi, got {describe(mean_degree)}")
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(n_graphs):
        n = int(rng.integers(min_nodes, max_nodes + 1))
        radius = math.sqrt(rng.uniform(*mean_degree) / (math.pi * (n - 1)))
        points = rng.random((n, 2))
        close = ((points[:, None] - points[None]) ** 2).sum(-1) < radius**2
        adj = torch.from_numpy(close & ~np.eye(n, dtype=bool)).float()
        triangle = on_triangle(adj)
        x = torch.stack([torch.ones(n), adj.sum(1)], dim=1)
        graphs.append(Data(x=x, edge_index=adj.nonzero().T.contiguous(), y=triangle.float().mean().reshape(1),
                           triangle=triangle))
    return graphs


def sizes(graphs: Sequence[Data]) -> torch.Tensor:
    """Nodes per graph, ``(len(graphs),)`` int64."""
    return torch.tensor([g.num_nodes for g in graphs], dtype=torch.int64)


def targets(graphs: Sequence[Data]) -> torch.Tensor:
    """The graphs' targets, ``(len(graphs),)``."""
    return torch.cat([g.y for g in graphs])


def degree_lookup(train: Sequence[Data]) -> Callable[[Data], torch.Tensor]:
    """A baseline that sees only degrees: for each degree, the fraction of the nodes of
    ``train`` with that degree that lie on a triangle. Returns ``predict(graph)``, a float64
    scalar tensor: the mean of that fraction over the graph's nodes (a degree larger than any
    in ``train`` counts as the largest seen). A mean-aggregation network sees degrees, so it
    must beat this to have learned anything about the wiring."""
    train = _check_graphs(train, "train")
    degree = torch.cat([g.x[:, 1] for g in train]).long()
    on = torch.cat([g.triangle for g in train]).double()
    rate = torch.bincount(degree, weights=on) / torch.bincount(degree).clamp_min(1)
    return lambda g: rate[g.x[:, 1].long().clamp_max(len(rate) - 1)].mean()


def baseline_mse(predict: Callable[[Data], torch.Tensor | float], test: Sequence[Data]) -> float:
    """Mean squared error over ``test`` of a baseline ``predict(graph) -> scalar`` (a graph's
    prediction), in float64: e.g. :func:`degree_lookup`'s, or ``lambda g: mean`` for the
    training mean."""
    if not callable(predict):
        raise TypeError(f"predict must be a function of one graph, got {describe(predict)}")
    test = _check_graphs(test, "test")
    guess = torch.stack([torch.as_tensor(predict(g), dtype=torch.float64).reshape(()) for g in test])
    return float(((guess - targets(test).double()) ** 2).mean())


def target_variance(graphs: Sequence[Data]) -> float:
    """The variance of the graphs' targets (over graphs, ``correction=0``): the MSE of
    predicting each test set's own mean, the scale on which test sets of different spread
    compare."""
    return float(targets(_check_graphs(graphs, "graphs")).double().var(correction=0))


def relative_mse(values: Sequence[float] | np.ndarray, reference: float) -> np.ndarray:
    """``values / reference``, per seed ``(n,)``: test MSEs on the scale of a reference MSE on
    the same test set (:func:`baseline_mse` of :func:`degree_lookup`, or
    :func:`target_variance`), so that test sets whose targets spread differently compare.
    Below 1 against the lookup: the network beats it."""
    if not isinstance(reference, (int, float)) or isinstance(reference, bool) or not 0 < reference < math.inf:
        raise ValueError(f"reference must be a positive finite MSE, got {describe(reference)}")
    out = np.asarray(values, dtype=float)
    if out.ndim != 1 or not len(out):
        raise ValueError(f"values must be a non-empty sequence of per-seed MSEs, got {describe(values)}")
    return out / reference


def make_norm(kind: str, size: int) -> nn.Module:
    """PyG's module for the norm ``kind`` of :data:`NORMS` over ``size`` features."""
    from torch_geometric.nn import BatchNorm, GraphNorm, InstanceNorm, LayerNorm

    check_choice(kind, NORMS, "norm")
    check_positive_int(size, "size")
    return {
        "none": lambda: nn.Identity(),
        "batch": lambda: BatchNorm(size),
        "layer_node": lambda: LayerNorm(size, mode="node"),
        "layer_graph": lambda: LayerNorm(size, mode="graph"),
        "instance": lambda: InstanceNorm(size, affine=True),
        "graph": lambda: GraphNorm(size),
    }[kind]()


def apply_norm(norm: nn.Module, h: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
    """``norm(h)``, handing the per-graph norms (LayerNorm, InstanceNorm, GraphNorm) the graph of each node."""
    from torch_geometric.nn import GraphNorm, InstanceNorm, LayerNorm

    if isinstance(norm, (LayerNorm, InstanceNorm, GraphNorm)):
        return norm(h, batch, num_graphs)
    return norm(h)


class GraphNet(nn.Module):
    """A message-passing regressor: one number per graph.

    ``Linear(in_features, hidden)``, then ``layers`` rounds of message passing (PyG's
    ``SAGEConv`` with mean aggregation: ``W_1 h_i + W_2 mean_{j in N(i)} h_j``, sparse), then
    the mean over each graph's nodes and ``Linear(hidden, 1)``. ``placement``: ``"residual"``,
    each round ``h + relu(norm(SAGEConv(h)))``, the norm on a branch, so the readout sees an
    un-normalized stream; ``"main"``, each round ``relu(norm(SAGEConv(h)))``, the norm on the
    main path as in Cai et al.'s GIN and GCN. Call it on a PyG ``Batch``; output
    ``(num_graphs,)``. Only ``"batch"`` in training mode makes a graph's output depend on the
    other graphs of its batch.
    """

    NORMS = NORMS

    def __init__(self, in_features: int, hidden: int, layers: int, norm: str = "none",
                 placement: str = "residual") -> None:
        from torch_geometric.nn import SAGEConv

        super().__init__()
        for value, name in ((in_features, "in_features"), (hidden, "hidden"), (layers, "layers")):
            check_positive_int(value, name)
        self.norm = check_choice(norm, NORMS, "norm")
        self.placement = check_choice(placement, PLACEMENTS, "placement")
        self.embed = nn.Linear(in_features, hidden)
        self.convs = nn.ModuleList(SAGEConv(hidden, hidden, aggr="mean") for _ in range(layers))
        self.norms = nn.ModuleList(make_norm(norm, hidden) for _ in range(layers))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, data: Batch) -> torch.Tensor:
        from torch_geometric.data import Batch
        from torch_geometric.nn import global_mean_pool

        if not isinstance(data, Batch):
            raise TypeError(f"data must be a torch_geometric Batch (Batch.from_data_list), got {type(data).__name__}")
        h = self.embed(data.x)
        for conv, norm in zip(self.convs, self.norms):
            branch = torch.relu(apply_norm(norm, conv(h, data.edge_index), data.batch, data.num_graphs))
            h = h + branch if self.placement == "residual" else branch
        return self.readout(global_mean_pool(h, data.batch, data.num_graphs)).squeeze(-1)


@dataclass
class RegressionHistory:
    """What :func:`fit_graphs` measured: the MSE of every optimizer step (training mode);
    after each epoch, the mean of that epoch's step losses (``train_loss``), the test MSE in
    eval mode (``test_loss``) and the seconds of training so far (``wall_time``)."""

    step_loss: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    test_loss: list[float] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    steps_per_epoch: int = 0


def _check_graphs(data: object, name: str) -> list[Data]:
    from torch_geometric.data import Data

    if not isinstance(data, (list, tuple)) or not data or not all(isinstance(g, Data) for g in data):
        raise TypeError(f"{name} must be a non-empty list of torch_geometric Data (see random_graphs), got {describe(data)}")
    return list(data)


def predict(model: nn.Module, graphs: Sequence[Data], batch_size: int = 64) -> torch.Tensor:
    """The model's predictions in eval mode, ``(len(graphs),)``, in batches of ``batch_size`` graphs."""
    from torch_geometric.data import Batch

    graphs = _check_graphs(graphs, "graphs")
    with evaluating(model) as device:
        return torch.cat([model(Batch.from_data_list(graphs[i : i + batch_size]).to(device)).cpu()
                          for i in range(0, len(graphs), batch_size)])


def mse(model: nn.Module, graphs: Sequence[Data], batch_size: int = 64) -> float:
    """Mean squared error of ``model`` (in eval mode) on ``graphs``."""
    return float(((predict(model, graphs, batch_size) - targets(graphs)) ** 2).mean())


def fit_graphs(
    model: nn.Module, train: Sequence[Data], test: Sequence[Data], *, epochs: int, lr: float, batch_size: int, seed: int,
    decay: bool = False,
) -> RegressionHistory:
    """Train a graph regressor (``model(Batch) -> (num_graphs,)``) with MSE and Adam.

    Each epoch shuffles ``train`` (by ``seed``) into batches of ``batch_size`` graphs, then
    measures :func:`mse` on ``test`` (pass a validation split here to choose a learning rate
    on it). ``decay``: the learning rate follows a cosine from ``lr`` to 0 over the run
    (:func:`lnbook.train.warmup_cosine` without warm-up); else it stays ``lr``. Seed the model's initialization for a repeatable run;
    on a CPU with a fixed thread count, the same seed gives the same history. For
    :func:`lnbook.train.fit_many`, put ``"fit": fit_graphs`` in the job.
    """
    from torch_geometric.data import Batch

    train, test = _check_graphs(train, "train"), _check_graphs(test, "test")
    check_positive_int(epochs, "epochs")
    check_positive_int(batch_size, "batch_size")
    if not isinstance(decay, bool):
        raise TypeError(f"decay must be a bool, got {describe(decay)}")
    run = prepare(model, lr, seed)
    history = RegressionHistory(steps_per_epoch=-(-len(train) // batch_size))
    total = epochs * history.steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        run.optimizer, lambda step: warmup_cosine(min(step + 1, total), 0, total) if decay else 1.0)
    y = targets(train)
    elapsed = 0.0
    for _ in progress(range(epochs), "epochs"):
        start = time.perf_counter()
        for idx in torch.randperm(len(train), generator=run.generator).split(batch_size):
            batch = Batch.from_data_list([train[i] for i in idx]).to(run.device)
            loss = nn.functional.mse_loss(model(batch), y[idx].to(run.device))
            history.step_loss.append(optimizer_step(run.optimizer, loss))
            schedule.step()
        elapsed += time.perf_counter() - start
        history.wall_time.append(elapsed)
        history.train_loss.append(sum(history.step_loss[-history.steps_per_epoch :]) / history.steps_per_epoch)
        history.test_loss.append(mse(model, test))
    return history


def batch_noise(model: nn.Module, graphs: Sequence[Data], pool: Sequence[Data], mates: int, draws: int,
                seed: int = 0) -> torch.Tensor:
    """Each graph's prediction in TRAINING mode (the norms use the statistics of the batch at
    hand, as in training) inside ``draws`` batches, each with ``mates`` other graphs drawn at
    random from ``pool``: ``(len(graphs), draws)``. Run on a copy, so the model's running
    statistics do not move. With fixed weights, the spread of a row is pure batch noise:
    what the batch-mates alone do to a graph's output."""
    from torch_geometric.data import Batch

    graphs, pool = _check_graphs(graphs, "graphs"), _check_graphs(pool, "pool")
    check_positive_int(mates, "mates")
    check_positive_int(draws, "draws")
    probe = copy.deepcopy(model).train()
    device = next(probe.parameters()).device
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(len(graphs), draws)
    with torch.no_grad():
        for k in range(draws):
            for i, graph in enumerate(graphs):
                others = [pool[j] for j in torch.randint(len(pool), (mates,), generator=g).tolist()]
                out[i, k] = probe(Batch.from_data_list([graph, *others]).to(device))[0].cpu()
    return out


def norm_sets_figure(sizes: Sequence[int] = (2, 4, 3), features: int = 6):
    """The book's axes figure for a batch of graphs: rows are the nodes of the batch (graphs of
    ``sizes`` nodes, stacked as PyG stacks them), columns the features; for each norm, the
    cells that share one mean and variance (for node 0, feature 1 and graph 0) are shaded."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from .plotting import HIGHLIGHT, PLAIN

    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"sizes must be positive ints, one per graph, got {describe(sizes)}")
    check_positive_int(features, "features")
    n = sum(sizes)
    first = np.zeros(n, dtype=bool)
    first[: sizes[0]] = True
    node0 = np.arange(n) == 0
    every, feat1, one_feat = np.ones(n, dtype=bool), np.arange(features) == 1, np.ones(features, dtype=bool)
    sets = {  # (nodes, features) that one mean and variance cover
        "BatchNorm": (every, feat1),
        "LayerNorm, node mode": (node0, one_feat),
        "LayerNorm, graph mode": (first, one_feat),
        "GraphNorm": (first, feat1),
    }
    fig, axes = plt.subplots(1, len(sets), figsize=(2.3 * len(sets), 3.0))
    bounds = np.cumsum([0, *sizes])
    for ax, (name, (rows, cols)) in zip(axes, sets.items()):
        for i in range(n):
            for j in range(features):
                ax.add_patch(Rectangle((j, n - 1 - i), 1, 1, facecolor=HIGHLIGHT if rows[i] and cols[j] else PLAIN,
                                       edgecolor="0.35", lw=0.7))
        for b in bounds[1:-1]:
            ax.plot([-0.2, features + 0.2], [n - b, n - b], color="k", lw=2)
        for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            ax.text(-0.3, n - (lo + hi) / 2, f"graph {k}", ha="right", va="center", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.set_xlim(-2.4, features + 0.2)
        ax.set_ylim(-0.8, n + 0.2)
        ax.text(features / 2, -0.4, "features", ha="center", va="top", fontsize=8)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle("A batch of graphs, nodes stacked: blue cells share one mean and variance", y=0.98)
    fig.tight_layout()
    return fig


@dataclass
class GraphRace:
    """The stored graph race of ``benchmarks/graph_race.py`` (:func:`stored_graph_race`): GraphNet
    with each norm on the main path, keyed by ``(norm, lr)``. ``train_loss`` and ``val_curve``:
    per seed and epoch, the epoch's mean training loss (training mode) and the validation MSE
    after it (eval mode), ``(S, epochs)``; ``val``, ``test``, ``large``: the final MSE on the
    validation set, the test graphs of 5-100 nodes and those of 101-200 nodes, ``(S,)``.
    ``lookup`` and ``variance``: per set (``"val"``, ``"test"``, ``"large"``), the degree
    lookup's MSE and the target variance. Seeds ascending; ``provenance``: machine, commit,
    date, command, versions and setting."""

    provenance: list[str]
    seeds: list[int]
    norms: list[str]
    lrs: list[float]
    train_loss: dict[tuple[str, float], np.ndarray]
    val_curve: dict[tuple[str, float], np.ndarray]
    val: dict[tuple[str, float], np.ndarray]
    test: dict[tuple[str, float], np.ndarray]
    large: dict[tuple[str, float], np.ndarray]
    lookup: dict[str, float]
    variance: dict[str, float]

    def select(self, measure: str = "test", relative_to: str | None = "lookup"):
        """Each norm's rate chosen on the final validation MSE (:func:`lnbook.compare.select`,
        lower is better) and its per-seed ``measure`` there (``"test"`` or ``"large"``),
        divided by that set's degree-lookup MSE (``relative_to="lookup"``), its target variance
        (``"variance"``) or raw (None). Returns the :class:`lnbook.compare.Selection`."""
        from .compare import select

        check_choice(measure, ("test", "large"), "measure")
        if relative_to is not None:
            check_choice(relative_to, ("lookup", "variance"), "relative_to")
        scale = 1.0 if relative_to is None else getattr(self, relative_to)[measure]
        values = getattr(self, measure)
        return select({n: {lr: self.val[n, lr] for lr in self.lrs} for n in self.norms},
                      lambda n, lr: values[n, lr] / scale, higher=False)


def _read_csv(folder: Path | None, name: str) -> tuple[list[str], list[dict[str, str]]]:
    """A stored result file's provenance lines and rows, from ``folder`` or else the package's ``results/``."""
    import csv
    from importlib import resources

    path = resources.files("lnbook") / "results" / name if folder is None else Path(folder) / name
    lines = path.read_text().splitlines()
    return [line[2:] for line in lines if line.startswith("# ")], list(csv.DictReader(l for l in lines if not l.startswith("#")))


def stored_graph_race(folder: str | Path | None = None) -> GraphRace:
    """The graph race that chapter 09 cannot afford to train, read from the files
    ``benchmarks/graph_race.py`` wrote into ``lnbook/results/`` (installed with the package;
    ``folder``: another folder the script wrote into), checked for completeness: every norm at
    every rate holds every seed and epoch."""
    from .batchnorm_study import per_seed

    if folder is not None and not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be a path or None, got {describe(folder)}")
    provenance, final_rows = _read_csv(folder, "graph_race-final.csv")
    seeds, final = per_seed(final_rows, lambda r: (r["norm"], float(r["lr"])), "graph race")
    _, curve_rows = _read_csv(folder, "graph_race-curves.csv")
    curves: dict[tuple[str, float], dict[int, list[tuple[int, float, float]]]] = {}
    for r in curve_rows:
        curves.setdefault((r["norm"], float(r["lr"])), {}).setdefault(int(r["seed"]), []).append(
            (int(r["epoch"]), float(r["train_loss"]), float(r["val_mse"])))
    norms = list(dict.fromkeys(k[0] for k in final))
    lrs = sorted({k[1] for k in final})
    if set(curves) != set(final) or set(final) != {(n, lr) for n in norms for lr in lrs}:
        raise ValueError("the stored graph race does not hold every norm at every rate")
    epochs = len(curves[norms[0], lrs[0]][seeds[0]])
    train_loss, val_curve = {}, {}
    for key, by_seed in curves.items():
        if sorted(by_seed) != seeds or any([e for e, _, _ in by_seed[s]] != list(range(1, epochs + 1)) for s in seeds):
            raise ValueError(f"the stored graph race's curves for {key} do not hold every seed and epoch")
        train_loss[key] = np.array([[t for _, t, _ in by_seed[s]] for s in seeds])
        val_curve[key] = np.array([[v for _, _, v in by_seed[s]] for s in seeds])
    base = {r["set"]: r for r in _read_csv(folder, "graph_race-baselines.csv")[1]}

    def column(name: str) -> dict[tuple[str, float], np.ndarray]:
        return {k: np.array([float(g[s][name]) for s in seeds]) for k, g in final.items()}

    return GraphRace(provenance=provenance, seeds=seeds, norms=norms, lrs=lrs, train_loss=train_loss, val_curve=val_curve,
                     val=column("val_mse"), test=column("test_mse"), large=column("large_mse"),
                     lookup={k: float(r["lookup_mse"]) for k, r in base.items()},
                     variance={k: float(r["variance"]) for k, r in base.items()})
