"""Where a training step's activation memory goes, forward against backward, next to the
recompute planner's prediction (the same 4-layer Llama stack as benchmarks/recompute.py).
Diagnostic for the GPU machine:  python scripts/gpu/recompute_phases.py [POLICY=ARG ...]"""

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


def measure(model, x):
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
    loss = model(x)
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    after_fwd = torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base
    return fwd_peak, after_fwd, bwd_peak


def main() -> None:
    settings = sys.argv[1:] or ["HEURISTIC", "HANDCRAFT=1.0", "HANDCRAFT=0.5", "HANDCRAFT=0.0"]
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
        f, a, b = measure(model, x)
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
