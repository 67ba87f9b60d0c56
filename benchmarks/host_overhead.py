#!/usr/bin/env python
"""Host time per call of a compiled 4-layer Llama-style stack at tiny shapes.

At batch 4 × 32 tokens a call does little GPU work, so what a user waits for is mostly the
CPU side: Python, guards, dispatch and kernel launches. This script measures that cost for
eager PyTorch, ``magi_compile`` (the whole stack as one entry, and each layer as its own
entry) and ``torch.compile`` (default and ``mode="reduce-overhead"``), side by side in one
process, on the same weights and inputs. Model (``examples/blocks.py`` ``LlamaStack``):
4 layers, hidden 2048, 16 query / 8 key-value heads, intermediate 8192, bfloat16.

Method, per variant, after a first call (timed: it includes capture and compilation), an
output check against eager and warm-up calls. The timed calls take ``--inputs`` distinct
input tensors of equal values in turn (default 4), as a serving loop passes a new tensor each
step; ``--inputs 1`` passes the same tensor every call, which a runner that remembers its last
input's address can exploit:

1. **Host time per call** (``perf_counter``): the device is synchronised *before* each call,
   outside the timed region, then the call alone is timed on the host clock. The GPU is idle
   and its launch queue empty when the call starts, so the GPU cannot be the bottleneck: the
   number is the CPU time to run the Python call and enqueue its work (if the call waits for
   the GPU somewhere, e.g. a synchronising copy, that wait shows up here too). Median and p90
   over ``--iters`` calls; the cost of the timer itself (an empty call timed the same way) is
   printed beside it.
2. **Device span per call** (``torch.cuda.Event``): the same synchronise-then-call loop, with
   CUDA events recorded around the call instead of the host clock: the time from the first to
   the last of the call's work on the GPU, including any gaps where the GPU waited for the host.
   A host time above the device span means the call is host-bound.
3. **Host time per call, GPU busy** (CUDA only): a sleep kernel is queued first, so the calls
   that follow are enqueued behind it with the GPU busy and the launch queue non-empty, as in a
   serving loop that does not synchronise every step; bursts of ``BUSY_BURST`` calls, each
   timed on the host clock, median over all. Method 1 synchronises before each call, so its
   first CUDA call meets an idle device; this one measures the same host work without that.
4. **Back-to-back time per call**: ``--iters`` calls in a row with a single synchronise at the
   end, divided by the number of calls (median of 5 such runs). Host and GPU overlap here; it
   is the steady-state time per call a serving loop sees, bounded below by the larger of the
   host time and the GPU time.

``reduce-overhead`` (CUDA graphs) gets ``torch.compiler.cudagraph_mark_step_begin()`` before
each call, as its documentation asks of inference loops; that call is counted in its time.
On the CPU (``--device cpu``) there is no device span and no ``reduce-overhead``; ``--quick``
shrinks the model (hidden 256) and the iteration counts for a smoke check, and on the CPU also
leaves out ``torch.compile`` unless ``--variants`` names it (Inductor's C++ build is slow there).

Usage::

    python benchmarks/host_overhead.py --out benchmarks/results/cuda_h200_host_overhead.json
    python benchmarks/host_overhead.py --device cpu --quick --out /tmp/host_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "examples"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from blocks import LlamaStack, init_weights_  # noqa: E402

from benchmarks.harness import git_commit  # noqa: E402

FULL = dict(n_layers=4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192)
QUICK = dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, intermediate=512)
BATCH, TOKENS = 4, 32
VARIANTS = (
    "eager",
    "magi",
    "magi_per_layer",
    "magi_no_direct",
    "magi_cg",
    "magi_cg_args",
    "magi_cg_no_direct",
    "magi_cg_no_pad",
    "inductor",
    "inductor_ro",
)
LABELS = {
    "eager": "eager",
    "magi": "magi_compile (stack)",
    "magi_per_layer": "magi_compile (per layer)",
    "magi_no_direct": "magi_compile (stack, fast_dispatch off)",
    "magi_cg": "magi_compile CUDA graphs (stack)",
    "magi_cg_args": "magi_compile CUDA graphs (fast_dispatch_guards=arguments)",
    "magi_cg_no_direct": "magi_compile CUDA graphs (fast_dispatch off)",
    "magi_cg_no_pad": "magi_compile CUDA graphs (cudagraph_padding off)",
    "inductor": "torch.compile",
    "inductor_ro": "torch.compile reduce-overhead",
}
# config_patch of the magi variants
MAGI_PATCHES = {
    "magi": {},
    "magi_per_layer": {},
    "magi_no_direct": {"fast_dispatch": False},
    "magi_cg": {"cudagraph_mode": "FULL"},
    "magi_cg_args": {"cudagraph_mode": "FULL", "fast_dispatch_guards": "arguments"},
    "magi_cg_no_direct": {"cudagraph_mode": "FULL", "fast_dispatch": False},
    "magi_cg_no_pad": {"cudagraph_mode": "FULL", "cudagraph_padding": False},
}
CUDA_ONLY = ("inductor_ro", "magi_cg", "magi_cg_args", "magi_cg_no_direct", "magi_cg_no_pad")
BUSY_BURST = 20  # calls queued behind one sleep kernel (method 3)


@dataclass
class Result:
    variant: str
    label: str
    first_call_s: float | None = None
    max_rel_err: float | None = None
    host_us_median: float | None = None
    host_us_p90: float | None = None
    host_us_busy: float | None = None  # method 3: GPU busy, no synchronise before each call
    device_us_median: float | None = None
    back_to_back_us: float | None = None
    direct_calls: int | None = None  # magi variants: calls that took the direct path (of iters)
    error: str | None = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def build(variant: str, eager: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable running ``variant`` of the stack; compiled lazily on its first call."""
    if variant == "eager":
        return eager
    torch._dynamo.reset()
    model = copy.deepcopy(eager)
    if variant in MAGI_PATCHES:
        from magi_compiler import magi_compile

        patch = MAGI_PATCHES[variant] or None
        if variant != "magi_per_layer":
            return magi_compile(model, config_patch=patch)
        for layer in model.layers:
            magi_compile(layer, config_patch=patch)
        return model
    if variant == "inductor":
        return torch.compile(model)
    compiled = torch.compile(model, mode="reduce-overhead")

    def step(x: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(x)

    return step


def host_times(fn: Callable, xs: list[torch.Tensor], iters: int) -> list[float]:
    times = []
    for i in range(iters):
        x = xs[i % len(xs)]
        sync(x.device)
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def busy_host_times(fn: Callable, xs: list[torch.Tensor], iters: int) -> list[float]:
    """Host microseconds per call with a sleep kernel queued ahead (method 3)."""
    times: list[float] = []
    cycles = 100_000_000  # about 50 ms at Hopper's clocks: far longer than a burst's host time
    while len(times) < iters:
        torch.cuda.synchronize(xs[0].device)
        torch.cuda._sleep(cycles)
        for i in range(BUSY_BURST):
            x = xs[(len(times) + i) % len(xs)]
            t0 = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize(xs[0].device)
    return times


def device_times(fn: Callable, xs: list[torch.Tensor], iters: int) -> list[float]:
    times = []
    for i in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(xs[0].device)
        start.record()
        fn(xs[i % len(xs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def back_to_back(fn: Callable, xs: list[torch.Tensor], iters: int, repeats: int = 5) -> float:
    per_call = []
    for _ in range(repeats):
        sync(xs[0].device)
        t0 = time.perf_counter()
        for i in range(iters):
            fn(xs[i % len(xs)])
        sync(xs[0].device)
        per_call.append((time.perf_counter() - t0) * 1e6 / iters)
    return statistics.median(per_call)


def measure(
    variant: str, eager: nn.Module, xs: list[torch.Tensor], iters: int, warmup: int
) -> Result:
    """``xs``: the input tensors the timed calls take in turn (equal values)."""
    result = Result(variant, LABELS[variant])
    x = xs[0]
    try:
        fn = build(variant, eager)
        sync(x.device)
        t0 = time.perf_counter()
        out = fn(x)
        sync(x.device)
        result.first_call_s = time.perf_counter() - t0
        expected = eager(x)
        err = (out.float() - expected.float()).abs().max() / expected.float().abs().max()
        result.max_rel_err = err.item()
        del out, expected
        for i in range(warmup):
            fn(xs[i % len(xs)])
        direct_before = _direct_calls()
        host = host_times(fn, xs, iters)
        if variant.startswith("magi"):
            result.direct_calls = _direct_calls() - direct_before
        result.host_us_median = statistics.median(host)
        result.host_us_p90 = percentile(host, 0.9)
        if x.device.type == "cuda":
            result.host_us_busy = statistics.median(busy_host_times(fn, xs, iters))
            result.device_us_median = statistics.median(device_times(fn, xs, iters))
        result.back_to_back_us = back_to_back(fn, xs, iters)
    except Exception as e:  # noqa: BLE001 - a failing variant is reported, not fatal
        result.error = (
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        )
        traceback.print_exc()
    return result


def _direct_calls() -> int:
    import magi_compiler

    return int(magi_compiler.get_counters().direct_calls)


def timer_overhead_us(iters: int) -> float:
    def nothing(x):
        return x

    return statistics.median(host_times(nothing, [torch.empty(0)], iters))


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: list[Result], timer_us: float) -> None:
    header = (
        f"{'variant':<30} {'host µs':>9} {'host p90':>9} {'busy µs':>8} {'device µs':>10} "
        f"{'back-to-back µs':>16} {'first call s':>13} {'rel err':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if r.error:
            print(f"{r.label:<30} FAILED: {r.error}")
            continue
        print(
            f"{r.label:<30} {fmt(r.host_us_median, '9.1f')} {fmt(r.host_us_p90, '9.1f')} "
            f"{fmt(r.host_us_busy, '8.1f')} "
            f"{fmt(r.device_us_median, '10.1f')} {fmt(r.back_to_back_us, '16.1f')} "
            f"{fmt(r.first_call_s, '13.2f')} {fmt(r.max_rel_err, '9.1e')}"
        )
    print("-" * len(header))
    print(f"timer overhead (an empty call timed the same way): {timer_us:.2f} µs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--quick", action="store_true", help="small model, few iterations")
    parser.add_argument("--iters", type=int, default=None, help="calls per measurement")
    parser.add_argument("--variants", default=None, help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--inputs",
        type=int,
        default=4,
        help="distinct input tensors (equal values) the timed calls take in turn; 1 passes the "
        "same tensor every call",
    )
    args = parser.parse_args(argv)
    if args.inputs < 1:
        parser.error("--inputs must be at least 1")

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = QUICK if args.quick else FULL
    iters = args.iters or (20 if args.quick else 200)
    warmup = 3 if args.quick else 20
    if device.type == "cuda":
        default_variants = VARIANTS
    else:  # no CUDA graphs; Inductor's C++ compile takes a minute on a small CPU machine
        cpu = [v for v in VARIANTS if v not in CUDA_ONLY]
        default_variants = [v for v in cpu if v != "inductor"] if args.quick else cpu
    variants = args.variants.split(",") if args.variants else list(default_variants)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    if device.type == "cpu" and set(variants) & set(CUDA_ONLY):
        parser.error(f"{', '.join(sorted(set(variants) & set(CUDA_ONLY)))} need --device cuda")

    torch.manual_seed(0)
    eager = init_weights_(LlamaStack(**shape), seed=0).to(device=device, dtype=dtype).eval()
    x = torch.randn(BATCH, TOKENS, shape["hidden"], device=device, dtype=dtype)
    xs = [x] + [x.clone() for _ in range(args.inputs - 1)]
    device_name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu"
    )
    print(f"torch {torch.__version__}, {device_name}, {dtype}, batch {BATCH} x {TOKENS} tokens")
    print(
        f"model: LlamaStack {shape}; {iters} calls per measurement, taking {args.inputs} "
        "input tensors in turn"
    )

    results = []
    with torch.no_grad():
        timer_us = timer_overhead_us(iters)
        for variant in variants:
            results.append(measure(variant, eager, xs, iters, warmup))
    print_table(results, timer_us)

    if args.out is not None:
        record = {
            "benchmark": "host_overhead",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "device": device_name,
            "device_type": device.type,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "dtype": str(dtype).removeprefix("torch."),
            "model": {"class": "LlamaStack", **shape},
            "batch": BATCH,
            "tokens": TOKENS,
            "iters": iters,
            "inputs": args.inputs,
            "timer_overhead_us": timer_us,
            "results": [asdict(r) for r in results],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
