#!/usr/bin/env python
"""Usage: python benchmarks/report.py [--results DIR] [--out PATH] [--plots DIR] [--headline]

Writes ``benchmarks/RESULTS.md`` from the result JSON in ``benchmarks/results/``. Each file is
the output of one benchmark script (``run.py``'s suite, ``zoo.py``, ``bandwidth.py``,
``host_overhead.py``, ``recompute.py`` or ``offload.py``) on one device; for every benchmark and
device kind (the CPU, each GPU model) the latest complete run is reported, so adding a newer run
there and rerunning this script is the whole update. Runs restricted with ``--only``,
``--variants`` or ``--smoke`` are not complete and are skipped; a ``zoo.py`` file is reported
even when it lacks some of its six models or their scenarios (its runs are split with
``--models`` and ``--append``): the one covering the most is chosen, and its gaps are listed.
``--headline`` prints only the headline table (the one the README shows); ``--plots DIR`` also
writes PNG plots of the suite runs (needs matplotlib; the default folder
``benchmarks/plots`` is git-ignored).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: the repository root for the package
    sys.path.insert(0, str(HERE.parent))

from benchmarks.report_extra import (  # noqa: E402
    other_section,
    table,
    zoo_gaps,
)

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
# Section order within a device kind.
BENCHMARKS = (
    "suite",
    "zoo",
    "zoo_profile",
    "warm_start",
    "long_prefill",
    "decode",
    "attention",
    "bandwidth",
    "host_overhead",
    "recompute",
    "offload",
)
PARTIAL_FLAGS = ("--only", "--variants", "--smoke", "--no-bandwidth")


# --------------------------------------------------------------------------------------------
# Which runs are reported
# --------------------------------------------------------------------------------------------


def benchmark_of(doc: dict) -> str | None:
    """The script that wrote ``doc``, or None for a file this report does not know."""
    if "suite" in doc and "workloads" in doc:
        return "suite"
    if "bandwidth" in doc:
        return "bandwidth"
    kind = doc.get("benchmark")
    return kind if kind in BENCHMARKS else None


def stamp(doc: dict) -> dict[str, str]:
    """Device kind and name, torch version, date and commit of a run, whatever its schema."""
    meta = doc.get("meta") or doc  # host_overhead.py keeps them at the top level
    device = str(meta.get("device_type") or meta.get("device") or "?")
    name = str(meta.get("device_name") or "")
    if not name and meta.get("device") not in ("cpu", "cuda"):  # a name in the device field
        name = str(meta.get("device"))
    if device not in ("cpu", "cuda"):
        device = "cuda"
    name = name or device
    kind = "CPU" if device == "cpu" else name.removeprefix("NVIDIA ").split()[0]
    return {
        "kind": kind,
        "device": device,
        "name": name,
        "torch": str(meta.get("torch", "?")),
        "date": str(meta.get("date", "?"))[:10],
        "commit": str(meta.get("git_commit") or "?"),
        "sort_date": str(meta.get("date", "")),
    }


def is_complete(doc: dict) -> bool:
    if benchmark_of(doc) == "warm_start":  # written after each row: a cut run lists the rest
        return bool(doc.get("rows"))
    if benchmark_of(doc) == "zoo_profile":  # profiles the rows and variants it names
        return True
    command = str((doc.get("meta") or {}).get("command", ""))
    return not any(flag in command.split() for flag in PARTIAL_FLAGS)


def _rank(doc: dict) -> tuple:
    """Newer runs first; for the zoo, the one with fewer gaps first; for the warm start, the
    one with more rows (a run cut short against a complete one of fewer compilers)."""
    gaps = -len(zoo_gaps(doc)) if benchmark_of(doc) == "zoo" else 0
    if benchmark_of(doc) == "warm_start":
        gaps = len(doc.get("rows", []))
    return (gaps, stamp(doc)["sort_date"])


def latest_runs(files: list[Path]) -> dict[tuple[str, str], tuple[dict, Path]]:
    """{(device kind, benchmark): (document, path)} of the newest complete run of each."""
    chosen: dict[tuple[str, str], tuple[dict, Path]] = {}
    for path in files:
        doc = json.loads(path.read_text())
        bench = benchmark_of(doc)
        if bench is None or not is_complete(doc):
            continue
        key = (stamp(doc)["kind"], bench)
        if key not in chosen or _rank(doc) > _rank(chosen[key][0]):
            chosen[key] = (doc, path)
    return chosen


def stamp_line(doc: dict, source: str) -> str:
    s = stamp(doc)
    return (
        f"{s['name']} · torch {s['torch']} · {s['date']} · commit {s['commit']} · source `{source}`"
    )


# --------------------------------------------------------------------------------------------
# Suite tables (benchmarks/run.py)
# --------------------------------------------------------------------------------------------


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


def _variants(doc: dict) -> list[str]:
    return [v for v in LABELS if v in doc["suite"]["variants"]]


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
    return table(header, rows)


def _throughput(doc: dict) -> str:
    vs = _variants(doc)
    rows = []
    for w in doc["workloads"]:
        if not w.get("tokens"):
            continue
        unit = "generated tokens/s" if w.get("kind") == "decode" else "tokens/s"
        cells = [_cell(w, v, "tokens_per_s", ",.0f") for v in vs]
        rows.append([w["title"], unit] + cells)
    return table(["workload", "unit"] + [LABELS[v] for v in vs], rows) if rows else ""


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
    return table(header, rows)


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
    out = table(header, rows) if rows else ""
    reserved = [
        [w["title"]] + [_cell(w, v, "peak_reserved_bytes", ",.0f", 2**-20) for v in vs]
        for w in doc["workloads"]
        if any((_ok(w, v) or {}).get("peak_reserved_bytes") for v in vs)
    ]
    if out and reserved:
        out += (
            "\n\nDevice memory held over the same step (`max_memory_reserved`, cached free blocks "
            "released first), which counts the private pools where CUDA-graph replays keep their "
            "intermediates:\n\n" + table(["workload"] + [f"{LABELS[v]} MiB" for v in vs], reserved)
        )
    return out


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
    return table(header, rows)


def _correctness(doc: dict) -> str:
    vs = _variants(doc)
    header = ["workload"] + [LABELS[v] + (" (repeat)" if v == "eager" else "") for v in vs]
    rows = [
        [w["title"]] + [_cell(w, v, "norm_rel_err", ".1e") for v in vs] for w in doc["workloads"]
    ]
    return table(header, rows)


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


def suite_section(doc: dict, source: str) -> str:
    meta, suite = doc["meta"], doc["suite"]
    parts = [f"## {stamp(doc)['kind']}: whole models and kernels ({meta.get('preset')} shapes)"]
    parts += ["", stamp_line(doc, source), ""]
    details = [
        f"`{meta.get('command')}`",
        f"{meta.get('dtype')}",
        f"CUDA {meta.get('cuda')}" if meta["device"] == "cuda" else "",
        f"{meta['sm_count']} SMs, {meta['gpu_memory_gb']} GiB" if meta.get("sm_count") else "",
        f"Triton {meta.get('triton')}",
        f"Python {meta.get('python')}",
        f"suite wall time {suite['wall_s']:.0f} s of a {suite['budget_s']:.0f} s budget",
        f"error tolerance {suite['tolerance_norm_rel']:g}",
    ]
    parts += [" · ".join(d for d in details if d) + ".", ""]
    if meta["device"] == "cpu":
        parts += [
            "CPU numbers come from a small shared development machine at the quick preset's "
            "shapes, far from the GPU workloads; other jobs on the machine add noise. They show "
            "that the suite runs and how the variants compare there, nothing more.",
            "",
        ]
    parts += ["### Time per step", "", _times(doc)]
    if tp := _throughput(doc):
        parts += ["### Throughput", "", tp]
    if bw := _bandwidth(doc):
        parts += ["### Memory-bound kernels: effective bandwidth", "",
                  "Bytes read + written at the least, over the median time; percentages are "
                  "of the device copy on the same shape.", "", bw]  # fmt: skip
    if mem := _memory(doc):
        parts += ["### Peak memory", "", mem]
    parts += ["### First call (capture + compile)", "", _compile_times(doc)]
    parts += ["### Error against eager", "", _correctness(doc)]
    losses = _losses(doc)
    parts += ["### Where magi_compile loses, fails or was not measured", "",
              "Slower than eager or than the faster torch.compile mode by more than 3%, more "
              "than 5% above eager's peak memory, a slower cold compile than torch.compile, an "
              "error over the tolerance, a failure or a skip.", ""]  # fmt: skip
    parts += [f"- {x}" for x in losses] if losses else ["- nowhere in this run"]
    parts.append("")
    if fails := _failures(doc):
        parts += ["### Failures and skips", ""] + [f"- {x}" for x in fails] + [""]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# Headline
# --------------------------------------------------------------------------------------------


def headline(runs: dict[tuple[str, str], tuple[dict, Path]]) -> str:
    """The latest suite run on a GPU (else on the CPU) as one table of ratios."""
    suites = [(d, p) for (_, bench), (d, p) in runs.items() if bench == "suite"]
    if not suites:
        return ""
    doc, path = max(suites, key=lambda r: (r[0]["meta"]["device"] == "cuda", stamp(r[0])["sort_date"]))  # fmt: skip
    vs = _variants(doc)
    header = ["workload", "magi_compile vs eager", "vs torch.compile"]
    if "magi_cg" in vs and "inductor_ro" in vs:
        header.append("CUDA graphs vs reduce-overhead")
    rows = []
    for w in doc["workloads"]:
        if w["name"] == "micro_copy":
            continue
        row = [w["title"], _ratio(_t(w, "eager"), _t(w, "magi")), _ratio(_t(w, "inductor"), _t(w, "magi"))]  # fmt: skip
        if len(header) == 4:
            row.append(_ratio(_t(w, "inductor_ro"), _t(w, "magi_cg")))
        rows.append(row)
    source = os.path.relpath(path.resolve(), HERE.parent)
    return f"{stamp_line(doc, source)}\n\n{table(header, rows)}"


# --------------------------------------------------------------------------------------------
# Plots (optional)
# --------------------------------------------------------------------------------------------


def _bars(ax, names: list[str], series: dict[str, list[float | None]], ylabel: str) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (v, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(names))]
        ys = [y if y is not None and not math.isnan(y) else 0.0 for y in values]
        ax.bar(xs, ys, width, label=LABELS[v], color=COLORS[v])
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def plots(doc: dict, out_dir: Path) -> list[Path]:
    """Speed-up over eager and peak memory of one suite run as PNGs in ``out_dir``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib is not installed; no plots")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    s, vs, made = stamp(doc), _variants(doc), []
    title = f"{s['name']}, {doc['meta'].get('preset')} shapes, {s['date']}"
    work = [w for w in doc["workloads"] if _t(w, "eager") and w["name"] != "micro_copy"]
    mem = [w for w in doc["workloads"] if (_ok(w, "eager") or {}).get("peak_mem_bytes")]
    for kind, rows, label in (
        ("speedup", work, "speed-up over eager (higher is better)"),
        ("memory", mem, "peak allocated GiB (lower is better)"),
    ):
        if not rows:
            continue
        if kind == "speedup":
            te = [_t(w, "eager") for w in rows]
            series = {v: [(e / t if (t := _t(w, v)) else None) for w, e in zip(rows, te, strict=True)]
                      for v in vs if v != "eager"}  # fmt: skip
        else:
            series = {v: [((_ok(w, v) or {}).get("peak_mem_bytes") or 0) / 2**30 for w in rows]
                      for v in vs}  # fmt: skip
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows) + 2), 4.2))
        _bars(ax, [w["name"] for w in rows], series, label)
        ax.set_title(f"{kind}: {title}", fontsize=10)
        fig.tight_layout()
        path = out_dir / f"{s['kind'].lower()}_{kind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


# --------------------------------------------------------------------------------------------
# Document
# --------------------------------------------------------------------------------------------

PREAMBLE = """# Benchmark results

Generated by `python benchmarks/report.py` from the JSON files in `benchmarks/results/` (the
latest complete run of each benchmark on each device kind); edit those scripts or add a newer
run, never this file. Every number is a measurement of the run named above its tables.

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
  (kernels compiled by an earlier workload or variant of the same run can be reused). *Warm*:
  a second compile of the same variant in the same process, from a wrapper with a fresh code
  object.
- **Peak memory**: `torch.cuda.max_memory_allocated` over one step, less what the variants
  compiled before it still hold; the weights and the rotating inputs are in every number.
  GPU only. A CUDA-graph replay (`reduce-overhead`) keeps its intermediates in a private pool
  this figure does not see; the device memory held over the step (`max_memory_reserved`) is
  shown below it where the run recorded it.
- **Error**: normwise relative error `||out - eager|| / ||eager||` of the outputs (training:
  loss and every gradient; decode: first-step logits), worst tensor; ⚠ marks one over the
  tolerance. Eager's column compares two eager runs: the noise floor.
- A variant that fails or runs out of time budget is listed with its reason, never dropped.
- Compare variants within one run only: a memory-bound kernel's figure moves by a few points
  with what else the process ran and where its buffers landed.
"""


def render(runs: dict[tuple[str, str], tuple[dict, Path]]) -> str:
    body = [PREAMBLE]
    if head := headline(runs):
        body += ["## Headline", "", head]
    kinds = sorted({k for k, _ in runs}, key=lambda k: (k == "CPU", [-ord(c) for c in k]))
    for kind in kinds:
        for bench in BENCHMARKS:
            if (kind, bench) not in runs:
                continue
            doc, path = runs[(kind, bench)]
            source = os.path.relpath(path.resolve(), HERE.parent)
            if bench == "suite":
                body.append(suite_section(doc, source))
            else:
                profile = runs.get((kind, "zoo_profile"), (None, None))[0]
                body.append(other_section(bench, doc, kind, stamp_line(doc, source), profile))
    return "\n".join(body).rstrip() + "\n"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(HERE / "results"), help="folder of result JSON")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"))
    p.add_argument("--plots", nargs="?", const=str(HERE / "plots"), help="write PNG plots here")
    p.add_argument("--headline", action="store_true", help="print the headline table only")
    args = p.parse_args(argv)
    runs = latest_runs(sorted(Path(args.results).glob("*.json")))
    if not runs:
        sys.exit(f"report: no result files in {args.results}; run benchmarks/run.py first")
    if args.headline:
        text = headline(runs)
        print(text)
        return text
    text = render(runs)
    Path(args.out).write_text(text)
    print(f"wrote {args.out} from {len(runs)} result file(s)")
    if args.plots:
        for (_, bench), (doc, _) in runs.items():
            if bench == "suite":
                for path in plots(doc, Path(args.plots)):
                    print(f"wrote {path}")
    return text


if __name__ == "__main__":
    main()
