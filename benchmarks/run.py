#!/usr/bin/env python
"""The benchmark suite in one command: eager vs torch.compile vs magi_compile, side by side.

Usage::

    python benchmarks/run.py --device cuda --out results.json      # the GPU suite (< 8 min)
    python benchmarks/run.py --device cpu --quick                   # the CPU subset (< 5 min)
    python benchmarks/run.py --device cpu --smoke --only gpt2_prefill --in-process

A complete run written to ``benchmarks/results/`` (the default ``--out``) is what
``python benchmarks/report.py`` turns into ``benchmarks/RESULTS.md``.

The workloads run in a worker process; this process only shares out the time budget, watches
the worker and writes the JSON. A worker that crashes (a segfault, a CUDA fault) or overruns
its workload's share by more than the grace is killed; what was in flight is recorded as a
failure with the reason, and a fresh worker carries on with the rest. Variants that raise are
recorded with their phase and error text by the worker itself. Inductor's and magi's cache
directories are fresh for each run (``--keep-caches`` keeps the user's), so "cold" means cold.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT / "examples"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

from benchmarks import harness, workloads  # noqa: E402

BUDGET_S = {"full": 420.0, "quick": 230.0, "smoke": 120.0}  # under 8 min GPU, 5 min CPU
MAX_WORKERS = 8  # fresh workers after crashes, per run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default: cuda when available, else cpu")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small shapes (the CPU subset)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes, correctness and first-call time only (tests)")  # fmt: skip
    p.add_argument("--only", help="comma-separated workload or group names, or 'all' "
                   "(default: all; with --quick, the CPU subset)")  # fmt: skip
    p.add_argument("--variants", help=f"comma-separated subset of {', '.join(harness.VARIANTS)}")
    p.add_argument("--out", help="JSON path (default: benchmarks/results/<device>_<preset>.json)")
    p.add_argument("--budget-s", type=float, help="time budget for all workloads")
    p.add_argument("--in-process", action="store_true",
                   help="run the workloads in this process: no crash isolation, usual caches")  # fmt: skip
    p.add_argument("--keep-caches", action="store_true",
                   help="use the usual Inductor/magi cache directories instead of fresh ones")  # fmt: skip
    p.add_argument("--threads", type=int,
                   help="CPU intra-op threads (default 1 for a CPU run: on a small shared machine "
                   "more threads than free cores make OpenMP timings swing several-fold)")  # fmt: skip
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    # Internal: the worker side.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--skip", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.device = harness.resolve_device(p, args.device)
    args.preset = "smoke" if args.smoke else "quick" if args.quick else "full"
    variants = [v for v in harness.VARIANTS if args.device == "cuda" or v not in harness.CUDA_ONLY]
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = [v for v in wanted if v not in harness.VARIANTS]
        if bad:
            p.error(f"--variants: unknown {bad}; known: {', '.join(harness.VARIANTS)}")
        variants = [v for v in variants if v in wanted]
    args.variant_list = variants
    if args.budget_s is None:
        args.budget_s = BUDGET_S[args.preset]
    if args.threads is None and args.device == "cpu" and not args.in_process:
        args.threads = 1
    return args


# --------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------


def environment(settings: harness.Settings) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "device": settings.device.type,
        "dtype": str(settings.dtype).removeprefix("torch."),
        "preset": settings.preset,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        meta["cpu"] = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    if settings.device.type == "cuda":
        props = torch.cuda.get_device_properties(settings.device)
        meta.update(device_name=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1),
                    sm_count=props.multi_processor_count)  # fmt: skip
    else:
        n = meta["cpu_threads"]
        meta["device_name"] = f"{meta['cpu']}, {os.cpu_count()} cores, {n} thread{'s' * (n != 1)}"
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        meta["triton"] = None
    try:
        import magi_compiler

        meta["magi_compiler"] = getattr(magi_compiler, "__version__", "?")
        meta["magi_compiler_path"] = str(Path(magi_compiler.__file__).parent)
        meta["magi_config"] = json.loads(
            json.dumps(dataclasses.asdict(magi_compiler.get_compile_config()), default=str)
        )
    except Exception as e:  # noqa: BLE001
        meta["magi_compiler"] = f"import failed: {e}"
    return meta


def worker_main(args: argparse.Namespace, emit) -> int:
    settings = harness.Settings.for_run(args.device, args.preset)
    if settings.device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    emit({"event": "meta", **environment(settings)})
    emit({"event": "prewarm", "seconds": harness.prewarm(settings, args.variant_list)})
    skip = {tuple(s.split(":", 1)) for s in args.skip.split(",") if ":" in s}
    try:
        harness.run_workloads(
            workloads.select(args.only, args.preset),
            args.variant_list,
            settings,
            args.deadline,
            skip,
            emit,
        )
    except harness.DeviceLost as e:
        emit({"event": "device_lost", "where": str(e)})
        return 3
    return 0


class _FileEmitter:
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)

    def __call__(self, event: dict) -> None:
        self.file.write(json.dumps(event, default=str) + "\n")
        self.file.flush()


# --------------------------------------------------------------------------------------------
# Parent side: budget, worker processes, results
# --------------------------------------------------------------------------------------------


class Collector:
    """Assembles worker events into the results document and prints progress."""

    def __init__(self, selected: list[workloads.Workload], variants: list[str]) -> None:
        self.meta: dict[str, Any] = {}
        self.results = {w.name: {**workloads.describe(w), "variants": {}} for w in selected}
        self.pending = [w.name for w in selected]
        self.variants = variants
        self.current: str | None = None
        self.current_deadline: float | None = None
        self.current_share = 0.0
        self.in_flight: tuple[str, str] | None = None  # being compiled and checked
        self.timing: tuple[str, list[str]] | None = None  # compiled, in the timing rounds
        self.prepared: dict[tuple[str, str], dict] = {}  # compiled and checked, not yet timed
        self.prewarm_s: list[float] = []
        self.suite_error: str | None = None

    def done(self) -> set[tuple[str, str]]:
        return {(w, v) for w, r in self.results.items() for v in r["variants"]}

    def handle(self, ev: dict) -> None:
        kind = ev.pop("event")
        if kind == "meta":
            self.meta = self.meta or ev
        elif kind == "prewarm":
            self.prewarm_s.append(ev["seconds"])
        elif kind == "workload":
            self.current, self.current_deadline = ev["name"], ev["deadline"]
            self.timing = None
            self.current_share = ev["share_s"]
        elif kind == "case":
            self.results[ev.pop("workload")].update(ev)
        elif kind == "workload_error":
            self.results[ev["workload"]]["error"] = ev["error"]
            print(f"  {ev['workload']}: could not build: {ev['error'].splitlines()[-1]}")
        elif kind == "start":
            self.in_flight = (ev["workload"], ev["variant"])
        elif kind == "variant":
            self.record(ev["workload"], ev["variant"], ev["result"])
            if self.timing and ev["variant"] in self.timing[1]:
                self.timing[1].remove(ev["variant"])
        elif kind == "prepared":  # compiled and checked; timed later with the others
            self.in_flight = None
            self.prepared[(ev["workload"], ev["variant"])] = ev["result"]
        elif kind == "timing":
            self.timing = (ev["workload"], ev["variants"])
        elif kind == "workload_done":
            self.prepared.clear()
            if ev["workload"] in self.pending:
                self.pending.remove(ev["workload"])
            self.current = self.current_deadline = None

    def record(self, wl: str, variant: str, result: dict) -> None:
        self.results[wl]["variants"][variant] = result
        self.in_flight = None
        if result["status"] == "ok":
            parts = [f"first call {result['first_call_s']:.2f} s"]
            if "median_ms" in result:
                parts.insert(0, f"{result['median_ms']:.3f} ms")
            if "norm_rel_err" in result:
                parts.append(
                    f"err {result['norm_rel_err']:.1e}" + ("" if result["correct"] else " WRONG")
                )
            text = ", ".join(parts) + (f" ({result['note']})" if result.get("note") else "")
        else:
            last = (result.get("error") or "").strip().splitlines() or [""]
            text = f"{result['status'].upper()} ({result.get('phase', '')}): {last[-1][:150]}"
        print(f"  {wl:<20} {variant:<12} {text}", flush=True)


def _read_new(path: Path, offset: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], offset
    with open(path) as f:
        f.seek(offset)
        data = f.read()
    complete = data[: data.rfind("\n") + 1]
    events = [json.loads(line) for line in complete.splitlines() if line.strip()]
    return events, offset + len(complete.encode())


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and its compile workers, nothing else
    except ProcessLookupError:
        pass
    proc.wait()


def _worker_env(args: argparse.Namespace, scratch: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    extra = [str(ROOT / "examples"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(extra + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if not args.keep_caches:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
        env["MAGI_COMPILE_CACHE_ROOT_DIR"] = str(scratch / "magi")
        env.pop("TRITON_CACHE_DIR", None)
    return env


def orchestrate(args: argparse.Namespace, col: Collector, deadline: float, log_path: Path):
    scratch = Path(tempfile.mkdtemp(prefix="magi_bench_"))
    env = _worker_env(args, scratch)
    workers = 0
    with open(log_path, "w") as log:
        while col.pending and workers < MAX_WORKERS and time.time() < deadline - 5:
            events_path = scratch / f"events{workers}.jsonl"
            skip = ",".join(f"{w}:{v}" for w, v in sorted(col.done()))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker",
                   "--device", args.device, "--events", str(events_path),
                   "--deadline", str(deadline), "--only", ",".join(col.pending),
                   "--variants", ",".join(args.variant_list), "--skip", skip]  # fmt: skip
            cmd += ["--quick"] if args.preset == "quick" else ["--smoke"] if args.smoke else []
            cmd += ["--threads", str(args.threads)] if args.threads else []
            log.write(f"\n=== worker {workers}: {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            workers += 1
            offset, killed = 0, None
            col.current = col.current_deadline = None
            while proc.poll() is None:
                events, offset = _read_new(events_path, offset)
                for ev in events:
                    col.handle(ev)
                # The worker skips variants itself after a workload's deadline; this catches
                # one call (a compile, a hang) that never returns.
                limit = deadline + 15
                if col.current_deadline is not None:
                    limit = min(limit, col.current_deadline + max(30.0, col.current_share))
                if time.time() > limit:
                    who = col.current or "the worker"
                    killed = f"killed: {who} ran past its share of the time budget"
                    _kill(proc)
                time.sleep(0.25)
            events, offset = _read_new(events_path, offset)
            for ev in events:
                col.handle(ev)
            if offset == 0:  # not one event: the worker cannot start; retrying will not help
                col.suite_error = (
                    f"worker exited with code {proc.returncode} before its first event"
                )
                break
            _settle(col, proc.returncode, killed)
    for name in col.pending:  # never started: the budget ran out first
        for v in col.variants:
            col.results[name]["variants"].setdefault(
                v, {"status": "skipped", "error": "time budget"}
            )
    if col.suite_error:
        tail = log_path.read_text().splitlines()[-15:]
        print(f"benchmarks: {col.suite_error}; end of {log_path}:\n" + "\n".join(tail))
    return workers


def _settle(col: Collector, returncode: int, killed: str | None) -> None:
    """After a worker exits: blame the variant in flight, drop a workload that overran."""
    if returncode == 0 and not killed:
        return
    if killed:
        reason = killed
    elif returncode == 3:
        reason = "CUDA context lost after this variant failed; a fresh worker continued"
    elif returncode < 0:
        reason = f"worker died with signal {signal.Signals(-returncode).name}"
    else:
        reason = f"worker exited with code {returncode}"
    if col.in_flight:
        wl, v = col.in_flight
        col.record(wl, v, {"status": "failed", "phase": "worker", "error": reason})
    if col.timing:  # the variants being timed together all lose their timing
        wl, variants = col.timing
        for v in list(variants):
            col.record(wl, v, {"status": "failed", "phase": "steady-state timing (worker)",
                               "error": reason})  # fmt: skip
        col.timing = None
    if killed:  # the workload is dropped: keep what its variants measured before timing
        for (wl, v), result in col.prepared.items():
            if v not in col.results[wl]["variants"]:
                col.record(wl, v, {**result, "note": f"not timed: {reason}"})
    col.prepared.clear()  # after a crash the next worker compiles and times them again
    if killed and col.current in col.pending:
        for v in col.variants:
            col.results[col.current]["variants"].setdefault(
                v, {"status": "skipped", "error": "time budget (worker killed)"}
            )
        col.pending.remove(col.current)


def in_process(args: argparse.Namespace, col: Collector, deadline: float) -> None:
    """Runs the workloads here, with the process's usual cache directories."""
    args.deadline = deadline
    args.only = ",".join(col.pending)
    worker_main(args, col.handle)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        sys.exit(worker_main(args, _FileEmitter(args.events)))
    selected = workloads.select(args.only, args.preset)
    if args.list:
        for w in selected:
            print(f"{w.name:<20} {w.group:<12} {w.title}")
        return {}
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"{args.device}_{args.preset}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    deadline = start + args.budget_s
    print(f"benchmarks: {len(selected)} workloads on {args.device} ({args.preset} shapes), "
          f"variants {', '.join(args.variant_list)}, budget {args.budget_s:.0f} s")  # fmt: skip
    col = Collector(selected, args.variant_list)
    workers = 0
    if args.in_process:
        in_process(args, col, deadline)
    else:
        workers = orchestrate(args, col, deadline, out.with_suffix(".log"))
    doc = {
        "schema": 1,
        "meta": {
            **col.meta,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": harness.git_commit(),
            "command": " ".join(["python", "benchmarks/run.py", *(argv or sys.argv[1:])]),
        },
        "suite": {
            "budget_s": args.budget_s,
            "wall_s": time.time() - start,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "workers": workers,
            "prewarm_s": col.prewarm_s,
            "tolerance_norm_rel": harness.Settings.for_run(args.device, args.preset).tolerance,
            "variants": args.variant_list,
            "error": col.suite_error,
        },
        "workloads": list(col.results.values()),
    }
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print_summary(doc)
    print(f"wrote {out} ({doc['suite']['wall_s']:.0f} s)")
    return doc


def print_summary(doc: dict[str, Any]) -> None:
    variants = doc["suite"]["variants"]
    print(
        f"\n{'workload':<20}"
        + "".join(f"{v:>16}" for v in variants)
        + "   (median ms; speedup vs eager)"
    )
    for w in doc["workloads"]:
        row = f"{w['name']:<20}"
        eager = w["variants"].get("eager", {}).get("median_ms")
        for v in variants:
            r = w["variants"].get(v)
            if r is None:
                cell = "-"
            elif r["status"] != "ok":
                cell = r["status"]
            elif "median_ms" not in r:
                cell = "ok" if r.get("correct", True) else "WRONG"
            else:
                cell = f"{r['median_ms']:.3f}"
                if eager and v != "eager":
                    cell += f" {eager / r['median_ms']:.2f}x"
                if r.get("correct") is False:
                    cell += "!"
            row += f"{cell:>16}"
        print(row)


if __name__ == "__main__":
    main()
