#!/usr/bin/env python
"""Memory-bound kernels against the device's copy bandwidth, and kernel compile latency.

Usage::

    python benchmarks/bandwidth.py --device cuda --out bandwidth.json   # the GPU run
    python benchmarks/bandwidth.py --device cpu --quick                 # a CPU smoke check

**Bandwidth.** In one process and side by side: eager, ``torch.compile`` (default mode) and
``magi_compile`` on large bfloat16 pointwise chains (SiLU·mul, x*y+z), RMSNorm, add+RMSNorm,
LayerNorm, softmax, rotary embedding (heads of 128, ``rotate_half`` with slices and ``cat``)
and an activation's backward with its bias gradient (a column reduction) (16384 x 8192 on the
GPU), and the device's copy bandwidth
(``dst.copy_(src)`` of a buffer of the same size). Effective bandwidth is
(bytes read + bytes written) / time, counting each input and output once, as a perfect fused
kernel would move them; intermediates and re-reads are the implementation's cost. Each variant
is checked against eager first, then all are timed together: warm-up calls of each, then six
rounds in which every variant makes 20 calls in turn, the order rotating from round to round
(interleaving puts any drift of the machine's clocks on every variant alike, rotation any
effect of the order), each call timed with CUDA events (the host clock on the CPU), over inputs
rotating through two sets (each tensor is 256 MiB on the GPU, so the L2 cache holds nothing
useful); the median of the 120 calls counts.

**Compile latency.** All kernels of one LlamaBlock (``examples/blocks.py``, hidden 2048,
bfloat16 on the GPU) compiled cold, in a fresh process with an empty kernel cache directory,
then warm from that disk cache in another fresh process. Reported per process: the first call
in total, the part in magi's lowering and first execution (import, passes, kernel compile or
disk load, one run) minus one steady-state run, and the compiler counters.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "examples"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks import harness  # noqa: E402

VARIANTS = ("eager", "torch.compile", "magi_compile")
TOLERANCE = 2e-2  # max |compiled - eager| / max |eager| in bfloat16


# ---- workloads --------------------------------------------------------------------------------


def silu_mul(x, u):
    return F.silu(x) * u


def fma(x, y, z):
    return x * y + z


def rmsnorm(x, w):
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(variance + 1e-6) * w.float()).to(x.dtype)


def add_rmsnorm(x, r, w):
    h = x + r
    return rmsnorm(h, w), h


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def softmax(x):
    return F.softmax(x, dim=-1)


HEAD_DIM = 128


def rotary(x, cos, sin):
    # x: [tokens, heads * 128] as attention's q; cos, sin: [tokens, 128], shared by the heads
    q = x.view(x.shape[0], x.shape[1] // HEAD_DIM, HEAD_DIM)
    half = HEAD_DIM // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return q * cos[:, None, :] + rotated * sin[:, None, :]


def bias_grad(g, h):
    # an activation's backward and the bias gradient, as a training step computes them
    gh = g * torch.sigmoid(h)
    return gh, gh.float().sum(0).to(g.dtype)


@dataclass
class Workload:
    name: str
    fn: Callable
    full: int  # inputs of the full [rows, cols] shape
    vectors: int  # inputs of shape [cols] (weights, biases)
    outputs: int  # full-size outputs
    per_token: int = 0  # inputs of shape [rows, HEAD_DIM] (rotary's cos and sin)
    column_outputs: int = 0  # outputs of shape [cols] (column reductions)

    def inputs(self, rows: int, cols: int, dtype: torch.dtype, device: str) -> tuple:
        full = [torch.randn(rows, cols, dtype=dtype, device=device) for _ in range(self.full)]
        vec = [torch.randn(cols, dtype=dtype, device=device) for _ in range(self.vectors)]
        tok = [
            torch.randn(rows, HEAD_DIM, dtype=dtype, device=device) for _ in range(self.per_token)
        ]
        return (*full, *vec, *tok)

    def bytes_moved(self, rows: int, cols: int, element_size: int) -> int:
        elements = (self.full + self.outputs) * rows * cols
        elements += (self.vectors + self.column_outputs) * cols + self.per_token * rows * HEAD_DIM
        return elements * element_size


WORKLOADS = [
    Workload("silu_mul", silu_mul, full=2, vectors=0, outputs=1),
    Workload("x*y+z", fma, full=3, vectors=0, outputs=1),
    Workload("rmsnorm", rmsnorm, full=1, vectors=1, outputs=1),
    Workload("add_rmsnorm", add_rmsnorm, full=2, vectors=1, outputs=2),
    Workload("layer_norm", layer_norm, full=1, vectors=2, outputs=1),
    Workload("softmax", softmax, full=1, vectors=0, outputs=1),
    Workload("rotary", rotary, full=1, vectors=0, outputs=1, per_token=2),
    Workload("bias_grad", bias_grad, full=2, vectors=0, outputs=1, column_outputs=1),
]


# ---- timing -----------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_block(fn: Callable, input_sets: list[tuple], device: str, iters: int) -> list[float]:
    """Seconds of each of `iters` back-to-back calls of fn over rotating input sets."""
    if device != "cuda":
        times = []
        for i in range(iters):
            t0 = time.perf_counter()
            fn(*input_sets[i % len(input_sets)])
            times.append(time.perf_counter() - t0)
        return times
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(*input_sets[i % len(input_sets)])
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def time_calls(fn: Callable, input_sets: list[tuple], device: str, warmup: int, iters: int):
    """Median seconds per call of fn over rotating input sets (after warm-up calls)."""
    return time_interleaved({"fn": fn}, input_sets, device, warmup, iters, rounds=1)["fn"]


def time_interleaved(
    fns: dict[str, Callable],
    input_sets: list[tuple],
    device: str,
    warmup: int,
    iters: int,
    rounds: int,
) -> dict[str, float]:
    """Median seconds per call of each fn: warm-up calls of each, then `rounds` rounds in which
    every fn runs iters / rounds calls in turn, so a drift of the machine (clocks, temperature)
    falls on every variant alike; the order of the variants rotates from round to round, so that
    no variant always follows the same one."""  # fmt: skip
    for fn in fns.values():
        for i in range(warmup):
            fn(*input_sets[i % len(input_sets)])
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    per_round = max(1, iters // rounds)
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name] += time_block(fns[name], input_sets, device, per_round)
    return {name: statistics.median(t) for name, t in times.items()}


def fresh_function(fn: Callable, tag: str) -> Callable:
    """fn with a code object of its own: Dynamo keeps its caches per code object, so each
    compiler traces it from nothing while the other variants' compiled code lives on."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def relative_error(actual, expected) -> float:
    if isinstance(expected, (tuple, list)):
        return max(relative_error(a, e) for a, e in zip(actual, expected, strict=True))
    a, e = actual.detach().double(), expected.detach().double()
    return ((a - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()


def make_variant(name: str, wl: Workload) -> Callable:
    if name == "eager":
        return wl.fn
    fn = fresh_function(wl.fn, name.replace(".", "_"))
    if name == "torch.compile":
        return torch.compile(fn)
    from magi_compiler import magi_compile

    # The rows of every full-size and per-token input are dynamic (the weights' are static).
    params = list(inspect.signature(wl.fn).parameters)
    dynamic = params[: wl.full] + params[len(params) - wl.per_token :]
    return magi_compile(fn, dynamic_arg_dims={p: 0 for p in dynamic})


def copy_bandwidth(rows: int, cols: int, dtype, device: str, warmup: int, iters: int) -> dict:
    src = [torch.randn(rows, cols, dtype=dtype, device=device) for _ in range(2)]
    dst = torch.empty_like(src[0])
    seconds = time_calls(lambda s: dst.copy_(s), [(s,) for s in src], device, warmup, iters)
    nbytes = 2 * src[0].numel() * src[0].element_size()
    return {"seconds": seconds, "bytes": nbytes, "gbps": nbytes / seconds / 1e9}


def measure_bandwidth(args) -> dict:
    device, dtype = args.device, getattr(torch, args.dtype)
    rows, cols = args.rows, args.cols
    # A long warm-up: the first kernels of a process can meet an idle GPU at low clocks, and a
    # low copy figure would inflate every percentage below.
    copy = copy_bandwidth(rows, cols, dtype, device, 10 * args.warmup, args.iters)
    print(f"copy: {copy['gbps']:.0f} GB/s ({rows}x{cols} {str(dtype)[6:]}, read + write)")
    print_header(args.variants)
    results = []
    for wl in WORKLOADS:
        if args.only and wl.name not in args.only:
            continue
        input_sets = [wl.inputs(rows, cols, dtype, device) for _ in range(2)]
        nbytes = wl.bytes_moved(rows, cols, torch.finfo(dtype).bits // 8)
        with torch.no_grad():
            expected = wl.fn(*input_sets[0])
            row = {"workload": wl.name, "bytes": nbytes, "variants": {}}
            torch._dynamo.reset()
            timed: dict[str, Callable] = {}
            for v in args.variants:  # each compiled and checked, then all timed together
                r: dict[str, Any] = {}
                try:
                    fn = make_variant(v, wl)
                    t0 = time.perf_counter()
                    out = fn(*input_sets[0])
                    _sync(device)
                    r["first_call_s"] = time.perf_counter() - t0
                    r["rel_error"] = relative_error(out, expected)
                    r["correct"] = r["rel_error"] <= TOLERANCE
                    r["status"] = "ok"
                    del out
                    timed[v] = fn
                except Exception as e:  # noqa: BLE001 - recorded, the table goes on
                    r = {"status": "error", "error": f"{type(e).__name__}: {e}"[:2000]}
                row["variants"][v] = r
            seconds = time_interleaved(timed, input_sets, device, args.warmup, args.iters,
                                       args.rounds)  # fmt: skip
            for v, t in seconds.items():
                r = row["variants"][v]
                r["seconds"] = t
                r["gbps"] = nbytes / t / 1e9
                r["pct_of_copy"] = 100.0 * r["gbps"] / copy["gbps"]
        results.append(row)
        print_row(row, args.variants)
        del input_sets, expected
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"copy": copy, "rows": rows, "cols": cols, "dtype": args.dtype, "workloads": results}


def print_header(variants) -> None:
    print(f"{'workload':<14}" + "".join(f"{v:>28}" for v in variants))
    print(f"{'':<14}" + "".join(f"{'GB/s  % of copy':>28}" for _ in variants))


def print_row(row: dict, variants) -> None:
    cells = []
    for v in variants:
        r = row["variants"][v]
        if r["status"] != "ok":
            cells.append(f"{'error':>28}")
        else:
            flag = "" if r["correct"] else " WRONG"
            cells.append(f"{r['gbps']:>14.1f} {r['pct_of_copy']:>8.1f}%{flag:>6}")
    print(f"{row['workload']:<14}" + "".join(f"{c:>28}" for c in cells), flush=True)


# ---- compile latency --------------------------------------------------------------------------


def compile_worker(args) -> dict:
    """In a fresh process: first call of a compiled LlamaBlock, split into capture and magi's
    lowering + first execution (where kernels compile or load from disk)."""
    from blocks import LlamaBlock, init_weights_
    from magi_compiler import _C, _backend, magi_compile

    _C.set_cache_dir(args.cache_dir)
    _C.reset_compiler_stats()
    device, dtype = args.device, torch.bfloat16 if args.device == "cuda" else torch.float32
    hidden = args.hidden
    block = LlamaBlock(hidden=hidden, n_heads=hidden // 128 or 2, n_kv_heads=hidden // 256 or 1,
                       intermediate=hidden * 8 // 3 // 64 * 64)  # fmt: skip
    block = init_weights_(block, seed=0).to(device=device, dtype=dtype)
    x = torch.randn(2, args.seq, hidden, device=device, dtype=dtype)
    with torch.no_grad():
        block(x)  # library start-up (cuBLAS handles, SDPA) is nobody's compile time
    _sync(device)

    lowering: list[float] = []
    runs: list[float] = []
    original = _backend.lower_graph

    def spy(gm, kind, config):
        t0 = time.perf_counter()
        run = original(gm, kind, config)
        lowering.append(time.perf_counter() - t0)

        def timed(boxed_args):
            t0 = time.perf_counter()
            out = run(boxed_args)
            _sync(device)
            runs.append(time.perf_counter() - t0)
            return out

        for attr in ("_boxed_call", "magi_graph", "magi_executable"):
            setattr(timed, attr, getattr(run, attr))
        return timed

    _backend.lower_graph = spy
    compiled = magi_compile(block)
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(x)
        _sync(device)
        first_call = time.perf_counter() - t0
        for _ in range(5):
            compiled(x)
    stats = _C.compiler_stats()
    steady = statistics.median(runs[1:])
    return {
        "first_call_s": first_call,
        "lowering_and_kernels_s": sum(lowering) + runs[0] - steady,
        "capture_s": first_call - sum(lowering) - runs[0],
        "steady_run_s": steady,
        "stats": stats,
        "hidden": hidden,
    }


def run_compile_worker(args, cache_dir: str, extra_env: dict | None = None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-worker",
           "--device", args.device, "--hidden", str(args.hidden), "--seq", str(args.seq),
           "--cache-dir", cache_dir]  # fmt: skip
    env = dict(os.environ, **(extra_env or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        return {"status": "error", "error": proc.stderr[-3000:]}
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return {"status": "ok", **json.loads(line)}


def measure_compile_latency(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="magi_kernels_") as cache_dir:
        cold = run_compile_worker(args, cache_dir)
        warm = run_compile_worker(args, cache_dir)
    out = {"hidden": args.hidden, "seq": args.seq, "cold": cold, "warm": warm}
    for label, r in (("cold", cold), ("warm", warm)):
        if r["status"] != "ok":
            print(f"compile latency ({label}): error\n{r['error']}")
            continue
        s = r["stats"]
        print(f"compile latency ({label}, LlamaBlock hidden {args.hidden}): lowering + kernels "
              f"{r['lowering_and_kernels_s']:.3f} s, capture {r['capture_s']:.2f} s, first call "
              f"{r['first_call_s']:.2f} s; compiles cuda {s['cuda_compiles']} cpu "
              f"{s['cpu_compiles']}, disk hits {s['disk_hits']}")  # fmt: skip
    return out


# ---- main -------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--quick", action="store_true", help="small shapes, few iterations")
    p.add_argument("--variants", help=f"comma-separated subset of {', '.join(VARIANTS)} "
                   "(default: all on CUDA; eager and magi_compile on the CPU)")  # fmt: skip
    p.add_argument("--only", help="comma-separated workload names")
    p.add_argument("--no-compile-latency", action="store_true")
    p.add_argument("--no-bandwidth", action="store_true")
    p.add_argument("--out", help="JSON path")
    p.add_argument("--rows", type=int)
    p.add_argument("--cols", type=int)
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        default="bfloat16",
        help="element type of the bandwidth workloads (default bfloat16)",
    )
    p.add_argument("--hidden", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--compile-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.device = harness.resolve_device(p, args.device)
    gpu = args.device == "cuda"
    big = gpu and not args.quick
    args.rows = args.rows or (16384 if big else 256)
    args.cols = args.cols or (8192 if big else 1024)
    args.hidden = args.hidden or (2048 if gpu else 256)
    args.seq = args.seq or (512 if gpu else 16)
    args.warmup = 5 if big else 2
    args.iters = 120 if big else 5
    args.rounds = 6 if big else 1  # each variant in each position twice (three variants)
    variants = args.variants.split(",") if args.variants else (
        list(VARIANTS) if gpu else ["eager", "magi_compile"])  # fmt: skip
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad}; known: {', '.join(VARIANTS)}")
    args.variants = variants
    args.only = args.only.split(",") if args.only else None
    return args


def environment(device: str) -> dict:
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_commit": harness.git_commit(),
    }
    if device == "cuda":
        meta["device_name"] = torch.cuda.get_device_name()
    else:
        meta["device_name"] = platform.processor() or platform.machine()
        meta["cpu_threads"] = torch.get_num_threads()
    return meta


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.compile_worker:
        print(json.dumps(compile_worker(args), default=str))
        return {}
    doc: dict[str, Any] = {"meta": environment(args.device)}
    doc["meta"]["command"] = " ".join(
        ["python", "benchmarks/bandwidth.py", *(argv or sys.argv[1:])]
    )
    print(f"{doc['meta']['device_name']}, torch {torch.__version__}")
    if not args.no_bandwidth:
        doc["bandwidth"] = measure_bandwidth(args)
    if not args.no_compile_latency:
        doc["compile_latency"] = measure_compile_latency(args)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
