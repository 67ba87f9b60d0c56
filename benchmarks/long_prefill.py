"""Long-context prefill: time and peak memory of one forward over 16k, 32k and 100k tokens at
batch 1, for eager PyTorch, torch.compile and magi_compile side by side in one process.

    python benchmarks/long_prefill.py --device cuda --out benchmarks/results/cuda_h100_long_prefill.json
    python benchmarks/long_prefill.py --device cpu --size tiny
    python benchmarks/long_prefill.py --device cuda --models llama --tokens 100000 --out F --append

A run too long for one command splits with ``--models``/``--tokens`` and ``--append``: rows of
the same model, length and variant are replaced, the others kept, and the meta lists each
command.

Models:

- ``block``: one pre-norm transformer block whose attention is written out as research code
  writes it (``q @ k.transpose(-2, -1) * scale``, ``masked_fill`` with a ``torch.tril`` mask,
  softmax in float32, ``@ v``) and a SiLU-gated MLP: hidden 2048, 16 heads, MLP 8192. Eager
  materialises the S x S scores.
- ``llama``: Hugging Face's ``LlamaForCausalLM`` at the Llama-3.2-1B shape (random weights,
  ``zoo_models.py``), called as a prefill is: ``model(input_ids=..., use_cache=False,
  logits_to_keep=1)``. Eager runs its SDPA attention with ``is_causal``; under a trace,
  transformers builds the [1, 1, S, S] mask instead (recognize_causal_masks in docs/passes.md).

Each (model, length, variant) compiles a fresh copy of the model (torch.compile with
``dynamic=False``), times the first call on the host clock, then the median of ``--runs``
calls with CUDA events (after one warm-up call), and records the peak of allocated device
memory over those calls (``torch.cuda.max_memory_allocated``). An out-of-memory error is a row
with the error, and the run goes on. Outputs are checked against eager's where eager ran.
Each row also carries the prefill's matmul FLOPs (the linear layers, and causal attention at
2 S^2 D per layer); with the bf16 matrix rate measured at the start of the run (an 8192^3
product), that gives the floor no implementation can beat.
bf16 on CUDA, float32 on the CPU (the tiny size: 256 and 512 tokens).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import grid  # noqa: E402

MODELS = ("block", "llama")
VARIANTS = ("eager", "inductor", "magi")
TOKENS = {"real": (16384, 32768, 100000), "tiny": (256, 512)}


class WrittenOutBlock(nn.Module):
    """Pre-norm block with attention written out and a causal tril mask."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (
            self.qkv(self.norm1(x)).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        )
        att = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.head_dim))
        mask = torch.tril(torch.ones(s, s, device=x.device))
        att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att.float(), dim=-1).type_as(q)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def build(model: str, size: str, device: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    if model == "block":
        dims = (2048, 16, 8192) if size == "real" else (64, 4, 256)
        with torch.device(device):
            return WrittenOutBlock(*dims).to(dtype).eval()
    from benchmarks import zoo_models

    return zoo_models.build(zoo_models.FAMILIES["llama"], size, device, dtype)


def prefill_flop(model: str, net: nn.Module, tokens: int) -> float:
    """Matmul FLOPs of one prefill: 2 x rows x in x out per linear layer (the HF model's LM head
    on the one kept position), and causal attention, 2 S^2 D per layer (QK^T and PV over half
    the S x S entries, D = heads x head dim)."""
    flop = 0.0
    for name, m in net.named_modules():
        if isinstance(m, nn.Linear):
            rows = 1 if name.endswith("lm_head") else tokens
            flop += 2.0 * rows * m.in_features * m.out_features
    if model == "block":
        layers, width = 1, net.o.in_features
    else:
        cfg = net.config
        layers = cfg.num_hidden_layers
        width = cfg.num_attention_heads * getattr(
            cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads
        )
    return flop + layers * 2.0 * tokens * tokens * width


def measured_matrix_tflops(device: str) -> float | None:
    """bf16 TFLOP/s of an 8192^3 matrix product on random data (median of 10 after 3 warm-ups);
    None on the CPU."""
    if device != "cuda":
        return None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        a @ b  # warm-ups (time_calls adds a third)
    ms = grid.time_calls(lambda: a @ b, device, 10)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def make_call(model: str, net: nn.Module, tokens: int, device: str, dtype: torch.dtype):
    """The call of one prefill and what to compare of its result."""
    g = torch.Generator(device="cpu").manual_seed(tokens)
    if model == "block":
        hidden = net.o.in_features
        x = torch.randn(1, tokens, hidden, generator=g).to(device, dtype)
        return lambda m: m(x)
    ids = torch.randint(0, net.config.vocab_size, (1, tokens), generator=g).to(device)
    return lambda m: m(input_ids=ids, use_cache=False, logits_to_keep=1).logits


def compile_variant(variant: str, net: nn.Module) -> nn.Module:
    if variant == "eager":
        return net
    if variant == "inductor":
        return torch.compile(net, dynamic=False)
    from magi_compiler import magi_compile

    return magi_compile(net)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_one(model: str, variant: str, tokens: int, args: argparse.Namespace, reference: dict):
    device, dtype = args.device, (torch.bfloat16 if args.device == "cuda" else torch.float32)
    row: dict[str, Any] = {"model": model, "tokens": tokens, "variant": variant}
    net = compiled = None
    try:
        net = build(model, args.size, device, dtype)
        row["flop"] = prefill_flop(model, net, tokens)
        call = make_call(model, net, tokens, device, dtype)
        compiled = compile_variant(variant, net)
        with torch.no_grad():
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            out = call(compiled)
            _sync(device)
            row["first_call_s"] = round(time.perf_counter() - start, 3)
            out = out.float().cpu()
            if variant == "eager":
                reference[(model, tokens)] = out
            elif (model, tokens) in reference:
                want = reference[(model, tokens)]
                row["max_rel_err"] = float(
                    (out - want).abs().max() / want.abs().max().clamp_min(1e-12)
                )
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            row["ms"] = round(grid.time_calls(lambda: call(compiled), device, args.runs), 3)
            if device == "cuda":
                row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    except Exception as e:  # a failure is a row; the next point still runs
        row["error"] = grid.failure(e)
    finally:
        net = compiled = None  # noqa: F841 (drops the model before the next row)
        grid.release(device)
    return row


def main(argv: list[str] | None = None) -> dict:
    p = grid.parser(__doc__)
    p.add_argument(
        "--size", choices=("real", "tiny"), default=None, help="real on CUDA, tiny on CPU"
    )
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--tokens", default=None, help="comma-separated lengths (default: per size)")
    p.add_argument("--runs", type=int, default=3, help="timed calls per row (median)")
    args = p.parse_args(argv)
    args.size = args.size or ("real" if args.device == "cuda" else "tiny")
    tokens = grid.parse_list(args.tokens, TOKENS[args.size], int)
    models, variants = grid.parse_list(args.models, ()), grid.parse_list(args.variants, ())
    grid.check_known(p, "model", models, MODELS)
    grid.check_known(p, "variant", variants, VARIANTS)
    meta = grid.run_meta(
        "long_prefill", args.device, argv,
        size=args.size,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        runs=args.runs,
        matrix_tflops=measured_matrix_tflops(args.device),
    )  # fmt: skip
    order = {name: i for i, name in enumerate((*MODELS, *VARIANTS))}
    results = grid.Results(
        meta, args.out, args.append,
        key=lambda r: (r["model"], r["tokens"], r["variant"]),
        asked=[(m, n, v) for m in models for n in tokens for v in variants],
        order=lambda r: (order[r["model"]], r["tokens"], order[r["variant"]]),
    )  # fmt: skip
    reference: dict = {}
    total, done = len(models) * len(tokens) * len(variants), 0
    for model in models:
        for n in tokens:
            for variant in variants:
                row = run_one(model, variant, n, args, reference)
                results.add(row)
                done += 1
                shown = (
                    row.get("error") or f"{row['ms']:.1f} ms, peak {row.get('peak_gib', '-')} GiB"
                )
                print(f"[{done}/{total}] {model} {n} tokens {variant}: {shown}", flush=True)
            reference.pop((model, n), None)
    return results.doc


if __name__ == "__main__":
    main()
