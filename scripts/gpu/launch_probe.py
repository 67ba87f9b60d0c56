"""Why a replay's cudaGraphLaunch costs the host 3-5 us in the 4-layer stack when a bare
launch of a 60-kernel graph costs about 2 (extra/cuda_h200_input_feed_probe.txt): the stream
it is launched on (PyTorch's default stream is CUDA's legacy NULL stream, which orders itself
with every blocking stream of the context) and how many executables the replays take in turn
(one input tensor: one executable every call; four in turn: four executables).

Each way is timed as host_floor.py times a call (GPU busy, bursts), interleaved in rounds:
the whole call and the runner's launch stage (set_stage_timing).

    python scripts/gpu/launch_probe.py [--iters 400] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from blocks import LlamaStack, init_weights_  # noqa: E402
from host_floor import SHAPE, busy  # noqa: E402

ROUNDS = 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--json")
    args = ap.parse_args()
    from magi_compiler import magi_compile
    from magi_compiler.api import _CompiledCallable

    torch.manual_seed(0)
    dtype = torch.bfloat16
    x = torch.randn(4, 32, SHAPE["hidden"], device="cuda", dtype=dtype)
    inputs = {"1": [x], "4": [x] + [x.clone() for _ in range(3)]}
    side = torch.cuda.Stream()
    streams = {"default": torch.cuda.default_stream(), "side": side}
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "default_stream_handle": torch.cuda.default_stream().cuda_stream,
    }
    with torch.no_grad():
        model = init_weights_(LlamaStack(**SHAPE), seed=0).to("cuda", dtype).eval()
        compiled = magi_compile(model, config_patch={"cudagraph_mode": "FULL"})
        for i in range(40):
            compiled(inputs["4"][i % 4])
        (entry,) = [o for o in gc.get_objects() if type(o) is _CompiledCallable]
        (path,) = entry._direct.get(model).paths
        runner = path.run.magi_cuda_graphs
        ways = [(s, n) for s in streams for n in inputs]
        calls: dict[str, list[float]] = {f"{s}_{n}": [] for s, n in ways}
        launch: dict[str, list[float]] = {f"{s}_{n}": [] for s, n in ways}
        for _ in range(ROUNDS):
            for s, n in ways:
                key = f"{s}_{n}"
                stream = streams[s]
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    xs = [(t,) for t in inputs[n]]
                    for t in inputs[n]:  # the executables settle on this way's tensors
                        compiled(t)
                    calls[key].append(busy(compiled, xs, args.iters))
                    runner.set_stage_timing(True)
                    busy(compiled, xs, args.iters)
                    stages = dict(runner.stage_times())
                    runner.set_stage_timing(False)
                    launch[key].append(stages["launch"] / max(stages["calls"], 1.0))
                torch.cuda.synchronize()
        for key in calls:
            result[f"call_{key}"] = statistics.median(calls[key])
            result[f"launch_{key}"] = statistics.median(launch[key])
        result["executables"] = runner.num_executables
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
