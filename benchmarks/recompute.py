#!/usr/bin/env python
"""Automatic recomputation in training: magi_compile's recompute planner against torch.compile.

Usage::

    python benchmarks/recompute.py --device cuda     # the GPU run (bfloat16), 3 to 8 minutes
    python benchmarks/recompute.py --device cpu --smoke --out /tmp/rc_smoke.json   # a check

Two models (``examples/blocks.py`` ``LlamaStack``), bfloat16 on the GPU:

- ``llama4``: 4 layers, hidden 2048, 16 / 8 heads, SwiGLU 8192, batch 2 x 2048 tokens;
- ``llama8b``: the shape of Llama-3-8B's layers, 2 of them: hidden 4096, 32 / 8 heads,
  SwiGLU 14336, batch 1 x 4096 tokens.

A step is a forward, the loss ``output.float().pow(2).mean()`` (inside the compiled module),
and a backward; no optimizer: gradients are set to None before each step. Inputs need no
gradient; every parameter does. Variants, each on its own deep copy of one initialised model,
compiled, checked and measured for memory one after the other (every compiled variant wraps
the copy in a module whose ``forward`` has a code object of its own, so no cache entry of one
serves another):

- ``eager``: the reference for correctness;
- ``tc``: ``torch.compile`` at its defaults;
- ``tc_amb<b>``: ``torch.compile`` with ``torch._functorch.config.activation_memory_budget = b``
  (patched around the compile and every call of that variant);
- ``magi_heuristic``: ``magi_compile`` with ``recompute_policy=HEURISTIC``;
- ``magi_auto<f>``: ``magi_compile`` with ``recompute_policy=AUTOSEARCH`` and
  ``memory_budget_bytes = f x`` the no-recompute plan's predicted activation peak (from the
  HEURISTIC compile's plan; ``inspection.last_recompute_plan()``).

Per variant: the first step's wall time (capture and compilation included); loss and gradients
against eager's on the same input (normwise relative error ``||a - e|| / ||e||``: the loss, the
worst gradient, and three named ones; correct within ``--tolerance``, 5e-2 in bfloat16 as in
harness.py; eager's row compares a second eager step, the noise floor); ``--warmup`` steps;
then one more step for memory: gradients dropped,
``torch.cuda.empty_cache()``, the peak statistics reset, and the **measured activation peak** is
``max_memory_allocated`` during the step less ``memory_allocated`` before it (the parameters,
inputs and the master copy are resident before, so the number holds activations, backward
temporaries and the gradients the step produces: what the planner's *simulated activation
peak* counts). The same difference of ``max_memory_reserved`` is recorded beside it (the
allocator's segments). For magi variants the plan's predicted peak, saved bytes and
no-recompute numbers are recorded too.

**Step time** (``--rounds``, default 4 on CUDA): every variant of a model stays alive after its
measurements, and once all are built their ``--steps`` timed steps run in rounds over all of
them (one warm-up step each first), each step timed with CUDA events around the whole step
(``time.perf_counter`` on the CPU); the median counts. Interleaving puts any drift of the
machine's speed during the run (clocks, power, other tenants) on every variant alike: run one
after the other, torch.compile's 8B-shaped step measured 18.57 ms in one process and 19.85-20.04
ms in four others the same day. All copies are then alive at once (about 17 GB for the
8B-shaped model's ten variants). ``--rounds 1`` times each variant right after its compile and
frees it before the next (at most two copies alive: the master and the one measured), Dynamo
reset before each.

Derived per model: HEURISTIC's activation-memory saving against ``tc`` and its step-time ratio;
for each AUTOSEARCH budget whether the predicted and the measured peak fit it; and, for each
magi variant, the fastest torch.compile variant (``tc`` or a ``tc_amb``) whose measured peak is
at most magi's ("tuned to the same measured peak") and the time ratio magi / that variant.

A measured *saved bytes* (the distinct storages autograd packs for the backward, through
``saved_tensors_hooks``, parameters and input left out) is taken on every device from one more
step; on the CPU, where there are no memory statistics, it stands in for the peak in the
"same peak" match.

One-time process costs (Inductor's compile workers, magi's first capture) are paid first on a
tiny module. Variants run in the order eager, tc, magi_heuristic, magi_auto*, tc_amb*; each
model has a share of ``--budget-s`` and a variant that would overrun it is skipped (recorded as
such). A variant that fails is recorded with its error and the run goes on. The JSON is
rewritten after every variant, so a run killed by a timeout leaves what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "examples"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
from blocks import LlamaStack, RMSNorm  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.harness import sync  # noqa: E402
from benchmarks.recompute_derive import (  # noqa: E402
    HEADER,
    derive,
    derived_text,
    mib,
    row_text,
)

MODELS: dict[str, dict[str, Any]] = {
    "llama4": dict(
        title="Llama-style stack, 4 layers",
        layers=4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192, batch=2, seq=2048,
    ),
    "llama8b": dict(
        title="Llama-3-8B-shaped stack, 2 layers",
        layers=2, hidden=4096, n_heads=32, n_kv_heads=8, intermediate=14336, batch=1, seq=4096,
    ),
}  # fmt: skip
SMOKE: dict[str, dict[str, Any]] = {  # tiny shapes, float32 (the 8B-shaped one keeps batch 1)
    "llama4": dict(layers=2, hidden=64, n_heads=4, n_kv_heads=2, intermediate=128, batch=2, seq=32),
    "llama8b": dict(layers=2, hidden=64, n_heads=4, n_kv_heads=1, intermediate=224, batch=1,
                    seq=64),
}  # fmt: skip
SHARE = {"llama4": 0.6, "llama8b": 0.4}  # of --budget-s; what one model leaves goes on
TC_BUDGETS = (0.1, 0.3, 0.5, 0.7)
FRACTIONS = (0.8, 0.5, 0.2)  # AUTOSEARCH budgets: floor + f * (no-recompute peak - floor)
SMOKE_TC_BUDGETS, SMOKE_FRACTIONS = (0.1,), (0.8, 0.2)  # fewer compiles: CPU Inductor is slow
KINDS = ("eager", "tc", "magi_heuristic", "magi_auto", "tc_amb")


# --------------------------------------------------------------------------------------------
# Model and variants
# --------------------------------------------------------------------------------------------


class _Entry(nn.Module):
    """What every variant runs: the model and the loss, one graph for the compilers."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).float().pow(2).mean()


def fresh_entry(model: nn.Module) -> nn.Module:
    """An :class:`_Entry` with a forward of its own code object, so each compile starts from
    nothing (harness.fresh_instance)."""
    return harness.fresh_instance(_Entry, model)


@torch.no_grad()
def build_master(cfg: dict, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The initialised model every variant copies: matrices N(0, 0.02), norm weights
    1 + N(0, 0.1), drawn on the device from seed 0 (fast at 8B-layer sizes)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaStack(
            cfg["layers"],
            hidden=cfg["hidden"],
            n_heads=cfg["n_heads"],
            n_kv_heads=cfg["n_kv_heads"],
            intermediate=cfg["intermediate"],
        )
    model = model.to(dtype=dtype)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.weight.normal_(0.0, 0.02)
        elif isinstance(m, RMSNorm):
            m.weight.normal_(1.0, 0.1)
    for p in model.parameters():
        p.requires_grad_(True)
    return model.train()


@dataclass
class Variant:
    name: str
    kind: str  # one of KINDS
    label: str
    tc_budget: float | None = None  # torch._functorch.config.activation_memory_budget
    fraction: float | None = None  # AUTOSEARCH: of the range floor .. no-recompute peak
    recompute: dict[str, Any] = field(default_factory=dict)  # magi recompute_config

    def context(self):
        if self.tc_budget is None:
            return contextlib.nullcontext()
        return torch._functorch.config.patch(activation_memory_budget=self.tc_budget)


def make_fn(v: Variant, model: nn.Module, reset: bool = True) -> Callable:
    """The variant's step function. ``reset``: Dynamo is reset first (no other compiled variant
    is alive); interleaved timing keeps the others and relies on each wrapper's own code
    object to keep their cache entries apart."""
    if v.kind == "eager":
        return _Entry(model)
    if reset:
        torch._dynamo.reset()
    entry = fresh_entry(model)
    if v.kind in ("tc", "tc_amb"):
        return torch.compile(entry)
    from magi_compiler import magi_compile

    patch = {"strict": True, "recompute_config": dict(v.recompute)}
    return magi_compile(entry, dynamic_arg_dims={}, config_patch=patch)


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


def drop_grads(params: list[nn.Parameter]) -> None:
    for p in params:
        p.grad = None


def step(fn: Callable, params: list[nn.Parameter], x: torch.Tensor) -> torch.Tensor:
    drop_grads(params)  # zero_grad(set_to_none=True)
    loss = fn(x)
    loss.backward()
    return loss


def time_steps(fn, params, inputs, device, n: int) -> list[float]:
    """Milliseconds of each of ``n`` steps, rotating through the input sets."""
    if device.type == "cuda":
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(n)
        ]
        sync(device)
        for i, (start, end) in enumerate(events):
            start.record()
            step(fn, params, inputs[i % len(inputs)])
            end.record()
        sync(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        step(fn, params, inputs[i % len(inputs)])
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_stats(times: list[float]) -> dict[str, Any]:
    times = sorted(times)
    n = len(times)
    return dict(median_ms=statistics.median(times), min_ms=times[0],
                p20_ms=times[int(0.2 * (n - 1))], p80_ms=times[int(0.8 * (n - 1))],
                steps=n)  # fmt: skip


def time_interleaved(lives: list[Live], inputs: list[torch.Tensor], args) -> None:
    """Times the live variants in ``args.rounds`` rounds, each variant taking its share of
    ``args.steps`` in every round (after one warm-up step in the first), so a drift of the
    machine's speed during the run reaches every variant alike; fills their results. A variant
    that fails here is marked failed and leaves the rotation."""
    active = list(lives)
    for k in range(args.rounds):
        for live in list(active):
            n = args.steps // args.rounds + (1 if k < args.steps % args.rounds else 0)
            try:
                with live.v.context():
                    if k == 0:
                        time_steps(live.fn, live.params, inputs, args.device, 1)
                    live.times += time_steps(live.fn, live.params, inputs, args.device, n)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                live.result.update(status="failed", error=error_text(e), phase="timed steps")
                active.remove(live)
    for live in active:
        live.result.update(time_stats(live.times))


def measure_saved(fn, params, x) -> dict[str, int]:
    """Bytes autograd saves for the backward during one step's forward: the distinct storages
    packed through ``saved_tensors_hooks`` (compiled graphs save through their autograd
    Function too), less the parameters and the input. Works on every device; for a magi
    variant it is the measured counterpart of the plan's ``saved_bytes``."""
    resident = {t.untyped_storage().data_ptr() for t in [*params, x]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in resident:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step(fn, params, x)
    del loss
    drop_grads(params)
    out = {"saved_bytes_measured": sum(seen.values()), "saved_tensors_measured": len(seen)}
    if torch._dynamo.utils.counters["stats"]["unique_graphs"] != graphs:
        out["saved_hooks_recompiled"] = 1  # Dynamo compiled again under the hooks
    return out


def measure_peak(fn, params, x, device) -> dict[str, int]:
    """Activation peak of one step: what it allocates above what was resident before it."""
    if device.type != "cuda":
        return {}
    drop_grads(params)
    gc.collect()
    sync(device)
    torch.cuda.empty_cache()
    base, base_reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    loss = step(fn, params, x)
    sync(device)
    out = {
        "act_peak_bytes": torch.cuda.max_memory_allocated(device) - base,
        "reserved_peak_bytes": torch.cuda.max_memory_reserved(device) - base_reserved,
        "resident_bytes": base,
    }
    del loss
    drop_grads(params)
    return out


def values_of(loss: torch.Tensor, named: list[tuple[str, nn.Parameter]]) -> dict[str, Any]:
    return {"loss": loss.detach(), **{n: p.grad for n, p in named}}


def to_host(values: dict[str, Any]) -> dict[str, Any]:
    return {k: None if v is None else v.detach().to("cpu", copy=True) for k, v in values.items()}


def rel_err(a: torch.Tensor | None, e: torch.Tensor | None) -> float:
    """``||a - e|| / ||e||`` in float32 on a's device (inf for a missing or NaN value)."""
    if a is None or e is None:
        return 0.0 if a is None and e is None else math.inf
    if a.shape != e.shape:
        return math.inf
    a = a.detach().float()
    e = e.detach().to(a.device).float()
    norm_e = torch.linalg.vector_norm(e).item()
    diff = torch.linalg.vector_norm(a - e).item()
    if math.isnan(diff):
        return math.inf
    return diff / norm_e if norm_e > 0 else diff


def compare(values: dict[str, Any], ref: dict[str, Any], last_layer: int) -> dict[str, Any]:
    """Errors against eager: the loss, the worst gradient, and three gradients by name."""
    named = ("layers.0.q_proj.weight", "layers.0.input_norm.weight",
             f"layers.{last_layer}.down_proj.weight")  # fmt: skip
    grads = {k: rel_err(values.get(k), ref[k]) for k in ref if k != "loss"}
    worst = max(grads, key=grads.get) if grads else None
    return {
        "loss_rel_err": rel_err(values["loss"], ref["loss"]),
        "grad_rel_err_max": grads[worst] if worst else 0.0,
        "grad_worst": worst,
        "grad_rel_err": {k: grads[k] for k in named if k in grads},
    }


def plan_summary(plans: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The scalars of the recompute plan(s) one compile made (summed if several graphs)."""
    if not plans:
        return None
    keys = ("saved_bytes", "no_recompute_bytes", "recomputed_bytes", "predicted_peak_bytes",
            "no_recompute_peak_bytes", "lowest_peak_bytes", "predicted_forward_peak_bytes",
            "recompute_seconds", "num_recomputed_ops", "compiled_peak_bytes",
            "compiled_forward_peak_bytes", "compiled_backward_peak_bytes")  # fmt: skip
    out: dict[str, Any] = {k: sum(p.get(k) or 0 for p in plans) for k in keys}
    out["policy"] = plans[-1].get("policy")
    out["budget_met"] = all(p.get("budget_met", True) for p in plans)
    out["note"] = "; ".join(p["note"] for p in plans if p.get("note"))
    out["graphs"] = len(plans)
    out["report"] = "\n".join(str(p.get("report", "")) for p in plans)[:20000]
    return out


def error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    tb = traceback.format_exc(limit=-6)
    return (text[:1500] + "\n" + tb[-2500:]) if tb and tb != "NoneType: None\n" else text[:4000]


@dataclass
class Live:
    """A variant kept alive for interleaved timing: its step function and parameters."""

    v: Variant
    fn: Callable
    params: list[nn.Parameter]
    model: nn.Module
    result: dict[str, Any]
    times: list[float] = field(default_factory=list)


def run_variant(v: Variant, master: nn.Module, inputs: list[torch.Tensor], ref, args,
                last_layer: int, keep: list[Live] | None = None,
                ) -> tuple[dict[str, Any], dict | None]:  # fmt: skip
    """Compiles, checks, times and measures one variant; returns (result, host values). With
    ``keep`` (interleaved timing) it is not timed here: it is appended to ``keep``, alive."""
    device = args.device
    r: dict[str, Any] = {"label": v.label, "kind": v.kind, "status": "ok", "phase": "copy"}
    if v.tc_budget is not None:
        r["tc_activation_memory_budget"] = v.tc_budget
    if v.recompute:
        r["recompute_config"] = dict(v.recompute)
    if v.fraction is not None:
        r["fraction_of_no_recompute_peak"] = v.fraction
    model = fn = loss = params = named = None
    host = None
    t_start = time.perf_counter()
    try:
        model = copy.deepcopy(master)
        params = list(model.parameters())
        named = list(model.named_parameters())
        with v.context():
            r["phase"] = "first step (compile)"
            if v.kind.startswith("magi"):
                from magi_compiler import inspection

                inspection.clear()
            fn = make_fn(v, model, reset=keep is None)
            sync(device)
            t0 = time.perf_counter()
            loss = step(fn, params, inputs[0])
            sync(device)
            r["first_step_s"] = time.perf_counter() - t0
            reason = getattr(getattr(fn, "_magi_compiled", None), "fallback_reason", None)
            if reason:
                raise RuntimeError(f"magi_compile fell back to eager: {reason}")
            r["loss"] = loss.item()
            values = values_of(loss, named)
            if v.kind == "eager":  # the reference, and a second run for the noise floor
                host = to_host(values)
                del values, loss
                loss = step(fn, params, inputs[0])
                values = values_of(loss, named)
                ref = host
            if ref is not None:
                r.update(compare(values, ref, last_layer))
                tol = args.tolerance
                r["correct"] = r["loss_rel_err"] <= tol and r["grad_rel_err_max"] <= tol
            else:
                r["correct"] = None  # eager failed: nothing to check against
            del values, loss
            loss = None
            if v.kind.startswith("magi"):
                from magi_compiler import inspection

                r["plan"] = plan_summary(inspection.recompute_plans())
            r["phase"] = "warm-up"
            time_steps(fn, params, inputs, device, args.warmup)
            if keep is None:
                r["phase"] = "timed steps"
                r.update(time_stats(time_steps(fn, params, inputs, device, args.steps)))
            r["phase"] = "memory step"
            r.update(measure_peak(fn, params, inputs[1 % len(inputs)], device))
            r["phase"] = "saved-tensor step"
            r.update(measure_saved(fn, params, inputs[0]))
        del r["phase"]
        if keep is not None:
            keep.append(Live(v, fn, params, model, r))
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        r["status"] = "failed"
        r["error"] = error_text(e)
    finally:
        r["wall_s"] = time.perf_counter() - t_start
        del fn, model, loss, params, named
        if v.kind != "eager" and keep is None:
            torch._dynamo.reset()  # drops the compiled code and whatever it holds
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return r, host


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def meta(device: torch.device, dtype: torch.dtype, argv: list[str]) -> dict[str, Any]:
    m: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "dtype": str(dtype).removeprefix("torch."),
        "command": " ".join(["python", "benchmarks/recompute.py", *argv]),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        m.update(device_name=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1))
    else:
        m["device_name"] = platform.processor() or platform.machine()
        m["cpu_threads"] = torch.get_num_threads()
    try:
        import magi_compiler

        m["magi_compiler"] = getattr(magi_compiler, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        m["magi_compiler"] = f"import failed: {e}"
    m["git_commit"] = harness.git_commit()
    return m


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(s) for s in text.split(",") if s.strip())


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, float32, few steps")
    p.add_argument("--only", help="comma-separated: llama4, llama8b (default: both)")
    p.add_argument("--variants", help=f"comma-separated kinds to run (eager always runs): "
                   f"{', '.join(KINDS)}")  # fmt: skip
    p.add_argument("--steps", type=int, help="timed steps per variant (default 20; CPU 5)")
    p.add_argument("--warmup", type=int, help="warm-up steps per variant (default 3; CPU 1)")
    p.add_argument("--rounds", type=int,
                   help="interleaved timing: every variant stays alive and the timed steps run "
                   "in this many rounds over all of them (default 4 on CUDA; 1: each variant "
                   "timed right after its compile, then freed)")  # fmt: skip
    p.add_argument(
        "--tc-budgets",
        type=_floats,
        default=None,
        help="torch.compile activation_memory_budget values, e.g. 0.1,0.3,0.5,0.7",
    )
    p.add_argument(
        "--fractions",
        type=_floats,
        default=None,
        help="AUTOSEARCH budgets: floor + f * (no-recompute predicted peak - floor), the floor "
        "being the lowest predicted peak the planner found",
    )
    p.add_argument("--tolerance", type=float,
                   help="normwise relative error of loss and gradients vs eager that counts as "
                   "correct (default 5e-2 in bfloat16, 1e-4 in float32)")  # fmt: skip
    p.add_argument("--budget-s", type=float, help="wall-time budget (default 470 s on CUDA)")
    p.add_argument("--out", help="JSON path (default benchmarks/results/"
                   "<device>_recompute.json; smoke: /tmp/recompute_smoke.json)")  # fmt: skip
    args = p.parse_args(argv)
    args.device = harness.resolve_device(p, args.device)
    gpu = args.device == "cuda"
    if args.tc_budgets is None:
        args.tc_budgets = SMOKE_TC_BUDGETS if args.smoke else TC_BUDGETS
    if args.fractions is None:
        args.fractions = SMOKE_FRACTIONS if args.smoke else FRACTIONS
    args.device = torch.device(args.device)
    args.dtype = torch.bfloat16 if gpu and not args.smoke else torch.float32
    if args.tolerance is None:
        # bfloat16: harness.py's tolerance for training steps; torch.compile's own worst
        # gradient error on this stack is of the same order.
        args.tolerance = 5e-2 if args.dtype == torch.bfloat16 else 1e-4
    args.steps = args.steps or (3 if args.smoke else 20 if gpu else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke or not gpu else 3)
    args.rounds = max(1, args.rounds if args.rounds is not None else (4 if gpu else 1))
    if args.budget_s is None:
        args.budget_s = 470.0 if gpu else math.inf
    names = [s.strip() for s in (args.only or "llama4,llama8b").split(",") if s.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad:
        p.error(f"--only: unknown {bad}; known: {', '.join(MODELS)}")
    args.models = names
    kinds = [s.strip() for s in (args.variants or ",".join(KINDS)).split(",") if s.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"--variants: unknown {bad}; known: {', '.join(KINDS)}")
    args.kinds = set(kinds) | {"eager"}
    args.cost = {}
    if args.out is None:
        args.out = (
            "/tmp/recompute_smoke.json"
            if args.smoke
            else str(ROOT / "benchmarks" / "results" / f"{args.device.type}_recompute.json")
        )
    return args


def write(doc: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def budgets_from(heuristic: dict | None, eager: dict | None) -> tuple[int | None, int, str]:
    """(reference, floor, what they are): the AUTOSEARCH budgets lie at fractions of the range
    from the floor (the lowest simulated peak the planner found, so a budget there is reachable)
    to the reference (the no-recompute plan's predicted peak)."""
    plan = (heuristic or {}).get("plan") or {}
    if plan.get("no_recompute_peak_bytes"):
        floor = int(plan.get("lowest_peak_bytes") or 0)
        return (
            int(plan["no_recompute_peak_bytes"]),
            floor,
            "the range from the lowest predicted peak the planner found to the no-recompute "
            "plan's predicted peak",
        )
    if (eager or {}).get("act_peak_bytes"):
        return int(eager["act_peak_bytes"]), 0, "eager's measured activation peak (no plan)"
    return None, 0, "none: neither a HEURISTIC plan nor eager's measured peak"


def prewarm(args) -> float:
    """Pays one-time process costs (Inductor's compile workers, magi's first capture, the
    device's libraries) on a tiny training step, so no variant's first step carries them."""
    start = time.perf_counter()
    tiny = nn.Sequential(nn.Linear(16, 16), nn.GELU()).to(args.device, args.dtype)
    x = torch.randn(4, 16, device=args.device, dtype=args.dtype)
    params = list(tiny.parameters())
    for kind in ("eager", "tc", "magi_heuristic"):
        try:
            v = Variant("prewarm", kind, "prewarm", recompute={"recompute_policy": "HEURISTIC"})
            fn = make_fn(v, tiny)
            for _ in range(2):
                step(fn, params, x)
        except Exception as e:  # noqa: BLE001 - the real variant will report it
            print(f"prewarm {kind}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    drop_grads(params)
    torch._dynamo.reset()
    sync(args.device)
    return time.perf_counter() - start


def run_model(name: str, args, doc: dict, deadline: float) -> None:
    cfg = dict(MODELS[name], **(SMOKE[name] if args.smoke else {}))
    device, dtype = args.device, args.dtype
    shape = (f"{cfg['layers']} layers, hidden {cfg['hidden']}, {cfg['n_heads']}/"
             f"{cfg['n_kv_heads']} heads, SwiGLU {cfg['intermediate']}, batch {cfg['batch']} x "
             f"{cfg['seq']} tokens")  # fmt: skip
    model: dict[str, Any] = {"name": name, "title": cfg["title"], "shape": shape,
                             "config": {k: v for k, v in cfg.items() if k != "title"},
                             "variants": {}}  # fmt: skip
    doc["models"].append(model)
    print(f"\n== {name}: {cfg['title']}: {shape}, {model['config']}", flush=True)
    t_model = time.perf_counter()
    try:
        master = build_master(cfg, device, dtype)
        model["param_bytes"] = sum(p.numel() * p.element_size() for p in master.parameters())
        torch.manual_seed(1)
        inputs = [torch.randn(cfg["batch"], cfg["seq"], cfg["hidden"], device=device, dtype=dtype)
                  for _ in range(2)]  # fmt: skip
    except Exception as e:  # noqa: BLE001
        model["error"] = error_text(e)
        print(f"could not build: {model['error']}", flush=True)
        return
    print(f"parameters {mib(model['param_bytes'])} MiB; deadline in "
          f"{deadline - time.time():.0f} s", flush=True)  # fmt: skip
    print(HEADER, flush=True)
    ref = None
    cost = args.cost  # the longest wall seconds of a variant of each kind so far (any model)
    last_layer = cfg["layers"] - 1
    keep: list[Live] | None = [] if args.rounds > 1 else None  # interleaved timing

    def run(v: Variant) -> dict:
        nonlocal ref
        if v.kind not in args.kinds:
            return {}
        similar = {"tc_amb": "tc", "magi_auto": "magi_heuristic"}.get(v.kind, v.kind)
        expected = cost.get(v.kind) or cost.get(similar, 0.0)
        if time.time() + expected > deadline:
            r = {"label": v.label, "kind": v.kind, "status": "skipped",
                 "error": f"time budget (needs ~{expected:.0f} s, "
                          f"{max(0.0, deadline - time.time()):.0f} s left)"}  # fmt: skip
        else:
            r, host = run_variant(v, master, inputs, ref, args, last_layer, keep)
            if v.kind == "eager":
                ref = host
            cost[v.kind] = max(cost.get(v.kind, 0.0), r["wall_s"])
        model["variants"][v.name] = r
        print(row_text(r), flush=True)
        write(doc, args.out)
        return r

    eager = run(Variant("eager", "eager", "eager"))
    if ref is None:
        print("eager failed: no reference; the compiled variants are not checked", flush=True)
    run(Variant("tc", "tc", "torch.compile"))
    heuristic = run(Variant("magi_heuristic", "magi_heuristic", "magi HEURISTIC",
                            recompute={"recompute_policy": "HEURISTIC"}))  # fmt: skip
    if "magi_auto" in args.kinds:
        reference, floor, source = budgets_from(heuristic, eager)
        model["autosearch_reference_bytes"], model["autosearch_reference"] = reference, source
        model["autosearch_floor_bytes"] = floor
        for f in args.fractions:
            name_f = f"magi_auto{f:g}"
            label = f"magi AUTOSEARCH {f:g}x"
            if reference is None:
                model["variants"][name_f] = {"label": label, "kind": "magi_auto",
                                             "status": "skipped", "error": source}  # fmt: skip
                print(row_text(model["variants"][name_f]), flush=True)
                continue
            budget = int(floor + f * (reference - floor))
            run(Variant(name_f, "magi_auto", label, fraction=f,
                        recompute={"recompute_policy": "AUTOSEARCH",
                                   "memory_budget_bytes": budget}))  # fmt: skip
    for b in args.tc_budgets:
        run(Variant(f"tc_amb{b:g}", "tc_amb", f"torch.compile budget {b:g}", tc_budget=b))
    if keep:
        print(f"timing {len(keep)} variants: {args.steps} steps each in {args.rounds} "
              "interleaved rounds", flush=True)  # fmt: skip
        time_interleaved(keep, inputs, args)
        print(HEADER, flush=True)
        for r in model["variants"].values():
            print(row_text(r), flush=True)
        write(doc, args.out)
        keep.clear()
        torch._dynamo.reset()
    master = inputs = ref = None  # free the copies before the next model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model["derived"] = derive(model["variants"])
    model["wall_s"] = time.perf_counter() - t_model
    for line in derived_text(model):
        print(line, flush=True)
    write(doc, args.out)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    start = time.time()
    doc: dict[str, Any] = {
        "benchmark": "recompute",
        "meta": meta(args.device, args.dtype, argv),
        "settings": {
            "smoke": args.smoke, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
            "tc_budgets": list(args.tc_budgets), "fractions": list(args.fractions),
            "tolerance_norm_rel": args.tolerance, "budget_s": args.budget_s,
            "loss": "output.float().pow(2).mean()",
        },
        "models": [],
    }  # fmt: skip
    print(f"{doc['meta']['device_name']}, torch {torch.__version__}, {doc['meta']['dtype']}; "
          f"writing {args.out}", flush=True)  # fmt: skip
    doc["prewarm_s"] = prewarm(args)
    print(f"prewarm (compilers' one-time costs, tiny module): {doc['prewarm_s']:.1f} s", flush=True)
    shares = [SHARE[n] for n in args.models]
    total = sum(shares)
    done = 0.0
    for name, share in zip(args.models, shares, strict=True):
        done += share
        deadline = start + args.budget_s * done / total
        run_model(name, args, doc, deadline)
    doc["wall_s"] = time.time() - start
    write(doc, args.out)
    print(f"\nwrote {args.out} ({doc['wall_s']:.0f} s)", flush=True)
    return doc


if __name__ == "__main__":
    main()
