"""Where a training step's activation memory goes, forward against backward, next to the
recompute planner's prediction (the same 4-layer Llama stack as benchmarks/recompute.py).
Diagnostic for the GPU machine:  python scripts/gpu/recompute_phases.py [--where] [POLICY=ARG ...]

--where records the CUDA allocator's history over the measured step and prints what is
allocated at the step's peak, grouped by the Python line that allocated it ("C++ only" for
allocations with no Python frame, such as the autograd engine accumulating gradients). Run with
MAGI_MEMORY_TRACE=1 to see the executor's own view beside it."""

from __future__ import annotations

import copy
import gc
import sys

import torch

sys.path.insert(0, "examples")
from blocks import LlamaStack, init_weights_  # noqa: E402
from magi_compiler import inspection, magi_compile  # noqa: E402

MIB = float(1 << 20)


class Loss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).float().pow(2).mean()


def where_at_peak(snapshot: dict, rows: int = 14) -> str:
    """What is allocated at the highest point of a recorded allocator history, by the Python
    line that allocated it."""
    events = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live: dict[int, dict] = {}
    total = peak = 0
    at_peak: dict[int, dict] = {}
    peak_index = -1
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, at_peak, peak_index = total, dict(live), i
        elif e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    groups: dict[str, list[int]] = {}
    for e in at_peak.values():
        frames = [f for f in e.get("frames", []) if f.get("filename", "").endswith(".py")]
        key = "C++ only"
        if frames:
            f = frames[0]
            key = f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"
        groups.setdefault(key, []).append(e["size"])
    lines = [f"peak {peak / MIB:.1f} MiB at event {peak_index} of {len(events)}"]
    for key, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:rows]:
        lines.append(f"  {sum(sizes) / MIB:8.1f} MiB in {len(sizes):3} blocks  {key}")
    return "\n".join(lines)


def measure(model, x, where: bool = False):
    params = list(model.parameters())
    for _ in range(2):  # compile and warm up
        for p in params:
            p.grad = None
        model(x).backward()
    for p in params:
        p.grad = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if where:
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    loss = model(x)
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    after_fwd = torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base
    if where:
        print(where_at_peak(torch.cuda.memory._snapshot()), flush=True)
        torch.cuda.memory._record_memory_history(enabled=None)
    return fwd_peak, after_fwd, bwd_peak


def main() -> None:
    where = "--where" in sys.argv
    settings = [a for a in sys.argv[1:] if a != "--where"] or [
        "HEURISTIC",
        "HANDCRAFT=1.0",
        "HANDCRAFT=0.5",
        "HANDCRAFT=0.0",
    ]
    torch.manual_seed(0)
    base = init_weights_(
        LlamaStack(4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192), seed=0
    ).to("cuda", torch.bfloat16)
    x = torch.randn(2, 2048, 2048, device="cuda", dtype=torch.bfloat16)
    print(
        f"{'plan':16} {'fwd peak':>9} {'after fwd':>9} {'bwd peak':>9} | predicted {'fwd':>7} {'all':>7} {'saved':>7}"
    )
    for s in settings:
        policy, _, arg = s.partition("=")
        rc = {"recompute_policy": policy}
        if policy == "HANDCRAFT":
            rc["memory_budget"] = float(arg)
        if policy == "AUTOSEARCH":
            rc["memory_budget_bytes"] = int(float(arg) * MIB)
        model = magi_compile(Loss(copy.deepcopy(base)), config_patch={"recompute_config": rc})
        f, a, b = measure(model, x, where)
        p = inspection.last_recompute_plan()
        print(
            f"{s:16} {f / MIB:9.1f} {a / MIB:9.1f} {b / MIB:9.1f} | predicted "
            f"{p['predicted_forward_peak_bytes'] / MIB:7.1f} {p['predicted_peak_bytes'] / MIB:7.1f} "
            f"{p['saved_bytes'] / MIB:7.1f}",
            flush=True,
        )
        del model
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
