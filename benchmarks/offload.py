"""Weight offload benchmark: a video-DiT-style stack with 30% of its weights on the GPU,
side by side in one process with the same model all-resident (eager, torch.compile, magi) and
with synchronous offload (each block's weights copied to the GPU right before it runs,
blocking: from pageable memory, as a plain ``.to("cuda")`` of CPU weights does, and from
pinned memory).

Every variant is checked against all-resident eager on the same input first, then timed with
CUDA events (warm-up, median of the timed calls). Offloaded variants first run the engine's
four calibration calls (docs/offload.md). Peak memory is ``max_memory_allocated`` during one
call less what was allocated before the variant was built.

    python benchmarks/offload.py --out benchmarks/results/cuda_h100_offload.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "examples"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
from blocks import DiTStack  # noqa: E402

from benchmarks.harness import fresh_instance, git_commit  # noqa: E402


class SyncOffload:
    """Each block's weights copied to the GPU right before it runs, the copy blocking."""

    def __init__(self, model: DiTStack, pinned: bool):
        self.blocks = []
        for block in model.blocks:
            cpu = copy.deepcopy(block).to("cpu")
            params = {
                n: (p.detach().pin_memory() if pinned else p.detach())
                for n, p in cpu.named_parameters()
            }
            self.blocks.append((cpu, params))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for block, params in self.blocks:
            on_gpu = {n: p.to(x.device) for n, p in params.items()}  # blocking copies
            x = torch.func.functional_call(block, on_gpu, (x,))
            del on_gpu
        return x


def _time(fn, x, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        fn(x)
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(x)
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return ms


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def run_config(reference: DiTStack, tokens: int, args, variants: list[str]) -> dict[str, Any]:
    from magi_compiler import inspection, magi_compile

    hidden = args.hidden
    x = torch.randn(1, tokens, hidden, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = reference(x)
    out: dict[str, Any] = {"tokens": tokens, "variants": {}}
    iters = args.iters if tokens >= 4096 else args.iters * 3
    for name in variants:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        row: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            if name == "eager":
                fn = reference
                before -= sum(p.numel() * p.element_size() for p in reference.parameters())
            elif name == "torch_compile":
                fn = torch.compile(reference)
                before -= sum(p.numel() * p.element_size() for p in reference.parameters())
            elif name == "magi":
                with torch.device("cuda"):  # built where its weights live: fast init
                    fn = fresh_instance(DiTStack, args.layers, hidden, args.heads, args.mlp, False)
                fn.to(torch.bfloat16).load_state_dict(reference.state_dict())
                fn = magi_compile(fn, dynamic_arg_dims={})  # batch 1: static
            elif name.startswith("offload_"):
                policy = name[len("offload_") :].upper()
                with torch.device("cuda"):  # then moved into pinned host memory, block by block
                    model = fresh_instance(
                        DiTStack, args.layers, hidden, args.heads, args.mlp, False
                    )
                model.to(torch.bfloat16).load_state_dict(reference.state_dict())
                fn = magi_compile(model, dynamic_arg_dims={}, config_patch={"offload_config": {
                    "model_cpu_offload": True, "offload_policy": policy,
                    "gpu_resident_weight_ratio": args.ratio}})  # fmt: skip
            elif name.startswith("sync_"):
                fn = SyncOffload(reference, pinned=name == "sync_pinned")
            else:
                raise ValueError(name)
            with torch.no_grad():
                got = fn(x)
                row["first_call_s"] = time.perf_counter() - t0
                row["rel_err"] = _rel(got, expected)
                for _ in range(3):  # offload: the cost-model and measured plans
                    fn(x)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                fn(x)
                torch.cuda.synchronize()
                row["peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
                ms = _time(fn, x, args.warmup, iters)
            row["median_ms"] = statistics.median(ms)
            row["min_ms"] = min(ms)
            if name.startswith("offload_"):
                report = inspection.offload_reports()[-1]
                row["report"] = report
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - recorded, never stops the others
            row["status"] = "error"
            row["error"] = f"{type(e).__name__}: {e}"
        out["variants"][name] = row
        print(f"  {tokens:>6} tokens  {name:<22} " + (
            f"{row['median_ms']:8.2f} ms  peak {row['peak_mib']:8.0f} MiB  err {row['rel_err']:.1e}"
            if row["status"] == "ok" else row["error"][:200]), flush=True)  # fmt: skip
        fn = None
    base = out["variants"].get("magi", {}).get("median_ms")
    for row in out["variants"].values():
        if base and row.get("median_ms"):
            row["vs_magi_resident"] = row["median_ms"] / base
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=3072)
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--mlp", type=int, default=4)
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 1024])
    p.add_argument("--ratio", type=float, default=0.3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    reference = (
        DiTStack(args.layers, args.hidden, args.heads, args.mlp, False)
        .to("cuda", torch.bfloat16)
        .eval()
    )
    weights = sum(p.numel() * p.element_size() for p in reference.parameters())
    from magi_compiler import _C

    link = _C.host_link_gbps(0)
    print(f"DiT: {args.layers} blocks, hidden {args.hidden}, {weights / 1e9:.2f} GB of bf16 weights; "
          f"pinned host-to-device copies at {link:.1f} GB/s")  # fmt: skip
    configs = []
    for tokens in args.tokens:
        main_shape = tokens == args.tokens[0]
        variants = ["eager"] + (
            [] if args.no_torch_compile or not main_shape else ["torch_compile"]
        )
        variants += ["magi", "offload_cost_effective", "offload_heuristic"]
        variants += (
            ["offload_base", "sync_pageable", "sync_pinned"] if main_shape else ["sync_pinned"]
        )
        configs.append(run_config(reference, tokens, args, variants))
    doc = {
        "benchmark": "offload",
        "meta": {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat(),
            "git_commit": git_commit(),
        },
        "model": {
            "layers": args.layers,
            "hidden": args.hidden,
            "heads": args.heads,
            "mlp": args.mlp,
            "weight_bytes": weights,
            "dtype": "bfloat16",
        },  # fmt: skip
        "settings": {"ratio": args.ratio, "warmup": args.warmup, "iters": args.iters},
        "link_gbps": link,
        "configs": configs,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
