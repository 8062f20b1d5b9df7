"""Every norm of :data:`lnbook.norms.NORMS`, and :mod:`lnbook.kernels`' fused norms, under the
uses a torch module supports: backward, double backward (a gradient penalty), ``torch.func``
(``vmap``, ``jacrev``, ``jacfwd``, model ensembling, per-sample gradients), forward-mode AD,
``torch.compile(fullgraph=True)`` and ``torch.export``.

Each use is checked against a computation that does not go through it (a Python loop, reverse
mode, finite differences), and, where torch has a module of the same kind, against that module
with the same parameters, to float64 precision. Batch norms normalize with their batch in
training, so under ``torch.func``, as torch's own BatchNorm, they are used in eval mode; their
gradients, first and second, are checked in training mode.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from torch import nn
from torch.autograd import gradcheck, gradgradcheck
from torch.func import functional_call, grad, jacfwd, jacrev, jvp, stack_module_state, vmap

from lnbook.norms import NORMS, norm_layer

F = 8  # features
NAMES = [name for name, kind in NORMS.items() if kind.over not in ("nothing", "weights")]
SEQUENCE = ("batch_per_step",)  # takes (B, T, F)
SURROGATE = ("detach", "adanorm")  # their backward is by design not their forward's derivative
TOL = 1e-10


def build(name: str, seed: int = 0) -> nn.Module:
    """The norm over F features, float64, its parameters moved off their initial values
    (a gain of 1 and a bias of 0 would hide a wrong gradient)."""
    norm = norm_layer(name, F, max_steps=3).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        for name_, b in norm.named_buffers():
            if name_.startswith("running_"):  # eval mode then normalizes with informative statistics
                b.add_(0.2 * torch.rand(b.shape, generator=gen, dtype=b.dtype))
    return norm


def twin(name: str, norm: nn.Module) -> nn.Module | None:
    """torch's module of the same kind with the same parameters and buffers, or None."""
    makers = {
        "layer": lambda: nn.LayerNorm(F),
        "layer_simple": lambda: nn.LayerNorm(F, elementwise_affine=False),
        "rms": lambda: nn.RMSNorm(F, eps=norm.eps),
        "group4": lambda: nn.GroupNorm(4, F),
        "batch": lambda: nn.BatchNorm1d(F),
        "batch_unmasked": lambda: nn.BatchNorm1d(F),
    }
    if name not in makers:
        return None
    theirs = makers[name]().double()
    theirs.load_state_dict(norm.state_dict())
    return theirs.train(norm.training)


def inputs(name: str, batch: int = 5, seed: int = 1) -> torch.Tensor:
    shape = (batch, 3, F) if name in SEQUENCE else (batch, F)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 + 0.5


def functional_mode(name: str, norm: nn.Module) -> nn.Module:
    """Eval mode for a norm over the batch (as torch's BatchNorm under torch.func), else as is."""
    return norm.eval() if NORMS[name].over in ("batch", "step") else norm


def both(name: str, norm: nn.Module):
    """The module, and torch's twin if there is one."""
    theirs = twin(name, norm)
    return [norm] if theirs is None else [norm, theirs]


@pytest.mark.parametrize("name", NAMES)
def test_first_and_second_derivatives_are_exact(name):
    """gradcheck and gradgradcheck in float64, in training mode, through the input and every
    parameter: the double backward a gradient penalty needs. DetachNorm and AdaNorm treat
    statistics as constants in the backward on purpose, so finite differences cannot check
    them; the gradient-penalty test runs their double backward."""
    if name in SURROGATE:
        pytest.skip(f"{name}'s backward is by design not its forward's derivative")
    norm = build(name)
    params = dict(norm.named_parameters())
    x = inputs(name).requires_grad_()

    def f(x, *values):
        return functional_call(norm, dict(zip(params, values)), (x,))

    args = (x, *(p.detach().requires_grad_() for p in params.values()))
    assert gradcheck(f, args)
    assert gradgradcheck(f, args)


@pytest.mark.parametrize("name", NAMES)
def test_gradient_penalty_matches_torchs_module(name):
    """A WGAN-GP style penalty, ``(|d out / d x| - 1)^2``, and its gradient with respect to
    the input and the parameters: the same as torch's module of the same kind gives."""
    results = []
    for norm in both(name, build(name)):
        x = inputs(name).requires_grad_()
        out = norm(x)
        (g,) = torch.autograd.grad((out * torch.linspace(-1, 1, F, dtype=out.dtype)).sum(), x, create_graph=True)
        penalty = ((g.flatten(1).norm(dim=1) - 1) ** 2).mean()
        results.append([penalty, *torch.autograd.grad(penalty, [x, *norm.parameters()], allow_unused=True)])
    assert all(torch.isfinite(r).all() for r in results[0] if r is not None)
    for theirs in results[1:]:
        for a, b in zip(results[0], theirs):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_inputs_equals_a_loop(name):
    norm = functional_mode(name, build(name))
    xs = torch.stack([inputs(name, seed=s) for s in range(3)])
    expected = torch.stack([norm(x) for x in xs])
    for module in both(name, norm):
        torch.testing.assert_close(vmap(module)(xs), expected, rtol=0, atol=TOL)
        torch.testing.assert_close(vmap(module, in_dims=1, out_dims=1)(xs.transpose(0, 1)), expected.transpose(0, 1),
                                   rtol=0, atol=TOL)


@pytest.mark.parametrize("name", NAMES)
def test_jacrev_and_jacfwd_equal_the_reverse_mode_jacobian(name):
    norm = functional_mode(name, build(name))
    x = inputs(name, batch=3)
    expected = torch.autograd.functional.jacobian(norm, x)
    for module in both(name, norm):
        torch.testing.assert_close(jacrev(module)(x), expected, rtol=0, atol=TOL)
        torch.testing.assert_close(jacfwd(module)(x), expected, rtol=0, atol=TOL)


def jacobian_times(norm: nn.Module, x: torch.Tensor, tangent: torch.Tensor) -> torch.Tensor:
    """J(x) @ tangent from reverse mode, on a copy (a batch norm in training moves its statistics)."""
    jacobian = torch.autograd.functional.jacobian(copy.deepcopy(norm), x).reshape(x.numel(), x.numel())
    return (jacobian @ tangent.reshape(-1)).reshape(x.shape)


@pytest.mark.parametrize("name", NAMES)
def test_forward_mode_ad_equals_the_jacobian_times_the_tangent(name):
    """torch.autograd.forward_ad in training mode, torch.func.jvp in torch.func's mode."""
    x, tangent = inputs(name), inputs(name, seed=2)
    norm = build(name)
    expected = jacobian_times(norm, x, tangent)
    for module in both(name, norm):
        with forward_ad.dual_level():
            out = module(forward_ad.make_dual(x, tangent))
            torch.testing.assert_close(forward_ad.unpack_dual(out).tangent, expected, rtol=0, atol=TOL)
    norm = functional_mode(name, norm)
    expected = jacobian_times(norm, x, tangent)
    for module in both(name, norm):
        torch.testing.assert_close(jvp(module, (x,), (tangent,))[1], expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", NAMES)
def test_ensembling_with_stack_module_state_equals_each_model(name):
    models = [functional_mode(name, build(name, seed=s)) for s in range(3)]
    if not any(True for _ in models[0].named_parameters()):
        pytest.skip(f"{name} has no parameters: its members would be the same model")
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    x = inputs(name)

    def call(p, b, x):
        return functional_call(base, (p, b), (x,))

    out = vmap(call, in_dims=(0, 0, None))(params, buffers, x)
    for i, model in enumerate(models):
        torch.testing.assert_close(out[i], model(x), rtol=0, atol=TOL)


@pytest.mark.parametrize("name", NAMES)
def test_per_sample_gradients_equal_a_loop(name):
    norm = functional_mode(name, build(name))
    params = {k: v.detach().requires_grad_() for k, v in norm.named_parameters()}
    if not params:
        pytest.skip(f"{name} has no parameters")
    x = inputs(name)
    weights = torch.linspace(-1, 1, F, dtype=x.dtype)

    def loss(module, p, sample):
        return (functional_call(module, p, (sample.unsqueeze(0),)) ** 2 * weights).sum()

    expected = [torch.autograd.grad(loss(norm, params, sample), list(params.values())) for sample in x]
    for module in both(name, norm):
        p = {k: v.detach() for k, v in module.named_parameters()}
        per_sample = vmap(grad(lambda p_, sample: loss(module, p_, sample)), in_dims=(None, 0))(p, x)
        for i, grads in enumerate(expected):
            for k, e in zip(params, grads):
                torch.testing.assert_close(per_sample[k][i], e, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", NAMES)
def test_compile_fullgraph_and_export_give_the_eager_output_and_gradient(name):
    norm = build(name).float()
    x = inputs(name).float().requires_grad_()
    eager = norm(x)
    (g_eager,) = torch.autograd.grad(eager.sum(), x)
    compiled = torch.compile(copy.deepcopy(norm), fullgraph=True, backend="aot_eager")(x)
    (g_compiled,) = torch.autograd.grad(compiled.sum(), x)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(g_compiled, g_eager)
    exported = torch.export.export(copy.deepcopy(norm).eval(), (x.detach(),))
    torch.testing.assert_close(exported.module()(x.detach()), copy.deepcopy(norm).eval()(x.detach()))



@pytest.mark.parametrize("name", NAMES)
def test_pickle_state_dict_bfloat16_meta_device_and_an_empty_batch(name):
    norm = build(name).float().eval()
    x = inputs(name).float()
    torch.testing.assert_close(pickle.loads(pickle.dumps(norm))(x), norm(x), rtol=0, atol=0)
    fresh = norm_layer(name, F, max_steps=3).eval()
    fresh.load_state_dict(norm.state_dict())
    torch.testing.assert_close(fresh(x), norm(x), rtol=0, atol=0)
    y16 = copy.deepcopy(norm).bfloat16()(x.bfloat16())
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), norm(x), rtol=0.05, atol=0.05)
    on_meta = copy.deepcopy(norm).to("meta")(x.to("meta"))
    assert on_meta.device.type == "meta" and on_meta.shape == x.shape
    empty = x[:0].requires_grad_()
    out = norm(empty)
    out.sum().backward()
    assert out.shape == empty.shape and empty.grad.shape == empty.shape


@pytest.mark.parametrize("name", NAMES)
def test_torchscript_is_refused_with_the_supported_paths_named(name):
    model = nn.Sequential(nn.Linear(F, F), build(name))
    with pytest.raises(RuntimeError, match=r"does not support TorchScript.*torch\.export\.export.*torch\.compile"):
        torch.jit.script(model)

# lnbook.kernels' fused norms: torch.library custom ops, float32 here (through Triton's
# interpreter on a CPU). vmap has rules of their own; the uses torch cannot give a custom op
# raise an error that names the alternative.


@pytest.fixture(scope="module")
def kernels():
    return pytest.importorskip("lnbook.kernels")


def fused_pair(kernels, rms: bool, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """A fused norm and its reference (torch's LayerNorm, or lnbook's RMSNorm), same parameters."""
    fused = kernels.FusedRMSNorm(F) if rms else kernels.FusedLayerNorm(F)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fused.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    reference = norm_layer("rms", F) if rms else nn.LayerNorm(F)
    reference.load_state_dict(fused.state_dict())
    return fused, reference


KERNEL_TOL = dict(rtol=1e-5, atol=1e-5)  # float32


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_fused_norms_vmap_over_inputs_and_over_ensembled_weights(kernels, rms):
    fused, reference = fused_pair(kernels, rms)
    xs = torch.randn(3, 5, F)
    torch.testing.assert_close(vmap(fused)(xs), reference(xs), **KERNEL_TOL)
    torch.testing.assert_close(vmap(fused, in_dims=1, out_dims=1)(xs), reference(xs), **KERNEL_TOL)
    pairs = [fused_pair(kernels, rms, seed=s) for s in range(3)]
    params, buffers = stack_module_state([member for member, _ in pairs])
    base = copy.deepcopy(pairs[0][0]).to("meta")
    out = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)))(params, buffers, xs)
    for i, (_, member_reference) in enumerate(pairs):
        torch.testing.assert_close(out[i], member_reference(xs[i]), **KERNEL_TOL)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_fused_add_norm_vmaps_with_a_shared_or_a_batched_residual(kernels, rms):
    fused, reference = fused_pair(kernels, rms)
    xs, residual = torch.randn(3, 5, F), torch.randn(5, F)
    for in_dims, r in (((0, None), residual), ((0, 0), torch.randn(3, 5, F))):
        y, total = vmap(fused.add_forward, in_dims=in_dims)(xs, r)
        torch.testing.assert_close(total, xs + r)
        torch.testing.assert_close(y, reference(xs + r), **KERNEL_TOL)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_fused_norms_batched_gradients_equal_reverse_mode_jacobians(kernels, rms):
    """torch.autograd.grad(is_grads_batched=True) runs the backward op under vmap."""
    fused, reference = fused_pair(kernels, rms)
    x = torch.randn(4, F)
    expected = torch.autograd.functional.jacobian(reference, x)
    torch.testing.assert_close(torch.autograd.functional.jacobian(fused, x, vectorize=True), expected, **KERNEL_TOL)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_fused_norms_refuse_what_a_custom_op_cannot_do_and_name_the_alternative(kernels, rms):
    fused, _ = fused_pair(kernels, rms)
    x = torch.randn(4, F, requires_grad=True)
    (g,) = torch.autograd.grad(fused(x).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="no double backward.*lnbook.norms.LayerNorm"):
        g.sum().backward()
    with pytest.raises(RuntimeError, match="no forward-mode AD.*lnbook.norms.LayerNorm"):
        jvp(fused, (x.detach(),), (torch.ones(4, F),))
    with pytest.raises(RuntimeError, match="no forward-mode AD"), forward_ad.dual_level():
        fused(forward_ad.make_dual(x.detach(), torch.ones(4, F)))
    for transform in (grad(lambda x: fused(x).sum()), jacrev(fused), vmap(grad(lambda x: fused(x).sum()))):
        with pytest.raises(RuntimeError, match="gradient transforms.*lnbook.norms.LayerNorm"):
            transform(x.detach())
    with pytest.raises(RuntimeError, match="does not support TorchScript"):
        torch.jit.script(fused)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_fused_norms_export(kernels, rms):
    fused, reference = fused_pair(kernels, rms)
    x = torch.randn(4, F)
    torch.testing.assert_close(torch.export.export(fused, (x,)).module()(x), reference(x), **KERNEL_TOL)
