"""Where the memory of magi's CUDA graphs goes, and the host floor of one graph launch, on the
4-layer Llama stack at batch 4 x 32 tokens (benchmarks' llama_small_batch). Diagnostic for the
GPU machine:  python scripts/gpu/graph_memory.py

Prints, in MiB, what the process holds allocated after eager, after magi without graphs and
with FULL graphs, how much of it the cuBLAS workspaces are (cleared with
torch._C._cuda_clearCublasWorkspaces), and each variant's step peak the way
benchmarks/harness.py measures it. Then the host time of replaying a one-kernel graph that
takes no Philox offset (CUDAGraph.replay() is then one cudaGraphLaunch plus checks)."""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT / "examples"), str(ROOT)):
    sys.path.insert(0, p)

import torch  # noqa: E402

from benchmarks import harness, workloads  # noqa: E402

MIB = float(1 << 20)


def allocated() -> float:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / MIB


def step_peak(fn, x) -> float:
    fn(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(x)
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - before) / MIB


def main() -> None:
    case = workloads.BY_NAME["llama_small_batch"].build(
        "full", torch.device("cuda"), torch.bfloat16
    )
    x = case.inputs[0][0]
    with torch.no_grad():
        base = allocated()
        print(f"weights + inputs: {base:.1f} MiB allocated")
        case.module(x)
        print(f"after eager: +{allocated() - base:.1f} MiB (the default stream's cuBLAS workspace)")
        print(f"eager step peak: {step_peak(case.module, x):.1f} MiB")
        for variant in ("magi", "magi_cg", "inductor"):
            before = allocated()
            fn, _ = harness.make_variant(variant, case.module)
            for _ in range(3):
                fn(x)
            held = allocated() - before
            peak = step_peak(fn, x)
            torch._C._cuda_clearCublasWorkspaces()
            after_clear = allocated() - before
            case.module(x)  # the default stream's workspace again
            print(f"{variant}: holds {held:.1f} MiB after 3 calls; step peak {peak:.1f} MiB; "
                  f"after clearing the cuBLAS workspaces {after_clear:.1f} MiB, "
                  f"after one eager call {allocated() - before:.1f} MiB; "
                  f"reserved {torch.cuda.memory_reserved() / MIB:.0f} MiB")  # fmt: skip
            del fn
            harness.reset_compilers()
            gc.collect()

    # Host floor: a graph with one small kernel and no generator use.
    s = torch.cuda.Stream()
    a = torch.zeros(1024, device="cuda")
    with torch.cuda.stream(s):
        a.add_(1)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        a.add_(1)
    for _ in range(50):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        g.replay()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    times.sort()
    print(f"one-kernel graph replay (no Philox offset): host median {statistics.median(times):.2f} us, "
          f"p10 {times[len(times) // 10]:.2f} us, p90 {times[9 * len(times) // 10]:.2f} us")  # fmt: skip


if __name__ == "__main__":
    main()
