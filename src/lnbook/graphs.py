"""Graphs of varying size: a synthetic regression task, padded batches and a message-passing
network in plain torch (dense adjacency, no graph library), with the norm as a setting.

A batch of graphs is ``(adj (B, N, N), x (B, N, F), mask (B, N))``, zero-padded to the
largest graph of the batch; ``mask`` is True on real nodes and padded nodes have no edges.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ._checks import check_float_tensor, check_positive_int, describe
from .data import pad_batch
from .norms import EXAMPLE_NORMS, apply_norm, check_norm, norm_layer
from .train import evaluating, optimizer_step, prepare

NORMS = ("none", "batch", *EXAMPLE_NORMS)


@dataclass(frozen=True)
class Graph:
    """One graph: ``adj (n, n)``, a symmetric 0/1 float32 adjacency without self loops, and
    node features ``x (n, F)``."""

    adj: torch.Tensor
    x: torch.Tensor

    @property
    def n_nodes(self) -> int:
        return len(self.x)


@dataclass(frozen=True)
class GraphSet:
    """Graphs and one float32 target per graph: ``y (len(graphs),)``."""

    graphs: tuple[Graph, ...]
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.graphs)

    @property
    def sizes(self) -> torch.Tensor:
        """Nodes per graph, ``(len(graphs),)`` int64."""
        return torch.tensor([g.n_nodes for g in self.graphs], dtype=torch.int64)


def node_features(adj: torch.Tensor) -> torch.Tensor:
    """The input features of each node, ``(n, 2)``: a constant 1 and the node's degree."""
    return torch.stack([torch.ones(len(adj)), adj.sum(1)], dim=1)


def on_triangle(adj: torch.Tensor) -> torch.Tensor:
    """``(n,)`` bool: whether each node lies on a triangle (two of its neighbours are adjacent)."""
    return ((adj @ adj) * adj).sum(1) > 0


def random_graphs(
    n_graphs: int, min_nodes: int, max_nodes: int, seed: int, mean_degree: tuple[float, float] = (1.0, 6.0)
) -> GraphSet:
    """Random geometric graphs whose target is the fraction of nodes that lie on a triangle.

    Each graph draws its size ``n`` uniformly from ``min_nodes..max_nodes`` and a mean degree
    ``d`` uniformly from ``mean_degree``, places ``n`` points uniformly in the unit square and
    joins two points closer than ``r``, with ``pi r^2 (n - 1) = d`` (nodes near the border
    have fewer neighbours, so the realized mean degree is a little below ``d``). Node
    features are :func:`node_features`; the target ``y`` is the fraction of nodes on a
    triangle (:func:`on_triangle`), in [0, 1]. The same arguments give the same graphs.

    Why this task: the target depends on how the edges are wired, not on the graph's size,
    and it spreads widely because ``d`` varies (few nodes on a triangle at ``d = 1``, almost
    all at ``d = 6``). In a geometric graph triangles are local: up to border effects, the
    same rule links degrees to triangles in a graph of 10 nodes and of 200, so a model can
    be tested on sizes it never saw. (In Erdős–Rényi graphs of a fixed mean degree,
    triangles vanish as ``1/n``, so any triangle count would be a disguised graph size.) A
    mean-aggregation network sees degrees, not triangles, so it learns the strong link
    between the two; the rest of the target's spread is beyond it.
    """
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
    graphs, y = [], []
    for _ in range(n_graphs):
        n = int(rng.integers(min_nodes, max_nodes + 1))
        radius = math.sqrt(rng.uniform(*mean_degree) / (math.pi * (n - 1)))
        points = rng.random((n, 2))
        close = ((points[:, None] - points[None]) ** 2).sum(-1) < radius**2
        adj = torch.from_numpy(close & ~np.eye(n, dtype=bool)).float()
        graphs.append(Graph(adj, node_features(adj)))
        y.append(on_triangle(adj).float().mean())
    return GraphSet(tuple(graphs), torch.stack(y))


def batch_graphs(graphs: Sequence[Graph]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero-pad graphs to the largest: ``adj (B, N, N)``, ``x (B, N, F)``, ``mask (B, N)``
    (True on real nodes). Padded nodes have no edges and zero features."""
    if len(graphs) == 0 or not all(isinstance(g, Graph) for g in graphs):
        raise TypeError("graphs must be a non-empty sequence of Graph")
    x, lengths, mask = pad_batch([g.x for g in graphs])
    adj = x.new_zeros(len(graphs), x.shape[1], x.shape[1])
    for i, (g, n) in enumerate(zip(graphs, lengths.tolist())):
        if g.adj.shape != (n, n):
            raise ValueError(f"graphs[{i}].adj must have shape ({n}, {n}) to match its x, got {tuple(g.adj.shape)}")
        adj[i, :n, :n] = g.adj
    return adj, x, mask


def graph_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``h (B, N, F)`` over each graph's real nodes (``mask (B, N)``): ``(B, F)``."""
    real = mask.unsqueeze(-1)
    return torch.where(real, h, 0.0).sum(1) / real.sum(1)


class GraphLayer(nn.Module):
    """One round of message passing: ``h + relu(norm(W_self h + W_nbr mean_nbr(h)))``.

    ``mean_nbr(h)`` averages each node's neighbours (``walk = adj / degree``, zero for a node
    without neighbours). ``norm``: ``"none"``, ``"layer"`` (LayerNorm over each node's
    features, or another norm over one example's features) or ``"batch"`` (BatchNorm over
    every real node of every graph in the batch). The norm gets the mask if it takes one.
    Shapes: ``h (B, N, H)``, ``walk (B, N, N)``, ``mask (B, N)`` -> ``(B, N, H)``.
    """

    def __init__(self, hidden: int, norm: str) -> None:
        super().__init__()
        check_positive_int(hidden, "hidden")
        norm = check_norm(norm, NORMS)
        self.self_weight = nn.Linear(hidden, hidden)
        self.neighbour_weight = nn.Linear(hidden, hidden, bias=False)
        self.norm = norm_layer(norm, hidden)

    def forward(self, h: torch.Tensor, walk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a = self.self_weight(h) + self.neighbour_weight(walk @ h)
        return h + torch.relu(apply_norm(self.norm, a, mask))


class GraphNet(nn.Module):
    """A message-passing regressor: one number per graph.

    ``Linear(in_features, hidden) -> GraphLayer * layers -> mean over the graph's real nodes
    -> Linear(hidden, 1)``. Input a padded batch ``adj (B, N, N)``, ``x (B, N, in_features)``,
    ``mask (B, N)`` (:func:`batch_graphs`); output ``(B,)``. Padded nodes, whatever their
    features, change no real node's result; only ``"batch"`` in training mode makes a
    graph's output depend on the other graphs of its batch.
    """

    NORMS = NORMS

    def __init__(self, in_features: int, hidden: int, layers: int, norm: str = "none") -> None:
        super().__init__()
        for value, name in ((in_features, "in_features"), (hidden, "hidden"), (layers, "layers")):
            check_positive_int(value, name)
        self.norm = check_norm(norm, NORMS)
        self.in_features = in_features
        self.embed = nn.Linear(in_features, hidden)
        self.layers = nn.ModuleList(GraphLayer(hidden, norm) for _ in range(layers))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, adj: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self._check_batch(adj, x, mask)
        walk = adj / adj.sum(-1, keepdim=True).clamp_min(1)
        h = self.embed(torch.where(mask.unsqueeze(-1), x, 0.0))
        for layer in self.layers:
            h = layer(h, walk, mask)
        return self.readout(graph_mean(h, mask)).squeeze(-1)

    def _check_batch(self, adj: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> None:
        check_float_tensor(x, "x")
        check_float_tensor(adj, "adj")
        if x.ndim != 3 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (B, N, {self.in_features}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        if adj.shape != (b, n, n) or adj.dtype != x.dtype:
            got = f"{tuple(adj.shape)} of {adj.dtype}"
            raise ValueError(f"adj must be ({b}, {n}, {n}) of x's dtype {x.dtype}, got {got}")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (b, n):
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(f"mask must be a ({b}, {n}) bool tensor, True on real nodes, got {got}")
        if not mask.any(1).all():
            raise ValueError("mask must leave every graph at least one real node")
        pad = ~mask
        if (adj.transpose(1, 2)[pad] != 0).any() or (adj[pad] != 0).any():
            raise ValueError("adj must have no edges at padded nodes (where mask is False)")


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


def _check_graph_set(data: object, name: str) -> GraphSet:
    if not isinstance(data, GraphSet):
        raise TypeError(f"{name} must be a GraphSet (see random_graphs), got {type(data).__name__}")
    return data


def mse(model: nn.Module, data: GraphSet, batch_size: int = 64) -> float:
    """Mean squared error of ``model`` (in eval mode) on ``data``, in batches of ``batch_size`` graphs."""
    _check_graph_set(data, "data")
    check_positive_int(batch_size, "batch_size")
    total = 0.0
    with evaluating(model) as device:
        for i in range(0, len(data), batch_size):
            inputs = (t.to(device) for t in batch_graphs(data.graphs[i : i + batch_size]))
            total += float(((model(*inputs) - data.y[i : i + batch_size].to(device)) ** 2).sum())
    return total / len(data)


def fit_graphs(
    model: nn.Module, train: GraphSet, test: GraphSet, *, epochs: int, lr: float, batch_size: int, seed: int
) -> RegressionHistory:
    """Train a graph regressor (``model(adj, x, mask) -> (B,)``) with MSE and Adam.

    Each epoch shuffles ``train`` (by ``seed``) into batches of ``batch_size`` graphs, each
    padded to its largest graph (:func:`batch_graphs`), then measures :func:`mse` on
    ``test``. Seed the model's initialization for a repeatable run; on a CPU with a fixed
    thread count, the same seed gives the same history. For :func:`lnbook.train.fit_many`,
    put ``"fit": fit_graphs`` in the job.
    """
    train, test = _check_graph_set(train, "train"), _check_graph_set(test, "test")
    check_positive_int(epochs, "epochs")
    check_positive_int(batch_size, "batch_size")
    run = prepare(model, lr, seed)
    history = RegressionHistory(steps_per_epoch=-(-len(train) // batch_size))
    elapsed = 0.0
    for _ in range(epochs):
        start = time.perf_counter()
        for idx in torch.randperm(len(train), generator=run.generator).split(batch_size):
            inputs = (t.to(run.device) for t in batch_graphs([train.graphs[i] for i in idx]))
            loss = nn.functional.mse_loss(model(*inputs), train.y[idx].to(run.device))
            history.step_loss.append(optimizer_step(run.optimizer, loss))
        elapsed += time.perf_counter() - start
        history.wall_time.append(elapsed)
        history.train_loss.append(sum(history.step_loss[-history.steps_per_epoch :]) / history.steps_per_epoch)
        history.test_loss.append(mse(model, test))
    return history
