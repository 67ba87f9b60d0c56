"""A video-DiT-style transformer block with adaLN modulation.

The block of diffusion transformers for video (DiT, and the video models built on it): the
conditioning vector ``c`` (timestep and class/text summary) passes through SiLU and one linear
layer to six modulation vectors; each half of the block is
``x = x + gate * f(LN(x) * (1 + scale) + shift)`` with ``f`` full (non-causal) multi-head
attention with RMSNorm on queries and keys and rotary positions over the flattened
frames x height x width sequence, or a GELU(tanh) MLP of 4x width. LayerNorms have no affine
parameters: the modulation plays that role.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from blocks import RMSNorm, apply_rotary, rotary_cos_sin
from torch import nn


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class DiTBlock(nn.Module):
    """``forward(x (B, S, hidden), c (B, hidden)) -> (B, S, hidden)``."""

    def __init__(self, hidden: int = 3072, heads: int = 24, seq: int = 16384) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.q_norm = RMSNorm(self.head_dim)
        self.k_norm = RMSNorm(self.head_dim)
        self.attn_out = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.fc_in = nn.Linear(hidden, 4 * hidden)
        self.fc_out = nn.Linear(4 * hidden, hidden)
        self.ada_ln = nn.Linear(hidden, 6 * hidden)
        cos, sin = rotary_cos_sin(seq, self.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, hidden = x.shape
        q, k, v = self.qkv(x).view(bsz, seq, 3, self.heads, self.head_dim).unbind(2)
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        q = apply_rotary(self.q_norm(q), cos, sin).transpose(1, 2)
        k = apply_rotary(self.k_norm(k), cos, sin).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2))
        return self.attn_out(out.transpose(1, 2).reshape(bsz, seq, hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        mods = self.ada_ln(F.silu(c))[:, None, :].chunk(6, dim=-1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods
        x = x + gate_msa * self._attention(modulate(self.norm1(x), shift_msa, scale_msa))
        h = modulate(self.norm2(x), shift_mlp, scale_mlp)
        return x + gate_mlp * self.fc_out(F.gelu(self.fc_in(h), approximate="tanh"))
