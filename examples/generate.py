"""Greedy generation with a static KV cache under magi_compile: prefill, then one token a step.

Builds a Llama-shaped model with random weights (Hugging Face's ``LlamaForCausalLM`` from a
config, or ``--model blocks``: examples/decoder.py's decoder), decodes ``--new-tokens``
tokens after a random ``--prompt-len``-token prompt, eagerly and compiled, and prints for
each the time to first token, decode tokens per second and peak memory (CUDA), then checks
that the compiled model's greedy tokens equal eager's. The Hugging Face model keeps its own
``StaticCache``, wrapped with the model by ``magi_compiler.kv_cache.HFStaticCacheLM``; on CUDA
the compiled model replays one CUDA graph per step (``--cudagraph-mode``, FULL by default).

    python examples/generate.py                                  # tiny, CPU: a few seconds
    python examples/generate.py --size 1b --device cuda --prompt-len 1024 --new-tokens 256

Exits with status 1 when the tokens differ in float32 (in bf16 a near tie between two random
logits can flip by rounding: reported, not an error). docs/decode.md explains the API.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from magi_compiler import get_counters, magi_compile  # noqa: E402
from magi_compiler.kv_cache import Generation, HFStaticCacheLM, generate  # noqa: E402

# Llama-3.2-1B's shape (16 layers, hidden 2048, 32/8 heads of 64, SwiGLU 8192, vocab 128256),
# and a tiny one with the same structure.
SIZES = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        initializer_range=0.3,  # decisive logits, so greedy tokens vary from step to step
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
    ),
}


def build(args: argparse.Namespace, max_len: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(eager, to be compiled): the same weights, each with a cache of its own."""
    size = SIZES[args.size]
    torch.manual_seed(0)
    if args.model == "blocks":
        import copy

        from blocks import init_weights_
        from decoder import LlamaDecoder

        model = LlamaDecoder(
            vocab=size["vocab_size"],
            layers=size["num_hidden_layers"],
            hidden=size["hidden_size"],
            heads=size["num_attention_heads"],
            kv_heads=size["num_key_value_heads"],
            intermediate=size["intermediate_size"],
            max_len=max_len,
            batch=args.batch,
            rope_base=size.get("rope_theta", 10000.0),
            device=args.device,
        )
        std = size.get("initializer_range", 0.02)
        init_weights_(model, std=std, seed=0).to(args.dtype).eval()
        return model, copy.deepcopy(model)
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    config = LlamaConfig(
        **size,
        max_position_embeddings=max(max_len, 2048),
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    with torch.device(args.device):
        model = LlamaForCausalLM(config).to(args.dtype).eval()

    def lm() -> HFStaticCacheLM:
        return HFStaticCacheLM(model, StaticCache(config=config, max_cache_len=max_len), args.batch)

    return lm(), lm()


def report(name: str, run: Generation) -> None:
    peak = "n/a (CPU)"
    if run.peak_memory_bytes is not None:
        peak = f"{run.peak_memory_bytes / 2**30:.2f} GiB"
    print(
        f"{name:>13}: first token {1e3 * run.time_to_first_token_s:8.1f} ms, "
        f"decode {run.decode_tokens_per_s:9.1f} tokens/s ({run.ms_per_token:.3f} ms/step), "
        f"peak memory {peak}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--model", choices=["hf", "blocks"], default="hf")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--cudagraph-mode", choices=["NONE", "PIECEWISE", "FULL"], default=None)
    parser.add_argument("--prefill-chunk", type=int, default=None, help="tokens per prefill call")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (tiny: 1)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    # A tiny model's matmuls are too small to split: on a loaded machine ATen's spinning
    # OpenMP threads make them many times slower than one thread.
    threads = args.threads or (
        1 if args.size == "tiny" and "OMP_NUM_THREADS" not in os.environ else 0
    )
    if threads:
        torch.set_num_threads(threads)
    args.device = torch.device(args.device)
    on_cuda = args.device.type == "cuda"
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if on_cuda else "float32"))
    mode = args.cudagraph_mode or ("FULL" if on_cuda else "NONE")

    max_len = args.prompt_len + args.new_tokens
    eager, model = build(args, max_len)
    compiled = magi_compile(model, config_patch={"cudagraph_mode": mode})
    gen = torch.Generator().manual_seed(1)
    vocab = SIZES[args.size]["vocab_size"]
    prompt = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen)
    prompt = prompt.to(args.device)
    print(
        f"{args.model} Llama, {args.size}: batch {args.batch}, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, {args.device} {str(args.dtype).removeprefix('torch.')}, "
        f"cudagraph_mode {mode}"
    )

    runs = {}
    for name, m in (("eager", eager), ("magi_compile", compiled)):
        # Warm-up (captures, compiles, CUDA graphs of the prefill and decode signatures), then
        # the timed generation from an empty cache.
        for _ in range(2):
            generate(m, prompt, min(args.new_tokens, 3), prefill_chunk=args.prefill_chunk)
            m.reset()
        runs[name] = generate(
            m,
            prompt,
            args.new_tokens,
            prefill_chunk=args.prefill_chunk,
            progress=not args.no_progress,
        )
        report(name, runs[name])
    c = get_counters()
    print(f"magi_compile: {c.captures} captures, {c.direct_calls} direct calls")
    speedup = runs["magi_compile"].decode_tokens_per_s / runs["eager"].decode_tokens_per_s
    print(f"decode speedup over eager: {speedup:.2f}x")

    want, got = runs["eager"].tokens, runs["magi_compile"].tokens
    if torch.equal(got, want):
        print(f"greedy tokens equal eager's ({got.numel()} tokens)")
        return 0
    step = int((got != want).any(0).nonzero()[0])
    print(f"greedy tokens differ from eager's from step {step} on")
    if args.dtype != torch.float32:
        print("(random weights in low precision: a near tie can flip; --dtype float32 is exact)")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
