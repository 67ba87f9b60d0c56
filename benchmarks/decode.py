"""KV-cache decode: milliseconds per token of greedy decode with a static cache, over a grid of
batch sizes and context lengths, for eager PyTorch, torch.compile and magi_compile side by side
in one process, with the bandwidth floor beside each point.

    python benchmarks/decode.py --device cuda --out benchmarks/results/cuda_h100_decode.json
    python benchmarks/decode.py --device cpu --size tiny
    python benchmarks/decode.py --device cuda --batches 32 --contexts 32768 --out F --append

The model is Hugging Face's ``LlamaForCausalLM`` at the Llama-3.2-1B shape (random weights,
``zoo_models.py``) with its own ``transformers.StaticCache`` of ``context`` slots, called
through ``magi_compiler.kv_cache.HFStaticCacheLM`` (docs/decode.md). Hugging Face's static
layers attend over all ``max_cache_len`` slots under a mask, so every step reads the whole
cache: the context is the cache's length, and where in it the tokens sit does not change the
work. Variants: ``eager``; ``inductor``: ``torch.compile(mode="reduce-overhead")`` (CUDA
graphs); ``magi``: ``magi_compile`` with ``cudagraph_mode=FULL`` (one graph replayed per
token). Each point builds the model once per variant, generates once to compile and capture,
then ``--runs`` times: the cache is reset, a ``--prompt``-token prompt is prefilled, and
``--steps`` tokens are decoded with :func:`magi_compiler.kv_cache.generate` (argmax and
positions on the device; one synchronisation at the end). *ms/token* is the median decode time
per step; *tokens/s* counts every row of the batch. The greedy tokens are compared with
eager's (the fraction that agree: bf16 can flip a near tie between random logits).

The floor of a step is the bytes it must read at the device's copy bandwidth (measured at the
start of the run: a 1 GiB device-to-device copy, read plus write bytes over time): every weight
once (the tied embedding is the LM head), and the keys and values of every cache slot of every
layer and row. A CUDA-graph replay of a 1B-parameter model cannot go below it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import grid, zoo_models  # noqa: E402

VARIANTS = ("eager", "inductor", "magi")
GRID = {"real": ((1, 8, 32), (1024, 8192, 32768)), "tiny": ((1, 2), (64, 128))}


def copy_gbps(device: str) -> float | None:
    """Device-to-device copy bandwidth in GB/s (read plus write bytes of a 1 GiB copy, median
    of 10 after a warm-up); None on the CPU."""
    if device != "cuda":
        return None
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = grid.time_calls(lambda: dst.copy_(src), device, 10)
    return 2 * 2**30 / (ms * 1e-3) / 1e9


def step_bytes(model: torch.nn.Module, batch: int, context: int) -> int:
    """Bytes one decode step must read: each distinct weight once, and the cache's keys and
    values over all ``context`` slots of every layer and row."""
    weights = sum(
        p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()
    )
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = next(model.parameters()).element_size()
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * context * head_dim
    return weights + kv * element


def build(size: str, device: str, dtype: torch.dtype, batch: int, context: int):
    """The model at ``size`` and an HFStaticCacheLM around it with a cache of ``context`` slots."""
    from magi_compiler.kv_cache import HFStaticCacheLM
    from transformers import StaticCache

    model = zoo_models.build(zoo_models.FAMILIES["llama"], size, device, dtype)
    cache = StaticCache(config=model.config, max_cache_len=context)
    return model, HFStaticCacheLM(model, cache, batch=batch)


def compile_variant(variant: str, lm: torch.nn.Module, device: str) -> torch.nn.Module:
    if variant == "eager":
        return lm
    if variant == "inductor":
        mode = "reduce-overhead" if device == "cuda" else None
        return torch.compile(lm, mode=mode, dynamic=False)
    from magi_compiler import magi_compile

    mode = "FULL" if device == "cuda" else "NONE"
    return magi_compile(lm, config_patch={"cudagraph_mode": mode})


def run_point(batch: int, context: int, variant: str, args: argparse.Namespace, reference: dict):
    from magi_compiler.kv_cache import generate

    device, dtype = args.device, (torch.bfloat16 if args.device == "cuda" else torch.float32)
    row: dict[str, Any] = {"batch": batch, "context": context, "variant": variant}
    lm = compiled = None
    try:
        model, lm = build(args.size, device, dtype, batch, context)
        row["bytes"] = step_bytes(model, batch, context)
        vocab = model.config.vocab_size
        g = torch.Generator(device="cpu").manual_seed(batch * 100003 + context)
        prompt = torch.randint(0, vocab, (batch, args.prompt), generator=g).to(device)
        compiled = compile_variant(variant, lm, device)
        with torch.no_grad():
            start = time.perf_counter()
            first = generate(compiled, prompt, args.steps + 1)  # compiles (and captures)
            row["first_call_s"] = round(time.perf_counter() - start, 3)
            if variant == "eager":
                reference[(batch, context)] = first.tokens.cpu()
            elif (batch, context) in reference:
                want = reference[(batch, context)]
                row["tokens_agree"] = round(float((first.tokens.cpu() == want).float().mean()), 4)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            per_token = []
            for _ in range(args.runs):
                lm.reset()
                per_token.append(generate(compiled, prompt, args.steps + 1).ms_per_token)
            row["ms_per_token"] = round(statistics.median(per_token), 4)
            row["tokens_per_s"] = round(batch * 1e3 / row["ms_per_token"], 1)
            if device == "cuda":
                row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    except Exception as e:  # a failure is a row; the next point still runs
        row["error"] = grid.failure(e)
    finally:
        lm = compiled = None  # noqa: F841 (drops the model and its cache before the next point)
        grid.release(device)
    return row


def main(argv: list[str] | None = None) -> dict:
    p = grid.parser(__doc__)
    p.add_argument(
        "--size", choices=("real", "tiny"), default=None, help="real on CUDA, tiny on CPU"
    )
    p.add_argument(
        "--batches", default=None, help="comma-separated batch sizes (default: per size)"
    )
    p.add_argument(
        "--contexts", default=None, help="comma-separated cache lengths (default: per size)"
    )
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens before the decode")
    p.add_argument("--steps", type=int, default=32, help="decode steps per timed generation")
    p.add_argument("--runs", type=int, default=3, help="timed generations per point (median)")
    args = p.parse_args(argv)
    args.size = args.size or ("real" if args.device == "cuda" else "tiny")
    default_batches, default_contexts = GRID[args.size]
    batches = grid.parse_list(args.batches, default_batches, int)
    contexts = grid.parse_list(args.contexts, default_contexts, int)
    variants = grid.parse_list(args.variants, ())
    grid.check_known(p, "variant", variants, VARIANTS)
    too_short = [c for c in contexts if c < args.prompt + args.steps + 1]
    if too_short:
        p.error(f"context {too_short[0]} holds fewer than --prompt + --steps + 1 tokens")
    meta = grid.run_meta(
        "decode", args.device, argv,
        size=args.size,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        prompt=args.prompt,
        steps=args.steps,
        runs=args.runs,
        copy_gbps=copy_gbps(args.device),
    )  # fmt: skip
    order = {v: i for i, v in enumerate(VARIANTS)}
    results = grid.Results(
        meta, args.out, args.append,
        key=lambda r: (r["batch"], r["context"], r["variant"]),
        asked=[(b, c, v) for b in batches for c in contexts for v in variants],
        order=lambda r: (r["context"], r["batch"], order[r["variant"]]),
        per_row=("copy_gbps",),
    )  # fmt: skip
    reference: dict = {}
    total, done = len(batches) * len(contexts) * len(variants), 0
    for context in contexts:
        for batch in batches:
            for variant in variants:
                row = run_point(batch, context, variant, args, reference)
                results.add(row)
                done += 1
                shown = row.get("error") or (
                    f"{row['ms_per_token']:.3f} ms/token, {row['tokens_per_s']:,.0f} tokens/s, "
                    f"first call {row['first_call_s']:.1f} s"
                )
                print(
                    f"[{done}/{total}] batch {batch} context {context} {variant}: {shown}",
                    flush=True,
                )
            reference.pop((batch, context), None)
    return results.doc


if __name__ == "__main__":
    main()
