"""Warm start: the first call of a compiled model in a fresh process, with empty caches (cold)
and with the caches the previous process left (warm), for magi_compile's compiled-module cache
(docs/cache.md) and torch.compile's own on-disk caches (Inductor's FX graph cache and
AOTAutograd's cache, on by default; Dynamo still traces in a warm process).

    python benchmarks/warm_start.py --device cuda --out benchmarks/results/cuda_h100_warm_start.json
    python benchmarks/warm_start.py --device cpu --size tiny

Models: ``stack``, the 4-layer Llama-style stack of examples/blocks.py (hidden 2048, 1 x 512
tokens at the real size), and ``llama``, Hugging Face's ``LlamaForCausalLM`` at the Llama-3.2-1B
shape (random weights, ``zoo_models.py``; 1 x 128 tokens, called with keywords), both inference
(no grad); and ``stack_train``, the stack's training step: each call is a forward and the
backward of the output's sum (the first call includes both). bf16 on CUDA, fp32 on the CPU.

Each (model, compiler) pair runs two child processes one after the other over one fresh set
of cache directories. A child builds the model (seeded, so both build the same weights),
computes eager's output, then times its first compiled call on the host clock (CUDA
synchronised), then the median of 20 more calls, and reports both with the largest relative
error against eager, its magi counters and the process's wall time. The cache directories
are removed afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("stack", "llama", "stack_train")
COMPILERS = ("magi", "inductor")


# --- one child process ---------------------------------------------------------------------
def _build(model: str, size: str, device: str, dtype: Any) -> tuple[Any, Any, dict]:
    import torch

    sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
    if model in ("stack", "stack_train"):
        from blocks import LlamaStack

        dims = dict(n_layers=4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192)
        seq = 512
        if size == "tiny":
            dims, seq = dict(n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, intermediate=128), 16
        torch.manual_seed(0)
        with torch.device(device):
            net = LlamaStack(**dims)
        net = net.to(dtype).eval()
        x = torch.randn(1, seq, dims["hidden"], device=device, dtype=dtype)
        return net, (x,), {}
    from benchmarks import zoo_models

    family = zoo_models.FAMILIES["llama"]
    net = zoo_models.build(family, "real" if size == "real" else "tiny", device, dtype)
    torch.manual_seed(1)
    seq = 128 if size == "real" else 16
    ids = torch.randint(0, net.config.vocab_size, (1, seq), device=device)
    return net, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}


def _first_tensor(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def child(spec: dict) -> dict:
    start = time.perf_counter()
    import magi_compiler
    import torch

    device, dtype = spec["device"], getattr(torch, spec["dtype"])
    net, args, kwargs = _build(spec["model"], spec["size"], device, dtype)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    training = spec["model"].endswith("_train")

    def step(fn: Any) -> Any:
        out = fn(*args, **kwargs)
        if training:
            _first_tensor(out).float().sum().backward()
        return out

    with torch.no_grad():
        expected = _first_tensor(net(*args, **kwargs)).float()
    with torch.set_grad_enabled(training):
        if spec["compiler"] == "magi":
            compiled = magi_compiler.magi_compile(
                net, config_patch={"cache_root_dir": spec["cache"], "disable_cache": False}
            )
        else:
            compiled = torch.compile(net)
        sync()
        t0 = time.perf_counter()
        out = step(compiled)
        sync()
        first = time.perf_counter() - t0
        times = []
        for _ in range(20):
            t = time.perf_counter()
            out = step(compiled)
            sync()
            times.append(time.perf_counter() - t)
    actual = _first_tensor(out).detach().float()
    error = float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
    counters = magi_compiler.get_counters().as_dict()
    counters.update(magi_compiler._C.compiler_stats())
    return {
        "first_call_s": first,
        "steady_ms": statistics.median(times) * 1e3,
        "max_rel_error": error,
        "counters": counters,
        "process_s": time.perf_counter() - start,
    }


# --- the parent ----------------------------------------------------------------------------
def _run_child(spec: dict, dirs: dict[str, str]) -> dict:
    env = dict(os.environ)
    env.pop("MAGI_COMPILE_DISABLE_CACHE", None)
    env["MAGI_CACHE_DIR"] = dirs["kernels"]
    env["TORCHINDUCTOR_CACHE_DIR"] = dirs["inductor"]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    process = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps({**spec, "cache": dirs["magi"]})],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    wall = time.perf_counter() - started
    if process.returncode != 0:
        return {"error": process.stderr.strip().splitlines()[-1:] or ["failed"], "wall_s": wall}
    result = json.loads(process.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def _entry_bytes(directory: str) -> int:
    return sum(p.stat().st_size for p in Path(directory).rglob("*.entry"))


def measure(model: str, compiler: str, device: str, size: str) -> dict:
    dtype = "bfloat16" if device == "cuda" else "float32"
    spec = {"model": model, "compiler": compiler, "device": device, "size": size, "dtype": dtype}
    base = tempfile.mkdtemp(prefix="magi_warm_start_")
    dirs = {name: os.path.join(base, name) for name in ("magi", "kernels", "inductor")}
    try:
        row = {"model": model, "compiler": compiler, "size": size}
        for phase in ("cold", "warm"):
            row[phase] = _run_child(spec, dirs)
            print(f"[warm_start] {model} {compiler} {phase}: {_summary(row[phase])}", flush=True)
        row["entry_bytes"] = _entry_bytes(dirs["magi"]) if compiler == "magi" else None
        return row
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _summary(result: dict) -> str:
    if "error" in result:
        return f"error: {result['error']}"
    c = result["counters"]
    return (
        f"first call {result['first_call_s']:.3f} s, steady {result['steady_ms']:.3f} ms, "
        f"error {result['max_rel_error']:.1e}, captures {c['captures']}, compiles {c['compiles']}, "
        f"loaded graphs {c['cache_loaded_graphs']}, kernel compiles "
        f"{c['cuda_compiles'] + c['cpu_compiles']}"
    )


def _meta(device: str, size: str) -> dict:
    import torch

    sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # harness imports the example blocks
    from benchmarks.harness import git_commit

    commit = git_commit()
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    return {
        "benchmark": "warm_start",
        "device_type": device,
        "device_name": name,
        "torch": torch.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "git_commit": commit or "?",
        "size": size,
        # Whether torch's modules load from cached bytecode; without it every import of a
        # fresh process compiles Python source, which each first call pays for what it imports.
        "bytecode_cached": os.path.exists(importlib.util.cache_from_source(torch.__file__)),
        "complete": False,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--size", default=None, choices=("real", "tiny"),
                   help="default: real on CUDA, tiny on the CPU")  # fmt: skip
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return {}
    size = args.size or ("real" if args.device == "cuda" else "tiny")
    pairs = [(m, c) for m in args.models.split(",") for c in args.compilers.split(",")]
    doc = {"benchmark": "warm_start", "meta": _meta(args.device, size), "rows": []}
    doc["meta"]["pairs"] = [list(p) for p in pairs]  # what was asked: a cut run lists the rest
    for model, compiler in pairs:
        doc["rows"].append(measure(model, compiler, args.device, size))
        doc["meta"]["complete"] = len(doc["rows"]) == len(pairs)
        if args.out:  # after each row: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    if args.out:
        print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
