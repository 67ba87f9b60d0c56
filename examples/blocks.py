"""Plain PyTorch transformer blocks used by the quick start, the tests and the benchmarks.

Nothing in this file depends on magi_compiler: these are ordinary ``nn.Module`` definitions,
written out explicitly (no fused helpers such as ``F.rms_norm``) so that the graphs the
compiler sees contain the usual elementwise / reduction / matmul patterns it optimises.

Every ``forward`` is traceable by ``torch.compile(fullgraph=True)`` with dim 0 of the input
(the batch) marked dynamic: there is no data-dependent Python control flow and no ``.item()``.
The sequence length is read from ``x.shape[1]`` and is treated as static.

Contents
--------
- :class:`RMSNorm`                    root-mean-square norm, computed in float32.
- :func:`rotary_cos_sin`, :func:`apply_rotary`   Llama-style rotary position embedding.
- :class:`LlamaBlock`                 pre-norm decoder block: RoPE + GQA attention + SwiGLU MLP.
- :class:`GPT2Block`                  pre-norm decoder block: fused qkv + GELU(tanh) MLP.
- :class:`DiTBlock`                   video-DiT-style block: LayerNorm, full attention, GELU MLP.
- :class:`LlamaStack`, :class:`GPT2Stack`, :class:`DiTStack`   stacks of the blocks above.
- :func:`init_weights_`               deterministic, non-trivial re-initialisation for tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "RMSNorm",
    "rotary_cos_sin",
    "apply_rotary",
    "LlamaBlock",
    "GPT2Block",
    "DiTBlock",
    "LlamaStack",
    "GPT2Stack",
    "DiTStack",
    "init_weights_",
]


# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich, 2019), as used by Llama.

    ``y = x / sqrt(mean(x^2, -1) + eps) * weight``, computed in float32 and cast back to the
    input dtype. Written out explicitly rather than via ``F.rms_norm``.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        xf = xf * torch.rsqrt(variance + self.eps)
        return (xf * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


# --------------------------------------------------------------------------------------------
# Rotary position embedding
# --------------------------------------------------------------------------------------------


def rotary_cos_sin(
    seq_len: int,
    head_dim: int,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cos / sin tables for rotary embedding, each of shape ``(seq_len, head_dim)``.

    Frequencies are ``base ** (-2i / head_dim)`` for ``i in [0, head_dim / 2)``; the table is
    duplicated along the last dim to match the rotate-half layout used by :func:`apply_rotary`.
    The tables are computed in float32 and cast to ``dtype`` (default: float32) at the end.
    Built from ``torch.arange`` so it traces cleanly inside a compiled forward.
    """
    if head_dim % 2 != 0:
        raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
    inv_freq = 1.0 / (
        base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)  # (seq_len, head_dim / 2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (seq_len, head_dim)
    out_dtype = dtype if dtype is not None else torch.float32
    return emb.cos().to(out_dtype), emb.sin().to(out_dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` along the last dim."""
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary embedding (rotate-half form, as in Hugging Face Llama).

    ``x`` has shape ``(batch, seq, heads, head_dim)``; ``cos`` / ``sin`` have shape
    ``(seq, head_dim)`` and are broadcast over batch and heads.
    """
    cos = cos[:, None, :]  # (seq, 1, head_dim) -> broadcasts over (batch, seq, heads, head_dim)
    sin = sin[:, None, :]
    return x * cos + _rotate_half(x) * sin


# --------------------------------------------------------------------------------------------
# Llama-style block
# --------------------------------------------------------------------------------------------


class LlamaBlock(nn.Module):
    """Pre-norm Llama-style decoder block.

    ``x -> x + o_proj(attn(rope(q), rope(k), v))`` with grouped-query causal attention,
    then ``x -> x + down(silu(gate(h)) * up(h))`` with ``h = RMSNorm(x)``.

    Input and output have shape ``(batch, seq, hidden)``.
    """

    def __init__(
        self,
        hidden: int = 256,
        n_heads: int = 8,
        n_kv_heads: int = 4,
        intermediate: int = 512,
        eps: float = 1e-6,
        rope_base: float = 10000.0,
    ) -> None:
        super().__init__()
        if hidden % n_heads != 0:
            raise ValueError(f"hidden ({hidden}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        self.hidden = hidden
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = hidden // n_heads
        self.n_rep = n_heads // n_kv_heads
        self.rope_base = rope_base

        self.input_norm = RMSNorm(hidden, eps)
        self.q_proj = nn.Linear(hidden, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, hidden, bias=False)

        self.post_attn_norm = RMSNorm(hidden, eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.shape
        q = self.q_proj(x).view(bsz, seq_len, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim)

        cos, sin = rotary_cos_sin(
            seq_len, self.head_dim, self.rope_base, device=x.device, dtype=x.dtype
        )
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)

        # (B, S, H, D) -> (B, H, S, D)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)

        # Grouped-query attention: repeat each kv head n_rep times (kv head j serves query
        # heads j*n_rep .. (j+1)*n_rep - 1).
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)

        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, S, D)
        out = out.transpose(1, 2).reshape(bsz, seq_len, self.n_heads * self.head_dim)
        return self.o_proj(out)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.input_norm(x))
        x = x + self._mlp(self.post_attn_norm(x))
        return x


# --------------------------------------------------------------------------------------------
# GPT-2-style block
# --------------------------------------------------------------------------------------------


class GPT2Block(nn.Module):
    """Pre-norm GPT-2-style decoder block.

    ``x -> x + proj(attn(split(qkv(LN(x)))))`` with causal multi-head attention, then
    ``x -> x + fc_out(gelu_tanh(fc_in(LN(x))))`` with a 4x-wide MLP.

    Input and output have shape ``(batch, seq, hidden)``.
    """

    def __init__(self, hidden: int = 256, n_heads: int = 8, eps: float = 1e-5) -> None:
        super().__init__()
        if hidden % n_heads != 0:
            raise ValueError(f"hidden ({hidden}) must be divisible by n_heads ({n_heads})")
        self.hidden = hidden
        self.n_heads = n_heads
        self.head_dim = hidden // n_heads

        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=True)
        self.proj = nn.Linear(hidden, hidden, bias=True)

        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.fc_in = nn.Linear(hidden, 4 * hidden, bias=True)
        self.fc_out = nn.Linear(4 * hidden, hidden, bias=True)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.shape
        q, k, v = self.qkv(x).split(self.hidden, dim=-1)
        # (B, S, hidden) -> (B, H, S, D)
        q = q.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(bsz, seq_len, self.hidden)
        return self.proj(out)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self.ln_1(x))
        x = x + self._mlp(self.ln_2(x))
        return x


# --------------------------------------------------------------------------------------------
# Stacks
# --------------------------------------------------------------------------------------------


class LlamaStack(nn.Module):
    """``n_layers`` :class:`LlamaBlock` s applied in sequence (keyword args go to each block)."""

    def __init__(self, n_layers: int, **block_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LlamaBlock(**block_kwargs) for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class GPT2Stack(nn.Module):
    """``n_layers`` :class:`GPT2Block` s applied in sequence (keyword args go to each block)."""

    def __init__(self, n_layers: int, **block_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(GPT2Block(**block_kwargs) for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class DiTBlock(nn.Module):
    """A diffusion-transformer block without timestep modulation: LayerNorm, bidirectional
    (unmasked) attention, LayerNorm, GELU(tanh) MLP of ``mlp`` times the hidden size, with
    residuals. ``norm_affine=False`` gives the norms no weights (as DiTs that modulate them)."""

    def __init__(self, hidden: int, heads: int, mlp: int = 4, norm_affine: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=norm_affine)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=norm_affine)
        self.fc1 = nn.Linear(hidden, mlp * hidden)
        self.fc2 = nn.Linear(mlp * hidden, hidden)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of shape [batch, heads, seq, head_dim] from the normed input."""
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        return tuple(t.transpose(1, 2) for t in (q, k, v))  # type: ignore[return-value]

    def finish(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of the block after attention output ``o`` [batch, heads, seq, head_dim]."""
        b, s, h = x.shape
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_heads(x)
        return self.finish(x, F.scaled_dot_product_attention(q, k, v))


class DiTStack(nn.Module):
    """``layers`` :class:`DiTBlock` s applied in sequence."""

    def __init__(
        self, layers: int, hidden: int, heads: int, mlp: int = 4, norm_affine: bool = True
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            DiTBlock(hidden, heads, mlp, norm_affine) for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


# --------------------------------------------------------------------------------------------
# Initialisation
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def init_weights_(module: nn.Module, std: float = 0.02, seed: int | None = None) -> nn.Module:
    """Re-initialise ``module`` in place so that tests exercise non-trivial values.

    - ``nn.Linear``: weight ~ N(0, std), bias ~ N(0, std) (if present).
    - ``nn.LayerNorm`` / :class:`RMSNorm`: weight = 1 + N(0, 0.1), LayerNorm bias ~ N(0, 0.1).

    With ``seed`` set, the values are drawn from a private CPU generator, so the result is
    deterministic and independent of the global RNG state and of the module's device.
    Returns ``module`` for chaining.
    """
    gen = torch.Generator(device="cpu")
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()

    def normal_(p: torch.Tensor, mean: float, s: float) -> None:
        values = torch.randn(p.shape, generator=gen, dtype=torch.float32) * s + mean
        p.copy_(values.to(device=p.device, dtype=p.dtype))

    for m in module.modules():
        if isinstance(m, nn.Linear):
            normal_(m.weight, 0.0, std)
            if m.bias is not None:
                normal_(m.bias, 0.0, std)
        elif isinstance(m, (nn.LayerNorm, RMSNorm)):
            if getattr(m, "weight", None) is not None:
                normal_(m.weight, 1.0, 0.1)
            if getattr(m, "bias", None) is not None:
                normal_(m.bias, 0.0, 0.1)
    return module
