"""Why does our RMSNorm measure about 93% of copy bandwidth timed alone and 98% timed in blocks
of 20 calls beside torch.compile's (extra/cuda_rmsnorm_placement_findings.json)? A trend over
back-to-back calls (a slow steady state that blocks of 20 calls after a synchronisation do not
reach) would show here: each variant makes 200 calls in a row, each timed with CUDA events, and
the medians of windows of them are printed; then the same over ten blocks of 20 calls with a
synchronisation between blocks, the variants alternating. 16384 x 8192 bf16, % of the copy
bandwidth measured the same way.

    python scripts/gpu/rmsnorm_trend_probe.py [workload ...]
"""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bandwidth  # noqa: E402

ROWS, COLS = 16384, 8192
VARIANTS = ("magi_compile", "torch.compile")
WINDOWS = ((0, 10), (10, 20), (20, 50), (50, 100), (100, 200))
names = sys.argv[1:] or ["rmsnorm"]
copy = bandwidth.copy_bandwidth(ROWS, COLS, torch.bfloat16, "cuda", 50, 120)["gbps"]
print(f"copy {copy:.0f} GB/s")
for w in [w for w in bandwidth.WORKLOADS if w.name in names]:
    inputs = [w.inputs(ROWS, COLS, torch.bfloat16, "cuda") for _ in range(2)]
    nbytes = w.bytes_moved(ROWS, COLS, 2)
    fns = {v: bandwidth.make_variant(v, w) for v in VARIANTS}
    for f in fns.values():
        for i in range(5):
            f(*inputs[i % 2])
    torch.cuda.synchronize()

    def pct(seconds: list[float], nbytes: int = nbytes) -> str:
        return f"{100 * nbytes / statistics.median(seconds) / 1e9 / copy:.1f}%"

    for v, f in fns.items():
        t = bandwidth.time_block(f, inputs, "cuda", 200)
        cells = [f"calls {a}-{b - 1}: {pct(t[a:b])}" for a, b in WINDOWS]
        print(f"{w.name}/{v} 200 in a row:", "  ".join(cells), flush=True)
    blocks: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    for _ in range(10):
        for v, f in fns.items():
            blocks[v].append(bandwidth.time_block(f, inputs, "cuda", 20))
    for v in VARIANTS:
        by_position = [[b[i] for b in blocks[v]] for i in range(20)]
        cells = [f"call {i}: {pct(by_position[i])}" for i in (0, 1, 2, 5, 10, 19)]
        everything = [x for b in blocks[v] for x in b]
        print(
            f"{w.name}/{v} blocks of 20:", "  ".join(cells), f"all: {pct(everything)}", flush=True
        )
