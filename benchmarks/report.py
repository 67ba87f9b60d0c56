#!/usr/bin/env python
"""Regenerates ``benchmarks/RESULTS.md`` (and its PNG plots) from result JSON files.

Usage::

    python benchmarks/report.py                                  # every benchmarks/results/*.json
    python benchmarks/report.py results/cuda_full.json results/cpu_quick.json

One section per JSON file (GPU sections first): the device, torch, CUDA and date; absolute
times with ratios to eager and to torch.compile; throughput; the memory-bound kernels'
effective bandwidth against the device copy; peak memory; first-call (compile) times;
correctness; and, spelled out, every place where magi_compile loses, fails or was skipped.
Plots need matplotlib; without it the tables are written alone.
The sections of the other result files (``results/extra``) are in ``report_extra.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: the repository root for the package
    sys.path.insert(0, str(HERE.parent))

from benchmarks.report_extra import extra_section  # noqa: E402
from benchmarks.report_extra import table as _table  # noqa: E402

LABELS = {
    "eager": "eager",
    "inductor": "torch.compile",
    "inductor_ro": "torch.compile reduce-overhead",
    "magi": "magi_compile",
    "magi_cg": "magi_compile CUDA graphs",
}
COLORS = {
    "eager": "#9e9e9e",
    "inductor": "#4c72b0",
    "inductor_ro": "#8172b2",
    "magi": "#dd8452",
    "magi_cg": "#c44e52",
}
# Each magi variant against its torch.compile counterpart: plain, and with CUDA graphs.
PAIRS = (("magi", "inductor"), ("magi_cg", "inductor_ro"))


def _ok(w: dict, v: str) -> dict | None:
    r = w["variants"].get(v)
    return r if r and r.get("status") == "ok" else None


def _t(w: dict, v: str) -> float | None:
    r = _ok(w, v)
    return r.get("median_ms") if r else None


def _cell(w: dict, v: str, key: str, fmt: str, scale: float = 1.0) -> str:
    r = w["variants"].get(v)
    if r is None:
        return "–"
    if r.get("status") != "ok":
        return r.get("status", "?")
    value = r.get(key)
    if value is None:
        return "–"
    text = format(value * scale, fmt)
    return text + (" ⚠" if r.get("correct") is False else "")


def _ratio(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}×" if num and den else "–"


def _tag(meta: dict) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", meta.get("device_name", meta["device"]).lower()).strip("-")
    return f"{meta['device']}_{name[:32]}_{meta.get('preset', 'full')}"


def _variants(doc: dict) -> list[str]:
    return [v for v in LABELS if v in doc["suite"]["variants"]]


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _times(doc: dict) -> str:
    vs = _variants(doc)
    header = ["workload", "shapes"] + [f"{LABELS[v]} ms" for v in vs]
    header += [f"{LABELS[v]} vs eager" for v in vs if v != "eager"]
    pairs = [(m, t) for m, t in PAIRS if m in vs and t in vs]
    header += [f"{LABELS[m]} vs {LABELS[t]}" for m, t in pairs]
    rows = []
    for w in doc["workloads"]:
        if w["group"] == "micro":
            continue
        row = [w["title"], w.get("shape", "")] + [_cell(w, v, "median_ms", ".3f") for v in vs]
        row += [_ratio(_t(w, "eager"), _t(w, v)) for v in vs if v != "eager"]
        row += [_ratio(_t(w, t), _t(w, m)) for m, t in pairs]
        rows.append(row)
    return _table(header, rows)


def _throughput(doc: dict) -> str:
    vs = _variants(doc)
    rows = []
    for w in doc["workloads"]:
        if not w.get("tokens"):
            continue
        unit = "generated tokens/s" if w.get("kind") == "decode" else "tokens/s"
        cells = [_cell(w, v, "tokens_per_s", ",.0f") for v in vs]
        rows.append([w["title"], unit] + cells)
    return _table(["workload", "unit"] + [LABELS[v] for v in vs], rows) if rows else ""


def _bandwidth(doc: dict) -> str:
    vs = _variants(doc)
    micro = [w for w in doc["workloads"] if w["group"] == "micro"]
    copy = next((w for w in micro if w["name"] == "micro_copy"), None)
    ceiling = (_ok(copy, "eager") or {}).get("bandwidth_gbs") if copy else None
    rows = []
    for w in micro:
        row = [w["title"], w.get("shape", ""), f"{w.get('bytes_moved', 0) / 1e6:,.0f}"]
        for v in vs:
            r = _ok(w, v)
            gbs = r.get("bandwidth_gbs") if r else None
            if gbs is None:
                row.append(_cell(w, v, "bandwidth_gbs", ".0f") if w["variants"].get(v) else "–")
            else:
                pct = f" ({100 * gbs / ceiling:.0f}%)" if ceiling else ""
                row.append(f"{gbs:,.0f}{pct}" if gbs >= 100 else f"{gbs:.3g}{pct}")
        rows.append(row)
    if not rows:
        return ""
    header = ["kernel", "shape", "MB moved"] + [f"{LABELS[v]} GB/s (% of copy)" for v in vs]
    return _table(header, rows)


def _memory(doc: dict) -> str:
    vs = _variants(doc)
    rows = []
    for w in doc["workloads"]:
        if not any((_ok(w, v) or {}).get("peak_mem_bytes") for v in vs):
            continue
        row = [w["title"]] + [_cell(w, v, "peak_mem_bytes", ",.0f", 2**-20) for v in vs]
        eager = (_ok(w, "eager") or {}).get("peak_mem_bytes")
        magi = (_ok(w, "magi") or {}).get("peak_mem_bytes")
        rows.append(row + [_ratio(magi, eager)])
    header = ["workload"] + [f"{LABELS[v]} MiB" for v in vs] + ["magi / eager"]
    table = _table(header, rows) if rows else ""
    reserved = [
        [w["title"]] + [_cell(w, v, "peak_reserved_bytes", ",.0f", 2**-20) for v in vs]
        for w in doc["workloads"]
        if any((_ok(w, v) or {}).get("peak_reserved_bytes") for v in vs)
    ]
    if table and reserved:
        table += (
            "\n\nDevice memory held over the same step (`max_memory_reserved`, cached free blocks "
            "released first), which counts the private pools where CUDA-graph replays keep their "
            "intermediates:\n\n" + _table(["workload"] + [f"{LABELS[v]} MiB" for v in vs], reserved)
        )
    return table


def _compile_times(doc: dict) -> str:
    vs = [v for v in _variants(doc) if v != "eager"]
    header = ["workload"] + [f"{LABELS[v]} {k}" for v in vs for k in ("cold s", "warm s")]
    rows = []
    for w in doc["workloads"]:
        if not any(v in w["variants"] for v in vs):
            continue
        row = [w["title"]]
        for v in vs:
            warm = _cell(w, v, "warm_first_call_s", ".2f")
            if (_ok(w, v) or {}).get("warm_skipped"):
                warm = "not run (budget)"
            row += [_cell(w, v, "first_call_s", ".2f"), warm]
        rows.append(row)
    return _table(header, rows)


def _correctness(doc: dict) -> str:
    vs = _variants(doc)
    header = ["workload"] + [LABELS[v] + (" (repeat)" if v == "eager" else "") for v in vs]
    rows = [
        [w["title"]] + [_cell(w, v, "norm_rel_err", ".1e") for v in vs] for w in doc["workloads"]
    ]
    return _table(header, rows)


def _losses(doc: dict) -> list[str]:
    """Every place where a magi variant is slower, heavier, wrong, failed or was not measured."""
    out = []
    for w in doc["workloads"]:
        for mv in ("magi", "magi_cg"):
            out += _losses_of(w, mv)
    return out


def _losses_of(w: dict, mv: str) -> list[str]:
    m, name, title = w["variants"].get(mv), LABELS[mv], f"**{w['title']}**"
    if m is None:
        return []
    if m.get("status") != "ok":
        err = (m.get("error") or "").strip().splitlines() or [""]
        phase = f" in {m['phase']}" if m.get("phase") else ""
        return [f"{title}: {name} {m.get('status')}{phase}: `{err[-1][:200]}`"]
    out = []
    if m.get("correct") is False:
        out.append(f"{title}: {name} differs from eager (error {m['norm_rel_err']:.2e})")
    tm, te = m.get("median_ms"), _t(w, "eager")
    best = min(((t, v) for v in ("inductor", "inductor_ro") if (t := _t(w, v))), default=None)
    if tm and te and tm > 1.03 * te:
        out.append(f"{title}: {name} is slower than eager ({te / tm:.2f}×: {tm:.3f} ms vs "
                   f"{te:.3f} ms)")  # fmt: skip
    if tm and best and tm > 1.03 * best[0]:
        out.append(f"{title}: {LABELS[best[1]]} is {tm / best[0]:.2f}× faster than {name} "
                   f"({best[0]:.3f} ms vs {tm:.3f} ms)")  # fmt: skip
    pm, pe = m.get("peak_mem_bytes"), (_ok(w, "eager") or {}).get("peak_mem_bytes")
    if pm and pe and pm > 1.05 * pe:
        out.append(f"{title}: {name} peaks at {pm / pe:.2f}× eager's memory")
    tc = (_ok(w, "inductor") or {}).get("first_call_s")
    if tc and m.get("first_call_s", 0) > tc:
        out.append(f"{title}: {name}'s cold first call takes longer than torch.compile's "
                   f"({m['first_call_s']:.2f} s vs {tc:.2f} s)")  # fmt: skip
    return out


def _failures(doc: dict) -> list[str]:
    out = []
    for w in doc["workloads"]:
        if w.get("error"):
            out.append(f"{w['title']}: could not be built: `{w['error'].splitlines()[-1][:200]}`")
        for v, r in w["variants"].items():
            if r.get("note"):
                out.append(f"{w['title']} / {LABELS[v]}: {r['note']}")
            if r.get("status") != "ok":
                err = (r.get("error") or "").strip().splitlines() or [""]
                phase = f" in {r['phase']}" if r.get("phase") else ""
                out.append(f"{w['title']} / {LABELS[v]}: {r['status']}{phase}: `{err[-1][:240]}`")
    return out


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


def _bars(ax, names: list[str], series: dict[str, list[float | None]], ylabel: str) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (v, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(names))]
        ys = [y if y is not None and not math.isnan(y) else 0.0 for y in values]
        ax.bar(xs, ys, width, label=LABELS[v], color=COLORS[v])
        for x, y in zip(xs, values, strict=True):
            if y is None:  # failed or skipped: say so instead of a gap (NaN: not applicable)
                ax.text(x, 0, "×", ha="center", va="bottom", fontsize=8, color=COLORS[v])
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def plots(doc: dict, out_dir: Path, md_dir: Path) -> dict[str, str]:
    """Writes the PNGs of one section; returns {kind: path relative to RESULTS.md}."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    tag, vs, made = _tag(doc["meta"]), _variants(doc), {}
    title = f"{doc['meta'].get('device_name', '')}, {doc['meta'].get('preset', '')} shapes"
    work = [w for w in doc["workloads"] if _t(w, "eager") and w["name"] != "micro_copy"]

    def save(fig, kind: str) -> None:
        fig.tight_layout()
        path = out_dir / f"{tag}_{kind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made[kind] = Path(os.path.relpath(path, md_dir)).as_posix()

    speed = {v: [_ratio_value(_t(w, "eager"), _t(w, v)) for w in work] for v in vs if v != "eager"}
    if work and speed:
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(work) + 2), 4.2))
        _bars(ax, [w["name"] for w in work], speed, "speedup vs eager (higher is better)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"Speedup over eager: {title}", fontsize=10)
        save(fig, "speedup")
    mem = [w for w in doc["workloads"] if (_ok(w, "eager") or {}).get("peak_mem_bytes")]
    if mem:
        series = {
            v: [((_ok(w, v) or {}).get("peak_mem_bytes") or 0) / 2**30 for w in mem] for v in vs
        }
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(mem) + 2), 4.2))
        _bars(ax, [w["name"] for w in mem], series, "peak allocated GiB (lower is better)")
        ax.set_title(f"Peak memory: {title}", fontsize=10)
        save(fig, "memory")
    micro = [w for w in doc["workloads"] if w["group"] == "micro" and _t(w, "eager")]
    if micro:
        series = {v: [_value(w, v, "bandwidth_gbs") for w in micro] for v in vs}
        fig, ax = plt.subplots(figsize=(7, 4.2))
        _bars(ax, [w["name"].removeprefix("micro_") for w in micro], series, "effective GB/s")
        ax.set_title(f"Memory-bound kernels: {title}", fontsize=10)
        save(fig, "bandwidth")
    return made


def _value(w: dict, v: str, key: str) -> float | None:
    """A plotted value: None when the variant failed or was skipped, NaN when it does not
    apply (a variant the workload does not run)."""
    if v not in w["variants"]:
        return math.nan
    return (_ok(w, v) or {}).get(key)


def _ratio_value(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


# --------------------------------------------------------------------------------------------
# Document
# --------------------------------------------------------------------------------------------

PREAMBLE = """# Benchmark results

Generated by `python benchmarks/report.py` from the JSON files named in each section
(written by `python benchmarks/run.py`); edit those scripts, not this file. Every number
here is a measurement of that run; nothing is estimated.

How to read the tables:

- **Time**: median over many steps after warm-up. All variants of a workload are compiled
  and checked first, then timed together in interleaved rounds (so drift of the machine
  falls on all of them alike), rotating through 2 or 3 sets of random inputs; CUDA events on
  the GPU, `time.perf_counter` on the CPU. A step is one forward, one training step
  (forward + loss + backward, gradients set to None first; no optimizer), or a whole greedy
  decode of the stated number of tokens (one compiled call per token plus an eager `argmax`).
- **Ratios**: "X vs eager" = eager time / X time, and "magi vs torch.compile" = torch.compile
  time / magi time: above 1.00× means faster.
- **First call** includes capture and compilation. *Cold*: the first compile of that graph in
  the process, with Inductor and magi cache directories that were empty when the run started
  (kernels compiled by an earlier workload or variant of the same run can be reused; process
  start-up costs, such as Inductor's worker pool and precompiled header, were paid beforehand
  on a tiny module). *Warm*: a second compile of the same variant in the same process, from a
  wrapper with a fresh code object: Dynamo traces again and Inductor finds its graph and
  kernels in its caches. It is not a fresh process with a warm disk cache.
- **Peak memory**: `torch.cuda.max_memory_allocated` over one step, less what the variants
  compiled before it still hold; the weights and the rotating inputs are in every number.
  GPU only. A CUDA-graph replay (`reduce-overhead`) keeps its intermediates in a private pool
  this figure does not see, so runs since 2026-11-26 also record the device memory held over
  the step (`max_memory_reserved`, cached free blocks released first), shown below it.
- **Error**: normwise relative error `||out - eager|| / ||eager||` of the outputs (training:
  loss and every gradient; decode: first-step logits), worst tensor; ⚠ marks one over the
  tolerance. Eager's column compares two eager runs: the noise floor.
- A variant that fails or runs out of time budget is listed with its reason, never dropped.
"""


def section(doc: dict, source: str, plot_dir: Path, md_dir: Path) -> str:
    meta, suite = doc["meta"], doc["suite"]
    title = f"## {meta.get('device_name', meta['device'])}: {meta.get('preset', 'full')} shapes"
    facts = [
        f"device `{meta['device']}` ({meta.get('device_name', '?')}"
        + (f", {meta['sm_count']} SMs, {meta['gpu_memory_gb']} GiB" if meta.get("sm_count") else "")
        + ")",
        f"torch {meta.get('torch')}",
        f"CUDA {meta.get('cuda')}"
        if meta["device"] == "cuda"
        else f"torch built for CUDA {meta.get('cuda')}",
        f"Triton {meta.get('triton')}",
        f"Python {meta.get('python')}",
        f"magi_compiler {meta.get('magi_compiler')} (commit {meta.get('git_commit')})",
        f"dtype {meta.get('dtype')}",
        f"date {meta.get('date')}",
    ]
    parts = [title, "", " · ".join(facts), ""]
    parts.append(
        f"Source: `{source}`; command `{meta.get('command')}`; suite wall time "
        f"{suite['wall_s']:.0f} s of a {suite['budget_s']:.0f} s budget; error tolerance "
        f"{suite['tolerance_norm_rel']:g}"
        + (f"; load average (1, 5, 15 min) {meta['load_average_at_start']} at the start, "
           f"{suite.get('load_average_at_end')} at the end" if meta.get("load_average_at_start")
           else "")
        + ".\n"
    )  # fmt: skip
    if meta.get("note"):
        parts.append(meta["note"] + "\n")
    if meta["device"] == "cpu":
        parts.append(
            "CPU numbers come from a small shared development machine: shapes are the quick "
            "preset's, far from the GPU workloads, and other jobs on the machine add noise. "
            "They show that the suite runs and how the variants compare there, nothing more."
            + (
                " The run used one intra-op thread (`--threads`, the CPU default): with two "
                "OpenMP threads on cores that other jobs also used, timings swung several-fold."
                if meta.get("cpu_threads") == 1
                else ""
            )
            + "\n"
        )
    figs = plots(doc, plot_dir, md_dir)
    parts += ["### Time per step", "", _times(doc)]
    if "speedup" in figs:
        parts.append(f"![speedup over eager]({figs['speedup']})\n")
    if tp := _throughput(doc):
        parts += ["### Throughput", "", tp]
    if bw := _bandwidth(doc):
        parts += ["### Memory-bound kernels: effective bandwidth", "",
                  "Bytes read + written at the least, over the median time; percentages are "
                  "of the device copy on the same shape.", "", bw]  # fmt: skip
        if "bandwidth" in figs:
            parts.append(f"![bandwidth]({figs['bandwidth']})\n")
    if mem := _memory(doc):
        parts += ["### Peak memory", "", mem]
        if "memory" in figs:
            parts.append(f"![peak memory]({figs['memory']})\n")
    parts += ["### First call (capture + compile)", "", _compile_times(doc)]
    parts += ["### Error against eager", "", _correctness(doc)]
    losses = _losses(doc)
    parts += ["### Where magi_compile loses, fails or was not measured", "",
              "Slower than eager or than the faster torch.compile mode by more than 3%, more "
              "than 5% above eager's peak memory, a slower cold compile than torch.compile, an "
              "error over the tolerance, a failure or a skip.", ""]  # fmt: skip
    parts += [f"- {x}" for x in losses] if losses else ["- nowhere in this run"]
    parts.append("")
    fails = _failures(doc)
    if fails:
        parts += ["### Failures and skips", ""] + [f"- {x}" for x in fails] + [""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "files", nargs="*", help="result JSON files (default: benchmarks/results/*.json)"
    )
    p.add_argument("--out", default=str(HERE / "RESULTS.md"))
    p.add_argument("--plots", default=str(HERE / "plots"))
    args = p.parse_args(argv)
    files = [Path(f) for f in args.files] or sorted((HERE / "results").glob("*.json"))
    if not files:
        sys.exit("report: no result files; run benchmarks/run.py first")
    docs = [(json.loads(f.read_text()), f) for f in files]
    docs.sort(key=lambda d: (d[0]["meta"]["device"] != "cuda", d[0]["meta"].get("date", "")))
    body = [PREAMBLE]
    headline = HERE / "results" / "HEADLINE.md"  # hand-written summary of the latest figures
    if headline.exists() and not args.files:
        body.append(headline.read_text())
    for doc, f in docs:
        source = os.path.relpath(f.resolve(), HERE.parent)
        body.append(section(doc, source, Path(args.plots), Path(args.out).resolve().parent))
    extra = sorted((HERE / "results" / "extra").glob("*.json")) if not args.files else []
    for f in extra:
        body.append(extra_section(json.loads(f.read_text()), os.path.relpath(f, HERE.parent)))
    Path(args.out).write_text("\n".join(body).rstrip() + "\n")
    print(f"wrote {args.out} from {len(docs) + len(extra)} result file(s)")


if __name__ == "__main__":
    main()
