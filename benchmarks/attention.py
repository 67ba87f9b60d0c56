"""Range-mask attention: TFLOP/s of ``range_attention`` forward and backward per mask and
length, against the kernels PyTorch offers for the same mask, side by side in one process.

    python benchmarks/attention.py --device cuda --out benchmarks/results/cuda_h100_attention.json
    python benchmarks/attention.py --device cuda --tokens 8192 --masks causal,varlen_causal
    python benchmarks/attention.py --device cpu --tokens 512 --runs 2

Masks over ``T`` packed tokens (bf16 on CUDA, float32 on the CPU; 16 query and 16 key/value
heads of dim 128 on CUDA, 4 heads of 32 on the CPU):

- ``full``, ``causal``: one slice over all tokens;
- ``varlen_causal``: documents of 512 to 8,192 tokens (seeded), each causal;
- ``sliding_window``: the same documents, causal under a 1,024-key window;
- ``block_causal``: the same documents in blocks of 1,024 tokens, each block seeing its own and
  the earlier blocks of its document fully;
- ``prefix_lm``: the same documents, the first quarter of each seen fully, the rest causal.

Variants: ``magi`` (``range_attention``, on PyTorch's flash varlen kernels in one call or in
layers, docs/attention.md), ``cudnn`` and ``flash`` (SDPA with one
backend, dense masks only), ``varlen`` (``torch.nn.attention.varlen.varlen_attn``, documents,
with or without the window), ``flex`` (``flex_attention`` compiled, with the mask as a block mask; its
compile time is reported apart). Each row: median ms of ``--runs`` calls after a warm-up (CUDA
events), forward alone and backward alone (``autograd.grad`` of the kept forward), and TFLOP/s
in FlashAttention's convention: 4 x visible (query, key) pairs x head dim x heads forward, 2.5
times that backward. Outputs are checked against the magi variant's.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from magi_compiler.attention import (  # noqa: E402
    block_causal_slices,
    prefix_lm_slices,
    range_attention,
    sliding_window_slices,
    varlen_slices,
)
from magi_compiler.attention.slices import diagonal_bounds  # noqa: E402

from benchmarks import grid  # noqa: E402

MASKS = ("full", "causal", "varlen_causal", "sliding_window", "block_causal", "prefix_lm")
VARIANTS = ("magi", "cudnn", "flash", "varlen", "flex")
WINDOW, BLOCK = 1024, 1024


def documents(tokens: int, seed: int = 0) -> list[int]:
    """Cumulative offsets of documents of 512 to 8,192 tokens (the last one cut) filling
    ``tokens``."""
    rng = random.Random(seed)
    cu = [0]
    while cu[-1] < tokens:
        cu.append(min(tokens, cu[-1] + rng.randint(512, 8192)))
    return cu


def slices_of(mask: str, tokens: int, device: str):
    whole = [0, tokens]
    cu = documents(tokens)
    if mask == "full":
        return varlen_slices(whole, device=device), cu
    if mask == "causal":
        return varlen_slices(whole, causal=True, device=device), cu
    if mask == "varlen_causal":
        return varlen_slices(cu, causal=True, device=device), cu
    if mask == "sliding_window":
        return sliding_window_slices(cu, WINDOW, device=device), cu
    if mask == "block_causal":
        return block_causal_slices(cu, BLOCK, device=device), cu
    prefixes = [(b - a) // 4 for a, b in zip(cu, cu[1:], strict=False)]
    return prefix_lm_slices(cu, prefixes, device=device), cu


def visible_pairs(slices) -> int:
    """(query, key) pairs the slices make visible, counted per slice (FlashAttention's FLOP
    convention counts the work, and overlapping slices are both computed)."""
    total = 0
    q_list, k_list, t_list = (x.tolist() for x in slices)
    for (qs, qe), (ks, ke), t in zip(q_list, k_list, t_list, strict=True):
        lo, hi = diagonal_bounds((qs, qe), (ks, ke), t)
        for q in range(qs, qe):
            total += max(0, min(ke - 1, q + hi) - max(ks, q + lo) + 1)
    return total


def applies(variant: str, mask: str, device: str) -> bool:
    if variant in ("cudnn", "flex", "varlen") and device != "cuda":
        return False  # CUDA kernels only (flex: its backward)
    if variant in ("cudnn", "flash"):
        return mask in ("full", "causal")
    if variant == "varlen":
        return mask in ("full", "causal", "varlen_causal", "sliding_window")
    return True


def make_call(variant: str, mask: str, slices, cu: list[int], q, k, v):
    """A function computing the attention output ``(tokens, heads, dim)``, and the seconds its
    preparation took (flex: the compile)."""
    tokens = q.shape[0]
    if variant == "magi":
        return lambda: range_attention(q, k, v, *slices)[0], 0.0
    if variant in ("cudnn", "flash"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.CUDNN_ATTENTION if variant == "cudnn" else SDPBackend.FLASH_ATTENTION
        causal = mask == "causal"

        def dense():
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                    is_causal=causal,
                )  # fmt: skip
            return out[0].transpose(0, 1)

        return dense, 0.0
    if variant == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        offsets = cu if mask in ("varlen_causal", "sliding_window") else [0, tokens]
        cu_t = torch.tensor(offsets, dtype=torch.int32, device=q.device)
        longest = max(b - a for a, b in zip(offsets, offsets[1:], strict=False))
        window = {"full": (-1, -1), "sliding_window": (WINDOW - 1, 0)}.get(mask, (-1, 0))
        return lambda: varlen_attn(q, k, v, cu_t, cu_t, longest, longest, window_size=window), 0.0
    # flex: the dense mask of the slices as a block mask, the call compiled.
    from magi_compiler.attention import dense_mask
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    start = time.perf_counter()
    keep = dense_mask(*slices, tokens, tokens)
    block_mask = create_block_mask(
        lambda b, h, qi, ki: keep[qi, ki], None, None, tokens, tokens, device=q.device
    )
    flex = torch.compile(flex_attention, dynamic=False)

    def call():
        out = flex(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                   block_mask=block_mask)  # fmt: skip
        return out[0].transpose(0, 1)

    call()
    if q.is_cuda:
        torch.cuda.synchronize()
    return call, time.perf_counter() - start


def magi_kernels(q, k, v, slices) -> str:
    """What range_attention ran for this call, forward / backward: ``cudnn`` (one dense document
    where the first call found cuDNN faster), ``flash`` (one varlen call), ``flash xN`` (N calls
    merged) or ``portable``."""
    from magi_compiler.attention import cudnn_path, flash_path, op

    checked = op._checked_slices(*slices, q.shape[0], k.shape[0])
    calls = flash_path.plan(q, k, v, checked, None, 0.0, False)
    if calls is None:
        return "portable / portable"
    on_flash = "flash" if len(calls) == 1 else f"flash x{len(calls)}"
    chosen = {e["direction"]: e["chosen"] for e in cudnn_path.choices()
              if e["q"] == tuple(q.shape) and e["k"] == tuple(k.shape)}  # fmt: skip
    if cudnn_path.dense_causal(q, k, v, calls) is None:
        chosen = {}
    return " / ".join(
        "cudnn" if chosen.get(d) == "cudnn" else on_flash for d in ("forward", "backward")
    )


def run_row(mask: str, tokens: int, variant: str, args, reference: dict) -> dict[str, Any]:
    device = args.device
    dtype, heads, dim = (torch.bfloat16, 16, 128) if device == "cuda" else (torch.float32, 4, 32)
    row: dict[str, Any] = {"mask": mask, "tokens": tokens, "variant": variant}
    try:
        slices, cu = slices_of(mask, tokens, device)
        pairs = visible_pairs(slices)
        row["flop_forward"] = 4.0 * pairs * dim * heads
        g = torch.Generator(device="cpu").manual_seed(tokens)
        q, k, v = (
            torch.randn(tokens, heads, dim, generator=g).to(device, dtype).requires_grad_()
            for _ in range(3)
        )
        call, prepare_s = make_call(variant, mask, slices, cu, q, k, v)
        if prepare_s:
            row["compile_s"] = round(prepare_s, 2)
        out = call()
        if variant == "magi":
            reference[(mask, tokens)] = out.detach().float()
        elif (mask, tokens) in reference:
            want = reference[(mask, tokens)]
            err = (out.detach().float() - want).abs().max() / want.abs().max()
            row["max_rel_err"] = float(err)
        row["forward_ms"] = round(grid.time_calls(call, device, args.runs), 3)
        grad = torch.randn_like(out)
        row["backward_ms"] = round(
            grid.time_calls(
                lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True),
                device,
                args.runs,
            ),
            3,
        )
        if variant == "magi":
            row["kernels"] = magi_kernels(q, k, v, slices)
        row["forward_tflops"] = round(row["flop_forward"] / row["forward_ms"] / 1e9, 3)
        row["backward_tflops"] = round(2.5 * row["flop_forward"] / row["backward_ms"] / 1e9, 3)
    except Exception as e:  # a failure is a row; the next point still runs
        row["error"] = grid.failure(e)
    finally:
        grid.release(device)
    return row


def main(argv: list[str] | None = None) -> dict:
    p = grid.parser(__doc__)
    p.add_argument("--tokens", default=None, help="comma-separated (default 8192,16384,32768)")
    p.add_argument("--masks", default=",".join(MASKS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--runs", type=int, default=10, help="timed calls per row (median)")
    args = p.parse_args(argv)
    default = (8192, 16384, 32768) if args.device == "cuda" else (512, 1024)
    tokens = grid.parse_list(args.tokens, default, int)
    masks, variants = grid.parse_list(args.masks, ()), grid.parse_list(args.variants, ())
    grid.check_known(p, "mask", masks, MASKS)
    grid.check_known(p, "variant", variants, VARIANTS)
    if "magi" in variants:  # the reference for the others' errors
        variants = ["magi", *(v for v in variants if v != "magi")]
    meta = grid.run_meta(
        "attention", args.device, argv,
        runs=args.runs,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        heads=16 if args.device == "cuda" else 4,
        head_dim=128 if args.device == "cuda" else 32,
    )  # fmt: skip
    order = {name: i for i, name in enumerate((*MASKS, *VARIANTS))}
    results = grid.Results(
        meta, args.out, args.append,
        key=lambda r: (r["mask"], r["tokens"], r["variant"]),
        asked=[(m, n, v) for m in masks for n in tokens for v in variants],
        order=lambda r: (order[r["mask"]], r["tokens"], order[r["variant"]]),
    )  # fmt: skip
    reference: dict = {}
    for mask in masks:
        for n in tokens:
            for variant in variants:
                if not applies(variant, mask, args.device):
                    continue
                row = run_row(mask, n, variant, args, reference)
                results.add(row)
                shown = row.get("error") or (
                    f"forward {row['forward_ms']:.2f} ms ({row['forward_tflops']} TFLOP/s), "
                    f"backward {row['backward_ms']:.2f} ms ({row['backward_tflops']} TFLOP/s)"
                )
                print(f"[{mask} {n} {variant}] {shown}", flush=True)
            reference.pop((mask, n), None)
    return results.doc


if __name__ == "__main__":
    main()
