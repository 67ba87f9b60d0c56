"""Where the host time of a replaying call goes with the GPU busy (issue 6's 10 us target):
the 4-layer Llama-style stack at batch 4 x 32 under magi_compile(cudagraph_mode=FULL), with
Dynamo's guards per call (fast_dispatch_guards default) and once per argument layout
('arguments').

Every part is timed as benchmarks/host_overhead.py's method 3: calls queued behind a sleep
kernel in bursts, so none meets an idle device, taking --inputs distinct input tensors in turn.
Parts: the whole call, with inputs reaching the graph through its copy nodes and, interleaved
with it, copied on the stream before the launch (CudaGraphRunner.set_input_copy_nodes); the
C++ direct call alone (no nn.Module call, no Python dispatch); the runner's stages
(set_stage_timing) inside those calls, both ways; and the floors: an empty nn.Module call, and
CUDAGraph.replay() of a one-kernel graph (what one launch costs through PyTorch).

    python scripts/gpu/host_floor.py [--iters 400] [--inputs 4] [--json PATH]
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

SHAPE = dict(n_layers=4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192)
BURST = 20
ROUNDS = 3


def busy(fn, args_list, iters: int) -> float:
    """Median host microseconds of fn(args) with a sleep kernel queued ahead of each burst."""
    times: list[float] = []
    while len(times) < iters:
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)
        for _ in range(BURST):
            args = args_list[len(times) % len(args_list)]
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def measure(guards: str, model, xs, iters: int) -> dict[str, float]:
    from magi_compiler import magi_compile
    from magi_compiler.api import _CompiledCallable

    torch._dynamo.reset()
    patch = {"cudagraph_mode": "FULL"}
    if guards != "default":
        patch["fast_dispatch_guards"] = guards
    compiled = magi_compile(model, config_patch=patch)
    out: dict[str, float] = {}
    for i in range(30):
        compiled(xs[i % len(xs)])
    (entry,) = [o for o in gc.get_objects() if type(o) is _CompiledCallable]
    (path,) = entry._direct.get(model).paths
    native = path.native
    runner = getattr(path.run, "magi_cuda_graphs", None)
    calls = [(x,) for x in xs]
    if runner is None:
        out["call"] = busy(compiled, calls, iters)
    else:
        # Inputs through the graphs' copy nodes and copied on the stream, interleaved in
        # rounds so that drift of the host's speed reaches both alike.
        per_way: dict[str, list[float]] = {"nodes": [], "stream": []}
        for _ in range(ROUNDS):
            for way in per_way:
                runner.set_input_copy_nodes(way == "nodes")
                per_way[way].append(busy(compiled, calls, iters))
        runner.set_input_copy_nodes(True)
        out["call"] = statistics.median(per_way["nodes"])
        out["call_inputs_copied_on_stream"] = statistics.median(per_way["stream"])
    if native is not None:
        out["native_alone"] = busy(native, [((model, x),) for x in xs], iters)
    if runner is not None:
        for way in ("nodes", "stream"):
            runner.set_input_copy_nodes(way == "nodes")
            runner.set_stage_timing(True)
            busy(compiled, calls, iters)
            stages = dict(runner.stage_times())
            runner.set_stage_timing(False)
            n = max(stages.pop("calls"), 1.0)
            suffix = "" if way == "nodes" else "_stream"
            for name, total in stages.items():
                out[f"stage_{name}{suffix}"] = total / n
        runner.set_input_copy_nodes(True)
        out["input_retargets_per_replay"] = runner.num_input_retargets / max(runner.num_replays, 1)
    if native is not None:  # how Dynamo's guards were evaluated, and how often
        out["guard_reuse"] = native.guard_reuse
        out["guard_checks"] = native.num_guard_checks
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--inputs", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = torch.bfloat16
    xs = [torch.randn(4, 32, SHAPE["hidden"], device="cuda", dtype=dtype)]
    xs += [xs[0].clone() for _ in range(args.inputs - 1)]
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "inputs": args.inputs,
        "iters": args.iters,
    }
    with torch.no_grad():
        empty = torch.nn.Identity()
        result["empty_module_call"] = busy(empty, [(x,) for x in xs], args.iters)
        y = torch.zeros(16, device="cuda")
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            y.add_(1)
        result["one_kernel_graph_replay"] = busy(graph.replay, [()], args.iters)
        for guards in ("default", "arguments"):
            model = init_weights_(LlamaStack(**SHAPE), seed=0).to("cuda", dtype).eval()
            result[guards] = measure(guards, model, xs, args.iters)
            del model
            gc.collect()
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
