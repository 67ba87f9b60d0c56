"""Where the host time of one CUDA-graph call goes (issue 6): the 4-layer Llama-style stack at
batch 4 x 32 under magi_compile(cudagraph_mode=FULL), each part of a direct call timed alone.

Parts, each the median of many calls with the device synchronised before each (as in
benchmarks/host_overhead.py): the whole call (through the C++ direct call when there is one),
that C++ call alone, and the whole call through the Python direct path (also both interleaved
in --rounds blocks); that path's gather, signature match and Dynamo guard check (Python); the
compiled graph's run function; the whole call again without the guard check and without the
run function (their cost in place); the C++ runner called alone; the runner's own stages
(CudaGraphRunner.set_stage_timing). Then reference costs: an empty nn.Module call, torch.empty
of the output's shape, a device-to-device copy of it.

    python scripts/gpu/host_breakdown.py [--iters 500] [--json PATH] [--device cpu --quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from blocks import LlamaStack, init_weights_  # noqa: E402

FULL = dict(n_layers=4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192)
QUICK = dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, intermediate=512)


def timed(fn, iters: int, device: torch.device) -> float:
    """Median host microseconds of fn() with the device idle before each call."""
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--padding", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved A/B blocks")
    ap.add_argument("--json")
    args = ap.parse_args()
    from magi_compiler import magi_compile
    from magi_compiler.api import _CompiledCallable

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = QUICK if args.quick else FULL
    model = init_weights_(LlamaStack(**shape), seed=0).to(device=device, dtype=dtype).eval()
    patch = {"cudagraph_mode": "FULL" if device.type == "cuda" else "NONE"}
    if not args.padding:
        patch["cudagraph_padding"] = False
    compiled = magi_compile(model, config_patch=patch)
    x = torch.randn(4, 32, shape["hidden"], device=device, dtype=dtype)
    n = args.iters
    out: dict[str, float] = {}
    with torch.no_grad():
        for _ in range(20):
            compiled(x)
        (entry,) = [o for o in gc.get_objects() if type(o) is _CompiledCallable]
        (path,) = entry._direct.get(model).paths
        values, inputs, frame = path.gather(model, x)
        runner = getattr(path.run, "magi_cuda_graphs", None)
        out["inputs"] = len(inputs)
        out["call"] = timed(lambda: compiled(x), n, device)
        native = path.native  # the C++ direct call (bind_dispatch.cpp); None: Python only
        out["native"] = 1.0 if native is not None else 0.0
        if native is not None:
            out["native_alone"] = timed(lambda: native((model, x)), n, device)
        path.native = None  # the parts below time the Python direct path
        out["call_python_path"] = timed(lambda: compiled(x), n, device)
        if native is not None:
            # The two paths interleaved, `rounds` blocks of n calls each, so drift of the host's
            # speed reaches both alike: the median of each path's block medians.
            per_path: dict[str, list[float]] = {"native": [], "python": []}
            for _ in range(args.rounds):
                for name, value in (("native", native), ("python", None)):
                    path.native = value
                    per_path[name].append(timed(lambda: compiled(x), n, device))
            path.native = None
            out["ab_call_native"] = statistics.median(per_path["native"])
            out["ab_call_python_path"] = statistics.median(per_path["python"])
        out["gather"] = timed(lambda: path.gather(model, x), n, device)
        out["signature_match"] = timed(lambda: path.signature.matches(values, False), n, device)
        out["dynamo_guards"] = timed(lambda: path.guards.check(frame), n, device)
        out["run_function"] = timed(lambda: path.run(list(inputs)), n, device)
        if runner is not None:
            out["runner"] = timed(lambda: runner.run(list(inputs), steal_inputs=True), n, device)
            runner.set_stage_timing(True)
            timed(lambda: runner.run(list(inputs), steal_inputs=True), n, device)
            stages = dict(runner.stage_times())
            runner.set_stage_timing(False)
            calls = max(stages.pop("calls"), 1.0)
            for name, total in stages.items():
                out[f"stage_{name}"] = total / calls
        # The same whole call with one part taken out, to see its cost in place (parts timed
        # alone run with warmer caches than inside the call).
        guards, run = path.guards, path.run

        class _Pass:
            @staticmethod
            def check(_frame):
                return True

        path.guards = _Pass()
        out["call_without_guard_check"] = timed(lambda: compiled(x), n, device)
        path.guards = guards
        held = path.run(list(inputs))
        path.run = lambda _inputs, held=held: held
        out["call_without_run"] = timed(lambda: compiled(x), n, device)
        path.run = run
        path.native = native
        del held
        empty = torch.nn.Identity()
        out["empty_module_call"] = timed(lambda: empty(x), n, device)
        y = compiled(x)
        out["torch_empty_like"] = timed(lambda: torch.empty_like(y), n, device)
        z = torch.empty_like(y)
        out["copy_"] = timed(lambda: z.copy_(y), n, device)
        out["list_of_inputs"] = timed(lambda: list(inputs), n, device)
    for k, v in out.items():
        print(f"{k:>24}: {v:8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
