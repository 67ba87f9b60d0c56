"""Launch shapes of the pointwise kernels torch.compile and magi_compile run for the bandwidth
benchmark's silu_mul and x*y+z (16384 x 8192 bf16): grid, block, registers and shared memory of
each kernel from a torch.profiler trace, and the Triton source Inductor wrote. Run on the GPU
machine after `scripts/gpu/run_gpu.sh build`; prints a table and writes $OUT/pointwise_kernels.json."""

import inspect
import json
import os
import sys
import tempfile

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from bandwidth import fma, fresh_function, silu_mul, time_interleaved  # noqa: E402
from magi_compiler import magi_compile  # noqa: E402


def kernels_of(fn, args) -> list[dict]:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn(*args)
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    out = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            a = e.get("args", {})
            key = e["name"]
            rec = out.setdefault(key, {"name": key, "durations_us": []})
            rec["durations_us"].append(e["dur"])
            for k in ("grid", "block", "registers per thread", "shared memory",
                      "est. achieved occupancy %"):  # fmt: skip
                if k in a:
                    rec[k] = a[k]
    return list(out.values())


def event_times(tc, mg, args, swap: bool = False) -> dict:
    """The benchmark's timing (CUDA events around each call) of each variant alone, then of the
    two interleaved in rounds; torch.compile gets clones (magi_compile marks its arguments'
    dims dynamic on the tensors themselves). `swap` gives each the memory the other had."""
    sets = [args, tuple(a.clone() for a in args)]
    tc_sets = [tuple(a.clone() for a in s) for s in sets]
    if swap:  # the same memory, the other variant: does placement decide the difference?
        sets, tc_sets = tc_sets, sets
        for t in (t for s in tc_sets for t in s):  # magi_compile's marks, or Dynamo recompiles
            if hasattr(t, "_dynamo_dynamic_indices"):
                del t._dynamo_dynamic_indices
    n = len(args)
    alone = {
        "torch.compile": time_interleaved({"f": tc}, tc_sets, "cuda", 5, 200, 1)["f"],
        "magi_compile": time_interleaved({"f": mg}, sets, "cuda", 5, 200, 1)["f"],
    }
    both = time_interleaved(
        {"torch.compile": lambda *a: tc(*a[:n]), "magi_compile": lambda *a: mg(*a[n:])},
        [t + m for t, m in zip(tc_sets, sets, strict=True)], "cuda", 5, 500, 5,
    )  # fmt: skip
    return {"alone": alone, "interleaved": both}


def main() -> None:
    rows, cols = 16384, 8192
    x, y, z = (torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    report = {}
    for name, fn, args in (("silu_mul", silu_mul, (x, y)), ("x*y+z", fma, (x, y, z))):
        tc = torch.compile(fresh_function(fn, "tc"))
        dims = {p: 0 for p in inspect.signature(fn).parameters}  # as the benchmark does
        mg = magi_compile(fresh_function(fn, "mg"), dynamic_arg_dims=dims)
        tc_args = tuple(a.clone() for a in args)
        kernels = {"torch.compile": kernels_of(tc, tc_args), "magi_compile": kernels_of(mg, args)}
        times = event_times(tc, mg, args)
        swapped = event_times(tc, mg, args, swap=True)
        times.update({k + "_swapped": v for k, v in swapped.items()})
        report[name] = {"kernels": kernels, "event_s": times}
        for how, t in times.items():
            print(f"{name:9s} event-timed {how:12s}", {k: round(v * 1e6, 2) for k, v in t.items()})
        for variant, ks in kernels.items():
            for k in ks:
                durations = sorted(k["durations_us"])
                print(f"{name:9s} {variant:14s} {k['name'][:44]:44s} grid {k.get('grid')} "
                      f"block {k.get('block')} regs {k.get('registers per thread')} "
                      f"median {durations[len(durations) // 2]:.1f} us")  # fmt: skip
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "pointwise_kernels.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    if os.environ.get("NO_GRAD") == "1":  # as benchmarks/bandwidth.py runs
        with torch.no_grad():
            main()
    else:
        main()
