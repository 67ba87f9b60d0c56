#!/usr/bin/env python
"""Where the host time of one direct call goes: each stage of the direct path timed on its own.

Compiles the Llama-style stack of ``benchmarks/host_overhead.py`` with ``magi_compile``, calls
it until the direct path is set up, then times (median ns over ``--iters`` calls, the device
synchronised before each) the whole call and each stage the call runs: gathering the graph's
inputs, the compact guard signature, Dynamo's guard manager, and the compiled graph's run.

    python scripts/profile_direct_call.py --device cuda --mode FULL
    python scripts/profile_direct_call.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from blocks import LlamaStack, init_weights_  # noqa: E402

FULL = dict(n_layers=4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192)
QUICK = dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, intermediate=512)


def timed(fn, iters: int, sync) -> float:
    samples = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--mode", default="FULL", help="cudagraph_mode")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--padding", type=int, default=1)
    args = ap.parse_args()
    from magi_compiler import magi_compile

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = LlamaStack(**(QUICK if args.quick else FULL)).to(device, dtype).eval()
    init_weights_(model)
    eager = copy.deepcopy(model)  # magi_compile compiles `model` in place
    hidden = (QUICK if args.quick else FULL)["hidden"]
    x = torch.randn(4, 32, hidden, device=device, dtype=dtype)
    compiled = magi_compile(
        model,
        config_patch={"cudagraph_mode": args.mode, "cudagraph_padding": bool(args.padding)},
    )
    sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for _ in range(5):
            compiled(x)
        from magi_compiler import get_counters

        print("direct calls so far", get_counters().direct_calls)
        entry = compiled._magi_compiled
        path = entry._direct.get(compiled).paths[0]
        owner = compiled
        values, inputs, frame = path.gather(owner, x)
        print(f"{len(inputs)} graph inputs, {len(values)} guard values")

        def replica():  # the direct branch of _CompiledCallable.__call__, inline
            v, i, f = path.gather(owner, x)
            if path.signature.matches(v, False) and path.guards.check(f):
                return path.rebuild(path.run(i))
            raise AssertionError("the direct path no longer matches")

        rows = {
            "whole call": lambda: compiled(x),
            "entry(owner, x)": lambda: entry(owner, x),
            "direct branch replica": replica,
            "gather": lambda: path.gather(owner, x),
            "signature.matches": lambda: path.signature.matches(values, False),
            "dynamo guards": lambda: path.guards.check(frame),
            "run (graph)": lambda: path.run(list(inputs)),
            "list(inputs)": lambda: list(inputs),
        }
        if device.type == "cuda":
            # PyTorch's own replay of the eager model: the launch plus the generator update that
            # replay() does because the stack's attention takes a Philox offset.
            static_x = x.clone()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    eager(static_x)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                eager(static_x)
            rows["torch CUDAGraph.replay"] = graph.replay
            rows["x.copy_ (Python)"] = lambda: static_x.copy_(x)
            rows["torch.empty_like"] = lambda: torch.empty_like(x)
            runner = path.run.magi_cuda_graphs
            if runner is not None:
                rows["runner.run (C++)"] = lambda: runner.run(list(inputs), steal_inputs=True)
        for name, fn in rows.items():
            print(f"{name:24s} {timed(fn, args.iters, sync):8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
