"""A training step on packed documents: a Llama-style stack whose attention is
``magi_compiler.attention.range_attention``, compiled with ``magi_compile``, against the same
stack attending through a dense boolean mask (eager), gradients compared.

    python examples/packed_training.py                          # CUDA, bf16, causal documents
    python examples/packed_training.py --mask prefix_lm          # or block_causal
    python examples/packed_training.py --device cpu --tokens 256 # float32

Documents of random lengths (seeded) are packed into one sequence; rotary positions restart at
each document; the mask comes from the slice builders (``varlen_slices``, ``prefix_lm_slices``,
``block_causal_slices``). Prints one line and exits non-zero when the loss or a gradient differs
from the reference's by more than the tolerance (bf16: 3e-2 of the largest magnitude, float32:
1e-4).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blocks import LlamaBlock, apply_rotary, init_weights_, rotary_cos_sin  # noqa: E402
from magi_compiler import inspection, magi_compile  # noqa: E402
from magi_compiler.attention import (  # noqa: E402
    block_causal_slices,
    dense_mask,
    prefix_lm_slices,
    range_attention,
    varlen_slices,
)

MASKS = ("causal", "prefix_lm", "block_causal")


class PackedBlock(LlamaBlock):
    """:class:`LlamaBlock` over packed tokens ``(1, tokens, hidden)``: attention through
    ``range_attention`` with the mask's slices, or (``dense``) through SDPA with its dense
    boolean mask, the reference."""

    dense = False

    def forward(self, x, cos, sin, slices, mask):
        h = self.input_norm(x)
        tokens = x.shape[1]
        q = self.q_proj(h).view(1, tokens, self.n_heads, self.head_dim)
        k = self.k_proj(h).view(1, tokens, self.n_kv_heads, self.head_dim)
        v = self.v_proj(h).view(tokens, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos, sin)[0], apply_rotary(k, cos, sin)[0]
        if self.dense:
            kh, vh = (t.repeat_interleave(self.n_rep, dim=1).transpose(0, 1) for t in (k, v))
            out = F.scaled_dot_product_attention(q.transpose(0, 1), kh, vh, attn_mask=mask)
            out = out.transpose(0, 1)
        else:
            out, _ = range_attention(q, k, v, *slices)
        x = x + self.o_proj(out.reshape(1, tokens, -1))
        return x + self._mlp(self.post_attn_norm(x))


class PackedStack(nn.Module):
    def __init__(self, layers: int, **block_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PackedBlock(**block_kwargs) for _ in range(layers))

    def forward(self, x, cos, sin, q_ranges, k_ranges, mask_types, mask):
        for layer in self.layers:
            x = layer(x, cos, sin, (q_ranges, k_ranges, mask_types), mask)
        return x


def documents(tokens: int, seed: int) -> list[int]:
    """Cumulative offsets of documents of 1/16 to 1/4 of ``tokens`` (the last one cut)."""
    g = torch.Generator().manual_seed(seed)
    cu = [0]
    while cu[-1] < tokens:
        cu.append(
            min(
                tokens,
                cu[-1] + int(torch.randint(tokens // 16, tokens // 4 + 1, (1,), generator=g)),
            )
        )
    return cu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--mask", default="causal", choices=MASKS)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cu = documents(args.tokens, args.seed)
    slices = {
        "causal": lambda: varlen_slices(cu, causal=True, device=device),
        "prefix_lm": lambda: prefix_lm_slices(
            cu, [(b - a) // 4 for a, b in zip(cu, cu[1:], strict=False)], device=device
        ),
        "block_causal": lambda: block_causal_slices(cu, 64, device=device),
    }[args.mask]()
    mask = dense_mask(*slices, args.tokens, args.tokens).to(device)

    # Rotary positions restart at each document.
    starts = torch.tensor(cu[:-1]).repeat_interleave(torch.tensor(cu).diff())
    positions = torch.arange(args.tokens) - starts
    head_dim = args.hidden // 8
    cos, sin = (t[positions].to(device) for t in rotary_cos_sin(args.tokens, head_dim, dtype=dtype))

    torch.manual_seed(args.seed)
    reference = PackedStack(args.layers, hidden=args.hidden, n_heads=8, n_kv_heads=4,
                            intermediate=2 * args.hidden)  # fmt: skip
    init_weights_(reference, seed=args.seed)
    reference = reference.to(device, dtype)
    compiled = magi_compile(copy.deepcopy(reference))
    for block in reference.layers:
        block.dense = True
    x = torch.randn(1, args.tokens, args.hidden, device=device, dtype=dtype)
    target = torch.randn_like(x)
    losses, grads = [], []
    for model in (compiled, reference):
        loss = F.mse_loss(model(x, cos, sin, *slices, mask).float(), target.float())
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.float() for p in model.parameters()])
    # The compiled forward was cut at each range_attention call (a graph boundary).
    cuts = inspection.last_compiled("forward").boundary_ops.count("magi::range_attention")
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-4
    worst = max(
        float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
        for a, b in zip(*grads, strict=True)
    )
    loss_error = abs(losses[0] - losses[1]) / abs(losses[1])
    ok = worst <= tolerance and loss_error <= tolerance and cuts == args.layers
    print(
        f"packed training step on {device.type}: {len(cu) - 1} documents, {args.tokens} tokens, "
        f"mask {args.mask}, {args.layers} layers under magi_compile ({cuts} range_attention "
        f"boundaries): loss {losses[0]:.6f} "
        f"(dense reference {losses[1]:.6f}), worst gradient error {worst:.2e} "
        f"(tolerance {tolerance:.0e}): {'ok' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
