"""The model zoo benchmark: Hugging Face models as users bring them,
compiled with the default ``magi_compile`` and timed beside eager PyTorch and torch.compile.

    python benchmarks/zoo.py --device cuda --out benchmarks/results/zoo_cuda.json
    python benchmarks/zoo.py --device cuda --models llama,qwen3 --out zoo.json
    python benchmarks/zoo.py --device cuda --models gpt2,bert,vit,t5 --out zoo.json --append
    python benchmarks/zoo.py --device cpu --sizes tiny --variants eager,magi

Models (``zoo_models.py``; random weights from config objects, nothing is downloaded): Llama
(3.2-1B shape), Qwen3 (0.6B shape), GPT-2 (124M), BERT-base, ViT-base, T5-small; bf16 on CUDA,
fp32 on the CPU. Scenarios: ``whole`` (``magi_compile(model)``), ``layers`` (the layer class
decorated), ``cache`` (``use_cache=True``, a prefill). Each scenario is called first at batch 1,
then at the larger batch (1 x 128 and 8 x 128 tokens at the real size), with keyword arguments.

Variants: ``eager``; ``inductor`` (``torch.compile(model)``) and ``inductor_ro``
(``mode="reduce-overhead"``, CUDA only), both of the whole model with the scenario's call;
``magi`` (the scenario's ``magi_compile``, default config) and ``magi_cg`` (the same with
``cudagraph_mode=FULL``, CUDA only). For every variant and batch the first call is timed on the
host clock (capture and compile included) and its outputs (logits, hidden states, the new cache)
are compared with eager's on the same inputs. For magi's variants the row also records captures,
compiles and guard misses (``magi_compiler.get_counters``), the graphs lowered (pieces and
dispatcher calls, ``magi_compiler.inspection``), fallbacks (``fallback_reason`` of
every compiled entry and magi_compiler's "will run eagerly" warnings) and, in the timed calls,
direct calls per call. Then the variants of a scenario group are timed together in interleaved
rounds: CUDA events per call after a warm-up (``time.perf_counter`` on the CPU), the median over
all rounds. One failing variant or model is recorded with its error and the table goes on.
On the CPU, ATen runs one thread unless ``OMP_NUM_THREADS`` says otherwise (as in the tests).

``torch._dynamo.reset()`` runs between groups and models, so caches stay bounded; torch.compile
and magi_compile both trace HF's shared ``forward`` wrappers, so Dynamo's recompile limit is
raised to 64 for the run. The full CUDA run takes more than 10 minutes: split it with
``--models`` and ``--append`` (rows of the same model, scenario, size and batch are replaced).
``benchmarks/report.py`` shows a file in ``benchmarks/results/`` once its rows cover all six
models (the ``meta`` is the latest write's).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "examples"), str(ROOT)):  # harness imports the example blocks
    if _p not in sys.path:
        sys.path.insert(0, _p)

from benchmarks import harness  # noqa: E402
from benchmarks import zoo_models as zm  # noqa: E402

VARIANTS = ("eager", "inductor", "inductor_ro", "magi", "magi_cg")
CUDA_ONLY = ("inductor_ro", "magi_cg")
MAGI_VARIANTS = ("magi", "magi_cg")
BASELINES = ("eager", "inductor", "inductor_ro")  # of the whole model, one per scenario group
CG_PATCH = {"cudagraph_mode": "FULL"}
STEADY_COUNTERS = ("direct_calls", "captures", "guard_misses")


def log(msg: str) -> None:
    print(f"[zoo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def error_text(e: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    return text if len(text) <= 1500 else text[:1000] + " ... " + text[-400:]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_compilers(device: torch.device) -> None:
    torch._dynamo.reset()
    try:
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()
    except Exception:  # noqa: BLE001 - absent, or nothing to reset
        pass
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


# --- one variant -----------------------------------------------------------------------------
class Variant:
    """A callable model of one variant, with what its first calls showed."""

    def __init__(
        self,
        name: str,
        family: zm.Family,
        scenario: str,
        model: Any,
        before: Callable[[], None] = lambda: None,
    ):
        self.name, self.family, self.scenario = name, family, scenario
        self.model, self.before = model, before
        self.per_batch: dict[int, dict[str, Any]] = {}
        self.times: dict[int, list[float]] = {}
        self.steady: dict[int, dict[str, int]] = {}  # magi's counters in the timed calls

    def __call__(self, kwargs: dict[str, Any]) -> Any:
        self.before()
        config = self.model.config
        return self.model(**zm.call_arguments(self.family, self.scenario, config, kwargs))


def make_variant(
    name: str, family: zm.Family, scenario: str, ref: torch.nn.Module, size: str
) -> Variant:
    if name == "eager":
        return Variant(name, family, scenario, ref)
    if name == "inductor":
        return Variant(name, family, scenario, torch.compile(ref))
    if name == "inductor_ro":
        model = torch.compile(ref, mode="reduce-overhead")
        return Variant(name, family, scenario, model, torch.compiler.cudagraph_mark_step_begin)
    patch = CG_PATCH if name == "magi_cg" else None
    return Variant(name, family, scenario, zm.compiled(family, scenario, ref, size, patch))


def first_calls(
    v: Variant,
    inputs: dict[int, dict[str, Any]],
    expected: dict[int, Any],
    device: torch.device,
) -> None:
    """The variant's first call at each batch, in order: seconds, errors against eager, and
    for magi what was captured and whether anything fell back."""
    import magi_compiler
    from magi_compiler import inspection

    for batch, kwargs in inputs.items():
        rec: dict[str, Any] = {}
        before = magi_compiler.get_counters()
        graphs_before = {id(g) for g in inspection.compiled_graphs()}
        breaks = graph_breaks()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sync(device)
            start = time.perf_counter()
            try:
                with torch.no_grad():
                    out = v(kwargs)
                sync(device)
                rec["first_call_s"] = round(time.perf_counter() - start, 3)
                rec["max_abs_err"], rec["rel_err"] = zm.max_errors(out, expected[batch])
                del out
            except Exception as e:  # noqa: BLE001 - recorded in the row
                rec["error"] = error_text(e)
                log(f"  {v.scenario}/{v.name} batch {batch}: {rec['error'][:300]}")
        after = magi_compiler.get_counters()
        rec["graph_breaks"] = graph_breaks() - breaks
        if v.name in MAGI_VARIANTS:
            for key in ("captures", "compiles", "guard_misses"):
                rec[key] = after[key] - before[key]
            reasons = zm.fallback_reasons(v.model)
            fell = zm.fallback_warnings(caught)
            rec["fallbacks"] = max(len(reasons), len(fell))
            rec["fallback_reasons"] = reasons or fell
            rec["entries"] = len(zm.compiled_entries(v.model))
            # What each graph lowered in this call became (inspection.CompiledGraphInfo).
            rec["graphs"] = [
                {"kind": g.kind, "pieces": g.num_pieces, "operator_calls": g.num_operator_calls}
                for g in inspection.compiled_graphs()
                if id(g) not in graphs_before
            ]
            other = [m for m in zm.magi_warnings(caught) if m not in fell]
            if other:
                rec["warnings"] = other
        v.per_batch[batch] = rec


def time_round(
    v: Variant, kwargs: dict[str, Any], device: torch.device, iters: int
) -> tuple[list[float], dict[str, int]]:
    """``iters`` timed calls: per-call milliseconds, and what magi's counters counted meanwhile
    (direct calls; captures and guard misses, which a steady state should not have)."""
    import magi_compiler

    before = magi_compiler.get_counters()
    out: list[float] = []
    with torch.no_grad():
        if device.type == "cuda":
            events = []
            for _ in range(iters):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                v(kwargs)
                end.record()
                events.append((start, end))
            torch.cuda.synchronize(device)
            out = [s.elapsed_time(e) for s, e in events]
        else:
            for _ in range(iters):
                start = time.perf_counter()
                v(kwargs)
                out.append((time.perf_counter() - start) * 1e3)
    after = magi_compiler.get_counters()
    return out, {k: after[k] - before[k] for k in STEADY_COUNTERS}


def time_group(
    variants: list[Variant],
    inputs: dict[int, dict[str, Any]],
    device: torch.device,
    rounds: int,
    target_ms: float,
) -> None:
    """Interleaved rounds over the variants whose first call at that batch worked."""
    for batch, kwargs in inputs.items():
        live = [v for v in variants if "error" not in v.per_batch.get(batch, {"error": 1})]
        iters: dict[str, int] = {}
        for v in live:  # warm-up, and a guess of how many calls fill a round
            try:
                time_round(v, kwargs, device, 3)
                ms = statistics.median(time_round(v, kwargs, device, 3)[0])
                iters[v.name + v.scenario] = int(min(100, max(5, target_ms / max(ms, 1e-3))))
            except Exception as e:  # noqa: BLE001
                v.per_batch[batch]["error"] = "timing: " + error_text(e)
        for _ in range(rounds):
            for v in live:
                if "error" in v.per_batch[batch]:
                    continue
                n = iters[v.name + v.scenario]
                try:
                    times, counted = time_round(v, kwargs, device, n)
                except Exception as e:  # noqa: BLE001
                    v.per_batch[batch]["error"] = "timing: " + error_text(e)
                    continue
                v.times.setdefault(batch, []).extend(times)
                seen = v.steady.setdefault(batch, dict.fromkeys(STEADY_COUNTERS, 0))
                for key, n in counted.items():
                    seen[key] += n
        for v in live:
            times = v.times.get(batch)
            if times:
                v.per_batch[batch]["ms"] = round(statistics.median(times), 4)
                v.per_batch[batch]["timed_calls"] = len(times)
                if v.name in MAGI_VARIANTS:
                    seen = v.steady[batch]
                    v.per_batch[batch]["direct_calls_per_call"] = round(
                        seen["direct_calls"] / len(times), 2
                    )
                    v.per_batch[batch]["steady_captures"] = seen["captures"]
                    v.per_batch[batch]["steady_guard_misses"] = seen["guard_misses"]


# --- one model ---------------------------------------------------------------------------------
def clone_output(out: Any) -> list[torch.Tensor]:
    return [t.detach().clone() for t in zm.tensors(out)]


def run_model(family: zm.Family, args: argparse.Namespace, device, dtype) -> list[dict]:
    size = args.sizes
    shapes = zm.SHAPES[size]
    started = time.perf_counter()
    ref = zm.build(family, size, device, dtype)
    shape = family.describe if size == "real" else "tiny: 2 layers, hidden 64"
    log(f"{family.name}: built ({shape}), "
        f"{sum(p.numel() for p in ref.parameters()) / 1e6:.1f} M parameters")  # fmt: skip
    scenarios = [s for s in family.scenarios() if s in args.scenarios]
    # Scenarios making the same call share the baselines: (whole, layers) and (cache).
    groups = [[s for s in scenarios if s != "cache"], [s for s in scenarios if s == "cache"]]
    rows = []
    for group in filter(None, groups):
        inputs = {
            b: zm.make_inputs(family, group[0], ref.config, b, size, device, dtype)
            for b in shapes.batches
        }
        with torch.no_grad():
            expected = {
                b: clone_output(ref(**zm.call_arguments(family, group[0], ref.config, kw)))
                for b, kw in inputs.items()
            }
        variants: list[Variant] = []
        for name in args.variants:
            for scenario in group if name in MAGI_VARIANTS else group[:1]:
                log(f"{family.name}/{scenario}: {name} first calls")
                try:
                    v = make_variant(name, family, scenario, ref, size)
                except Exception as e:  # noqa: BLE001
                    v = Variant(name, family, scenario, None)
                    v.per_batch = {b: {"error": "build: " + error_text(e)} for b in inputs}
                    variants.append(v)
                    continue
                first_calls(v, inputs, expected, device)
                variants.append(v)
        if args.timing:
            log(f"{family.name}/{','.join(group)}: timing {len(variants)} variants")
            time_group(variants, inputs, device, args.rounds, args.round_ms)
        for scenario in group:
            for b in shapes.batches:
                row = {"model": family.name, "size": size, "scenario": scenario, "batch": b,
                       "inputs": {k: list(t.shape) for k, t in inputs[b].items()
                                  if isinstance(t, torch.Tensor)},
                       "variants": {}}  # fmt: skip
                for v in variants:
                    if v.name in MAGI_VARIANTS and v.scenario != scenario:
                        continue
                    row["variants"][v.name] = v.per_batch.get(b, {})
                rows.append(row)
        del variants, expected
        reset_compilers(device)
    log(f"{family.name}: done in {time.perf_counter() - started:.0f} s")
    del ref
    reset_compilers(device)
    return rows


# --- report ------------------------------------------------------------------------------------
def _ms(rec: dict[str, Any]) -> str:
    if "error" in rec:
        return "error"
    return f"{rec['ms']:.3f}" if "ms" in rec else "-"


def markdown(rows: list[dict]) -> str:
    head = ("| model | scenario | batch | captures | fallbacks | magi rel err | magi first call s "
            "| eager ms | torch.compile ms | reduce-overhead ms | magi ms | magi FULL ms "
            "| magi direct/call | notes |")  # fmt: skip
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        vs = r["variants"]
        magi = vs.get("magi", {})
        notes = []
        for name, rec in vs.items():
            if rec.get("error"):
                notes.append(f"{name}: {rec['error'].splitlines()[0][:160]}")
            for reason in rec.get("fallback_reasons", []):
                notes.append(f"{name} falls back: {reason[:160]}")
        err = magi.get("rel_err")
        cells = [
            r["model"],
            r["scenario"],
            str(r["batch"]),
            str(magi.get("captures", "-")),
            str(magi.get("fallbacks", "-")),
            "-" if err is None else f"{err:.1e}",
            str(magi.get("first_call_s", "-")),
            *(_ms(vs[v]) if v in vs else "-" for v in VARIANTS),
            str(magi.get("direct_calls_per_call", "-")),
            "; ".join(notes).replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prewarm(device: torch.device, dtype: torch.dtype, variants: list[str]) -> None:
    """One-time process costs (imports, Inductor's workers, the CUDA context) before any
    first call is timed."""
    from magi_compiler import magi_compile

    tiny = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).to(device, dtype)
    x = torch.randn(4, 16, device=device, dtype=dtype)
    makers = {"inductor": lambda: torch.compile(torch.nn.Sequential(*tiny)),
              "magi": lambda: magi_compile(torch.nn.Sequential(*tiny))}  # fmt: skip
    with torch.no_grad():
        for name, make in makers.items():
            if name in variants:
                try:
                    make()(x)
                except Exception:  # noqa: BLE001 - the real runs will report it
                    pass
    reset_compilers(device)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default=",".join(zm.FAMILIES), help="comma-separated subset")
    p.add_argument("--sizes", choices=zm.SIZES, default=None,
                   help="tiny (CPU tests) or real; default real on CUDA, tiny on the CPU")  # fmt: skip
    p.add_argument("--scenarios", default=",".join(zm.SCENARIOS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--round-ms", type=float, default=None, help="time per variant and round")
    p.add_argument("--no-timing", dest="timing", action="store_false",
                   help="first calls and errors only")  # fmt: skip
    p.add_argument("--out", default=None, help="JSON file to write")
    p.add_argument("--append", action="store_true",
                   help="merge into --out's rows (same model, size, scenario, batch replaced)")  # fmt: skip
    args = p.parse_args(argv)
    device = torch.device(args.device)
    args.sizes = args.sizes or ("real" if device.type == "cuda" else "tiny")
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in zm.FAMILIES]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(zm.FAMILIES)}")
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.variants = [v for v in args.variants.split(",") if v]
    if device.type != "cuda":
        args.variants = [v for v in args.variants if v not in CUDA_ONLY]
    if "eager" in args.variants:  # the reference is always run; keep it first in the table
        args.variants.remove("eager")
    args.variants.insert(0, "eager")
    if args.round_ms is None:
        args.round_ms = 200.0 if device.type == "cuda" else 300.0
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    import transformers

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # As in the CPU tests: ATen's spinning OpenMP team made small ops erratic on 2 cores.
        torch.set_num_threads(1)
    log(f"device {device}, {dtype}, size {args.sizes}, models {','.join(args.models)}, "
        f"variants {','.join(args.variants)}")  # fmt: skip
    prewarm(device, dtype, args.variants)
    torch.manual_seed(0)  # the inputs; the weights are seeded per model
    rows: list[dict] = []
    failures: list[dict] = []
    for name in args.models:
        try:
            rows += run_model(zm.FAMILIES[name], args, device, dtype)
        except Exception as e:  # noqa: BLE001 - one model must not stop the table
            log(f"{name}: FAILED: {error_text(e)}")
            failures.append({"model": name, "error": error_text(e)})
            reset_compilers(device)
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine()
    commit = harness.git_commit() or "unknown"
    for row in rows:  # with --append, rows of several runs share a file
        row["git_commit"] = commit
    # report.py reads "benchmark" and "meta"; with --append, the meta is this write's.
    doc = {
        "benchmark": "zoo",
        "meta": {
            "device_type": device.type,
            "device_name": device_name,
            "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": commit,
            "command": " ".join(
                ["python", "benchmarks/zoo.py", *(sys.argv[1:] if argv is None else argv)]
            ),
        },
        "rows": rows,
        "failures": failures,
    }
    if args.out:
        out = Path(args.out)
        if args.append and out.exists():
            old = json.loads(out.read_text())
            key = lambda r: (r["model"], r["size"], r["scenario"], r["batch"])  # noqa: E731
            fresh = {key(r) for r in rows}
            doc["rows"] = [r for r in old.get("rows", []) if key(r) not in fresh] + rows
            done = {r["model"] for r in rows}
            doc["failures"] = [f for f in old.get("failures", []) if f["model"] not in done]
            doc["failures"] += failures
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"wrote {out}")
    print(markdown(doc["rows"]))
    for f in doc["failures"]:
        print(f"\n{f['model']} failed: {f['error']}")
    return doc


if __name__ == "__main__":
    main()
