"""Where the host time of a replaying call goes with the GPU busy (issue 6's 10 us target):
the 4-layer Llama-style stack at batch 4 x 32 under magi_compile(cudagraph_mode=FULL), with
Dynamo's guards per call (fast_dispatch_guards default) and once per argument layout
('arguments').

Every part is timed as benchmarks/host_overhead.py's method 3: calls queued behind a sleep
kernel in bursts, so none meets an idle device, taking --inputs distinct input tensors in turn.
Parts: the whole call, with inputs reaching the graph through its copy nodes and, interleaved
with it, copied on the stream before the launch (CudaGraphRunner.set_input_copy_nodes), with
the runner comparing the parameters on every call (set_steady_inputs(False)), and with its
replays kept to two executables per graph (set_max_executables(2)); the
C++ direct call alone (no nn.Module call, no Python dispatch); the runner's stages
(set_stage_timing) inside those calls, both ways; and the floors: an empty nn.Module call, and
CUDAGraph.replay() of a one-kernel graph (what one launch costs through PyTorch) and of graphs of
16, 64 and 128 one-element kernels (the driver's launch cost by node count on this host).

    python scripts/gpu/host_floor.py [--iters 400] [--inputs 4] [--modes default,arguments]
        [--json PATH]

--modes lists the guard modes in the order they are measured; a mode named again is measured
again under "<mode>_<n>" (the first measured is often the slowest on these hosts).
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
# The ways a replaying call is measured, interleaved in rounds: (suffix of its keys, inputs
# through the graphs' copy nodes, the runner trusting the direct call's steady inputs, the
# executables a graph's replays pick from).
WAYS = {
    "": (True, True, 4),
    "_stream": (False, True, 4),
    "_no_steady": (True, False, 4),
    "_two_executables": (True, True, 2),
}


def set_way(runner, way: str) -> None:
    nodes, steady, executables = WAYS[way]
    runner.set_input_copy_nodes(nodes)
    runner.set_steady_inputs(steady)
    runner.set_max_executables(executables)


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
        # The ways interleaved in rounds, so that drift of the host's speed reaches all alike.
        per_way: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(ROUNDS):
            for way in per_way:
                set_way(runner, way)
                per_way[way].append(busy(compiled, calls, iters))
        set_way(runner, "")
        out["call"] = statistics.median(per_way[""])
        out["call_inputs_copied_on_stream"] = statistics.median(per_way["_stream"])
        out["call_without_steady_inputs"] = statistics.median(per_way["_no_steady"])
        out["call_two_executables"] = statistics.median(per_way["_two_executables"])
    if native is not None:
        out["native_alone"] = busy(native, [((model, x),) for x in xs], iters)
    if runner is not None:
        for way in WAYS:
            set_way(runner, way)
            runner.set_stage_timing(True)
            busy(compiled, calls, iters)
            stages = dict(runner.stage_times())
            runner.set_stage_timing(False)
            n = max(stages.pop("calls"), 1.0)
            for name, total in stages.items():
                out[f"stage_{name}{way}"] = total / n
        set_way(runner, "")
        out["input_retargets_per_replay"] = runner.num_input_retargets / max(runner.num_replays, 1)
        out["executables"] = runner.num_executables
        before = (runner.num_input_retargets, runner.num_replays)
        busy(compiled, calls, iters)
        out["input_retargets_per_replay_last"] = (runner.num_input_retargets - before[0]) / max(
            runner.num_replays - before[1], 1
        )
    if native is not None:  # how Dynamo's guards were evaluated, and how often
        out["guard_reuse"] = native.guard_reuse
        out["guard_checks"] = native.num_guard_checks
    return out


def _graph_of_kernels(y: torch.Tensor, k: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `k` in-place adds to `y` (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(k):
            y.add_(1)
    return graph


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--inputs", type=int, default=4)
    ap.add_argument("--modes", default="default,arguments")
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
        # The driver's launch cost by graph size: graphs of K one-element kernels (K = 1: what
        # one launch costs through PyTorch), so that the stack's own launch stage can be read
        # against the floor for its node count on this host.
        y = torch.zeros(16, device="cuda")
        for k in (1, 16, 64, 128):
            graph = _graph_of_kernels(y, k)
            key = "one_kernel_graph_replay" if k == 1 else f"graph_of_{k}_kernels_replay"
            result[key] = busy(graph.replay, [()], args.iters)
        seen: dict[str, int] = {}
        for guards in args.modes.split(","):
            seen[guards] = seen.get(guards, 0) + 1
            key = guards if seen[guards] == 1 else f"{guards}_{seen[guards]}"
            model = init_weights_(LlamaStack(**SHAPE), seed=0).to("cuda", dtype).eval()
            result[key] = measure(guards, model, xs, args.iters)
            del model
            gc.collect()
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
