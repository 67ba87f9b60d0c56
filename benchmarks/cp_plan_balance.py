"""The context-parallel planner's balance on random varlen-causal masks, beside the zigzag and
contiguous layouts: the table of docs/attention.md's "Context parallelism" section.

    python benchmarks/cp_plan_balance.py            # the four rows of the table, 10 masks each
    python benchmarks/cp_plan_balance.py --masks 3  # quicker

No device and no process group: plans are plain Python. Imbalance is max / mean rank area
(the (q, k) pairs each rank's queries attend to); "received" is the busiest rank's key/value
tokens from other ranks, in units of its own tokens (ring attention moves world_size - 1).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from magi_compiler.attention.context_parallel import (  # noqa: E402
    contiguous_plan,
    plan_context_parallel,
    zigzag_plan,
)

CASES = [  # (label, tokens, chunk, ranks, shortest document, longest document)
    ("varlen causal, documents 0.5k-8k", 65536, 512, 8, 512, 8192),
    ("varlen causal, documents 1k-32k", 262144, 1024, 8, 1024, 32768),
    ("varlen causal, documents 0.5k-8k", 65536, 512, 4, 512, 8192),
    ("dense causal", 65536, 512, 8, 65536, 65536),
]


def documents(total: int, shortest: int, longest: int, rng: random.Random):
    ranges, pos = [], 0
    while pos < total:
        n = min(rng.randint(shortest, longest), total - pos)
        ranges.append((pos, pos + n))
        pos += n
    return ranges


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masks", type=int, default=10, help="random masks per row")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print("| mask | tokens | chunk | ranks | solver worst | zigzag worst | contiguous worst "
          "| received, busiest rank | plan time (median) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for label, total, chunk, ranks, shortest, longest in CASES:
        solver, zigzag, contiguous, received, seconds = [], [], [], [], []
        for _ in range(args.masks):
            q = documents(total, shortest, longest, rng)
            types = [1] * len(q)
            start = time.perf_counter()
            plan = plan_context_parallel(q, q, types, total, chunk, ranks)
            seconds.append(time.perf_counter() - start)
            solver.append(plan.imbalance)
            zigzag.append(zigzag_plan(q, q, types, total, ranks).imbalance)
            contiguous.append(contiguous_plan(q, q, types, total, ranks).imbalance)
            busiest = max(sum(r) for r in plan.recv_split_sizes)
            received.append(busiest / plan.tokens_per_rank)
        print(
            f"| {label} | {total // 1024}k | {chunk} | {ranks} | {max(solver):.4f} | "
            f"{max(zigzag):.3f} | {max(contiguous):.3f} | {max(received):.1f}x "
            f"(ring: {ranks - 1}x) | {statistics.median(seconds):.2f} s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
