"""lnbook.graphs: the graph task as PyG data, GraphNet with PyG's norms, its training loop and the
batch-noise measurement."""

import itertools

import pytest
import torch
from torch_geometric.data import Batch

from lnbook import graphs, train, utils
from lnbook.graphs import GraphNet, fit_graphs, random_graphs


pytestmark = pytest.mark.usefixtures("one_thread")


def brute_force_on_triangle(n: int, edges: set[tuple[int, int]]) -> list[bool]:
    on = [False] * n
    for i, j, k in itertools.combinations(range(n), 3):
        if {(i, j), (j, k), (i, k)} <= edges:
            on[i] = on[j] = on[k] = True
    return on


def test_random_graphs_are_valid_pyg_data_and_deterministic():
    data = random_graphs(30, 5, 40, seed=3)
    again, other = random_graphs(30, 5, 40, seed=3), random_graphs(30, 5, 40, seed=4)
    assert len(data) == 30 and graphs.targets(data).shape == (30,)
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(data, again))
    assert not torch.equal(graphs.sizes(data), graphs.sizes(other))
    sizes = graphs.sizes(data)
    assert 5 <= int(sizes.min()) and int(sizes.max()) <= 40 and len(sizes.unique()) > 10
    for g in data:
        g.validate(raise_on_error=True)
        edges = set(map(tuple, g.edge_index.T.tolist()))
        assert all((j, i) in edges and i != j for i, j in edges)  # undirected, no self loops
        degree = torch.bincount(g.edge_index[0], minlength=g.num_nodes).float()
        torch.testing.assert_close(g.x, torch.stack([torch.ones(g.num_nodes), degree], 1))
        assert g.triangle.tolist() == brute_force_on_triangle(g.num_nodes, edges)
        assert g.y.item() == pytest.approx(g.triangle.float().mean().item())
    y = graphs.targets(data)
    assert 0.0 <= float(y.min()) and float(y.max()) <= 1.0 and float(y.std()) > 0.15


def test_mean_degree_sets_the_density():
    sparse = random_graphs(20, 60, 60, seed=0, mean_degree=(1.0, 1.0))
    dense = random_graphs(20, 60, 60, seed=0, mean_degree=(6.0, 6.0))
    degree = lambda d: torch.stack([g.x[:, 1].mean() for g in d]).mean()  # noqa: E731
    assert 0.7 < float(degree(sparse)) < 1.0 and 4.5 < float(degree(dense)) < 6.0  # the border lowers it
    assert float(graphs.targets(sparse).mean()) < 0.3 < 0.8 < float(graphs.targets(dense).mean())


@pytest.mark.parametrize("bad", [dict(n_graphs=0), dict(min_nodes=2), dict(max_nodes=4, min_nodes=5), dict(mean_degree=(0, 1))])
def test_random_graphs_refuses_bad_arguments(bad):
    args = dict(n_graphs=2, min_nodes=5, max_nodes=8, seed=0) | bad
    with pytest.raises(ValueError):
        random_graphs(**args)


@pytest.mark.parametrize("norm", GraphNet.NORMS)
def test_only_batchnorm_makes_a_graph_depend_on_its_batch_mates(norm):
    utils.seed_everything(0)
    model = GraphNet(2, 8, 2, norm).train()
    small, *mates = random_graphs(4, 5, 30, seed=1)
    with torch.no_grad():
        alone = model(Batch.from_data_list([small, mates[0]]))[0]
        other = model(Batch.from_data_list([small, mates[1], mates[2]]))[0]
    assert torch.isclose(alone, other, atol=1e-6).item() == (norm != "batch")
    noise = graphs.batch_noise(model, [small], mates, mates=2, draws=5)
    assert noise.shape == (1, 5)
    assert (noise.std() > 1e-4).item() == (norm == "batch")


def test_batch_noise_leaves_the_running_statistics_alone():
    utils.seed_everything(0)
    model = GraphNet(2, 8, 2, "batch")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pool = random_graphs(6, 5, 20, seed=2)
    graphs.batch_noise(model, pool[:2], pool, mates=3, draws=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_norms_average_over_what_their_names_say():
    """PyG's modules, called as GraphNet calls them: node mode normalizes each row, graph mode
    and GraphNorm each graph, BatchNorm each feature over the whole batch."""
    g = torch.Generator().manual_seed(0)
    h, batch = torch.randn(9, 6, generator=g) * 3 + 1, torch.tensor([0, 0, 1, 1, 1, 1, 2, 2, 2])
    out = {k: graphs.apply_norm(graphs.make_norm(k, 6).train(), h, batch, 3) for k in graphs.NORMS if k != "none"}
    torch.testing.assert_close(out["layer_node"].mean(1), torch.zeros(9), atol=1e-5, rtol=0)
    torch.testing.assert_close(out["batch"].mean(0), torch.zeros(6), atol=1e-5, rtol=0)
    for k in graphs.NORMS:
        if k in ("layer_graph", "graph", "instance"):
            for b in range(3):
                rows = out[k][batch == b]
                means = rows.mean() if k == "layer_graph" else rows.mean(0)
                torch.testing.assert_close(means, torch.zeros_like(means), atol=1e-5, rtol=0)
    assert out["batch"][batch == 0].mean(0).abs().max() > 0.05  # a graph's own means are not removed
    for b in range(3):  # InstanceNorm: each feature of a graph scaled to unit variance over its own nodes
        torch.testing.assert_close(out["instance"][batch == b].var(0, correction=0), torch.ones(6), atol=1e-3, rtol=0)


@pytest.mark.parametrize("placement", graphs.PLACEMENTS)
def test_placement_puts_the_norm_on_the_branch_or_on_the_main_path(placement):
    """On the main path every round ends in relu(norm(.)), so with node-mode LayerNorm and no
    gain the readout's input is a mean of ReLUs of standardized rows; on the residual branch
    the embedding passes through unnormalized."""
    utils.seed_everything(0)
    model = GraphNet(2, 8, 2, "layer_node", placement=placement).eval()
    batch = Batch.from_data_list(random_graphs(3, 5, 12, seed=0))
    seen = []
    hook = model.readout.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    with torch.no_grad():
        model(batch)
    hook.remove()
    h = model.embed(batch.x)
    for conv, norm in zip(model.convs, model.norms):
        branch = torch.relu(graphs.apply_norm(norm, conv(h, batch.edge_index), batch.batch, 3))
        h = h + branch if placement == "residual" else branch
    from torch_geometric.nn import global_mean_pool
    torch.testing.assert_close(seen[0], global_mean_pool(h, batch.batch, 3))
    if placement == "main":  # a mean of ReLUs
        assert (seen[0] >= 0).all()
    with pytest.raises(ValueError, match="placement"):
        GraphNet(2, 8, 2, "graph", placement="side")


def test_degree_lookup_predicts_each_degree_s_triangle_rate():
    train_set = random_graphs(30, 5, 30, seed=0)
    predict = graphs.degree_lookup(train_set)
    degree = torch.cat([g.x[:, 1] for g in train_set]).long()
    on = torch.cat([g.triangle for g in train_set]).float()
    g = train_set[0]
    expected = torch.stack([on[degree == int(d)].mean() for d in g.x[:, 1]]).mean()
    assert predict(g).item() == pytest.approx(expected.item(), rel=1e-6)
    assert predict(g).dtype == torch.float64
    test = random_graphs(20, 5, 30, seed=1)
    lookup = graphs.baseline_mse(predict, test)
    mean = graphs.baseline_mse(lambda _: graphs.targets(train_set).mean(), test)
    assert 0 < lookup < mean  # degrees say much about triangles
    assert graphs.baseline_mse(lambda g: g.y[0], test) == 0.0
    assert graphs.baseline_mse(lambda _: graphs.targets(test).mean(), test) == pytest.approx(graphs.target_variance(test))
    with pytest.raises(TypeError, match="predict"):
        graphs.baseline_mse(0.5, test)
    with pytest.raises(TypeError, match="train"):
        graphs.degree_lookup([])


def test_relative_mse_divides_by_the_reference():
    assert graphs.relative_mse([0.002, 0.004], 0.004).tolist() == [0.5, 1.0]
    for bad in (0.0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="reference"):
            graphs.relative_mse([0.1], bad)
    with pytest.raises(ValueError, match="values"):
        graphs.relative_mse([], 1.0)


def test_graph_net_learns_and_fit_is_repeatable():
    data = random_graphs(40, 5, 30, seed=0)
    test = random_graphs(20, 5, 30, seed=1)
    runs = []
    for _ in range(2):
        utils.seed_everything(0)
        model = GraphNet(2, 16, 2, "layer_node")
        runs.append(fit_graphs(model, data, test, epochs=8, lr=1e-2, batch_size=8, seed=0))
    assert runs[0].step_loss == runs[1].step_loss and len(runs[0].test_loss) == 8
    assert runs[0].test_loss[-1] < 0.5 * runs[0].test_loss[0]
    assert graphs.mse(model, test) == pytest.approx(runs[1].test_loss[-1], rel=1e-5)
    with pytest.raises(TypeError, match="Batch"):
        model(data[0])
    with pytest.raises(TypeError, match="list of torch_geometric Data"):
        fit_graphs(model, [], test, epochs=1, lr=1e-2, batch_size=8, seed=0)


def test_graph_runs_go_through_the_workers_queue():
    data = random_graphs(12, 5, 12, seed=0)
    futures = train.start_runs(lambda: GraphNet(2, 8, 1, "graph"), [0], None, fit=fit_graphs, train=data, test=data,
                               epochs=1, lr=1e-2, batch_size=4)
    (model, history), = train.finish_runs({"g": futures})["g"]
    assert isinstance(model, GraphNet) and len(history.test_loss) == 1


def test_norm_sets_figure_shades_one_set_per_norm():
    fig = graphs.norm_sets_figure(sizes=(2, 3), features=4)
    assert [ax.get_title() for ax in fig.axes] == ["BatchNorm", "LayerNorm, node mode", "LayerNorm, graph mode", "GraphNorm"]
    from lnbook.plotting import HIGHLIGHT
    import matplotlib.colors as mcolors

    shaded = [sum(mcolors.to_hex(p.get_facecolor()) == HIGHLIGHT for p in ax.patches) for ax in fig.axes]
    assert shaded == [5, 4, 8, 2]  # 5 nodes x 1 feature; 1 node x 4; 2 nodes x 4; 2 nodes x 1
    with pytest.raises(ValueError, match="sizes"):
        graphs.norm_sets_figure(sizes=())


def test_fit_graphs_decay_changes_the_steps_not_the_start():
    data = random_graphs(16, 5, 20, seed=0)
    runs = {}
    for decay in (False, True):
        utils.seed_everything(0)
        runs[decay] = fit_graphs(GraphNet(2, 8, 1, "graph", placement="main"), data, data[:4], epochs=3, lr=3e-2,
                                 batch_size=4, seed=0, decay=decay)
    assert runs[True].step_loss[0] == runs[False].step_loss[0]  # the same model, batch and first loss
    assert runs[True].step_loss[-1] != runs[False].step_loss[-1]
    with pytest.raises(TypeError, match="decay"):
        fit_graphs(GraphNet(2, 8, 1), data, data, epochs=1, lr=1e-2, batch_size=4, seed=0, decay="cosine")
