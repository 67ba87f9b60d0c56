"""Kernel-level profile of eager vs magi_compile (with and without CUDA graphs) for the
quick-start blocks on the GPU: the top CUDA kernels by total time, per variant.

    python scripts/gpu/profile_block.py [--model gpt2|llama] [--batch 8] [--seq 512]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from blocks import GPT2Block, LlamaBlock, init_weights_  # noqa: E402
from magi_compiler import magi_compile  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rows", type=int, default=12)
    args = ap.parse_args()
    if args.model == "gpt2":
        model, hidden = GPT2Block(hidden=768, n_heads=12), 768
    else:
        model, hidden = LlamaBlock(hidden=1024, n_heads=16, n_kv_heads=8, intermediate=2816), 1024
    init_weights_(model, seed=0)
    model = model.cuda().to(torch.bfloat16).eval()
    variants = {
        "eager": model,
        "magi": magi_compile(copy.deepcopy(model)),
        "magi+graphs": magi_compile(copy.deepcopy(model), config_patch={"cudagraph_mode": "FULL"}),
        "torch.compile": torch.compile(copy.deepcopy(model)),
    }
    x = torch.randn(args.batch, args.seq, hidden, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for name, fn in variants.items():
            for _ in range(5):
                fn(x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    fn(x)
                torch.cuda.synchronize()
            print(f"\n===== {name} (10 calls) =====")
            print(
                prof.key_averages().table(
                    sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60
                )
            )


if __name__ == "__main__":
    main()
