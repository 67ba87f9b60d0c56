"""Measures workloads: every variant checked against eager first, then all timed together.

For each workload, variant by variant (``eager``, ``magi``, ``inductor``, ``inductor_ro``):

1. **Cold first call**: the module wrapped afresh and one check call timed on the host clock
   (device synchronised before and after); it includes capture and compilation. Each compile
   gets a wrapper whose ``forward`` has a code object of its own, so Dynamo traces from scratch
   without ``torch._dynamo.reset()`` (which would drop the other variants' compiled code).
   One-time process costs (imports, Inductor's compile workers and precompiled header, the
   CUDA context) were paid before the first workload by :func:`prewarm`.
2. **Correctness**: that call's values (outputs; loss and every gradient; first decode step's
   logits) against eager's on the same fresh random inputs: max abs error, max error relative
   to max |eager|, and the normwise relative error ``||a - e|| / ||e||`` per tensor (the worst
   tensor counts). Eager's own row compares a second eager run: the noise floor.
3. **Warm first call**: a second compile of the same variant in the same process: Dynamo
   traces again; Inductor finds its graph and kernels in its caches; magi finds whatever it
   caches. Not a fresh process with a warm disk cache.
4. **Peak memory**: ``torch.cuda.max_memory_allocated`` over one step, minus whatever the
   variants compiled before it still hold, so each variant is charged only for itself (the
   weights and the rotating inputs are in every variant's number).

Then **steady state**, all variants of the workload together: warm-up, then rounds in which
every variant runs its share of steps, each step timed with CUDA events (``perf_counter`` on
the CPU), rotating through the input sets. Interleaving puts any drift of the machine on every
variant alike. The median counts. Failures are recorded with their phase and error text and
never stop the suite.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
import os
import statistics
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks.grid import git_commit  # noqa: F401 - bandwidth.py and zoo.py read it here
from benchmarks.workloads import Case, Workload, describe

OVERRUN = 2.0  # a workload may use up to this many times its share of the budget
ROUNDS = 5  # interleaved timing rounds
# Run order; eager is the reference. The *_cg variants replay CUDA graphs (CUDA only).
VARIANTS = ("eager", "magi", "magi_cg", "inductor", "inductor_ro")
CUDA_ONLY = ("magi_cg", "inductor_ro")


@dataclass
class Settings:
    device: torch.device
    dtype: torch.dtype
    preset: str
    timing: bool = True  # False: correctness and first-call time only (smoke)
    warm_compile: bool = True
    warmup: int = 3
    target_s: float = 0.5  # steady-state timing per variant
    min_iters: int = 5
    max_iters: int = 100
    tolerance: float = 5e-2  # normwise relative error vs eager

    @classmethod
    def for_run(cls, device: str, preset: str) -> Settings:
        dev = torch.device(device)
        if dev.type == "cuda":
            s = cls(dev, torch.bfloat16, preset, tolerance=5e-2)
        else:
            s = cls(dev, torch.float32, preset, warmup=1, target_s=0.4, min_iters=7,
                    max_iters=40, tolerance=1e-4)  # fmt: skip
        if preset == "smoke":
            s.timing = s.warm_compile = False
        return s


class DeviceLost(RuntimeError):
    """The CUDA context is unusable (a kernel faulted): the worker must restart."""


class _Entry(nn.Module):
    """The module each compiled variant wraps, so compiling never touches the eager module."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, a, b=None):
        return self.model(a) if b is None else self.model(a, b)


_fresh_ids = itertools.count()


def fresh_instance(cls: type[nn.Module], *args: Any) -> nn.Module:
    """``cls(*args)`` through a subclass whose ``forward`` has a new code object: Dynamo keeps
    its caches per code object, so compiling it starts from nothing while other compiled
    variants live on."""
    n = next(_fresh_ids)
    base = cls.forward
    code = base.__code__.replace(co_name=f"forward_{n}")
    forward = types.FunctionType(code, base.__globals__, code.co_name, base.__defaults__)
    forward.__qualname__ = f"{cls.__name__}{n}.forward"
    return type(f"{cls.__name__}{n}", (cls,), {"forward": forward})(*args)


def _fresh_entry(model: nn.Module) -> nn.Module:
    return fresh_instance(_Entry, model)


def _noop() -> None:
    pass


def make_variant(name: str, module: nn.Module) -> tuple[Callable, Callable[[], None]]:
    """The callable of one variant and the hook to call before each of its calls."""
    if name == "eager":
        return module, _noop
    if name == "inductor":
        return torch.compile(_fresh_entry(module)), _noop
    if name == "inductor_ro":
        fn = torch.compile(_fresh_entry(module), mode="reduce-overhead")
        return fn, torch.compiler.cudagraph_mark_step_begin
    if name in ("magi", "magi_cg"):
        from magi_compiler import CompileConfig, magi_compile

        fields = {f.name for f in dataclasses.fields(CompileConfig)}
        patch = {"strict": True} if "strict" in fields else {}  # raise, never run eagerly
        if name == "magi_cg":
            if "cudagraph_mode" not in fields:
                raise NotImplementedError("this magi_compiler has no CompileConfig.cudagraph_mode")
            patch["cudagraph_mode"] = "FULL"
        entry = _fresh_entry(module)
        return magi_compile(entry, dynamic_arg_dims={}, config_patch=patch or None), _noop
    raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")


def reset_compilers() -> None:
    """Drops every compiled artifact (between workloads, when no variant is alive)."""
    torch._dynamo.reset()
    try:
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()
    except Exception:  # noqa: BLE001 - absent or already reset
        pass
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _reserved(device: torch.device) -> int:
    """Device memory the caching allocator holds for live blocks and graph pools (cached free
    blocks released first)."""
    if device.type != "cuda":
        return 0
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)


def compare(outs: list[Any], refs: list[Any]) -> dict[str, Any]:
    """Errors of ``outs`` against ``refs`` (refs may live on the CPU)."""
    inf = {"max_abs_err": math.inf, "max_rel_err": math.inf, "norm_rel_err": math.inf}
    if len(outs) != len(refs):
        return {**inf, "error_note": f"{len(outs)} values, eager has {len(refs)}"}
    max_abs = max_rel = norm_rel = 0.0
    for a, e in zip(outs, refs, strict=True):
        if not isinstance(e, torch.Tensor):
            continue
        if not isinstance(a, torch.Tensor) or a.shape != e.shape:
            return {**inf, "error_note": f"got {getattr(a, 'shape', a)}, eager {tuple(e.shape)}"}
        a = a.detach().float()
        e = e.to(a.device).float()
        if not e.numel():
            continue
        diff = (a - e).abs()
        err = diff.max().item()
        if math.isnan(err) or a.isnan().any().item():
            err = math.inf
        scale = e.abs().max().item()
        norm_e = torch.linalg.vector_norm(e).item()
        norm_d = torch.linalg.vector_norm(diff).item() if math.isfinite(err) else math.inf
        max_abs = max(max_abs, err)
        max_rel = max(max_rel, err / scale if scale > 0 else err)
        norm_rel = max(norm_rel, norm_d / norm_e if norm_e > 0 else norm_d)
    return {"max_abs_err": max_abs, "max_rel_err": max_rel, "norm_rel_err": norm_rel}


def _to_host(values: list[Any]) -> list[Any]:
    return [v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for v in values]


def _compiler_notes(variant: str, fn: Callable, magi_before: Any) -> dict[str, Any]:
    counters = torch._dynamo.utils.counters
    notes: dict[str, Any] = {"graph_breaks": sum(counters["graph_break"].values())}
    if variant == "inductor_ro":
        notes["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
    if variant.startswith("magi"):
        import magi_compiler

        after = magi_compiler.get_counters()
        notes["magi_captures"] = after.captures - magi_before.captures
        notes["magi_compiles"] = after.compiles - magi_before.compiles
        reason = getattr(getattr(fn, "_magi_compiled", None), "fallback_reason", None)
        if reason:
            raise RuntimeError(f"magi_compile fell back to eager: {reason}")
    return notes


def _first_call(case: Case, variant: str, settings: Settings, args: tuple):
    """Compiles ``variant`` afresh and runs one check call: (fn, before, outs, seconds, notes)."""
    torch._dynamo.utils.counters.clear()
    magi_before = None
    if variant.startswith("magi"):
        import magi_compiler

        magi_before = magi_compiler.get_counters()
    sync(settings.device)
    start = time.perf_counter()
    fn, before = make_variant(variant, case.module)
    outs = case.check(fn, args, before)
    sync(settings.device)
    seconds = time.perf_counter() - start
    notes = _compiler_notes(variant, fn, magi_before) if variant != "eager" else {}
    return fn, before, outs, seconds, notes


@dataclass
class Live:
    """A compiled, checked variant waiting for the steady-state timing."""

    variant: str
    fn: Callable
    before: Callable[[], None]
    result: dict[str, Any]
    times: list[float] = field(default_factory=list)
    iters: int = 0


def prepare_variant(
    case: Case, variant: str, refs: list[Any] | None, settings: Settings, deadline: float,
    phase: list[str], static_bytes: int,
) -> tuple[Live, list[Any] | None]:  # fmt: skip
    """Compile (cold, warm), check, memory. Returns the live variant and, for eager, the
    reference values on the host."""
    result: dict[str, Any] = {"status": "ok"}
    held_by_others = _allocated(settings.device) - static_bytes
    reserved_by_others = _reserved(settings.device) - static_bytes
    with torch.set_grad_enabled(case.kind == "train"):
        phase[0] = "first call (compile)"
        fn, before, outs, cold_s, notes = _first_call(case, variant, settings, case.inputs[0])
        result["first_call_s"] = cold_s
        result.update(notes)
        host = None
        if variant == "eager":
            host = refs = _to_host(outs)
            del outs
            phase[0] = "eager repeat (noise floor)"
            outs = case.check(fn, case.inputs[0], before)
        if refs is not None:
            result.update(compare(outs, refs))
            result["correct"] = result["norm_rel_err"] <= settings.tolerance
        del outs
        case.drop_grads()
        if variant != "eager" and settings.warm_compile:
            if time.time() + 1.5 * cold_s < deadline:
                phase[0] = "warm first call (second compile)"
                del fn
                fn, before, outs, warm_s, _ = _first_call(case, variant, settings, case.inputs[1])
                result["warm_first_call_s"] = warm_s
                del outs
                case.drop_grads()
            else:
                result["warm_skipped"] = "time budget"
        if settings.device.type == "cuda" and settings.timing:
            phase[0] = "peak memory"
            case.step(fn, case.inputs[1], before)  # past any recording call (CUDA graphs)
            case.drop_grads()
            torch.cuda.synchronize(settings.device)

            def measured_step() -> None:
                torch.cuda.reset_peak_memory_stats(settings.device)
                out = case.step(fn, case.inputs[0], before)
                torch.cuda.synchronize(settings.device)
                del out
                case.drop_grads()

            measured_step()
            result["peak_mem_bytes"] = torch.cuda.max_memory_allocated() - held_by_others
            result["static_mem_bytes"] = static_bytes
            # What the step holds from the device, CUDA graphs' private pools included: a
            # replay's intermediates live in its pool, where max_memory_allocated does not see
            # them. Cached free blocks are released first, so they do not count.
            torch.cuda.empty_cache()
            measured_step()
            result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved() - reserved_by_others
    return Live(variant, fn, before, result), host


def _time_steps(case: Case, live: Live, settings: Settings, n: int, offset: int) -> list[float]:
    """Milliseconds of ``n`` steps of one variant, rotating through the input sets."""
    sets = case.inputs
    if settings.device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        torch.cuda.synchronize(settings.device)
        for i in range(n):
            starts[i].record()
            case.step(live.fn, sets[(offset + i) % len(sets)], live.before)
            ends[i].record()
        torch.cuda.synchronize(settings.device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    times = []
    for i in range(n):
        start = time.perf_counter()
        case.step(live.fn, sets[(offset + i) % len(sets)], live.before)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def time_interleaved(
    case: Case, lives: list[Live], settings: Settings, budget_s: float, phase: list[str]
) -> None:
    """Steady-state timing of all live variants in interleaved rounds; fills their results.
    A variant that raises here is marked failed and leaves the rotation."""
    warmup = 1 if case.kind == "decode" else max(1, settings.warmup)  # a decode is many calls
    min_iters = 3 if case.kind == "decode" else settings.min_iters
    per_variant_s = max(0.0, min(settings.target_s, budget_s / max(1, len(lives))))
    active = []
    with torch.set_grad_enabled(case.kind == "train"):
        for live in lives:
            try:
                phase[0] = f"warm-up ({live.variant})"
                warm = _time_steps(case, live, settings, warmup, 0)
                estimate_s = max(statistics.median(warm), 1e-3) / 1e3
                live.iters = int(
                    min(settings.max_iters, max(min_iters, per_variant_s / estimate_s))
                )
                active.append(live)
            except Exception as e:  # noqa: BLE001
                live.result = {"status": "failed", "phase": phase[0], "error": error_text(e)}
        for r in range(ROUNDS):
            for live in list(active):
                n = live.iters // ROUNDS + (1 if r < live.iters % ROUNDS else 0)
                if n == 0:
                    continue
                try:
                    phase[0] = f"steady-state timing ({live.variant})"
                    live.times += _time_steps(case, live, settings, n, len(live.times) + warmup)
                except Exception as e:  # noqa: BLE001
                    live.result = {"status": "failed", "phase": phase[0], "error": error_text(e)}
                    active.remove(live)
            case.drop_grads()
    for live in active:
        times = sorted(live.times)
        n, median = len(times), statistics.median(times)
        live.result.update(median_ms=median, min_ms=times[0], p20_ms=times[int(0.2 * (n - 1))],
                           p80_ms=times[int(0.8 * (n - 1))], iters=n)  # fmt: skip
        if case.tokens:
            live.result["tokens_per_s"] = case.tokens / (median / 1e3)
        if case.bytes_moved:
            live.result["bandwidth_gbs"] = case.bytes_moved / (median / 1e3) / 1e9


def resolve_device(parser: Any, requested: str | None) -> str:
    """``--device``: CUDA when present unless one is named; naming CUDA without it is an
    argument error."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    return requested


def device_ok(device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.empty(1, device=device).add_(1).item()
        return True
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False


def prewarm(settings: Settings, variants: list[str]) -> float:
    """Pays one-time process costs (imports, compile worker pools) on a tiny module."""
    start = time.perf_counter()
    tiny = nn.Sequential(nn.Linear(16, 16), nn.GELU()).to(settings.device, settings.dtype)
    x = torch.randn(4, 16, device=settings.device, dtype=settings.dtype)
    with torch.no_grad():
        for v in variants:
            try:
                fn, before = make_variant(v, tiny)
                for _ in range(3):
                    before()
                    fn(x)
            except Exception:  # noqa: BLE001 - the real variant will report it
                pass
    reset_compilers()
    sync(settings.device)
    return time.perf_counter() - start


def error_text(e: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    return text if len(text) <= 2000 else text[:1000] + "\n...\n" + text[-1000:]


def _skipped(wl: Workload, v: str) -> dict:
    return {"event": "variant", "workload": wl.name, "variant": v,
            "result": {"status": "skipped", "error": "time budget"}}  # fmt: skip


def run_workload(
    wl: Workload, variants: list[str], settings: Settings, wl_deadline: float,
    skip: set[tuple[str, str]], emit: Callable[[dict], None],
) -> None:  # fmt: skip
    """Builds one workload, prepares its variants one by one, then times them together."""
    try:
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # fresh inputs per run
        case = wl.build(settings.preset, settings.device, settings.dtype)
    except Exception as e:  # noqa: BLE001
        emit({"event": "workload_error", "workload": wl.name, "error": error_text(e)})
        if not device_ok(settings.device):
            raise DeviceLost(wl.name) from e
        return
    emit({"event": "case", "workload": wl.name, "kind": case.kind, "shape": case.shape,
          "tokens": case.tokens, "bytes_moved": case.bytes_moved,
          "params": sum(p.numel() for p in case.module.parameters())})  # fmt: skip
    sync(settings.device)
    static_bytes = _allocated(settings.device)
    refs, lives = None, []
    for v in variants if case.compile else ["eager"]:
        if (wl.name, v) in skip:
            if v == "eager":  # measured by an earlier worker: recompute the reference only
                refs = _reference(case)
            continue
        if time.time() > wl_deadline:
            emit(_skipped(wl, v))
            continue
        emit({"event": "start", "workload": wl.name, "variant": v})
        phase = ["setup"]
        try:
            live, host = prepare_variant(case, v, refs, settings, wl_deadline, phase, static_bytes)
            refs = host if v == "eager" else refs
            if settings.timing:
                lives.append(live)
                emit({"event": "prepared", "workload": wl.name, "variant": v,
                      "result": live.result})  # fmt: skip
            else:
                emit({"event": "variant", "workload": wl.name, "variant": v, "result": live.result})
        except Exception as e:  # noqa: BLE001
            result = {"status": "failed", "phase": phase[0], "error": error_text(e)}
            emit({"event": "variant", "workload": wl.name, "variant": v, "result": result})
            if not device_ok(settings.device):
                raise DeviceLost(f"{wl.name}/{v}") from e
    if lives:
        emit({"event": "timing", "workload": wl.name, "variants": [x.variant for x in lives]})
        phase = ["steady-state timing"]
        time_interleaved(case, lives, settings, wl_deadline - time.time(), phase)
        for live in lives:
            emit({"event": "variant", "workload": wl.name, "variant": live.variant,
                  "result": live.result})  # fmt: skip
        if any(x.result["status"] == "failed" for x in lives) and not device_ok(settings.device):
            raise DeviceLost(f"{wl.name}/timing")


def _reference(case: Case) -> list[Any] | None:
    """Eager values on the host, or None when eager cannot run."""
    try:
        with torch.set_grad_enabled(case.kind == "train"):
            values = _to_host(case.check(case.module, case.inputs[0], _noop))
        case.drop_grads()
        return values
    except Exception:  # noqa: BLE001 - compiled variants are then reported without errors
        return None


def run_workloads(
    workloads: list[Workload], variants: list[str], settings: Settings, deadline: float,
    skip: set[tuple[str, str]], emit: Callable[[dict], None],
) -> None:  # fmt: skip
    """Runs ``workloads`` in order, sharing the time until ``deadline`` by their weights.

    A workload's share is its weight's part of the time left when it starts. It may overrun
    its share up to ``OVERRUN`` times (compile times vary more than the weights know); after
    that its remaining variants are skipped, and later workloads share what is left.
    """
    for i, wl in enumerate(workloads):
        remaining = sum(w.weight for w in workloads[i:])
        share = max(0.0, deadline - time.time()) * wl.weight / remaining
        wl_deadline = min(deadline, time.time() + OVERRUN * share)
        emit({"event": "workload", **describe(wl), "share_s": share, "deadline": wl_deadline})
        if time.time() < deadline:
            run_workload(wl, variants, settings, wl_deadline, skip, emit)
        else:
            for v in variants:
                emit(_skipped(wl, v))
        reset_compilers()
        emit({"event": "workload_done", "workload": wl.name})
