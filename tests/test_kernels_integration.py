"""lnbook.kernels in the rest of PyTorch: exact bfloat16 rounding, autocast, custom ops and
torch.compile. On a machine without a GPU the kernels run through Triton's interpreter."""

import pytest
import torch

from lnbook.kernels import FusedLayerNorm, FusedRMSNorm, fuse_norms, fuse_residual_adds, layer_norm, rms_norm
from lnbook.kernels.norm import output_dtype
from test_kernels import DEVICE


def _leaves(*tensors):
    return [t.clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("m, n, max_block", [(37, 1151, None), (5, 300, 64), (3, 5000, None)])
def test_bfloat16_results_are_the_float32_results_rounded_to_nearest_even(rms, m, n, max_block):
    """The kernel computes in float32 whatever the input: on bfloat16 inputs its outputs must be
    exactly its float32 results (on the same values) rounded to nearest, ties to even."""
    g = torch.Generator().manual_seed(1)
    x, dy = (torch.randn(m, n, generator=g) * 3 + 1).bfloat16(), torch.randn(m, n, generator=g).bfloat16()
    w, b = torch.randn(n, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()
    results = []
    for dtype in (torch.bfloat16, torch.float32):  # bf16 -> float32 is exact: the same values
        xs, ws, bs = _leaves(*(t.to(dtype).to(DEVICE) for t in (x, w, b)))
        y = rms_norm(xs, ws, max_block=max_block) if rms else layer_norm(xs, ws, bs, max_block=max_block)
        y.backward(dy.to(dtype).to(DEVICE))
        results.append([y, xs.grad, ws.grad] + ([] if rms else [bs.grad]))
    truncated = 0
    for name, low, high in zip(("y", "dx", "dw", "db"), *results):
        assert low.dtype == torch.bfloat16
        assert torch.equal(low, high.to(torch.bfloat16)), name  # torch's .to rounds to nearest even
        # rounding toward zero would differ on about half the elements
        toward_zero = (high.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
        truncated += int((low != toward_zero).sum())
    assert truncated > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU autocast; the GPU's is checked by make gpu-check")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_under_autocast_the_fused_layer_norm_returns_what_nn_layer_norm_returns(dtype):
    torch.manual_seed(0)
    ref, fused = torch.nn.LayerNorm(64), FusedLayerNorm(64)
    with torch.no_grad():
        ref.weight.normal_(), ref.bias.normal_()
    fused.load_state_dict(ref.state_dict())
    x = (torch.randn(8, 64) + 300).to(dtype)  # a large mean: statistics in bfloat16 would be wrong
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = ref(x), fused(x)
        assert output_dtype(x, rms=False) == want.dtype
        _, mean, rstd = torch.ops.lnbook.norm_forward(x, fused.weight, fused.bias, 1e-5, False, None, want.dtype)
    assert got.dtype == want.dtype and mean.dtype == rstd.dtype == torch.float32
    exact = torch.nn.functional.layer_norm(x.double(), (64,), ref.weight.double(), ref.bias.double(), 1e-5)
    torch.testing.assert_close(mean.double(), x.double().mean(-1), rtol=1e-6, atol=0)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-3  # float32: x's ulp at 300 (3e-5) over sigma = 1, times w
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol * 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU autocast")
def test_under_autocast_the_fused_rms_norm_keeps_the_input_dtype_like_lnbook_rms_norm():
    from lnbook.norms import RMSNorm

    x = torch.randn(4, 32).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert FusedRMSNorm(32)(x).dtype == RMSNorm(32)(x).dtype == torch.bfloat16


def test_the_custom_ops_pass_torch_library_opcheck():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(6, 40, generator=g), torch.randn(40, generator=g), torch.randn(40, generator=g)
    x, w, b = (t.to(DEVICE).requires_grad_() for t in (x, w, b))
    torch.library.opcheck(torch.ops.lnbook.norm_forward, (x, w, b, 1e-5, False, None, torch.float32))
    torch.library.opcheck(torch.ops.lnbook.norm_forward, (x, w, None, 1e-6, True, 16, torch.float32))


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_torch_compile_fullgraph_of_a_model_with_fused_norms_gives_the_same_loss_and_gradients(norm):
    """The norms are custom ops with fake implementations: Dynamo traces through them without a
    graph break (fullgraph=True fails on one), AOTAutograd through their backward. The
    aot_eager backend keeps the test to seconds on a CPU; inductor compiles the same graph."""
    from lnbook.transformer import GPTConfig, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(11, 16, n_layer=2, n_head=2, d_model=32, norm=norm)).to(DEVICE)
    fused = TinyGPT(model.cfg).to(DEVICE)
    fused.load_state_dict(model.state_dict())
    assert fuse_norms(fused) == 5 and fuse_residual_adds(fused) == 4  # every residual add in a norm's kernel
    idx = torch.randint(11, (3, 16), device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(fused.loss, fullgraph=True, backend="aot_eager")
    losses = [model.loss(idx[:, :-1], idx[:, 1:]), compiled(idx[:, :-1], idx[:, 1:])]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


ADD_TOL = {torch.float32: 2e-5, torch.bfloat16: 5e-2}


@pytest.mark.parametrize("dtype", ADD_TOL, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("m, n, max_block", [(3, 7, None), (37, 1151, None), (5, 300, 64), (2, 5000, None)])
def test_fused_add_norm_forward_and_gradients_match_float64(rms, dtype, m, n, max_block):
    """(y, s) = (norm(x + r), x + r): y and every gradient against float64 on the same inputs,
    with s rounded to the dtype as torch's + rounds it; gradients flow into both outputs."""
    from lnbook.kernels import add_layer_norm, add_rms_norm

    g = torch.Generator().manual_seed(2)
    x, r, dy, ds = (torch.randn(m, n, generator=g).to(dtype) for _ in range(4))
    w, b = (torch.randn(n, generator=g).to(dtype) for _ in range(2))
    got_leaves = _leaves(*(t.to(DEVICE) for t in (x, r, w, b)))
    if rms:
        y, s = add_rms_norm(*got_leaves[:3], max_block=max_block)
    else:
        y, s = add_layer_norm(*got_leaves, max_block=max_block)
    assert y.dtype == s.dtype == dtype and torch.equal(s, (x + r).to(DEVICE))  # the sum, exactly as torch rounds it
    torch.autograd.backward((y, s), (dy.to(DEVICE), ds.to(DEVICE)))
    ref = [t.double().requires_grad_() for t in (x, r, w, b)]
    s64 = (ref[0] + ref[1]).to(dtype).double()  # the kernel normalizes the rounded sum
    y64 = F_rms(s64, ref[2]) if rms else torch.nn.functional.layer_norm(s64, (n,), ref[2], ref[3], 1e-5)
    torch.autograd.backward((y64, s64), (dy.double(), ds.double()))
    tol = ADD_TOL[dtype]
    torch.testing.assert_close(y.double().cpu(), y64.detach(), rtol=tol, atol=tol)
    for name, a, e in zip(("dx", "dresidual", "dw", "db"), got_leaves, ref):
        if rms and name == "db":
            continue
        torch.testing.assert_close(a.grad.double().cpu(), e.grad, rtol=tol, atol=tol * max(1.0, m**0.5), msg=name)


def F_rms(x, w):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)


def test_fused_add_norm_rejects_a_mismatched_residual():
    from lnbook.kernels import add_layer_norm

    x, w = torch.randn(2, 8, device=DEVICE), torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        add_layer_norm(x, x[:, :4], w)
    with pytest.raises(ValueError, match="residual must have x's shape, dtype"):
        add_layer_norm(x, x.half(), w)
    with pytest.raises(TypeError, match="residual must be a tensor"):
        add_layer_norm(x, 1.0, w)


# (GPTConfig settings, norms swapped, residual adds fused): a Pre-LN TinyGPT with fused norms
# and a final norm fuses both adds of each of its 2 blocks; one add stays plain where the final
# norm is missing or not fused; Post-LN, DeepNorm and norms without a kernel fuse none.
FUSION_CASES = {
    "layer": (dict(norm="layernorm"), 5, 4),
    "layer-no-bias": (dict(norm="layernorm", bias=False), 5, 4),
    "rms": (dict(norm="rmsnorm"), 5, 4),
    "rms-no-bias": (dict(norm="rmsnorm", bias=False), 5, 4),
    "sandwich": (dict(norm_position="sandwich"), 9, 4),  # norm1_out and norm2_out in each block
    "normformer": (dict(normformer=True), 9, 4),  # norm1_out, and a norm inside the MLP
    "embed-norm": (dict(embed_norm=True), 6, 4),
    "no-final-norm": (dict(final_norm=False), 4, 3),
    "final-dyt": (dict(final_norm="dyt"), 4, 3),
    "dyt": (dict(norm="dyt"), 0, 0),
    "post": (dict(norm_position="post"), 5, 0),
    "deepnorm": (dict(norm_position="post", deepnorm=True), 5, 0),
}


def _models(settings, names=("norms", "adds")):
    """A TinyGPT with torch's norms (seeded, always the same) and a copy of it for each of ``names``."""
    from lnbook.transformer import GPTConfig, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(11, 16, n_layer=2, n_head=2, d_model=32, **settings)).to(DEVICE)
    copies = {}
    for name in names:
        copies[name] = TinyGPT(model.cfg).to(DEVICE)
        copies[name].load_state_dict(model.state_dict())
    return model, copies


def _loss_and_grads(model, idx, mask):
    model.zero_grad(set_to_none=True)
    loss = model.loss(idx[..., :-1], idx[..., 1:], mask)
    loss.sum().backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("case", FUSION_CASES)
def test_fuse_residual_adds_fuses_every_pre_ln_add_and_changes_no_result(case):
    """Every residual add of a Pre-LN TinyGPT (Sandwich-LN and NormFormer too) runs in a norm's
    kernel, and the loss and gradients on a padded batch are those of the same fused norms with
    the adds left to torch (to float32 rounding) and of torch's norms (to the kernels' error)."""
    from lnbook.kernels.modules import FusedAddBlock, FusedTinyGPT
    from lnbook.transformer import Block, TinyGPT

    settings, swapped, adds = FUSION_CASES[case]
    model, fused = _models(settings)
    assert fuse_norms(fused["norms"], residual=False) == swapped and type(fused["norms"].blocks[0]) is Block
    assert fuse_norms(fused["adds"]) == swapped
    assert fuse_residual_adds(fused["adds"]) == adds and fuse_residual_adds(fused["adds"]) == adds  # once; again, the same
    assert type(fused["adds"]) is (FusedTinyGPT if adds else TinyGPT)
    assert {type(b) for b in fused["adds"].blocks} == {FusedAddBlock if adds else Block}
    assert fused["adds"].state_dict().keys() == model.state_dict().keys()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(11, (3, 16), generator=g).to(DEVICE)
    mask = (torch.arange(15) < torch.tensor([[15], [9], [4]])).to(DEVICE)  # right-padded
    want, want_grads = _loss_and_grads(fused["norms"], idx, mask)
    ref, ref_grads = _loss_and_grads(model, idx, mask)
    got, got_grads = _loss_and_grads(fused["adds"], idx, mask)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for name, grad in got_grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-6, atol=1e-6, msg=name)
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_seed_stacked_tinygpt_is_left_as_it_is():
    """A model of S seeds (lnbook.seeds.stack) holds one gain per member in lnbook.seeds.Norm,
    which the kernels do not take: fuse_norms swaps nothing, fuses no add, changes no result."""
    import copy

    from lnbook import seeds

    model, _ = _models(dict(norm="layernorm"), ())
    stacked = seeds.stack([model, model])
    fused = copy.deepcopy(stacked)
    assert fuse_norms(fused) == 0 and fuse_residual_adds(fused) == 0 and type(fused) is type(stacked)
    idx = torch.randint(11, (2, 3, 16)).to(DEVICE)
    mask = torch.ones(2, 3, 15, dtype=torch.bool, device=DEVICE)
    mask[:, 1, 10:] = False
    (want, _), (got, _) = (_loss_and_grads(m, idx, mask) for m in (stacked, fused))
    assert got.shape == (2,) and torch.equal(got, want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU autocast")
def test_under_autocast_a_residual_of_a_lower_dtype_is_added_by_torch():
    """Under autocast the sublayers return bfloat16 while the residual stream stays float32:
    the kernel takes two tensors of one dtype, so those adds run as torch's + (which promotes)."""
    _, fused = _models(dict(norm="layernorm"))
    fuse_norms(fused["norms"], residual=False), fuse_norms(fused["adds"])
    idx = torch.randint(11, (3, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = (m.loss(idx[:, :-1], idx[:, 1:]) for m in (fused["norms"], fused["adds"]))
    assert torch.equal(got, want)


def test_fused_adds_save_one_read_of_the_sum_each_in_the_forward_pass():
    """In bench.count_bytes' model of memory traffic, an add then a norm read the sum the add
    wrote; the fused kernel does not. Attention-only fusion (each block called as a block)
    fuses 2 adds of a 2-block Pre-LN TinyGPT, full fusion 4: each step saves 2 reads of a
    (B, T, d) float32 tensor, and writes the same bytes."""
    from lnbook import bench

    _, models = _models(dict(norm="layernorm"), ("none", "attention", "all"))
    for model in models.values():
        assert fuse_norms(model, residual=False) == 5
    assert fuse_residual_adds(models["attention"].blocks) == 2  # the blocks alone: TinyGPT's own forward calls them
    assert fuse_residual_adds(models["all"]) == 4
    b, t, d = 3, 16, 32
    idx = torch.randint(11, (b, t), device=DEVICE)
    with torch.no_grad():
        traffic = {name: bench.count_bytes(lambda m=model: m(idx)) for name, model in models.items()}
        torch.testing.assert_close(models["all"](idx), models["none"](idx), rtol=1e-6, atol=1e-6)
    stream = b * t * d * 4
    assert traffic["none"]["read"] - traffic["attention"]["read"] == 2 * stream
    assert traffic["attention"]["read"] - traffic["all"]["read"] == 2 * stream
    assert traffic["none"]["written"] == traffic["attention"]["written"] == traffic["all"]["written"]


def test_a_tinyvit_fuses_the_attention_add_of_each_block():
    """fuse_residual_adds fuses any model's Pre-LN blocks; a TinyViT keeps its own forward, so
    each block's MLP add stays a plain add."""
    from lnbook.kernels.modules import FusedAddBlock
    from lnbook.transformer import TinyViT

    torch.manual_seed(0)
    model = TinyViT(n_layer=3).to(DEVICE)
    fused = TinyViT(n_layer=3).to(DEVICE)
    fused.load_state_dict(model.state_dict())
    assert fuse_norms(fused) == 3 * 2 + 1 and fuse_residual_adds(fused) == 3
    assert all(type(b) is FusedAddBlock for b in fused.blocks)
    images = torch.randn(4, 8, 8, device=DEVICE)
    torch.testing.assert_close(fused(images), model(images), rtol=1e-5, atol=1e-5)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)")


@gpu
def test_under_cuda_autocast_the_fused_layer_norm_returns_float32_like_nn_layer_norm():
    torch.manual_seed(0)
    ref = torch.nn.LayerNorm(768).cuda()
    fused = FusedLayerNorm(768).cuda()
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(64, 768, device="cuda").bfloat16()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want, got = ref(x), fused(x)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@gpu
def test_torch_compile_with_inductor_on_the_gpu():
    from lnbook.transformer import GPTConfig, TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(11, 16, n_layer=2, n_head=2, d_model=64)).cuda()
    fused = TinyGPT(model.cfg).cuda()
    fused.load_state_dict(model.state_dict())
    fuse_norms(fused)
    idx = torch.randint(11, (3, 16), device="cuda")
    torch._dynamo.reset()
    loss = torch.compile(fused.loss, fullgraph=True)(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(loss, model.loss(idx[:, :-1], idx[:, 1:]), rtol=1e-5, atol=1e-5)


def test_the_notebook_runner_executes_notebooks_and_reports_failures(tmp_path):
    """benchmarks/run_notebooks.py, the last step of make gpu-check, on two tiny notebooks."""
    import csv
    import os
    import subprocess
    import sys

    import nbformat

    for name, code in (("good.ipynb", "x = 1 + 1\nprint(x)"), ("bad.ipynb", "raise ValueError('planted')")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / name)
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "run_notebooks.py")
    result = subprocess.run([sys.executable, script, str(tmp_path / "good.ipynb"), str(tmp_path / "bad.ipynb"), "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    (csv_path,) = tmp_path.glob("notebooks-*.csv")
    rows = {r["notebook"]: r for r in csv.DictReader(open(csv_path))}
    assert rows["good.ipynb"]["status"] == "ok" and rows["bad.ipynb"]["status"] == "failed"
    assert "planted" in rows["bad.ipynb"]["error"] and rows["good.ipynb"]["torch"] == torch.__version__


def test_an_unused_sum_of_the_fused_add_costs_no_gradient_traffic():
    """Only y is used (the last block's add into the final norm): autograd hands the backward no
    zero gradient for the sum, so nothing of the sum's size is written or read for it."""
    from lnbook import bench
    from lnbook.kernels import add_layer_norm

    m, n = 16, 64
    x, r, dy, ds = (torch.randn(m, n, device=DEVICE) for _ in range(4))
    w, b = (torch.randn(n, device=DEVICE, requires_grad=True) for _ in range(2))

    def backward_ops(use_sum):
        leaves = [t.clone().requires_grad_() for t in (x, r)]
        y, s = add_layer_norm(*leaves, w, b)
        return bench.list_op_traffic(lambda: torch.autograd.backward([y, s] if use_sum else [y], [dy, ds] if use_sum else [dy]))

    alone, both = backward_ops(False), backward_ops(True)
    read = {k: sum(op.read for op in ops if op.name == "norm_backward") for k, ops in (("alone", alone), ("both", both))}
    assert read["both"] - read["alone"] == m * n * 4  # the sum's gradient, read only when it exists
    assert not [op for op in alone if op.name.startswith("zeros") and op.written >= m * n * 4]
