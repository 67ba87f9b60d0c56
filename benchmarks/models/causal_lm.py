"""Decoder-only language models with a static KV cache: GPT-2 small and a Llama-3.2-1B shape.

One :class:`CausalLM` serves both architectures (``LMConfig.arch``): token embedding, ``layers``
decoder blocks, final norm and a tied LM head that returns the logits of the last position
only, as generation does. Every layer owns a KV cache buffer of shape
``(batch, kv_heads, max_seq, head_dim)``. A call ``model(tokens, start_pos)`` writes the keys
and values of ``tokens`` at positions ``start_pos .. start_pos + seq - 1`` (``index_copy_``)
and attends over the whole cache under a mask, so prefill (``seq > 1``) and decode
(``seq == 1``) are the same code and a new position never changes a shape: a compiler sees one
graph per (batch, seq), and ``start_pos`` is a 0-dim tensor, not a Python int, so its value is
never guarded on. This is the "static cache" of Hugging Face ``generate``.

The weights are random (:func:`blocks.init_weights_`); only shapes and op mix matter here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from blocks import RMSNorm, apply_rotary, rotary_cos_sin
from torch import nn


@dataclass(frozen=True)
class LMConfig:
    arch: str  # "gpt2": LayerNorm, learned positions, fused qkv with bias, GELU(tanh) MLP
    # "llama": RMSNorm, rotary positions, separate q/k/v without bias, GQA, SwiGLU MLP
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_seq: int  # cache length: prompt + generated tokens
    batch: int = 1  # cache batch; every call uses exactly this batch
    rope_base: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


GPT2_SMALL = LMConfig("gpt2", 50257, 768, 12, 12, 12, 3072, max_seq=256)
LLAMA_3_2_1B = LMConfig(
    "llama", 128256, 2048, 16, 32, 8, 8192, max_seq=256, rope_base=500000.0, eps=1e-5
)


def _norm(cfg: LMConfig) -> nn.Module:
    if cfg.arch == "gpt2":
        return nn.LayerNorm(cfg.hidden, eps=cfg.eps)
    return RMSNorm(cfg.hidden, eps=cfg.eps)


class CachedAttention(nn.Module):
    """Causal self-attention that appends to a static KV cache and attends over all of it."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, h, kv = cfg.head_dim, cfg.heads, cfg.kv_heads
        if cfg.arch == "gpt2":
            self.qkv = nn.Linear(cfg.hidden, (h + 2 * kv) * d, bias=True)
            self.o_proj = nn.Linear(h * d, cfg.hidden, bias=True)
        else:
            self.q_proj = nn.Linear(cfg.hidden, h * d, bias=False)
            self.k_proj = nn.Linear(cfg.hidden, kv * d, bias=False)
            self.v_proj = nn.Linear(cfg.hidden, kv * d, bias=False)
            self.o_proj = nn.Linear(h * d, cfg.hidden, bias=False)
        cache_shape = (cfg.batch, kv, cfg.max_seq, d)
        self.register_buffer("k_cache", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache_shape), persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
    ) -> torch.Tensor:
        cfg = self.cfg
        bsz, seq, _ = x.shape
        d, h, kv = cfg.head_dim, cfg.heads, cfg.kv_heads
        if cfg.arch == "gpt2":
            q, k, v = self.qkv(x).split([h * d, kv * d, kv * d], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(bsz, seq, h, d)
        k = k.view(bsz, seq, kv, d)
        v = v.view(bsz, seq, kv, d)
        if cos is not None:
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        q = q.transpose(1, 2)  # (B, H, S, D)
        self.k_cache.index_copy_(2, positions, k.transpose(1, 2))
        self.v_cache.index_copy_(2, positions, v.transpose(1, 2))
        keys, values = self.k_cache, self.v_cache  # (B, KV, max_seq, D)
        if h != kv:
            keys = keys.repeat_interleave(h // kv, dim=1)
            values = values.repeat_interleave(h // kv, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, h * d))


class CachedBlock(nn.Module):
    """Pre-norm decoder block around :class:`CachedAttention`."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn_norm = _norm(cfg)
        self.attn = CachedAttention(cfg)
        self.mlp_norm = _norm(cfg)
        if cfg.arch == "gpt2":
            self.fc_in = nn.Linear(cfg.hidden, cfg.intermediate)
            self.fc_out = nn.Linear(cfg.intermediate, cfg.hidden)
        else:
            self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
            self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
            self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.arch == "gpt2":
            return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def forward(self, x, positions, mask, cos, sin) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions, mask, cos, sin)
        return x + self._mlp(self.mlp_norm(x))


class CausalLM(nn.Module):
    """``forward(tokens (B, S) int64, start_pos () int64) -> logits (B, vocab)`` of the last
    position, updating every layer's KV cache at ``start_pos .. start_pos + S - 1``."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        if cfg.arch == "gpt2":
            self.pos_embed = nn.Embedding(cfg.max_seq, cfg.hidden)
        else:
            cos, sin = rotary_cos_sin(cfg.max_seq, cfg.head_dim, cfg.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.layers = nn.ModuleList(CachedBlock(cfg) for _ in range(cfg.layers))
        self.norm = _norm(cfg)

    def forward(self, tokens: torch.Tensor, start_pos: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        positions = start_pos + torch.arange(seq, device=tokens.device)
        key_pos = torch.arange(self.cfg.max_seq, device=tokens.device)
        mask = key_pos[None, :] <= positions[:, None]  # (S, max_seq): causal over the cache
        x = self.embed(tokens)
        cos = sin = None
        if self.cfg.arch == "gpt2":
            x = x + self.pos_embed(positions)
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        for layer in self.layers:
            x = layer(x, positions, mask, cos, sin)
        last = self.norm(x[:, -1])
        return F.linear(last, self.embed.weight)  # tied LM head

    def kv_caches(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in (layer.attn.k_cache, layer.attn.v_cache)]
