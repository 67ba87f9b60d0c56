"""Where the Llama-stack prefill's wall time goes beyond its kernels (issue 6's 0.90x target).

The prefill (4 layers, hidden 2048, 1 x 4096 tokens, bf16) measures about 4.0 ms per step
under magi_compile while its kernels are busy for about 3.76 ms: a quarter of a millisecond
per step passes with the GPU idle. This script splits that, per variant (torch.compile,
magi_compile, magi_compile with CUDA graphs), into:

1. **Steady state**: N steps queued back to back, CUDA events around each step (the
   benchmark's method) and around the whole run, so per-step time and the throughput of a
   serving loop are both seen.
2. **Host time per step with the GPU busy**: steps enqueued behind a sleep kernel, each timed
   on the host clock. If it is below the GPU time, the host never starves the GPU in steady
   state, and idle time inside steps has another cause.
3. **Synchronising calls**: one step under torch.cuda.set_sync_debug_mode("warn"); every
   synchronising PyTorch call in it is listed with its count.
4. **Gaps between kernels** (torch.profiler, CUDA activity only, steps back to back): GPU-busy
   time, idle time between consecutive kernels per step, split by the kernel pair around each
   gap, largest first.

    python scripts/gpu/prefill_gaps.py [--variants inductor,magi,magi_cg] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT / "examples"), str(ROOT)):
    sys.path.insert(0, p)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks import harness, workloads  # noqa: E402

STEPS = 30


def steady(case, fn, hook) -> dict:
    sets = case.inputs
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(STEPS + 1)]
    torch.cuda.synchronize()
    for i in range(STEPS):
        ev[i].record()
        case.step(fn, sets[i % len(sets)], hook)
    ev[STEPS].record()
    torch.cuda.synchronize()
    per = [ev[i].elapsed_time(ev[i + 1]) for i in range(STEPS)]
    return {"median_ms": statistics.median(per), "mean_ms": ev[0].elapsed_time(ev[STEPS]) / STEPS}


def host_busy(case, fn, hook) -> float:
    sets = case.inputs
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time ahead of the steps
        for i in range(8):
            t0 = time.perf_counter()
            case.step(fn, sets[i % len(sets)], hook)
            times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def syncs(case, fn, hook) -> dict:
    torch.cuda.synchronize()
    counts: dict[str, int] = defaultdict(int)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            case.step(fn, case.inputs[0], hook)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        counts[str(w.message)[:160]] += 1
    torch.cuda.synchronize()
    return dict(counts)


def gaps(case, fn, hook, steps: int = 5) -> dict:
    sets = case.inputs
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            case.step(fn, sets[i % len(sets)], hook)
        torch.cuda.synchronize()
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            spans.append((e.time_range.start, e.time_range.end, e.name))
    spans.sort()
    busy = sum(e - s for s, e, _ in spans) / steps
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for s, e, n in spans:
        per_kernel[n[:70]][0] += (e - s) / steps
        per_kernel[n[:70]][1] += 1 / steps
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    idle = 0.0
    for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:], strict=False):
        g = s1 - e0
        if g <= 0:
            continue
        idle += g
        key = (n0[:50], n1[:50])
        by_pair[key][0] += g / steps
        by_pair[key][1] += 1 / steps
    rows = sorted(by_pair.items(), key=lambda kv: -kv[1][0])
    span = (spans[-1][1] - spans[0][0]) / steps if spans else 0.0
    return {
        "busy_us": busy,
        "span_us": span,
        "idle_us": idle / steps,
        "kernels": len(spans) / steps,
        "per_kernel": sorted(
            ({"name": k, "us": v[0], "calls": v[1]} for k, v in per_kernel.items()),
            key=lambda r: -r["us"],
        ),
        "gaps": [
            {"after": a, "before": b, "us": v[0], "per_step": v[1]} for (a, b), v in rows[:25]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="inductor,magi,magi_cg")
    ap.add_argument("--json")
    args = ap.parse_args()
    case = workloads.BY_NAME["llama_prefill"].build("full", torch.device("cuda"), torch.bfloat16)
    result = {}
    with torch.no_grad():
        for name in args.variants.split(","):
            fn, hook = harness.make_variant(name, case.module)
            for i in range(5):
                case.step(fn, case.inputs[i % len(case.inputs)], hook)
            torch.cuda.synchronize()
            r = {"steady": steady(case, fn, hook), "host_busy_ms": host_busy(case, fn, hook)}
            r["steady_again"] = steady(case, fn, hook)
            r["syncs"] = syncs(case, fn, hook)
            r["profile"] = gaps(case, fn, hook)
            result[name] = r
            p = r["profile"]
            print(f"===== {name}: step {r['steady']['median_ms']:.3f} / {r['steady_again']['median_ms']:.3f} ms "
                  f"(mean {r['steady']['mean_ms']:.3f}), host {r['host_busy_ms']:.3f} ms per step with the GPU "
                  f"busy; profiled: busy {p['busy_us']:.0f} us, span {p['span_us']:.0f} us, idle {p['idle_us']:.0f} "
                  f"us per step, {p['kernels']:.0f} kernels")  # fmt: skip
            for k, v in r["syncs"].items():
                print(f"   sync x{v}: {k}")
            for k in p["per_kernel"][:10]:
                print(f"   kernel {k['us']:7.1f} us x{k['calls']:.0f} {k['name']}")
            for g in p["gaps"][:6]:
                print(
                    f"   {g['us']:7.1f} us ({g['per_step']:.1f}/step) {g['after']} -> {g['before']}"
                )
            del fn
            harness.reset_compilers()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
