"""magi_compiler quick start.

Compiles a Llama-style and a GPT-2-style transformer block with ``magi_compile`` and checks
the compiled model against eager PyTorch:

* correctness: max abs / relative error of compiled vs eager on fresh random inputs, first at
  batch 1 and then at three larger batch sizes (the default ``magi_compile``, no
  ``dynamic_arg_dims``: batch 1 is captured as it is, the first larger batch makes the batch
  dimension dynamic, so two captures serve every size);
* captures: how many graphs magi_compiler captured (from ``get_counters()``);
* speed: first-call time (includes compilation) and steady-state median time per call for
  eager and compiled, plus the speedup.

Runs on CUDA in bfloat16 when a GPU is available (batch 8 x seq 512), otherwise on CPU in
float32 (batch 4 x seq 128). Exits with status 1 if the compiled output differs from eager by
more than the tolerance (float32: 1e-4, bfloat16: 3e-2, relative to max |eager|).

Usage::

    python examples/quickstart.py
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Make ``blocks`` importable no matter where the script is run from.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blocks import GPT2Block, LlamaBlock, init_weights_  # noqa: E402
from magi_compiler import get_counters, magi_compile  # noqa: E402

WARMUP = 3
ITERS = 20
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@dataclass
class Result:
    name: str
    max_abs_err: float
    max_rel_err: float
    captures: int
    compiles: int
    first_call_s: float
    eager_ms: float
    compiled_ms: float
    graphs_ms: float | None = None  # magi with cudagraph_mode=FULL (GPU only)

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fns: list[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor) -> list[float]:
    """Median wall time of each ``fn(x)`` in milliseconds over ITERS runs, after WARMUP runs.

    The functions are run interleaved (fn0, fn1, fn0, fn1, ...) so that slow drifts of the
    machine (clock changes, other load) affect them alike.
    """
    for fn in fns:
        for _ in range(WARMUP):
            fn(x)
    times: list[list[float]] = [[] for _ in fns]
    if x.device.type == "cuda":
        synchronize(x.device)
        events = []
        for _ in range(ITERS):
            for i, fn in enumerate(fns):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn(x)
                end.record()
                events.append((i, start, end))
        synchronize(x.device)
        for i, start, end in events:
            times[i].append(start.elapsed_time(end))
    else:
        for _ in range(ITERS):
            for i, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn(x)
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def counter_snapshot() -> tuple[int, int]:
    counters = get_counters()
    return int(counters["captures"]), int(counters["compiles"])


def run_one(
    name: str,
    model: torch.nn.Module,
    hidden: int,
    batch: int,
    seq: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Result:
    print(f"\n=== {name} ===")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params / 1e6:.2f} M")

    # Eager reference and a compiled copy with identical weights. The imperative form
    # magi_compile(instance) compiles the instance in place and returns it.
    captures0, compiles0 = counter_snapshot()
    compiled = magi_compile(copy.deepcopy(model))

    with torch.no_grad():
        # First call, at batch 1: triggers capture + compilation.
        x = torch.randn(1, seq, hidden, device=device, dtype=dtype)
        synchronize(device)
        t0 = time.perf_counter()
        compiled(x)
        synchronize(device)
        first_call_s = time.perf_counter() - t0
        print(f"first call at batch 1 (capture + compile): {first_call_s:.2f} s")

        # Correctness on fresh inputs, for several batch sizes (dynamic batch dim).
        max_abs = max_rel = 0.0
        for b in (1, batch, batch - 1, batch + 2):
            x = torch.randn(b, seq, hidden, device=device, dtype=dtype)
            ref = model(x).float()
            out = compiled(x).float()
            abs_err = (out - ref).abs().max().item()
            rel_err = abs_err / ref.abs().max().item()
            max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
            print(
                f"input {tuple(x.shape)} -> output {tuple(out.shape)}: "
                f"max abs err {abs_err:.3e}, max rel err {rel_err:.3e}"
            )
        captures1, compiles1 = counter_snapshot()
        captures, compiles = captures1 - captures0, compiles1 - compiles0
        print(f"captures: {captures}, compiles: {compiles} (for 4 batch sizes)")

        # Steady-state timing at the base shape. On the GPU, also with CUDA graphs, which
        # remove the per-kernel launch cost (config_patch sets it for this copy only).
        x = torch.randn(batch, seq, hidden, device=device, dtype=dtype)
        fns = [model, compiled]
        if device.type == "cuda":
            graphed = magi_compile(copy.deepcopy(model), config_patch={"cudagraph_mode": "FULL"})
            ref = model(x).float()
            err = (graphed(x).float() - ref).abs().max().item() / ref.abs().max().item()
            max_rel = max(max_rel, err)
            print(f"with CUDA graphs: max rel err {err:.3e}")
            fns.append(graphed)
        times = median_ms(fns, x)
        eager_ms, compiled_ms = times[0], times[1]
        graphs_ms = times[2] if len(times) > 2 else None
    line = (
        f"median time per call: eager {eager_ms:.3f} ms, compiled {compiled_ms:.3f} ms "
        f"({eager_ms / compiled_ms:.2f}x)"
    )
    if graphs_ms is not None:
        line += f", compiled + CUDA graphs {graphs_ms:.3f} ms ({eager_ms / graphs_ms:.2f}x)"
    print(line)
    return Result(
        name, max_abs, max_rel, captures, compiles, first_call_s, eager_ms, compiled_ms, graphs_ms
    )


def print_table(results: list[Result], tol: float) -> None:
    header = (
        f"{'model':<12} {'max abs err':>12} {'max rel err':>12} {'captures':>9} "
        f"{'first call':>11} {'eager':>11} {'compiled':>11} {'speedup':>8}"
        f" {'+graphs':>11} {'speedup':>8}"
    )
    rule = "-" * len(header)
    print(f"\n{rule}\n{header}\n{rule}")
    for r in results:
        print(
            f"{r.name:<12} {r.max_abs_err:>12.3e} {r.max_rel_err:>12.3e} {r.captures:>9d} "
            f"{r.first_call_s:>10.2f}s {r.eager_ms:>9.3f}ms {r.compiled_ms:>9.3f}ms "
            f"{r.speedup:>7.2f}x"
            + (
                f" {r.graphs_ms:>9.3f}ms {r.eager_ms / r.graphs_ms:>7.2f}x"
                if r.graphs_ms is not None
                else f" {'-':>11} {'-':>8}"
            )
        )
    print(rule)
    print(f"tolerance: max rel err <= {tol:g}; times are medians of {ITERS} calls")


def main() -> int:
    if torch.cuda.is_available():
        device, dtype = torch.device("cuda"), torch.bfloat16
        batch, seq = 8, 512
        device_name = torch.cuda.get_device_name(device)
    else:
        device, dtype = torch.device("cpu"), torch.float32
        batch, seq = 4, 128
        device_name = f"CPU ({torch.get_num_threads()} threads)"
    tol = TOLERANCE[dtype]
    print(f"torch {torch.__version__}")
    print(f"device: {device_name}, dtype: {dtype}, batch {batch} x seq {seq}")

    configs = [
        ("llama", LlamaBlock(hidden=1024, n_heads=16, n_kv_heads=8, intermediate=2816), 1024),
        ("gpt2", GPT2Block(hidden=768, n_heads=12), 768),
    ]
    results = []
    for name, model, hidden in configs:
        torch.manual_seed(0)
        init_weights_(model, seed=0)
        model = model.to(device=device, dtype=dtype).eval()
        results.append(run_one(name, model, hidden, batch, seq, device, dtype))

    print_table(results, tol)

    failed = [r for r in results if not r.max_rel_err <= tol]
    if failed:
        for r in failed:
            print(
                f"FAILED: {r.name}: compiled output differs from eager by {r.max_rel_err:.3e} "
                f"(relative to max |eager|), above the {dtype} tolerance {tol:g}",
                file=sys.stderr,
            )
        return 1
    print("OK: compiled outputs match eager within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
