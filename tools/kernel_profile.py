"""Usage: python tools/kernel_profile.py --only llama_prefill,dit_block [--variants eager,inductor,magi]
    [--rows 14] [--json $OUT/profile.json] [--host]
       python tools/kernel_profile.py --zoo gpt2:whole:8,vit:layers:1 --variants inductor_ro,magi_cg

Where the GPU time of a benchmark workload (benchmarks/workloads.py, full shapes, bf16, CUDA)
goes, per variant: the CUDA kernels of one step grouped by name (total time, calls), the kernel
count, the GPU-busy time per step and the largest idle gaps between kernels, for eager,
torch.compile and magi_compile side by side.

--host profiles the host too: the CUDA runtime calls that can block the host (synchronise,
blocking copies, cudaMalloc/cudaFree) per step, and for the largest idle stretches of the GPU
the longest host operations running during them (why the GPU waited).

--zoo profiles models of the zoo benchmark instead (benchmarks/zoo.py, real size, bf16):
family:scenario:batch, each variant built as the zoo builds it and called at batch 1 first,
then warmed up and profiled at the given batch, as the zoo times it. Its --json file is a
``zoo_profile`` result (device, torch version, date, commit): saved as
benchmarks/results/cuda_<gpu>_zoo_profile.json, benchmarks/report.py shows it after the zoo
table (GPU time per kernel kind, the largest kernels).

Named kernel_profile, not profile: run as a script, its folder comes first on sys.path, where a
tools/profile.py would stand in for the standard library's profile module (cProfile imports
it, and transformers imports cProfile).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT / "examples"), str(ROOT)):
    sys.path.insert(0, p)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks import harness, workloads  # noqa: E402

STEPS = 5


# Kernel kinds by name, first match wins: generated kernels (ours are named fused_*, Inductor's
# triton_*), attention, matrix multiplies (cuBLAS's nvjet/xmma/cutlass kernels) and copies;
# the rest (ATen's own elementwise, reduction, index and norm kernels) is "other".
KERNEL_KINDS = (
    ("generated", ("fused_", "triton_", "magi_")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "attn")),
    ("GEMM", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "splitk", "wgmma")),
    ("copy", ("copy", "memcpy", "memset", "catarray")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, marks in KERNEL_KINDS:
        if any(m in low for m in marks):
            return kind
    return "other"


BLOCKING = ("Synchronize", "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaMemcpy", "cudaMemset")


def host_view(prof, gaps: list) -> dict:
    """Blocking runtime calls per step and what the host was doing in the largest GPU gaps."""
    calls: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    host = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            continue
        host.append((ev.time_range.start, ev.time_range.end, ev.name))
        if any(b in ev.name for b in BLOCKING) and "Async" not in ev.name:
            calls[ev.name][0] += (ev.time_range.end - ev.time_range.start) / STEPS
            calls[ev.name][1] += 1 / STEPS
    during = []
    for us, start, end, after, before in gaps[:4]:
        inside = [(min(e, end) - max(s, start), n) for s, e, n in host if s < end and e > start]
        inside.sort(reverse=True)
        during.append(
            {"gap_us": us, "after": after, "before": before,
             "host": [{"us": round(t, 1), "name": n[:80]} for t, n in inside[:8]]}
        )  # fmt: skip
    return {
        "blocking_calls": {k: {"us_per_step": v[0], "per_step": v[1]} for k, v in calls.items()},
        "host_in_gaps": during,
    }


def kernel_table(case: workloads.Case, fn, hook, with_host: bool = False) -> dict:
    args = case.inputs[0]
    for _ in range(3):
        case.step(fn, args, hook)
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if with_host else [])
    with profile(activities=activities) as prof:
        for _ in range(STEPS):
            case.step(fn, args, hook)
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    busy = 0.0
    spans = []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        totals[ev.name][0] += t / STEPS
        totals[ev.name][1] += 1 / STEPS
        busy += t / STEPS
        spans.append((ev.time_range.start, ev.time_range.end, ev.name))
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])
    # Idle stretches of the GPU between consecutive kernels (within the profiled steps).
    spans.sort()
    gaps = []
    for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:], strict=False):
        if s1 - e0 > 3:
            gaps.append((s1 - e0, e0, s1, n0[:60], n1[:60]))
    gaps.sort(reverse=True)
    # Wall time per step (CUDA events) and host time to issue one step (no sync inside).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall, host = [], []
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        case.step(fn, args, hook)
        end.record()
        host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        wall.append(start.elapsed_time(end) * 1e3)
    extra = host_view(prof, gaps) if with_host else {}
    return {
        **extra,
        "busy_us": busy,
        "wall_us": statistics.median(wall),
        "host_us": statistics.median(host),
        "idle_us": sum(g[0] for g in gaps) / STEPS,
        "largest_gaps": [{"us": g[0], "after": g[3], "before": g[4]} for g in gaps[:12]],
        "kernels_per_step": sum(v[1] for v in totals.values()),
        "kinds_us": kinds_of(rows),
        "kernels": [{"name": k, "us": v[0], "calls": v[1]} for k, v in rows],
    }


def kinds_of(rows: list) -> dict[str, float]:
    """GPU microseconds per step of each kernel kind (KERNEL_KINDS), from (name, [us, calls])."""
    kinds: dict[str, float] = defaultdict(float)
    for name, (us, _calls) in rows:
        kinds[kernel_kind(name)] += us
    return dict(kinds)


class ZooCase:
    """A zoo model's call in the shape kernel_table expects of a workload's case."""

    kind = "forward"

    def __init__(self, kwargs: dict) -> None:
        self.inputs = [(kwargs,)]

    def step(self, fn, args: tuple, before_call) -> object:
        before_call()
        return fn(*args)


def zoo_cases(
    specs: str, variants: list[str], with_host: bool, size: str = "real", device: str = "cuda"
) -> dict:
    """kernel_table of each variant of each family:scenario:batch in ``specs``."""
    from benchmarks import zoo
    from benchmarks import zoo_models as zm

    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    result = {}
    for spec in specs.split(","):
        family_name, scenario, batch = spec.split(":")
        family = zm.FAMILIES[family_name]
        ref = zm.build(family, "real", device, dtype)
        first = zm.make_inputs(family, scenario, ref.config, 1, "real", device, dtype)
        case = ZooCase(
            zm.make_inputs(family, scenario, ref.config, int(batch), "real", device, dtype)
        )
        result[spec] = {}
        for name in variants:
            fn = zoo.make_variant(name, family, scenario, ref, size)
            with torch.no_grad():
                fn(first)
                result[spec][name] = kernel_table(case, fn, lambda: None, with_host)
            del fn
            zoo.reset_compilers(device)
        del ref
    return result


def zoo_document(cases: dict, device: torch.device) -> dict:
    """The --zoo result as benchmarks/report.py reads it: one row per family:scenario:batch."""
    import datetime

    rows = []
    for spec, tables in cases.items():
        family, scenario, batch = spec.split(":")
        rows.append(
            {"model": family, "scenario": scenario, "batch": int(batch), "variants": tables}
        )
    return {
        "benchmark": "zoo_profile",
        "meta": {
            "device_type": device.type,
            "device_name": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": harness.git_commit() or "unknown",
            "command": " ".join(["python", "tools/kernel_profile.py", *sys.argv[1:]]),
            "steps": STEPS,
        },
        "rows": rows,
    }


def report(label: str, table: dict, rows: int) -> None:
    print(f"\n===== {label}: wall {table['wall_us'] / 1e3:.3f} ms, GPU busy "
          f"{table['busy_us'] / 1e3:.3f} ms, idle between kernels {table['idle_us'] / 1e3:.3f} ms, "
          f"host {table['host_us'] / 1e3:.3f} ms per step; {table['kernels_per_step']:.0f} kernels")  # fmt: skip
    for g in table["largest_gaps"][:6]:
        print(f"   gap {g['us']:8.1f} us after {g['after']} / before {g['before']}")
    for k, v in sorted(table.get("blocking_calls", {}).items()):
        print(f"   host {k}: {v['per_step']:.1f} calls, {v['us_per_step']:.1f} us per step")
    for g in table.get("host_in_gaps", []):
        busy = ", ".join(f"{h['name']} {h['us']}" for h in g["host"][:5])
        print(f"   in the {g['gap_us']:.0f} us gap before {g['before'][:30]}: {busy}")
    for k in table["kernels"][:rows]:
        print(f"{k['us']:10.1f} us {k['calls']:6.1f}x  {k['name'][:110]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="llama_prefill,dit_block")
    ap.add_argument("--zoo", help="family:scenario:batch,... of benchmarks/zoo.py instead")
    ap.add_argument("--variants", default="eager,inductor,magi")
    ap.add_argument("--rows", type=int, default=14)
    ap.add_argument("--json")
    ap.add_argument("--host", action="store_true", help="profile the host's blocking calls too")
    args = ap.parse_args()
    dtype, device = torch.bfloat16, torch.device("cuda")
    result: dict = {}
    if args.zoo:
        cases = zoo_cases(args.zoo, args.variants.split(","), args.host)
        for spec, tables in cases.items():
            for name, table in tables.items():
                report(f"{spec} / {name}", table, args.rows)
        result = zoo_document(cases, device)
    for w in workloads.select(args.only) if not args.zoo else []:
        case = w.build("full", device, dtype)
        result[w.name] = {}
        for name in args.variants.split(","):
            fn, hook = harness.make_variant(name, case.module)
            with torch.no_grad() if case.kind != "train" else torch.enable_grad():
                table = kernel_table(case, fn, hook, args.host)
            result[w.name][name] = table
            report(f"{w.name} / {name}", table, args.rows)
            del fn
            harness.reset_compilers()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
