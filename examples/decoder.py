"""A small Llama-style decoder that decodes with :class:`magi_compiler.kv_cache.StaticKVCache`.

The blocks are :class:`blocks.LlamaBlock` (the same projections, norms and SwiGLU MLP) with an
attention that writes its keys and values into the cache at ``positions`` and attends over the
cache under :meth:`StaticKVCache.attention_mask`. Prefill and decode are the same code:
``forward(tokens (batch, seq), positions (seq,) int64, context=None)`` returns the logits of
the last position. ``positions`` is a tensor, so a new token never changes a shape and never
captures again; ``context`` (an int, optional) attends over the first ``context`` cache slots
only, one capture (and CUDA graph) per value. Used by examples/generate.py ``--model blocks``
and tests/python/test_kv_cache_decode.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from blocks import LlamaBlock, RMSNorm, rotary_cos_sin
from magi_compiler.kv_cache import LayerKVCache, StaticKVCache
from torch import nn


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (``(batch, seq, heads, head_dim)``) with ``cos``/``sin`` of
    shape ``(seq, head_dim)`` or ``(batch, seq, head_dim)``."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class CachedLlamaBlock(LlamaBlock):
    """:class:`blocks.LlamaBlock` whose attention goes through a :class:`LayerKVCache`."""

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        cache: LayerKVCache,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context: int | None = None,
    ) -> torch.Tensor:
        h = self.input_norm(x)
        bsz, seq, _ = h.shape
        q = _rotate(self.q_proj(h).view(bsz, seq, self.n_heads, self.head_dim), cos, sin)
        k = _rotate(self.k_proj(h).view(bsz, seq, self.n_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(h).view(bsz, seq, self.n_kv_heads, self.head_dim)
        keys, values = cache.update(positions, k.transpose(1, 2), v.transpose(1, 2), context)
        if self.n_rep > 1:
            keys = keys.repeat_interleave(self.n_rep, dim=1)
            values = values.repeat_interleave(self.n_rep, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        x = x + self.o_proj(out.transpose(1, 2).reshape(bsz, seq, self.n_heads * self.head_dim))
        return x + self._mlp(self.post_attn_norm(x))


class LlamaDecoder(nn.Module):
    """Token embedding, ``layers`` :class:`CachedLlamaBlock` s, a final RMSNorm and a tied LM
    head, with a :class:`StaticKVCache` of ``batch`` rows and ``max_len`` slots."""

    def __init__(
        self,
        vocab: int = 256,
        layers: int = 2,
        hidden: int = 64,
        heads: int = 4,
        kv_heads: int = 2,
        intermediate: int = 128,
        max_len: int = 64,
        batch: int = 1,
        rope_base: float = 10000.0,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        with torch.device(device or "cpu"):
            self.embed = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList(
                CachedLlamaBlock(hidden, heads, kv_heads, intermediate, rope_base=rope_base)
                for _ in range(layers)
            )
            self.norm = RMSNorm(hidden)
        if dtype is not None:
            self.to(dtype)
        head_dim = hidden // heads
        self.cache = StaticKVCache(layers, batch, kv_heads, max_len, head_dim, dtype, device)
        cos, sin = rotary_cos_sin(max_len, head_dim, rope_base, device=device, dtype=dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, context: int | None = None
    ) -> torch.Tensor:
        mask = self.cache.attention_mask(positions, context)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.embed(tokens)
        for layer, cache in zip(self.layers, self.cache.layers, strict=True):
            x = layer(x, cache, positions, mask, cos, sin, context)
        return F.linear(self.norm(x[:, -1]), self.embed.weight)

    def reset(self) -> None:
        """Empties the cache in place for a new prompt."""
        self.cache.reset()
