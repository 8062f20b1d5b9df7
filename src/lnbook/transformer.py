"""Small Transformers whose normalization and its position are settings.

``TinyGPT(GPTConfig(...))`` maps token ids ``(B, T)`` to next-token logits ``(B, T, vocab)``.
Each block is attention then an MLP, each wrapped in a residual connection, with the norm
either before the sublayer (Pre-LN, ``x + f(norm(x))``) or after the residual sum (Post-LN,
``norm(x + f(x))``), or both (Sandwich-LN, ``x + norm(f(norm(x)))``). An optional ``mask (B, T)`` marks the real tokens of a right-padded
batch: padding is never attended to, so it changes no real token's output.
Two settings for stability at high learning rates: ``qk_norm`` normalizes each head's queries
and keys before their dot product (QK-layernorm), and ``deepnorm`` gives Post-LN blocks
DeepNorm's up-weighted residual and down-scaled initialization; ``normformer`` adds
NormFormer's three operations to Pre-LN blocks. Setting an attention layer's
``record_logits`` makes it compute attention explicitly and keep its largest logit and its
entropy (:func:`lnbook.train.fit_lm` does that with ``record_logits=True``).
``TinyViT`` classifies images with the same blocks, without the causal mask, over patches.
:data:`PRESETS` (and :func:`preset`) give the norm wiring of famous models as configs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ._checks import check_bool, check_choice, check_number, check_positive_int, describe
from .norms import EXAMPLE_NORMS, DyT, apply_norm, check_norm, norm_layer
from .progress import progress

NORMS = ("none", "batch", *EXAMPLE_NORMS)  # and chapter 06's spellings "layernorm", "rmsnorm", "batchnorm"
POSITIONS = ("pre", "post", "sandwich")
DEEPNORMS = (False, True, "alpha", "beta")
INITS = ("gpt2", "xavier", "bert")
QK_NORMS = ("none", "layernorm", "rmsnorm")


@dataclass(frozen=True)
class GPTConfig:
    """Sizes and the normalization of a :class:`TinyGPT`.

    ``norm``: a name of :data:`lnbook.norms.NORMS` over one token's features: ``"layer"`` (or
    ``"layernorm"``: torch's fused LayerNorm), ``"rms"`` (``"rmsnorm"``), ``"dyt"`` (Dynamic
    Tanh), ...; ``"none"``; or ``"batch"`` (``"batchnorm"``: statistics over the real tokens of
    the whole batch, to show why Transformers do not use it). ``norm_position``: ``"pre"``,
    ``"post"``, or ``"sandwich"`` (CogView's Sandwich-LN, Ding et al. 2021: Pre-LN with one more
    norm on each sublayer's output before it joins the residual stream, ``x + norm(f(norm(x)))``).
    ``final_norm``: one more norm after the last block (GPT-2's ``ln_f``): True, the blocks'
    ``norm``; a norm name, that norm (DyT blocks with a LayerNorm before the head, say); False,
    none. ``embed_norm``: a ``norm`` over the summed token and position embeddings before the
    first block (BERT's embedding LayerNorm). ``embed_scale``: the token embedding multiplied by
    a learnable scalar that starts at ``sqrt(d_model)`` (Zhu et al.'s DyT LLaMA recipe).
    ``dyt_alpha``: DyT's initial ``alpha``, one number for every site or three, for the norms
    before attention, before the MLP, and the final norm (Post-LN: after attention, after the
    MLP). ``tie_head``: the output head shares the token embedding's weights (GPT-2, BERT);
    False, it has its own (LLaMA), normal with standard deviation ``d_model ** -0.5`` whatever
    the ``init`` (as in the reference LLaMA training code, torchtitan). ``causal``: each
    token attends to itself and the tokens before it (a decoder); ``False``: to every token
    (an encoder, as over an image's patches). ``bias``: the linear layers and the LayerNorms
    have biases (``False``: none, as in T5 and LLaMA; RMSNorm never has one).
    ``init``: ``"gpt2"``, every weight matrix normal with standard deviation 0.02 and the
    residual projections (attention's output and the MLP's second layer) divided by
    ``sqrt(2 * n_layer)``; or ``"xavier"``, as the original Transformer and Xiong et al.'s
    analysis: every linear layer's weight Xavier-uniform (query, key and value each as a
    ``d_model x d_model`` matrix), no scaling with depth, and the embeddings normal with standard
    deviation ``d_model ** -0.5``; or ``"bert"``, BERT's: every weight matrix and embedding
    truncated normal with standard deviation 0.02 (cut at two standard deviations), no scaling
    with depth. Biases start at zero in all three.
    ``qk_norm``: ``"none"``; or ``"layernorm"`` / ``"rmsnorm"`` over each head's ``d_model //
    n_head`` query and key features before their dot product (query-key normalization, Henry
    et al. 2020; with LayerNorm, "QK-layernorm", as in ViT-22B), one norm for the queries and
    one for the keys, shared by the heads.
    ``deepnorm``: DeepNorm (Wang et al. 2022), for ``norm_position="post"`` only: each block
    computes ``norm(alpha * x + f(x))`` with ``alpha = (2 n_layer) ** 0.25``, and after the
    ``init`` above the value projection, attention's output and both MLP weights are multiplied
    by ``beta = (8 n_layer) ** -0.25`` (the decoder-only constants; with ``init="xavier"`` this is
    the paper's initialization, Xavier-uniform in place of Xavier-normal). ``"alpha"`` or
    ``"beta"``: one of the two alone, to tell which does the work.
    ``normformer``: NormFormer (Shleifer et al. 2021), for ``norm_position="pre"`` only: each
    head's attention output multiplied by a learned scale (starting at 1) before the output
    projection, a norm on attention's output before the residual sum, and a norm (over
    ``4 d_model`` features) after the MLP's activation.
    """

    vocab_size: int
    block_size: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0
    norm: str = "layernorm"
    norm_position: str = "pre"
    final_norm: bool | str = True
    causal: bool = True
    bias: bool = True
    init: str = "gpt2"
    qk_norm: str = "none"
    deepnorm: bool | str = False
    normformer: bool = False
    embed_norm: bool = False
    embed_scale: bool = False
    tie_head: bool = True
    dyt_alpha: float | tuple[float, float, float] = 0.5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            check_positive_int(getattr(self, name), name)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        check_number(self.dropout, "dropout", "a number in [0, 1)", lambda v: 0 <= v < 1)
        check_norm(self.norm, NORMS)
        check_choice(self.norm_position, POSITIONS, "norm_position")
        if not isinstance(self.final_norm, bool):
            if not isinstance(self.final_norm, str):
                raise TypeError(f"final_norm must be True, False or a norm name, got {describe(self.final_norm)}")
            check_norm(self.final_norm, NORMS)
        check_bool(self.embed_norm, "embed_norm")
        check_bool(self.embed_scale, "embed_scale")
        check_bool(self.tie_head, "tie_head")
        if len(self.dyt_alphas) != 3:
            raise ValueError(f"dyt_alpha must be one number or three (attention, MLP, final), got {describe(self.dyt_alpha)}")
        for alpha in self.dyt_alphas:
            check_number(alpha, "dyt_alpha", "a positive number (or three)", lambda v: v > 0)
        check_bool(self.causal, "causal")
        check_bool(self.bias, "bias")
        check_choice(self.init, INITS, "init")
        check_choice(self.qk_norm, QK_NORMS, "qk_norm")
        if not any(self.deepnorm is d for d in DEEPNORMS):
            raise ValueError(f"deepnorm must be one of {DEEPNORMS}, got {describe(self.deepnorm)}")
        if self.deepnorm and self.norm_position != "post":
            raise ValueError(f"deepnorm={self.deepnorm!r} needs norm_position='post', got norm_position={self.norm_position!r}")
        check_bool(self.normformer, "normformer")
        if self.normformer and self.norm_position != "pre":
            raise ValueError(f"normformer=True needs norm_position='pre', got norm_position={self.norm_position!r}")

    @property
    def dyt_alphas(self) -> tuple[float, ...]:
        """DyT's initial alpha before attention, before the MLP, and at the final norm."""
        return self.dyt_alpha if isinstance(self.dyt_alpha, tuple) else (self.dyt_alpha,) * 3


PRESETS: dict[str, dict] = {
    # The original Transformer's Post-LN blocks with no final norm, with the Xavier
    # initialization Xiong et al. analyse (the paper states none).
    "transformer": dict(norm="layernorm", norm_position="post", final_norm=False, init="xavier"),
    # BERT: an encoder (causal=False), Post-LN with no final norm, a LayerNorm over the summed
    # embeddings, every weight truncated normal with standard deviation 0.02.
    "bert": dict(norm="layernorm", norm_position="post", final_norm=False, causal=False, embed_norm=True, init="bert"),
    # GPT-2: Pre-LN plus a final LayerNorm (ln_f), its depth-scaled initialization.
    "gpt2": dict(norm="layernorm", norm_position="pre", final_norm=True, init="gpt2"),
    # T5 and LLaMA: Pre-norm RMSNorm (no mean subtraction, no bias), a final norm, no biases;
    # LLaMA's output head is its own, T5's (v1.0) shares the embedding.
    # Their initializations are not modelled: GPT-2's (see PUBLISHED_INIT).
    "t5": dict(norm="rmsnorm", norm_position="pre", final_norm=True, bias=False),
    "llama": dict(norm="rmsnorm", norm_position="pre", final_norm=True, bias=False, tie_head=False),
}
"""The norm wiring of famous models, as :class:`GPTConfig` settings: norm, its position, the
final norm, an embedding norm, biases, attention direction, and the initialization where the
model's own is one of :data:`INITS`. Only these: activations (ReLU, GELU, SwiGLU), position
encodings and encoder-decoder structure (the original Transformer, T5) are not modelled; the
decoder-only presets are causal."""

PUBLISHED_INIT: dict[str, str | None] = {
    "transformer": None,  # Vaswani et al. state none; the preset uses Xavier, Xiong et al.'s reading
    "bert": "bert",  # truncated normal, 0.02
    "gpt2": "gpt2",  # normal 0.02, residual projections / sqrt(2 L)
    "t5": None,  # Mesh TensorFlow's fan-in scaled normal, not modelled
    "llama": None,  # the paper states none
}
"""Each preset's model's own initialization, where it is one of :data:`INITS` (None: not stated
or not modelled; the preset uses Xiong et al.'s Xavier for the Transformer, GPT-2's otherwise)."""


def preset(name: str, vocab_size: int, block_size: int, **settings) -> GPTConfig:
    """The :class:`GPTConfig` of :data:`PRESETS` ``[name]``, with sizes and any other setting
    given in ``settings`` (which override the preset's)."""
    check_choice(name, tuple(PRESETS), "name")
    return GPTConfig(vocab_size, block_size, **{**PRESETS[name], **settings})


class Norm(nn.Module):
    """The norm a config names, over ``d_model`` features, called as ``norm(x, mask)``
    (:func:`lnbook.norms.apply_norm`: a batch norm leaves the padding out); a DyT starts at
    ``alpha``, and without ``bias`` a LayerNorm or DyT has none."""

    def __init__(self, kind: str, d_model: int, bias: bool = True, alpha: float = 0.5) -> None:
        super().__init__()
        self.norm = norm_layer(kind, d_model, native=True)
        if not bias and isinstance(self.norm, nn.LayerNorm):
            self.norm = nn.LayerNorm(d_model, bias=False)
        if isinstance(self.norm, DyT):
            self.norm = DyT(d_model, alpha, bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return apply_norm(self.norm, x, mask)


class SelfAttention(nn.Module):
    """Multi-head attention in which each token sees no padding and, if ``cfg.causal``, only
    itself and the tokens before it; with ``cfg.qk_norm``, queries and keys are normalized
    per head first.

    ``record_logits`` (default False): compute the attention weights explicitly instead of
    with ``F.scaled_dot_product_attention`` (the same result up to rounding, slower), and keep
    after each call ``logit_max``, the largest attention logit ``q . k / sqrt(head dim)`` over
    the allowed pairs, and ``entropy``, the entropy of the attention weights in nats (``log T``
    for uniform attention over T tokens, 0 for one-hot) averaged over the batch and the queries
    for each head, the smallest over the heads (so one collapsed head shows), both as floats.
    With ``cfg.normformer``, each head's output is multiplied by its own learned ``head_scale``.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.causal = cfg.n_head, cfg.causal
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        if cfg.qk_norm != "none":  # only then: the default model's modules, and its parameters, stay as they were
            head = cfg.d_model // cfg.n_head
            self.q_norm, self.k_norm = (Norm(cfg.qk_norm, head, cfg.bias) for _ in range(2))
        if cfg.normformer:  # NormFormer's head-wise scaling
            self.head_scale = nn.Parameter(torch.ones(cfg.n_head))
        self.record_logits, self.logit_max, self.entropy = False, float("nan"), float("nan")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        t, d = x.shape[-2:]  # x (*, T, d): a batch (B, T, d), or (S, B, T, d) for S seeds (lnbook.seeds)
        q, k, v = (z.unflatten(-1, (self.n_head, d // self.n_head)).transpose(-3, -2) for z in self.qkv(x).split(d, dim=-1))
        if hasattr(self, "q_norm"):  # QK-norm: over each head's features, (*, heads, T, head dim)
            q, k = self.q_norm(q, None), self.k_norm(k, None)
        allowed = None  # without padding, the causal mask alone (is_causal) or nothing
        if mask is not None:  # key padding (and causal): (*, 1, T, T), True where attention is allowed
            allowed = mask[..., None, None, :]
            if self.causal:
                allowed = torch.ones(t, t, dtype=torch.bool, device=x.device).tril() & allowed
        dropout = self.dropout if self.training else 0.0
        if self.record_logits:
            y = self._explicit(q, k, v, allowed, dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=self.causal and mask is None, dropout_p=dropout)
        if hasattr(self, "head_scale"):  # (heads,), or (S, heads) for S seeds, on y (*, heads, T, head dim)
            scale = self.head_scale
            y = y * scale.reshape(*scale.shape[:-1], *[1] * (y.ndim - 2 - scale.ndim), -1, 1, 1)
        return self.proj(y.transpose(-3, -2).flatten(-2))

    def _explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                  dropout: float) -> torch.Tensor:
        """Attention written out, recording the largest logit and the lowest head's mean entropy
        (one each per member, as lists, for ``(S, B, heads, T, T)`` logits)."""
        t = q.shape[-2]
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (*, heads, T, T)
        lead = logits.ndim - 4  # 1 for many seeds
        if allowed is None:
            allowed = torch.ones(t, t, dtype=torch.bool, device=q.device)
            allowed = allowed.tril() if self.causal else allowed
        logits = logits.masked_fill(~allowed, float("-inf"))
        weights = logits.softmax(-1)
        with torch.no_grad():
            self.logit_max = logits.flatten(lead).amax(-1).tolist()
            entropy = torch.special.entr(weights).sum(-1).nan_to_num(0.0)  # (*, heads, T); padded queries included
            per_head = entropy.movedim(-2, lead).flatten(lead + 1).mean(-1)  # (lead, heads)
            self.entropy = per_head.amin(-1).tolist()
        return F.dropout(weights, dropout) @ v


class Block(nn.Module):
    """One Transformer block: attention and an MLP, each with a residual and a norm (and, for
    Sandwich-LN and NormFormer, the extra norms on the sublayers' outputs)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.pre = cfg.norm_position != "post"
        self.alpha = (2 * cfg.n_layer) ** 0.25 if cfg.deepnorm in (True, "alpha") else 1.0  # DeepNorm's residual weight
        self.norm1, self.norm2 = (Norm(cfg.norm, cfg.d_model, cfg.bias, alpha) for alpha in cfg.dyt_alphas[:2])
        self.attn = SelfAttention(cfg)
        activation = nn.GELU()
        if cfg.normformer:  # a norm after the MLP's activation, inside its slot so that mlp.2 stays the output layer
            activation = nn.Sequential(activation, Norm(cfg.norm, 4 * cfg.d_model, cfg.bias, cfg.dyt_alphas[1]))
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias), activation,
            nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias), nn.Dropout(cfg.dropout),
        )
        if cfg.norm_position == "sandwich" or cfg.normformer:  # a norm on attention's output
            self.norm1_out = Norm(cfg.norm, cfg.d_model, cfg.bias, cfg.dyt_alphas[0])
        if cfg.norm_position == "sandwich":  # and on the MLP's
            self.norm2_out = Norm(cfg.norm, cfg.d_model, cfg.bias, cfg.dyt_alphas[1])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre:
            y = self.attn(self.norm1(x, mask), mask)
            x = x + (self.norm1_out(y, mask) if hasattr(self, "norm1_out") else y)
            y = self.mlp(self.norm2(x, mask))
            x = x + (self.norm2_out(y, mask) if hasattr(self, "norm2_out") else y)
        elif self.alpha == 1.0:
            x = self.norm1(x + self.attn(x, mask), mask)
            x = self.norm2(x + self.mlp(x), mask)
        else:  # DeepNorm: the residual up-weighted by alpha before the sum is normalized
            x = self.norm1(self.alpha * x + self.attn(x, mask), mask)
            x = self.norm2(self.alpha * x + self.mlp(x), mask)
        return x


class TinyGPT(nn.Module):
    """A GPT-style decoder: token and position embeddings, ``n_layer`` blocks, an optional
    final norm, and a linear head that shares the token embedding's weights.

    ``forward(idx (B, T), mask (B, T) or None) -> logits (B, T, vocab_size)``, with
    ``T <= block_size``; ``mask`` is True on the real tokens of a right-padded batch. A model
    of ``S`` seeds (:func:`lnbook.seeds.stack`) takes ``(S, B, T)`` and returns ``(S, B, T, vocab_size)``.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        if cfg.embed_scale:  # Zhu et al.'s LLaMA recipe: token embeddings times a learnable scalar, sqrt(d) at first
            self.embed_scale = nn.Parameter(torch.tensor(math.sqrt(cfg.d_model)))
        if cfg.embed_norm:  # BERT: a norm over the summed embeddings
            self.norm_e = Norm(cfg.norm, cfg.d_model, cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        final = cfg.norm if cfg.final_norm is True else cfg.final_norm or "none"
        self.norm_f = Norm(final, cfg.d_model, cfg.bias, cfg.dyt_alphas[2])
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_head:
            self.head.weight = self.tok.weight  # weight tying, as GPT-2
        for name, p in self.named_parameters():
            if name.endswith("bias") and (".attn." in name or ".mlp." in name):
                nn.init.zeros_(p)
            elif name == "head.weight":  # an untied head: unit-scale logits from a unit-scale stream
                nn.init.normal_(p, 0.0, cfg.d_model**-0.5)
            elif p.ndim != 2:
                continue
            elif cfg.init == "bert":  # truncated normal 0.02 everywhere, no depth scaling
                nn.init.trunc_normal_(p, 0.0, 0.02, -0.04, 0.04)
            elif cfg.init == "gpt2":  # small normal weights; residual projections scaled by depth
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name in ("tok.weight", "pos.weight"):  # Xavier: unit-scale logits through the tied head
                nn.init.normal_(p, 0.0, cfg.d_model**-0.5)
            else:  # Xavier-uniform, query, key and value each as its own square matrix
                for part in p.data.split(cfg.d_model) if name.endswith("qkv.weight") else (p.data,):
                    nn.init.xavier_uniform_(part)
        if cfg.deepnorm in (True, "beta"):  # DeepNorm's beta: value, attention output and MLP weights scaled down
            beta = (8 * cfg.n_layer) ** -0.25
            with torch.no_grad():
                for block in self.blocks:
                    block.attn.qkv.weight[2 * cfg.d_model :].mul_(beta)
                    for weight in (block.attn.proj.weight, block.mlp[0].weight, block.mlp[2].weight):
                        weight.mul_(beta)

    def forward(self, idx: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(idx, mask)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm_f(x, mask))

    def embed(self, idx: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The residual stream entering the first block, ``(B, T, d_model)`` (``(S, B, T,
        d_model)`` for S seeds): the token and position embeddings summed (then the embedding
        norm and dropout), after checking ``idx`` and ``mask`` as :meth:`forward` takes them."""
        shape = "(B, T)" if getattr(self, "members", None) is None else f"(S, B, T) with S = {self.members} seeds"
        if not isinstance(idx, torch.Tensor) or idx.ndim != len(shape.split(",")) or idx.dtype != torch.int64:
            raise ValueError(f"idx must be an int64 tensor of shape {shape}, got {describe(idx)}")
        t = idx.shape[-1]
        if not 1 <= t <= self.cfg.block_size:
            raise ValueError(f"sequence length must be in 1..block_size={self.cfg.block_size}, got {t}")
        if mask is not None and (mask.shape != idx.shape or mask.dtype != torch.bool):
            raise ValueError(f"mask must be a bool tensor of idx's shape {tuple(idx.shape)}, got {mask.dtype} {tuple(mask.shape)}")
        positions = torch.arange(t, device=idx.device).expand(*idx.shape[:-2], 1, t)  # (1, T), (S, 1, T) for seeds
        tok = self.tok(idx)
        if self.cfg.embed_scale:  # () or, for S seeds, (S,): one scalar per member
            scale = self.embed_scale
            tok = tok * scale.reshape(scale.shape + (1,) * (tok.ndim - scale.ndim))
        x = tok + self.pos(positions)
        if self.cfg.embed_norm:
            x = self.norm_e(x, mask)
        return self.drop(x)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy over the real positions; ``targets (B, T)``. A model of
        ``S`` seeds returns each member's, ``(S,)``."""
        logits = self(idx, mask)
        if mask is not None:
            targets = targets.masked_fill(~mask, -100)  # cross_entropy ignores -100
        if targets.ndim == 2:
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        each = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=-100, reduction="none")
        return each.view(targets.shape).flatten(1).sum(1) / (targets != -100).flatten(1).sum(1)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int, temperature: float = 1.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """Extend ``idx (B, T)`` by ``new_tokens`` sampled tokens; returns ``(B, T + new_tokens)``."""
        check_positive_int(new_tokens, "new_tokens")
        check_number(temperature, "temperature", "a positive number", lambda v: v > 0)
        was_training = self.training
        self.eval()
        for _ in range(new_tokens):
            logits = self(idx[:, -self.cfg.block_size :])[:, -1] / temperature
            idx = torch.cat([idx, torch.multinomial(logits.softmax(-1), 1, generator=generator)], dim=1)
        self.train(was_training)
        return idx


class TinyViT(nn.Module):
    """A vision Transformer: an image cut into square patches, each a token, through
    :class:`Block` layers without the causal mask; mean over the patches, then a linear head.

    ``forward(images (B, H, W)) -> logits (B, n_classes)`` for one-channel images of
    ``image_size`` x ``image_size`` pixels; ``patch_size`` must divide ``image_size``. ``norm``
    and ``norm_position`` are :class:`GPTConfig`'s; ``"batchnorm"`` takes its statistics over
    every patch of every image in the batch.
    """

    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        n_classes: int = 10,
        n_layer: int = 2,
        n_head: int = 4,
        d_model: int = 32,
        norm: str = "layernorm",
        norm_position: str = "pre",
    ) -> None:
        super().__init__()
        check_positive_int(image_size, "image_size")
        check_positive_int(patch_size, "patch_size")
        if image_size % patch_size:
            raise ValueError(f"patch_size ({patch_size}) must divide image_size ({image_size})")
        self.image_size, self.patch_size = image_size, patch_size
        n_patches = (image_size // patch_size) ** 2
        self.cfg = GPTConfig(n_classes, n_patches, n_layer, n_head, d_model, norm=norm,
                             norm_position=norm_position, final_norm=norm_position == "pre", causal=False)
        self.embed = nn.Linear(patch_size**2, d_model)
        self.pos = nn.Parameter(torch.zeros(n_patches, d_model))
        nn.init.normal_(self.pos, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(self.cfg) for _ in range(n_layer))
        self.norm_f = Norm(self.cfg.norm if self.cfg.final_norm else "none", d_model)
        self.head = nn.Linear(d_model, n_classes)

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, H, W) -> (B, patches, patch_size**2)``, patches in reading order (``(S, B, H, W)``
        for a model of ``S`` seeds, :func:`lnbook.seeds.stack`)."""
        size, stacked = self.image_size, getattr(self, "members", None) is not None
        if not isinstance(images, torch.Tensor) or images.ndim != 3 + stacked or images.shape[-2:] != (size, size):
            raise ValueError(f"images must be a tensor of shape {'(S, ' if stacked else '('}B, {size}, {size}), got {describe(images)}")
        p = self.patch_size
        return images.unfold(-2, p, p).unfold(-2, p, p).reshape(*images.shape[:-2], -1, p * p)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.patches(images)) + self.pos.unsqueeze(-3)  # (1, P, d); (S, 1, P, d) for seeds
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x, None).mean(dim=-2))


def block_grad_norms(model: TinyGPT, idx: torch.Tensor, targets: torch.Tensor, part: str = "all") -> list[float]:
    """The gradient norm of each block's weight matrices, from first block to last, for one
    batch's loss: ``part="all"``, attention and MLP together; ``"ffn_out"``, only the MLP's
    output weight ``W2`` (``d_model x 4 d_model``), the quantity Xiong et al. bound. The model's
    gradients are left set."""
    check_choice(part, ("all", "ffn_out"), "part")
    model.zero_grad(set_to_none=True)
    model.loss(idx, targets).backward()
    chosen = (lambda name, p: p.ndim == 2) if part == "all" else (lambda name, p: name == "mlp.2.weight")
    return [
        math.sqrt(sum(float(p.grad.pow(2).sum()) for name, p in block.named_parameters() if chosen(name, p)))
        for block in model.blocks
    ]


def _batch_norms(model: nn.Module) -> list[nn.Module]:
    """The batch-norm modules of ``model``: lnbook's (plain) or their stacked form (:class:`lnbook.seeds.Norm`)."""
    from .seeds import BATCH_NORMS
    from .seeds import Norm as StackedNorm

    return [m for m in model.modules() if isinstance(m, BATCH_NORMS)
            or (isinstance(m, StackedNorm) and issubclass(m.plain, BATCH_NORMS))]


def precise_bn(model: nn.Module, images: torch.Tensor, batch_size: int = 64) -> int:
    """"Precise BatchNorm": recompute every batch norm's running statistics from one pass over
    ``images (N, H, W)`` (the training set) at fixed weights, in place, for a model scored in
    eval mode with statistics of its final weights rather than running averages that mix in
    earlier ones.

    The running mean and (unbiased) variance become the equally weighted average of those of
    the ``ceil(N / batch_size)`` batches of ``images`` in order, taken in training mode without
    gradients: PyTorch's ``momentum=None`` (a cumulative average), done by setting the
    momentum of batch ``k`` (from 1) to ``1 / k``. The weights do not change; the momenta and
    the training/eval mode are restored. A stacked model (:func:`lnbook.seeds.stack`) gets
    each member's statistics from the same images. Returns the number of batch norms reset;
    raises ``ValueError`` if there is none.
    """
    from .seeds import members

    norms = _batch_norms(model)
    if not norms:
        raise ValueError("model has no batch norm whose statistics could be recomputed")
    if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.ndim < 2 or len(images) < 2:
        raise ValueError(f"images must be a float tensor (N, ...) of N >= 2 training inputs, got {describe(images)}")
    check_positive_int(batch_size, "batch_size")
    s = members(model)
    device = next(model.parameters()).device
    momenta, was_training = [m.momentum for m in norms], model.training
    model.train()
    try:
        with torch.no_grad():
            for k, start in enumerate(range(0, len(images), batch_size), start=1):
                for m in norms:
                    m.momentum = 1.0 / k
                x = images[start : start + batch_size].to(device)
                if len(x) < 2:  # a batch norm needs two examples; a last batch of one is left out
                    break
                model(x if s is None else x.expand(s, *x.shape))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.train(was_training)
    return len(norms)


@dataclass
class ViTHistory:
    """What :func:`fit_vit` recorded for one member: the training loss of every update
    (``step_loss``), the validation accuracy (eval mode) after the updates ``eval_steps``
    (``val_acc``), and whether the member stopped on a non-finite loss (``diverged``)."""

    step_loss: list[float]
    eval_steps: list[int]
    val_acc: list[float]
    diverged: bool = False


def fit_vit(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int,
    lr: float | list[float],
    seeds: list[int],
    batch_size: int = 64,
    warmup: int = 0,
    decay: bool = True,
    eval_every: int = 100,
) -> list[ViTHistory]:
    """Train a stacked classifier (:func:`lnbook.seeds.stack` of :class:`TinyViT`) with Adam and
    cross-entropy for ``steps`` updates, each member at its own rate ``lr[s]`` (or one rate),
    under a schedule: a linear warm-up over the first ``warmup`` updates, then (``decay``) a
    cosine to 0 at the last update (:func:`lnbook.train.warmup_cosine`), or the full rate.

    ``train``, ``val``: ``(images (N, H, W), labels (N,))``. Member ``s`` draws its batches of
    ``batch_size`` from a permutation of ``train`` per pass, seeded by ``seeds[s]`` (the last
    incomplete batch of a pass is dropped), so members with the same seed see the same batches
    whatever their rate. A member whose loss is not finite stops (its weights are kept) and is
    marked ``diverged``. The validation accuracy (eval mode) after every ``eval_every``
    updates and after the last. One :class:`ViTHistory` per member.
    """
    from .seeds import check_seeds, member_lrs, StackedOptimizer, stack_size, accuracy
    from .train import warmup_cosine

    s = stack_size(model)
    for value, name in ((steps, "steps"), (batch_size, "batch_size"), (eval_every, "eval_every")):
        check_positive_int(value, name)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup < steps:
        raise ValueError(f"warmup must be an int in 0..steps-1 = {steps - 1}, got {describe(warmup)}")
    check_bool(decay, "decay")
    for data, name in ((train, "train"), (val, "val")):
        if not (isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data)
                and len(data[0]) == len(data[1])):
            raise TypeError(f"{name} must be (images (N, H, W), labels (N,)), got {describe(data)}")
    n = len(train[1])
    if n < batch_size:
        raise ValueError(f"batch_size ({batch_size}) must not exceed the training examples ({n})")
    step = StackedOptimizer(model, member_lrs(lr, s), "adam", None)
    generators = [torch.Generator().manual_seed(seed) for seed in check_seeds(seeds, s)]
    device = step.params[0].device
    per_pass = n // batch_size
    histories = [ViTHistory([], [], []) for _ in range(s)]
    active = torch.ones(s, dtype=torch.bool, device=device)
    order: torch.Tensor | None = None
    model.train()
    for t in progress(range(1, steps + 1), "ViT steps"):
        k = (t - 1) % per_pass
        if k == 0:
            order = torch.stack([torch.randperm(n, generator=g)[: per_pass * batch_size] for g in generators])
        idx = order[:, k * batch_size : (k + 1) * batch_size]
        x, y = train[0][idx].to(device), train[1][idx].to(device)
        losses = F.cross_entropy(model(x).transpose(1, 2), y, reduction="none").mean(1)
        factor = warmup_cosine(t, warmup, steps) if decay else min(1.0, t / warmup) if warmup else 1.0
        step.step(losses, active, factor)
        for i, loss in enumerate(losses.tolist()):
            if bool(active[i]):
                histories[i].step_loss.append(loss)
                if not math.isfinite(loss):
                    histories[i].diverged, active[i] = True, False
        if t % eval_every == 0 or t == steps:
            acc = accuracy(model, val)
            for i, h in enumerate(histories):
                h.eval_steps.append(t)
                h.val_acc.append(float(acc[i]))
        if not bool(active.any()):
            break
    return histories


@dataclass
class ViTSweep:
    """The stored ViT sweep of ``benchmarks/vit_sweep.py`` (:func:`stored_vit_sweep`), keyed by
    ``(norm, depth, lr)`` with norm ``"none"``, ``"layernorm"`` or ``"batchnorm"``: ``val`` the
    final validation accuracy, ``test`` the test accuracy in eval mode, ``diverged`` whether the
    run stopped on a non-finite loss, each ``(S,)``; for BatchNorm only, ``precise`` the test
    accuracy after :func:`precise_bn` and ``batch`` with the statistics of the whole test set
    (one batch of 360). ``steps`` the evaluation steps; ``train_loss`` and ``val_curve``
    ``(S, len(steps))``: the mean training loss since the previous evaluation and the
    validation accuracy. Seeds ascending; ``provenance``: machine, commit, date, command,
    versions and setting."""

    provenance: list[str]
    seeds: list[int]
    norms: list[str]
    depths: list[int]
    lrs: list[float]
    steps: list[int]
    val: dict[tuple[str, int, float], np.ndarray]
    test: dict[tuple[str, int, float], np.ndarray]
    diverged: dict[tuple[str, int, float], np.ndarray]
    precise: dict[tuple[str, int, float], np.ndarray]
    batch: dict[tuple[str, int, float], np.ndarray]
    train_loss: dict[tuple[str, int, float], np.ndarray]
    val_curve: dict[tuple[str, int, float], np.ndarray]

    def select(self, depth: int, measure: str = "test"):
        """At ``depth``, each norm's rate chosen on the final validation accuracy
        (:func:`lnbook.compare.select`, higher is better; a diverged run counts as the worst)
        and its per-seed ``measure`` there: ``"test"`` (eval mode), or for BatchNorm alone
        ``"precise"`` or ``"batch"``. Arms are named by norm. Returns the
        :class:`lnbook.compare.Selection`."""
        from .compare import select

        check_choice(measure, ("test", "precise", "batch"), "measure")
        if depth not in self.depths:
            raise ValueError(f"depth must be one of {self.depths}, got {describe(depth)}")
        norms = self.norms if measure == "test" else [n for n in self.norms if n == "batchnorm"]
        values = getattr(self, measure)
        val = {n: {lr: np.where(self.diverged[n, depth, lr], np.nan, self.val[n, depth, lr]) for lr in self.lrs}
               for n in norms}
        return select(val, lambda n, lr: values[n, depth, lr])


def stored_vit_sweep(folder: str | Path | None = None) -> ViTSweep:
    """The ViT sweep that chapter 09 cannot afford to train, read from the files
    ``benchmarks/vit_sweep.py`` wrote into ``lnbook/results/`` (installed with the package;
    ``folder``: another folder the script wrote into), checked for completeness: every norm,
    depth and rate holds every seed and evaluation step."""
    import csv
    from importlib import resources

    if folder is not None and not isinstance(folder, (str, Path)):
        raise TypeError(f"folder must be a path or None, got {describe(folder)}")

    def read(name: str) -> tuple[list[str], list[dict[str, str]]]:
        path = resources.files("lnbook") / "results" / name if folder is None else Path(folder) / name
        lines = path.read_text().splitlines()
        return [l[2:] for l in lines if l.startswith("# ")], list(csv.DictReader(l for l in lines if not l.startswith("#")))

    provenance, final_rows = read("vit_sweep-final.csv")
    _, curve_rows = read("vit_sweep-curves.csv")
    key = lambda r: (r["norm"], int(r["depth"]), float(r["lr"]))  # noqa: E731
    final: dict[tuple, dict[int, dict[str, str]]] = {}
    for r in final_rows:
        final.setdefault(key(r), {})[int(r["seed"])] = r
    curves: dict[tuple, dict[int, list[dict[str, str]]]] = {}
    for r in curve_rows:
        curves.setdefault(key(r), {}).setdefault(int(r["seed"]), []).append(r)
    norms = list(dict.fromkeys(k[0] for k in final))
    depths, lrs = sorted({k[1] for k in final}), sorted({k[2] for k in final})
    seeds = sorted(next(iter(final.values())))
    grid = {(n, d, lr) for n in norms for d in depths for lr in lrs}
    if set(final) != grid or set(curves) != grid or any(sorted(v) != seeds for v in (*final.values(), *curves.values())):
        raise ValueError("the stored ViT sweep does not hold every seed of every norm, depth and rate")
    steps = [int(r["step"]) for r in curves[next(iter(grid))][seeds[0]]]
    if any([int(r["step"]) for r in rows] != steps for c in curves.values() for rows in c.values()):
        raise ValueError("the stored ViT sweep's curves do not all hold the same evaluation steps")

    def column(name: str, keys=grid) -> dict:
        return {k: np.array([float(final[k][s][name]) for s in seeds]) for k in sorted(keys)}

    bn = {k for k in grid if k[0] == "batchnorm"}
    return ViTSweep(provenance=provenance, seeds=seeds, norms=norms, depths=depths, lrs=lrs, steps=steps,
                    val=column("val_acc"), test=column("test_acc"),
                    diverged={k: v.astype(bool) for k, v in column("diverged").items()},
                    precise=column("precise_acc", bn), batch=column("batch_acc", bn),
                    train_loss={k: np.array([[float(r["train_loss"]) for r in curves[k][s]] for s in seeds]) for k in grid},
                    val_curve={k: np.array([[float(r["val_acc"]) for r in curves[k][s]] for s in seeds]) for k in grid})
