"""A BERT-base-style encoder with a masked-language-model head, for training steps.

Post-norm encoder layers as in the original BERT: ``x = LN(x + attn(x))``,
``x = LN(x + fc_out(gelu(fc_in(x))))`` with exact (erf) GELU, bidirectional attention, learned
positions and token types, and an MLM head (dense, GELU, LayerNorm, decoder tied to the token
embedding). ``forward(tokens, labels)`` returns the mean cross-entropy over all positions, so a
compiler sees the whole step from token ids to the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab: int = 30522
    hidden: int = 768
    layers: int = 6
    heads: int = 12
    intermediate: int = 3072
    max_seq: int = 512
    eps: float = 1e-12


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.attn_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.attn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.fc_in = nn.Linear(cfg.hidden, cfg.intermediate)
        self.fc_out = nn.Linear(cfg.intermediate, cfg.hidden)
        self.mlp_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, hidden = x.shape
        q, k, v = self.qkv(x).view(bsz, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)  # (B, H, S, D), no mask
        x = self.attn_norm(x + self.attn_out(attn.transpose(1, 2).reshape(bsz, seq, hidden)))
        return self.mlp_norm(x + self.fc_out(F.gelu(self.fc_in(x))))


class BertForMLM(nn.Module):
    """``forward(tokens (B, S) int64, labels (B, S) int64) -> loss ()`` (float32)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos_embed = nn.Embedding(cfg.max_seq, cfg.hidden)
        self.type_embed = nn.Embedding(2, cfg.hidden)
        self.embed_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.layers))
        self.head_dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.head_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.head_bias = nn.Parameter(torch.zeros(cfg.vocab))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        positions = torch.arange(seq, device=tokens.device)
        x = self.tok_embed(tokens) + self.pos_embed(positions) + self.type_embed.weight[0]
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x)
        h = self.head_norm(F.gelu(self.head_dense(x)))
        logits = F.linear(h, self.tok_embed.weight, self.head_bias)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
