"""lnbook.transformer: TinyGPT (causality, padding, pre and post norms, configs) and TinyViT."""

import pytest
import torch

from lnbook import data, train, transformer, utils
import math

from lnbook.norms import DyT, RMSNorm
from lnbook.transformer import PRESETS, PUBLISHED_INIT, Block, GPTConfig, TinyGPT, TinyViT, block_grad_norms, preset

VOCAB = 11


def config(**kw):
    return GPTConfig(**{"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "n_head": 2, "d_model": 16} | kw)


def model(**kw):
    torch.manual_seed(0)
    return TinyGPT(config(**kw)).double()


# ---------------------------------------------------------------- TinyGPT
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "dyt", "none"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_a_future_token_never_changes_an_earlier_output(norm, position):
    m = model(norm=norm, norm_position=position)
    idx = torch.randint(VOCAB, (2, 12))
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % VOCAB
    a, b = m(idx), m(changed)
    assert a.shape == (2, 12, VOCAB)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-12)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-6


def test_batchnorm_over_batch_and_time_leaks_the_future_in_training():
    m = model(norm="batchnorm")
    idx = torch.randint(VOCAB, (4, 12))
    changed = idx.clone()
    changed[:, 11] = (changed[:, 11] + 1) % VOCAB
    assert (m(idx)[:, :11] - m(changed)[:, :11]).abs().max() > 1e-6  # the statistics see step 11


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_a_sequence_gets_the_same_logits_alone_and_in_a_padded_batch(norm, position):
    m = model(norm=norm, norm_position=position)
    seqs = [torch.randint(VOCAB, (n,)) for n in (5, 12, 9)]
    idx = torch.zeros(3, 12, dtype=torch.int64)
    mask = torch.zeros(3, 12, dtype=torch.bool)
    for i, s in enumerate(seqs):
        idx[i, : len(s)], mask[i, : len(s)] = s, True
    idx[0, 5:] = 3  # padding holds arbitrary tokens
    batched = m(idx, mask)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(batched[i, : len(s)], m(s[None])[0], rtol=0, atol=1e-6)


def test_pre_and_post_wiring_is_what_the_names_say():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for position in ("pre", "post"):
        block = Block(config(norm_position=position)).double()
        n1, n2 = block.norm1.norm, block.norm2.norm
        attn = lambda z: block.attn(z, None)  # noqa: E731
        if position == "pre":
            h = x + attn(n1(x))
            expected = h + block.mlp(n2(h))
        else:
            h = n1(x + attn(x))
            expected = n2(h + block.mlp(h))
        torch.testing.assert_close(block(x), expected, rtol=0, atol=0)
        if position == "post":  # every block output is normalized: unit variance per token
            torch.testing.assert_close(block(x).var(-1, unbiased=False), torch.ones(2, 5, dtype=torch.float64), rtol=1e-4, atol=1e-4)


def test_final_norm_head_tying_generate_and_grad_norms():
    m = model(final_norm=False)
    assert isinstance(m.norm_f.norm, torch.nn.Identity) and isinstance(model().norm_f.norm, torch.nn.LayerNorm)
    assert m.head.weight is m.tok.weight
    out = m.generate(torch.zeros(2, 3, dtype=torch.int64), 20, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 23) and int(out.max()) < VOCAB
    idx = torch.randint(VOCAB, (4, 10))
    norms = block_grad_norms(m, idx, torch.roll(idx, -1, 1))
    assert len(norms) == 2 and all(n > 0 for n in norms)


@pytest.mark.parametrize(
    "kw, error, match",
    [
        ({"d_model": 10, "n_head": 3}, ValueError, "divisible by n_head"),
        ({"norm": "groupnorm"}, ValueError, "norm must be one of"),
        ({"norm_position": "middle"}, ValueError, "norm_position must be one of"),
        ({"n_layer": 0}, ValueError, "n_layer must be a positive int"),
        ({"dropout": 1.0}, ValueError, "dropout must be a number in"),
        ({"final_norm": "yes"}, ValueError, "norm must be one of"),
        ({"final_norm": 1}, TypeError, "final_norm must be True, False or a norm name"),
        ({"dyt_alpha": (0.5, 0.5)}, ValueError, "dyt_alpha must be one number or three"),
        ({"dyt_alpha": -1.0}, ValueError, "dyt_alpha must be a positive number"),
        ({"embed_scale": 1}, TypeError, "embed_scale must be a bool"),
        ({"embed_norm": "yes"}, TypeError, "embed_norm must be a bool"),
        ({"init": "kaiming"}, ValueError, "init must be one of"),
        ({"bias": 0}, TypeError, "bias must be a bool"),
    ],
)
def test_bad_configs_raise(kw, error, match):
    with pytest.raises(error, match=match):
        config(**kw)


def test_bad_model_input_raises():
    m = model()
    with pytest.raises(ValueError, match="sequence length must be in 1..block_size=16"):
        m(torch.zeros(1, 17, dtype=torch.int64))
    with pytest.raises(ValueError, match="idx must be an int64 tensor"):
        m(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        m(torch.zeros(1, 4, dtype=torch.int64), torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="cfg must be a GPTConfig"):
        TinyGPT({"vocab_size": 3})


def test_without_the_causal_mask_every_token_sees_every_other():
    cfg = dict(vocab_size=10, block_size=6, n_layer=1, n_head=2, d_model=8)
    x = torch.randn(2, 6, 8)
    later = x.clone()
    later[:, -1] += torch.randn(2, 8)  # change only the last token
    for causal, first_moves in ((True, False), (False, True)):
        torch.manual_seed(0)
        block = Block(GPTConfig(**cfg, causal=causal))
        moved = (block(x)[:, 0] - block(later)[:, 0]).abs().max().item()
        assert (moved > 1e-3) == first_moves, (causal, moved)
    with pytest.raises(TypeError, match="causal must be a bool"):
        GPTConfig(**cfg, causal=1)


def _block_wiring(m: TinyGPT) -> tuple[type, str, type, bool, bool]:
    """(norm class in the blocks, position, final norm class, any bias anywhere, causal),
    read from the built model, and the position checked against the block's arithmetic."""
    block = m.blocks[0]
    x = torch.randn(2, 5, m.cfg.d_model, dtype=torch.float64)
    n1, n2, attn = block.norm1.norm, block.norm2.norm, (lambda z: block.attn(z, None))
    h = x + attn(n1(x))
    pre = h + block.mlp(n2(h))
    h = n1(x + attn(x))
    post = n2(h + block.mlp(h))
    out = block(x)
    position = "pre" if torch.equal(out, pre) else "post" if torch.equal(out, post) else "?"
    has_bias = any(name.endswith("bias") and p is not None for name, p in m.named_parameters())
    return type(n1), position, type(m.norm_f.norm), has_bias, m.blocks[0].attn.causal


@pytest.mark.parametrize(
    "name, wiring",
    [  # the chapter 06 table: norm, position, final norm, biases, causal attention
        ("transformer", (torch.nn.LayerNorm, "post", torch.nn.Identity, True, True)),
        ("bert", (torch.nn.LayerNorm, "post", torch.nn.Identity, True, False)),  # and the embedding norm, below
        ("gpt2", (torch.nn.LayerNorm, "pre", torch.nn.LayerNorm, True, True)),
        ("t5", (RMSNorm, "pre", RMSNorm, False, True)),
        ("llama", (RMSNorm, "pre", RMSNorm, False, True)),
    ],
)
def test_presets_build_the_famous_models_norm_wiring(name, wiring):
    torch.manual_seed(0)
    m = TinyGPT(preset(name, VOCAB, 16, n_layer=2, n_head=2, d_model=16)).double()
    assert _block_wiring(m) == wiring
    if name in ("t5", "llama"):  # RMSNorm: no mean subtraction, a gain and no bias
        n = m.blocks[0].norm1.norm
        x = torch.randn(3, 16, dtype=torch.float64) + 5.0
        torch.testing.assert_close(n(x), x / x.pow(2).mean(-1, keepdim=True).add(n.eps).sqrt(), rtol=1e-12, atol=1e-12)
        assert [k for k, _ in n.named_parameters()] == ["weight"]
    assert m(torch.randint(VOCAB, (2, 7))).shape == (2, 7, VOCAB)


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_has_its_models_embedding_norm_and_initialization(name):
    """BERT normalizes the summed embeddings (its embedding LayerNorm) and initializes every weight
    truncated normal at 0.02 with no depth scaling; the others have no embedding norm; a preset's
    init is its model's own where PUBLISHED_INIT names one of ours, and GPT-2's otherwise."""
    torch.manual_seed(0)
    cfg = preset(name, 50, 16, n_layer=8, n_head=4, d_model=64)
    m = TinyGPT(cfg)
    assert hasattr(m, "norm_e") == (name == "bert")
    assert cfg.init == (PUBLISHED_INIT[name] or ("xavier" if name == "transformer" else "gpt2"))
    assert (m.head.weight is m.tok.weight) == (name != "llama")  # LLaMA's output head is its own
    proj = torch.cat([b.attn.proj.weight.flatten() for b in m.blocks])
    std = {"bert": 0.02 * 0.8796, "gpt2": 0.02 / math.sqrt(16), "xavier": math.sqrt(2 / 128)}[cfg.init]
    assert abs(proj.std().item() / std - 1) < 0.05  # truncated at 2 std: 0.88 of the untruncated std
    if name == "bert":
        assert isinstance(m.norm_e.norm, torch.nn.LayerNorm)
        weights = [p for n, p in m.named_parameters() if p.ndim == 2]
        assert all(p.abs().max().item() <= 0.04 for p in weights)  # cut at two standard deviations
        x = m.tok(torch.arange(5)) + m.pos(torch.arange(5))
        seen = []
        hook = m.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
        m(torch.arange(5)[None])
        hook.remove()
        torch.testing.assert_close(seen[0][0], torch.nn.functional.layer_norm(x, (64,), m.norm_e.norm.weight, m.norm_e.norm.bias))


def test_final_norm_by_name_dyt_alphas_per_site_and_the_embedding_scale():
    m = model(norm="dyt", final_norm="layernorm", dyt_alpha=(0.8, 0.2, 0.3), bias=False, embed_scale=True)
    assert isinstance(m.norm_f.norm, torch.nn.LayerNorm) and m.norm_f.norm.bias is None
    assert [(b.norm1.norm.alpha.item(), b.norm2.norm.alpha.item()) for b in m.blocks] == [pytest.approx((0.8, 0.2))] * 2
    assert all(b.norm1.norm.bias is None for b in m.blocks)  # bias=False: DyT without its bias, as Zhu et al.'s LLaMA
    assert m.embed_scale.item() == 4.0  # sqrt(d_model = 16)
    idx = torch.randint(VOCAB, (2, 5))
    seen = []
    hook = m.blocks[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    m(idx)
    hook.remove()
    torch.testing.assert_close(seen[0], 4.0 * m.tok(idx) + m.pos(torch.arange(5)))
    final_dyt = model(norm="layernorm", final_norm="dyt", dyt_alpha=(0.5, 0.5, 35.0))
    assert isinstance(final_dyt.norm_f.norm, DyT) and final_dyt.norm_f.norm.alpha.item() == pytest.approx(35.0)
    assert isinstance(final_dyt.blocks[0].norm1.norm, torch.nn.LayerNorm)
    assert isinstance(model(final_norm=False).norm_f.norm, torch.nn.Identity)


def test_preset_overrides_and_rejects_unknown_names():
    assert set(PRESETS) == {"transformer", "bert", "gpt2", "t5", "llama"}
    assert preset("gpt2", VOCAB, 16, norm_position="post").norm_position == "post"
    with pytest.raises(ValueError, match="name must be one of"):
        preset("gpt5", VOCAB, 16)


def test_init_gpt2_scales_residual_projections_and_xavier_does_not():
    cfg = dict(vocab_size=50, block_size=8, n_layer=8, n_head=4, d_model=64)
    torch.manual_seed(0)
    gpt2 = TinyGPT(GPTConfig(**cfg, init="gpt2"))
    torch.manual_seed(0)
    xavier = TinyGPT(GPTConfig(**cfg, init="xavier"))
    d, depth = 64, 8
    for m, expected in (
        (gpt2, {"attn.qkv": 0.02, "attn.proj": 0.02 / math.sqrt(2 * depth), "mlp.0": 0.02, "mlp.2": 0.02 / math.sqrt(2 * depth)}),
        (xavier, {"attn.qkv": math.sqrt(2 / (2 * d)), "attn.proj": math.sqrt(2 / (2 * d)),
                  "mlp.0": math.sqrt(2 / (5 * d)), "mlp.2": math.sqrt(2 / (5 * d))}),
    ):
        for key, std in expected.items():
            w = torch.cat([b.get_submodule(key).weight.flatten() for b in m.blocks])
            assert abs(w.std().item() / std - 1) < 0.03, (m.cfg.init, key, w.std().item(), std)
        assert all(b.get_submodule("mlp.0").bias.detach().abs().max().item() == 0 for b in m.blocks)
    assert abs(gpt2.tok.weight.std().item() / 0.02 - 1) < 0.03
    assert abs(xavier.tok.weight.std().item() * math.sqrt(d) - 1) < 0.03
    # query, key and value are each Xavier over d x d: their bounds are those of a square matrix
    assert xavier.blocks[0].attn.qkv.weight.abs().max() <= math.sqrt(6 / (2 * d)) + 1e-6
    assert xavier.blocks[0].attn.qkv.weight.abs().max() > math.sqrt(6 / (4 * d))


def test_ffn_out_grad_norms_are_the_mlp_output_weights():
    m = model()
    idx = torch.randint(VOCAB, (4, 10))
    got = block_grad_norms(m, idx, torch.roll(idx, -1, 1), part="ffn_out")
    assert got == pytest.approx([b.mlp[2].weight.grad.norm().item() for b in m.blocks], rel=1e-6)  # norms summed in another order
    assert all(a < b for a, b in zip(got, block_grad_norms(m, idx, torch.roll(idx, -1, 1))))
    with pytest.raises(ValueError, match="part must be one of"):
        block_grad_norms(m, idx, idx, part="ffn_in")


# ---------------------------------------------------------------- TinyViT
def test_vit_cuts_patches_in_reading_order_and_checks_its_input():
    vit = TinyViT(image_size=8, patch_size=4)
    images = torch.arange(2 * 64, dtype=torch.float32).reshape(2, 8, 8)
    patches = vit.patches(images)
    assert patches.shape == (2, 4, 16)
    assert torch.equal(patches[0, 1], images[0, :4, 4:].reshape(16))  # top right
    assert torch.equal(patches[1, 2], images[1, 4:, :4].reshape(16))  # bottom left
    assert vit(images).shape == (2, 10)
    with pytest.raises(ValueError, match=r"images must be a tensor of shape \(B, 8, 8\)"):
        vit(images.reshape(2, 64))
    with pytest.raises(ValueError, match=r"patch_size \(3\) must divide image_size \(8\)"):
        TinyViT(patch_size=3)


@pytest.mark.parametrize("norm", ["layernorm", "batchnorm"])
def test_vit_batch_independence_in_training_depends_on_the_norm(norm):
    torch.manual_seed(0)
    vit = TinyViT(norm=norm).train()
    images = torch.rand(6, 8, 8)
    alone = vit(images[:3])
    together = vit(torch.cat([images[:3], torch.rand(3, 8, 8) * 5]))[:3]
    gap = (alone - together).abs().max().item()
    assert (gap < 1e-5) if norm == "layernorm" else (gap > 1e-2)


def test_vit_learns_digits():
    train_set, test_set = data.digits_sequences("row")
    torch.manual_seed(0)
    vit = TinyViT(d_model=16, n_layer=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is several times faster beside another test process
    try:
        history = train.fit(vit, train_set, test_set, epochs=4, lr=3e-3, batch_size=32, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert history.test_acc[-1] > 0.5  # chance is 0.1


# ---------------------------------------------------------------- stability settings (chapter 07)
def test_qk_norm_normalizes_each_heads_queries_and_keys():
    m = model(qk_norm="layernorm")
    attn = m.blocks[0].attn
    assert isinstance(attn.q_norm.norm, torch.nn.LayerNorm) and attn.q_norm.norm.normalized_shape == (8,)
    assert not hasattr(model().blocks[0].attn, "q_norm")  # the default builds no extra module
    assert isinstance(model(qk_norm="rmsnorm").blocks[0].attn.k_norm.norm, RMSNorm)
    seen = {}
    attn.q_norm.register_forward_hook(lambda mod, args, out: seen.update(q_in=args[0], q_out=out))
    idx = torch.randint(VOCAB, (2, 12))
    m(idx)
    assert seen["q_in"].shape == (2, 2, 12, 8)  # (B, heads, T, head dim)
    q = seen["q_in"]  # LayerNorm over the last (head) dimension, weight 1 and bias 0 at init
    by_hand = (q - q.mean(-1, keepdim=True)) / torch.sqrt(q.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(seen["q_out"], by_hand, atol=1e-10, rtol=0)
    # scaling the query-key weights does not change the output with QK-norm, and does without
    for qk, changes in (("layernorm", False), ("none", True)):
        a = model(qk_norm=qk)
        before = a(idx)
        with torch.no_grad():
            for block in a.blocks:
                block.attn.qkv.weight[:32].mul_(10.0)
                if block.attn.qkv.bias is not None:
                    block.attn.qkv.bias[:32].mul_(10.0)
        moved = (a(idx) - before).abs().max().item()
        assert (moved > 1e-3) == changes, (qk, moved)


def test_recorded_attention_is_the_same_attention_and_its_statistics_are_right():
    idx = torch.randint(VOCAB, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    for kw in ({}, {"qk_norm": "layernorm"}, {"causal": False}):
        m = model(**kw)
        plain = m(idx, mask)
        for block in m.blocks:
            block.attn.record_logits = True
        torch.testing.assert_close(m(idx, mask), plain, rtol=0, atol=1e-12)
        torch.testing.assert_close(m(idx), model(**kw)(idx), rtol=0, atol=1e-12)
    # by hand, for one layer: the largest logit, and the lowest head's mean entropy of the causal weights
    m = model()
    attn = m.blocks[0].attn
    attn.record_logits = True
    x = 100 * torch.randn(2, 5, 16, dtype=torch.float64)  # large enough that the heads' attention is far from uniform
    attn(x, None)
    q, k, _ = (z.view(2, 5, 2, 8).transpose(1, 2) for z in attn.qkv(x).split(16, dim=2))
    logits = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    p = logits.softmax(-1)
    per_head = -(p * p.clamp_min(1e-300).log()).sum(-1).mean((0, 2))  # (heads,): over the batch and the queries
    entropy = per_head.min()
    assert per_head.max() - per_head.min() > 1e-3  # the heads differ, so the minimum is not the mean
    assert attn.logit_max == pytest.approx(logits.max().item(), abs=1e-12)
    assert attn.entropy == pytest.approx(entropy.item(), abs=1e-12)
    assert 0 < attn.entropy < math.log(5)  # the first query sees one token: entropy 0 there


def test_deepnorm_up_weights_the_residual_and_scales_the_init_down():
    layers = 6
    alpha, beta = (2 * layers) ** 0.25, (8 * layers) ** -0.25
    torch.manual_seed(0)
    plain = TinyGPT(config(n_layer=layers, norm_position="post", init="xavier"))
    torch.manual_seed(0)
    deep = TinyGPT(config(n_layer=layers, norm_position="post", init="xavier", deepnorm=True))
    for a, b in zip(plain.blocks, deep.blocks):
        assert b.alpha == pytest.approx(alpha) and a.alpha == 1.0
        torch.testing.assert_close(b.attn.qkv.weight[:32], a.attn.qkv.weight[:32], rtol=0, atol=0)  # queries, keys as they were
        torch.testing.assert_close(b.attn.qkv.weight[32:], beta * a.attn.qkv.weight[32:], rtol=1e-6, atol=0)  # values
        for wb, wa in ((b.attn.proj.weight, a.attn.proj.weight), (b.mlp[0].weight, a.mlp[0].weight), (b.mlp[2].weight, a.mlp[2].weight)):
            torch.testing.assert_close(wb, beta * wa, rtol=1e-6, atol=0)
    # the block computes norm(alpha * x + f(x)) for each sublayer
    block = deep.blocks[0].double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    h = block.norm1(alpha * x + block.attn(x, None), None)
    torch.testing.assert_close(block(x), block.norm2(alpha * h + block.mlp(h), None), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "kw, error, match",
    [
        ({"qk_norm": "dyt"}, ValueError, "qk_norm must be one of"),
        ({"deepnorm": 1}, ValueError, "deepnorm must be one of"),
        ({"deepnorm": "gamma"}, ValueError, "deepnorm must be one of"),
        ({"deepnorm": True}, ValueError, "deepnorm=True needs norm_position='post'"),
        ({"deepnorm": "beta", "norm_position": "sandwich"}, ValueError, "deepnorm='beta' needs norm_position='post'"),
        ({"normformer": 1}, TypeError, "normformer must be a bool"),
        ({"normformer": True, "norm_position": "post"}, ValueError, "normformer=True needs norm_position='pre'"),
        ({"norm_position": "middle"}, ValueError, "norm_position must be one of"),
    ],
)
def test_bad_stability_settings_raise(kw, error, match):
    with pytest.raises(error, match=match):
        config(**kw)


def test_the_default_model_is_unchanged_by_the_new_settings():
    """Same parameters drawn from the same seed, same outputs: chapters 06, 08 and 09 reproduce."""
    torch.manual_seed(0)
    a = TinyGPT(config())
    torch.manual_seed(0)
    b = TinyGPT(config(qk_norm="none", deepnorm=False))
    assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    torch.manual_seed(0)
    TinyGPT(config())
    after_default = torch.rand(3)
    torch.manual_seed(0)
    TinyGPT(config(qk_norm="layernorm"))
    assert torch.equal(torch.rand(3), after_default)  # QK-norm's parameters draw nothing
    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q)


def test_deepnorm_alpha_or_beta_alone_is_one_half_of_deepnorm():
    torch.manual_seed(0)
    full = TinyGPT(config(n_layer=6, norm_position="post", init="xavier", deepnorm=True))
    for part in ("alpha", "beta"):
        torch.manual_seed(0)
        plain = TinyGPT(config(n_layer=6, norm_position="post", init="xavier"))
        torch.manual_seed(0)
        half = TinyGPT(config(n_layer=6, norm_position="post", init="xavier", deepnorm=part))
        assert half.blocks[0].alpha == (full.blocks[0].alpha if part == "alpha" else 1.0)
        weights = (half.blocks[0].mlp[2].weight, (full if part == "beta" else plain).blocks[0].mlp[2].weight)
        torch.testing.assert_close(*weights, rtol=0, atol=0)


def test_sandwich_ln_normalizes_each_sublayer_output_before_the_residual_sum():
    m = model(norm_position="sandwich")
    block = m.blocks[0]
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    h = x + block.norm1_out(block.attn(block.norm1(x), None))
    torch.testing.assert_close(block(x), h + block.norm2_out(block.mlp(block.norm2(h))), rtol=0, atol=1e-12)
    assert not hasattr(model().blocks[0], "norm1_out")  # plain Pre-LN has no extra norms


def test_normformer_adds_head_scales_and_two_norms_to_pre_ln():
    m = model(normformer=True)
    block = m.blocks[0]
    assert block.attn.head_scale.shape == (2,) and bool((block.attn.head_scale == 1).all())
    assert block.mlp[1][1].norm.normalized_shape == (64,) and not hasattr(block, "norm2_out")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        block.attn.head_scale.copy_(torch.tensor([2.0, 0.0]))
    # the scaled heads' output by hand: head 0 doubled, head 1 silenced, then the output projection
    attn = block.attn
    q, k, v = (z.view(2, 5, 2, 8).transpose(1, 2) for z in attn.qkv(x).split(16, dim=2))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * torch.tensor([2.0, 0.0]).view(2, 1, 1)
    torch.testing.assert_close(attn(x, None), attn.proj(y.transpose(1, 2).flatten(2)), rtol=0, atol=1e-12)
    h = x + block.norm1_out(attn(block.norm1(x), None))
    hidden = block.mlp[1][1](block.mlp[1][0](block.mlp[0](block.norm2(h))))
    torch.testing.assert_close(block(x), h + block.mlp[2](hidden), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kw", [{"norm_position": "sandwich"}, {"normformer": True}, {"deepnorm": "alpha", "norm_position": "post"}])
def test_the_new_block_wirings_stay_causal_and_stack(kw):
    from lnbook import seeds

    m = model(**kw)
    idx = torch.randint(VOCAB, (2, 12))
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % VOCAB
    torch.testing.assert_close(m(idx)[:, :7], m(changed)[:, :7], rtol=0, atol=1e-12)
    members = [model(**kw) for _ in range(2)]
    with torch.no_grad():
        for i, member in enumerate(members):  # members that differ, head scales included
            for p in member.parameters():
                p.add_(0.01 * (i + 1) * torch.randn_like(p))
    stacked = seeds.stack(members)
    out = stacked(torch.stack([idx, changed]))
    for i, member in enumerate(members):
        torch.testing.assert_close(out[i], member((idx, changed)[i]), rtol=1e-9, atol=1e-9)


def test_precise_bn_sets_running_statistics_to_the_average_over_the_training_batches():
    from lnbook import seeds
    from lnbook.norms import MaskedBatchNorm1d
    from lnbook.transformer import precise_bn

    torch.manual_seed(0)
    images = torch.randn(40, 8, 8) * 2 + 1
    model = transformer.TinyViT(patch_size=4, norm="batchnorm").eval()
    first = next(m for m in model.modules() if isinstance(m, MaskedBatchNorm1d))
    seen = []
    hook = first.register_forward_hook(lambda m, i, o: seen.append(i[0].detach().reshape(-1, i[0].shape[-1])))
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "tracked" not in k}
    assert precise_bn(model, images, batch_size=16) == 5  # 2 blocks x 2 norms + the final norm
    hook.remove()
    assert len(seen) == 3 and not model.training and first.momentum == 0.1  # batches of 16, 16, 8; all restored
    torch.testing.assert_close(first.running_mean, torch.stack([s.mean(0) for s in seen]).mean(0))
    torch.testing.assert_close(first.running_var, torch.stack([s.var(0, correction=1) for s in seen]).mean(0))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())  # the weights did not move
    members = []
    for s in range(2):
        utils.seed_everything(s)
        members.append(transformer.TinyViT(patch_size=4, norm="batchnorm"))
    stacked = seeds.stack(members)
    precise_bn(stacked, images, batch_size=16)
    for member in members:
        precise_bn(member, images, batch_size=16)
    x = images[:5]
    torch.testing.assert_close(stacked.eval()(x.expand(2, *x.shape)), torch.stack([m.eval()(x) for m in members]),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no batch norm"):
        precise_bn(transformer.TinyViT(patch_size=4), images)


def test_fit_vit_trains_each_member_at_its_rate_on_its_seed_s_batches():
    from lnbook import seeds
    from lnbook.transformer import fit_vit

    g = torch.Generator().manual_seed(0)
    y = torch.arange(96) % 3
    x = torch.randn(96, 8, 8, generator=g) * 0.3 + y.view(-1, 1, 1).float()  # three easy classes
    val = (x[:30], y[:30])

    def stack(lrs):
        members = []
        for s in range(len(lrs)):
            utils.seed_everything(0)
            members.append(transformer.TinyViT(patch_size=4, n_classes=3, norm="layernorm", n_layer=1, d_model=16))
        return seeds.stack(members)

    model = stack([1e-3, 1e-2])
    hist = fit_vit(model, (x, y), val, steps=12, lr=[1e-3, 1e-2], seeds=[0, 0], batch_size=16, warmup=3, eval_every=6)
    assert [h.eval_steps for h in hist] == [[6, 12], [6, 12]] and len(hist[0].step_loss) == 12
    assert hist[0].step_loss[0] == pytest.approx(hist[1].step_loss[0])  # same weights, same first batch
    assert hist[1].step_loss[-1] < hist[0].step_loss[-1]  # the larger rate learns faster here
    alone = fit_vit(stack([1e-2]), (x, y), val, steps=12, lr=1e-2, seeds=[0], batch_size=16, warmup=3, eval_every=6)
    assert alone[0].step_loss == pytest.approx(hist[1].step_loss, rel=1e-4)  # a member trains as it would alone
    wild = fit_vit(stack([1e-3, 1e6]), (x, y), val, steps=30, lr=[1e-3, 1e6], seeds=[0, 0], batch_size=16, eval_every=10)
    assert not wild[0].diverged and len(wild[0].step_loss) == 30
    with pytest.raises(ValueError, match="warmup"):
        fit_vit(model, (x, y), val, steps=12, lr=1e-3, seeds=[0, 0], warmup=12)
    with pytest.raises(TypeError, match="train"):
        fit_vit(model, x, val, steps=12, lr=1e-3, seeds=[0, 0])
