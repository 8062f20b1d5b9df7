"""lnbook.graphs: the graph task, padded batches, GraphNet and its training loop."""

import itertools
import pickle

import pytest
import torch

from lnbook import graphs, train, utils
from lnbook.graphs import Graph, GraphNet, batch_graphs, fit_graphs, random_graphs


@pytest.fixture(autouse=True)
def _one_thread():
    """Small matrices: one thread is several times faster beside another test process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def brute_force_on_triangle(adj: torch.Tensor) -> list[bool]:
    n = len(adj)
    on = [False] * n
    for i, j, k in itertools.combinations(range(n), 3):
        if adj[i, j] and adj[j, k] and adj[i, k]:
            on[i] = on[j] = on[k] = True
    return on


def test_random_graphs_are_valid_and_deterministic():
    data = random_graphs(30, 5, 40, seed=3)
    again, other = random_graphs(30, 5, 40, seed=3), random_graphs(30, 5, 40, seed=4)
    assert len(data) == 30 and data.y.shape == (30,) and data.y.dtype == torch.float32
    assert all(torch.equal(a.adj, b.adj) for a, b in zip(data.graphs, again.graphs)) and torch.equal(data.y, again.y)
    assert not torch.equal(data.sizes, other.sizes)
    sizes = data.sizes
    assert 5 <= int(sizes.min()) and int(sizes.max()) <= 40 and len(sizes.unique()) > 10
    for g in data.graphs:
        assert g.adj.dtype == torch.float32 and set(g.adj.unique().tolist()) <= {0.0, 1.0}
        assert torch.equal(g.adj, g.adj.T) and (g.adj.diagonal() == 0).all()
        torch.testing.assert_close(g.x, torch.stack([torch.ones(g.n_nodes), g.adj.sum(1)], 1))
    assert 0.0 <= float(data.y.min()) and float(data.y.max()) <= 1.0 and float(data.y.std()) > 0.15


def test_mean_degree_sets_the_density():
    sparse = random_graphs(20, 60, 60, seed=0, mean_degree=(1.0, 1.0))
    dense = random_graphs(20, 60, 60, seed=0, mean_degree=(6.0, 6.0))
    degree = lambda d: torch.stack([g.adj.sum() / g.n_nodes for g in d.graphs]).mean()  # noqa: E731
    assert 0.7 < float(degree(sparse)) < 1.0 and 4.5 < float(degree(dense)) < 6.0  # the border lowers it
    assert float(sparse.y.mean()) < 0.3 < 0.8 < float(dense.y.mean())


def test_target_is_the_fraction_of_nodes_on_a_triangle():
    # a triangle 0-1-2 with a tail 2-3, and an isolated node 4
    adj = torch.zeros(5, 5)
    for i, j in [(0, 1), (1, 2), (0, 2), (2, 3)]:
        adj[i, j] = adj[j, i] = 1.0
    assert graphs.on_triangle(adj).tolist() == [True, True, True, False, False]
    data = random_graphs(40, 3, 12, seed=1)
    for g, y in zip(data.graphs, data.y.tolist()):
        assert graphs.on_triangle(g.adj).tolist() == brute_force_on_triangle(g.adj)
        assert y == pytest.approx(sum(brute_force_on_triangle(g.adj)) / g.n_nodes)
    assert 0.0 in data.y.tolist() and 1.0 in data.y.tolist()


def test_batch_graphs_pads_with_isolated_zero_nodes():
    data = random_graphs(3, 4, 9, seed=2)
    adj, x, mask = batch_graphs(data.graphs)
    sizes = data.sizes.tolist()
    n = max(sizes)
    assert adj.shape == (3, n, n) and x.shape == (3, n, 2) and mask.shape == (3, n)
    assert mask.sum(1).tolist() == sizes
    for i, (g, k) in enumerate(zip(data.graphs, sizes)):
        assert torch.equal(adj[i, :k, :k], g.adj) and torch.equal(x[i, :k], g.x)
    assert (adj[~mask] == 0).all() and (adj.transpose(1, 2)[~mask] == 0).all() and (x[~mask] == 0).all()


def one_and_padded(norm: str):
    """A GraphNet, one small graph alone, and the same graph first in a batch padded to a large one."""
    utils.seed_everything(0)
    model = GraphNet(2, 16, 3, norm)
    small, large = random_graphs(1, 7, 7, seed=0).graphs[0], random_graphs(1, 60, 60, seed=1).graphs[0]
    alone = batch_graphs([small])
    adj, x, mask = batch_graphs([small, large])
    x[0, ~mask[0]] = float("nan")  # padding that reached a real node would show
    return model, alone, (adj, x, mask)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("norm", ["none", "layer"])
def test_a_graph_predicts_the_same_alone_and_in_a_padded_batch(norm, mode):
    model, alone, batch = one_and_padded(norm)
    model.train(mode == "train")
    single = model(*alone)
    assert single.shape == (1,) and model(*batch).shape == (2,)
    torch.testing.assert_close(model(*batch)[:1], single, atol=1e-6, rtol=0)


def test_batchnorm_makes_a_graph_depend_on_its_batch_in_training_only():
    model, alone, batch = one_and_padded("batch")
    model.train()
    assert model(*batch).isfinite().all()  # masked: the NaN padding is left out of the statistics
    assert (model(*batch)[0] - model(*alone)[0]).abs() > 1e-3
    model.eval()
    torch.testing.assert_close(model(*batch)[:1], model(*alone), atol=1e-6, rtol=0)


def test_batchnorm_statistics_are_the_node_weighted_average_of_the_graphs():
    """BatchNorm over all nodes: each graph's statistics count in proportion to its size."""
    utils.seed_everything(0)
    model = GraphNet(2, 8, 1, "batch")
    norm = model.layers[0].norm
    seen = []
    norm.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    adj, x, mask = batch_graphs([random_graphs(1, n, n, seed=n).graphs[0] for n in (5, 12, 20, 200)])
    model(adj, x, mask)
    h = seen[0]  # the (B, N, 8) input of the norm
    count = mask.sum(1, keepdim=True).float()  # nodes per graph
    share = count / count.sum()
    mean = graphs.graph_mean(h, mask)  # (B, 8) per-graph statistics
    var = graphs.graph_mean((h - mean[:, None]) ** 2, mask)
    batch_mean = (share * mean).sum(0)
    batch_var = (share * (var + (mean - batch_mean) ** 2)).sum(0)  # the law of total variance
    n = int(count.sum())
    # one step from running (0, 1) with momentum 0.1; the running variance is unbiased
    torch.testing.assert_close(norm.running_mean, 0.1 * batch_mean)
    torch.testing.assert_close(norm.running_var, 0.9 + 0.1 * batch_var * n / (n - 1))
    big = int(count.argmax())
    assert big == 3 and float(share[big]) > 0.8  # the largest graph holds most nodes
    gap = lambda i: (mean[i] - batch_mean).abs().mean()  # noqa: E731
    assert all(gap(big) < gap(i) for i in range(4) if i != big)


def test_graphnet_rejects_bad_input():
    model = GraphNet(2, 4, 1)
    adj, x, mask = batch_graphs(random_graphs(2, 4, 6, seed=0).graphs)
    n = x.shape[1]
    cases = [
        ((adj, x.long(), mask), TypeError, "x must be a floating-point tensor"),
        ((adj.bool(), x, mask), TypeError, "adj must be a floating-point tensor"),
        ((adj, x[..., :1], mask), ValueError, r"x must have shape \(B, N, 2\)"),
        ((adj[:, :-1], x, mask), ValueError, rf"adj must be \(2, {n}, {n}\) of x's dtype"),
        ((adj.double(), x, mask), ValueError, "adj must be .* of x's dtype torch.float32"),
        ((adj, x, mask.float()), TypeError, r"mask must be a \(2, \d+\) bool tensor"),
        ((adj, x, mask[:1]), TypeError, "mask must be a"),
        ((adj, x, mask & torch.tensor([[True], [False]])), ValueError, "at least one real node"),
    ]
    for args, error, match in cases:
        with pytest.raises(error, match=match):
            model(*args)
    short = mask.clone()
    short[0, adj[0].sum(1).argmax()] = False  # a node with edges marked as padding
    with pytest.raises(ValueError, match="no edges at padded nodes"):
        model(adj, x, short)
    for kwargs, match in [
        ({"norm": "group"}, "norm must be one of"),
        ({"hidden": 0}, "hidden must be a positive int"),
        ({"layers": 1.5}, "layers must be a positive int"),
    ]:
        with pytest.raises(ValueError, match=match):
            GraphNet(**({"in_features": 2, "hidden": 4, "layers": 1} | kwargs))
    with pytest.raises(ValueError, match="norm must be one of"):
        graphs.GraphLayer(4, "weight")  # weight normalization is the MLP's and the cells'; a graph layer has no place for it


def test_data_functions_reject_bad_input():
    for args, match in [
        ((0, 5, 9, 0), "n_graphs must be a positive int"),
        ((5, 9, 5, 0), "min_nodes <= max_nodes"),
        ((5, 2, 5, 0), "3 <= min_nodes"),
    ]:
        with pytest.raises(ValueError, match=match):
            random_graphs(*args)
    for bad in [(0.0, 2.0), (3.0, 2.0), 4.0, (1.0, float("inf")), ("1", "2")]:
        with pytest.raises(ValueError, match="mean_degree must be a range"):
            random_graphs(2, 5, 9, 0, mean_degree=bad)
    g = random_graphs(1, 5, 5, seed=0).graphs[0]
    with pytest.raises(TypeError, match="non-empty sequence of Graph"):
        batch_graphs([])
    with pytest.raises(TypeError, match="non-empty sequence of Graph"):
        batch_graphs([g.adj])
    with pytest.raises(ValueError, match=r"graphs\[1\]\.adj must have shape \(4, 4\)"):
        batch_graphs([g, Graph(g.adj, g.x[:4])])
    with pytest.raises(ValueError, match=r"sequences\[1\] has 1 features"):
        batch_graphs([g, Graph(g.adj, g.x[:, :1])])


def tiny_run(norm: str, seed: int = 0, epochs: int = 10):
    data = random_graphs(40, 5, 16, seed=0)
    test = random_graphs(16, 5, 16, seed=1)
    utils.seed_everything(seed)
    model = GraphNet(2, 16, 2, norm)
    return model, data, test, fit_graphs(model, data, test, epochs=epochs, lr=1e-2, batch_size=8, seed=seed)


def test_fit_graphs_times_training_and_not_evaluation(fake_clock, monkeypatch):
    """One clock reading before and one after each epoch's training (1 s on the fake clock);
    the 100 s that each evaluation "takes" are left out."""
    evaluate = graphs.mse
    monkeypatch.setattr(graphs, "mse", lambda *args: (fake_clock.advance(100.0), evaluate(*args))[1])
    assert tiny_run("none", epochs=3)[-1].wall_time == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("norm", GraphNet.NORMS)
def test_fit_graphs_reduces_the_loss(norm):
    model, data, test, h = tiny_run(norm)
    assert h.steps_per_epoch == 5 and len(h.step_loss) == 50
    assert len(h.train_loss) == len(h.test_loss) == 10
    assert h.train_loss[-1] < 0.5 * h.train_loss[0]
    baseline = float(((test.y - data.y.mean()) ** 2).mean())  # predicting the training mean
    assert h.test_loss[-1] < 0.5 * baseline
    assert h.test_loss[-1] == pytest.approx(graphs.mse(model, test))


def test_fit_graphs_is_deterministic_and_runs_as_a_fit_many_job():
    _, data, test, h = tiny_run("batch", epochs=2)
    utils.seed_everything(0)
    job = {"model": GraphNet(2, 16, 2, "batch"), "fit": fit_graphs, "train": data, "test": test}
    (future,) = train.fit_many([job | {"epochs": 2, "lr": 1e-2, "batch_size": 8, "seed": 0}])
    model, again = future.result()
    assert isinstance(model, GraphNet) and again.step_loss == h.step_loss and again.test_loss == h.test_loss
    assert tiny_run("batch", seed=1, epochs=2)[3].step_loss != h.step_loss
    sent = pickle.loads(pickle.dumps(job))  # what a worker process of cpu_workers receives
    assert sent["fit"] is fit_graphs and torch.equal(sent["train"].y, data.y)


def test_fit_graphs_rejects_bad_arguments():
    data = random_graphs(4, 5, 6, seed=0)
    model = GraphNet(2, 4, 1)
    args = {"epochs": 1, "lr": 1e-2, "batch_size": 2, "seed": 0}
    with pytest.raises(TypeError, match="train must be a GraphSet"):
        fit_graphs(model, (data.graphs, data.y), data, **args)
    with pytest.raises(TypeError, match="test must be a GraphSet"):
        fit_graphs(model, data, None, **args)
    bad = [({"epochs": 0}, "epochs must be"), ({"lr": 0}, "lr must be"), ({"batch_size": -1}, "batch_size must be")]
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            fit_graphs(model, data, data, **(args | kwargs))
    with pytest.raises(ValueError, match="batch_size must be"):
        graphs.mse(model, data, batch_size=0)
