"""The sections of ``benchmarks/RESULTS.md`` for result files other than ``run.py``'s (the
JSON under ``benchmarks/results/extra``): bandwidth and compile-latency runs
(``bandwidth.py``), host time (``host_overhead.py``), weight offload, recomputation, schedule
and setting sweeps, CUDA test tiers and hand-recorded findings. ``report.py`` calls
``extra_section`` for each file.
"""

from __future__ import annotations


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _bw_variants(bw: dict) -> list[str]:
    seen: list[str] = []
    for w in bw["workloads"]:
        for v in w["variants"]:
            if v not in seen:
                seen.append(v)
    return seen


def _offload_section(doc: dict, source: str) -> str:
    """benchmarks/offload.py: a DiT stack with weights offloaded, beside all-resident and
    synchronous offload."""
    meta, m = doc["meta"], doc["model"]
    lines = [
        f"## Weight offload: {meta['device']}",
        "",
        f"`benchmarks/offload.py` · torch {meta['torch']} · CUDA {meta['cuda']} · {m['dtype']} · "
        f"commit {meta.get('git_commit', '?')} · date {meta['date']} · source `{source}`",
        "",
        f"DiT-style stack: {m['layers']} blocks, hidden {m['hidden']}, {m['heads']} heads, MLP "
        f"{m['mlp']}x, {m['weight_bytes'] / 1e9:.2f} GB of weights; pinned host-to-device copies "
        f"measured at {doc['link_gbps']:.1f} GB/s. Offloaded variants keep "
        f"{doc['settings']['ratio']:.0%} of the weight bytes resident (BASE: none). Median of "
        f"{doc['settings']['iters']} calls (CUDA events). *Overlap*: the share of the copy time "
        "hidden behind compute, measured (predicted by the plan).",
        "",
        *([doc["note"], ""] if doc.get("note") else []),
    ]
    for c in doc["configs"]:
        vs = c["variants"]
        base = vs.get("magi", {}).get("median_ms")
        rows = []
        for name, r in vs.items():
            if r.get("status") != "ok":
                rows.append(
                    [name, f"{r.get('status')}: `{(r.get('error') or '')[:100]}`"] + [""] * 7
                )
                continue
            rep = r.get("report") or {}
            ms = r["median_ms"]
            overlap = (
                f"{rep['measured_overlap']:.0%} ({rep['predicted_overlap']:.0%})" if rep else "–"
            )
            rows.append([
                name, f"{ms:.2f}", f"{ms / base:.2f}x" if base else "–", f"{r['peak_mib']:,.0f}",
                f"{rep['resident_bytes'] / 1e6:,.0f}" if rep else "–",
                f"{rep['streamed_bytes'] / 1e6:,.0f}" if rep else "–",
                f"{rep['buffer_bytes'] / 2**20:,.0f}" if rep else "–", overlap,
                f"{r['rel_err']:.1e}",
            ])  # fmt: skip
        header = ["variant", "ms", "vs magi all-resident", "peak MiB", "resident MB",
                  "streamed MB", "buffer MiB", "overlap", "error vs eager"]  # fmt: skip
        lines += [f"### {c['tokens']} tokens", "", table(header, rows).rstrip("\n"), ""]
        off = vs.get("offload_cost_effective", {}).get("median_ms")
        sync = vs.get("sync_pageable", {}).get("median_ms")
        pinned = vs.get("sync_pinned", {}).get("median_ms")
        facts = []
        if off and base:
            facts.append(f"COST_EFFECTIVE offload at {off / base:.3f}x all-resident magi")
        if off and sync:
            facts.append(f"{sync / off:.2f}x faster than synchronous pageable offload")
        if off and pinned:
            facts.append(f"{pinned / off:.2f}x faster than synchronous pinned offload")
        hidden = [r["report"]["hidden"] for r in vs.values() if r.get("report")]
        if hidden and not any(hidden):
            facts.append("the plans predict the copies cannot hide here (the regime warning fired)")
        if facts:
            lines += ["; ".join(facts) + ".", ""]
    return "\n".join(lines)


def extra_section(doc: dict, source: str) -> str:
    """Sections for benchmarks/host_overhead.py and benchmarks/bandwidth.py results."""
    if doc.get("benchmark") == "offload":
        return _offload_section(doc, source)
    if doc.get("benchmark") == "host_overhead":
        m = doc["model"]
        lines = [
            f"## Host time per call: {doc['device']}",
            "",
            f"`benchmarks/host_overhead.py` · torch {doc['torch']} · CUDA {doc['cuda']} · "
            f"{doc['dtype']} · date {doc['date']} · source `{source}`",
            "",
            *([doc["note"], ""] if doc.get("note") else []),
            f"{m['class']} ({m['n_layers']} layers, hidden {m['hidden']}, {m['n_heads']}/"
            f"{m['n_kv_heads']} heads, intermediate {m['intermediate']}) at batch {doc['batch']} x "
            f"{doc['tokens']} tokens, {doc['iters']} calls per measurement"
            + (
                f", taking {doc['inputs']} input tensors in turn"
                if doc.get("inputs") is not None
                else ", on one input tensor"
            )
            + ". *Host* is the wall time "
            "of the Python call (the GPU kept from being the bottleneck), *host, GPU busy* the same "
            "with the calls queued behind a sleep kernel instead of a synchronise before each (when "
            "measured), *device* the CUDA-event time of one call, *back-to-back* the mean time of "
            "calls issued without syncs.",
            "",
            "| variant | host µs (median) | host µs (p90) | host, GPU busy µs | device µs | "
            "back-to-back µs | first call s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in doc["results"]:
            if r.get("error"):
                lines.append(f"| {r['label']} | failed: {r['error']} | | | | | |")
                continue
            busy = r.get("host_us_busy")
            lines.append(
                f"| {r['label']} | {r['host_us_median']:.1f} | {r['host_us_p90']:.1f} | "
                f"{'-' if busy is None else f'{busy:.1f}'} | "
                f"{r['device_us_median']:.1f} | {r['back_to_back_us']:.1f} | {r['first_call_s']:.2f} |"
            )
        return "\n".join(lines) + "\n"
    if doc.get("benchmark") == "kernel_sweep":
        return _sweep_section(doc, source)
    if doc.get("benchmark") == "env_sweep":
        return _env_sweep_section(doc, source)
    if doc.get("benchmark") == "recompute":
        return _recompute_section(doc, source)
    if doc.get("benchmark") == "findings":
        return _findings_section(doc, source)
    if doc.get("benchmark") == "gpu_tests":
        lines = [
            f"## CUDA test tier: {doc['device']}",
            "",
            f"torch {doc['torch']} · source `{source}`",
            "",
            "| date | commit | command | result |",
            "|---|---|---|---|",
        ]
        for r in doc["runs"]:
            lines.append(f"| {r['date']} | {r['commit']} | `{r['command']}` | {r['summary']} |")
        return "\n".join(lines + [""] + [f"- {n}" for n in doc.get("notes", [])]) + "\n"
    lines = []
    meta = doc.get("meta", {})
    name = meta.get("device_name", meta.get("device", "?"))
    stamp = f"`benchmarks/bandwidth.py` · torch {meta.get('torch')} · date {meta.get('date')}"
    note = f"\n\n{doc['note']}" if doc.get("note") else ""
    bw = doc.get("bandwidth")
    if bw:
        variants = _bw_variants(bw)
        lines += [
            f"## Generated kernels: effective bandwidth, {name}",
            "",
            f"{stamp} · source `{source}`{note}",
            "",
            f"{bw['rows']} x {bw['cols']} {bw['dtype']}; device copy {bw['copy']['gbps']:,.0f} "
            "GB/s. Bytes read + written at the least (each input and output once), over the "
            "median time.",
            "",
            "| kernel | " + " | ".join(f"{v} GB/s (% of copy)" for v in variants) + " |",
            "|---|" + "---|" * len(variants),
        ]
        for w in bw["workloads"]:
            cells = []
            for v in variants:
                r = w["variants"].get(v, {})
                ok = r.get("status") == "ok"
                cells.append(f"{r['gbps']:,.0f} ({r['pct_of_copy']:.1f}%)" if ok else "–")
            lines.append(f"| {w['workload']} | " + " | ".join(cells) + " |")
        lines.append("")
    latency = doc.get("compile_latency")
    if latency:
        lines += [
            f"## Kernel compile latency: {name}",
            "",
            f"{stamp} · source `{source}`{note}",
            "",
            f"All kernels of one LlamaBlock (hidden {latency['hidden']}, sequence "
            f"{latency['seq']}), each case in a fresh process: *cold* with an empty kernel cache "
            "directory, *warm* loading from the one the cold process filled. *Lowering + "
            "kernels* is magi's part of the first call (import, passes, kernel compiles or "
            "loads, one run less a steady-state run); *capture* is Dynamo and AOTAutograd.",
            "",
            "| case | lowering + kernels s | capture s | first call s | CUDA compiles | disk hits |",
            "|---|---|---|---|---|---|",
        ]
        for case in ("cold", "warm"):
            r = latency.get(case, {})
            if r.get("status") != "ok":
                lines.append(f"| {case} | failed | | | | |")
                continue
            st = r["stats"]
            lines.append(
                f"| {case} | {r['lowering_and_kernels_s']:.3f} | {r['capture_s']:.2f} | "
                f"{r['first_call_s']:.2f} | {st['cuda_compiles']} | {st['disk_hits']} |"
            )
        lines.append("")
    return "\n".join(lines)


def _sweep_section(doc: dict, source: str) -> str:
    meta = doc.get("meta", {})
    lines = [
        f"## Generated kernels: schedule sweep, {meta.get('device_name', '?')}",
        "",
        f"`scripts/gpu/tune_kernels.sh` · torch {meta.get('torch')} · date {meta.get('date')} · "
        f"source `{source}`",
        "",
        "magi_compile's effective bandwidth under each schedule setting, one process per "
        f"setting, as % of the highest device copy of the runs ({doc['copy_gbps']:,.0f} GB/s). "
        "Setting names: per-column input loads (`late`: in the output pass, `row`: with each "
        "row's loads), `k` register chunks per thread, `t` threads per block at most, grid "
        "(`all`: a block per row, `wave`: one wave of persistent blocks); `u` pointwise unroll; "
        "a suffix names another row length. The defaults are `late_k4_t256_all` and `u1_all`.",
        "",
        "| setting | shape | " + " | ".join(doc["workloads"]) + " |",
        "|---|---|" + "---|" * len(doc["workloads"]),
    ]
    for name, s in doc["settings"].items():
        cells = []
        for w in doc["workloads"]:
            c = s["workloads"].get(w)
            if c is None:
                cells.append("–")
            elif c["status"] != "ok":
                cells.append("error")
            else:
                cells.append(f"{c['pct_of_copy']:.1f}%" + ("" if c["correct"] else " ⚠"))
        lines.append(f"| `{name}` | {s['shape']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _findings_section(doc: dict, source: str) -> str:
    """An investigation recorded by hand from a script's printed output (when its JSON did not
    come back from the GPU machine): a title, the scripts, notes and tables of the numbers."""
    meta = doc["meta"]
    lines = [
        f"## {doc['title']}: {meta['device_name']}",
        "",
        f"torch {meta['torch']} · date {meta['date']} · commit {meta['git_commit']} · scripts "
        + ", ".join(f"`{s}`" for s in doc["scripts"])
        + f" · source `{source}`",
        "",
        *[p + "\n" for p in doc.get("notes", [])],
    ]
    for t in doc.get("tables", []):
        lines += [f"**{t['caption']}**", "", table(t["header"], t["rows"]).rstrip("\n"), ""]
    return "\n".join(lines) + "\n"


def _env_sweep_section(doc: dict, source: str) -> str:
    meta = doc.get("meta", {})
    workloads = list(doc["runs"][0]["workloads"])
    lines = [
        f"## Generated kernels: settings measured apart, {meta.get('device_name', '?')}",
        "",
        f"`scripts/gpu/sweep_env.sh` · torch {meta.get('torch')} · date {meta.get('date')} · "
        f"source `{source}`",
        "",
        doc.get("note", ""),
        "",
        "One process per row, in the order run; each cell is magi_compile / torch.compile as % of "
        "that process's copy bandwidth, timed interleaved.",
        "",
        "| setting | shape | " + " | ".join(workloads) + " |",
        "|---|---|" + "---|" * len(workloads),
    ]
    for r in doc["runs"]:
        cells = []
        for w in workloads:
            c = r["workloads"].get(w, {})
            m, t = c.get("magi_compile"), c.get("torch.compile")
            cells.append(f"{m:.1f}% / {t:.1f}%" if m is not None and t is not None else "error")
        lines.append(f"| `{r['setting']}` | {r['shape']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _recompute_section(doc: dict, source: str) -> str:
    """benchmarks/recompute.py: training steps with recomputation, one table pair per model."""
    meta, st = doc.get("meta", {}), doc.get("settings", {})

    def mib(b: float | None) -> str:
        return "–" if b is None else f"{b / 2**20:,.0f}" if b >= 2**24 else f"{b / 2**20:,.2f}"

    def yes(flag: bool | None) -> str:
        return "–" if flag is None else "yes" if flag else "**no**"

    lines = [
        f"## Recomputation in training: {meta.get('device_name', meta.get('device', '?'))}",
        "",
        f"`benchmarks/recompute.py` · torch {meta.get('torch')} · CUDA {meta.get('cuda')} · "
        f"{meta.get('dtype')} · magi_compiler {meta.get('magi_compiler')} (commit "
        f"{meta.get('git_commit')}) · date {meta.get('date')} · source `{source}`",
        "",
        f"One training step (forward, loss `{st.get('loss', '?')}`, backward; no optimizer), "
        f"median of {st.get('steps')} steps after {st.get('warmup')} warm-up. *Act. peak*: "
        "`max_memory_allocated` during a step less what was allocated before it (activations, "
        "backward temporaries and the gradients produced). *Predicted*: the simulated activation "
        "peak of the compiled forward and backward graphs, fusion groups included (before "
        "2026-11-24 evening: the planner's, op by op on the joint graph). *Saved*: bytes autograd saved for the backward (measured through "
        "saved-tensor hooks), beside the plan's. `tc`: torch.compile, `budget b`: its "
        "`activation_memory_budget`; AUTOSEARCH budgets (`AUTOSEARCH f`) are the floor plus f of "
        "the range from the floor (the lowest predicted peak the planner found) to the "
        "no-recompute plan's predicted peak (before 2026-11-24 04:00: f of that peak alone). "
        "Error: worst normwise gradient error against eager.",
        "",
        *([doc["note"], ""] if doc.get("note") else []),
    ]
    for m in doc.get("models", []):
        lines += [f"### {m.get('title', m.get('name'))}: {m.get('shape', '')}", ""]
        if m.get("error"):
            lines += [f"Could not be built: `{m['error'].splitlines()[0][:200]}`", ""]
            continue
        vs = m.get("variants", {})
        tc = vs.get("tc", {}) if vs.get("tc", {}).get("status") == "ok" else {}
        rows = []
        for r in vs.values():
            if r.get("status") != "ok":
                err = (r.get("error") or "").strip().splitlines() or [""]
                rows.append([r.get("label", "?"), f"{r.get('status')}: `{err[0][:120]}`"]
                            + [""] * 8)  # fmt: skip
                continue
            plan = r.get("plan") or {}
            ms, peak = r.get("median_ms"), r.get("act_peak_bytes")
            t_ratio = f"{ms / tc['median_ms']:.2f}×" if ms and tc.get("median_ms") else "–"
            p_ratio = f"{peak / tc['act_peak_bytes']:.2f}×" if peak and tc.get("act_peak_bytes") else "–"  # fmt: skip
            err = r.get("grad_rel_err_max")
            err_text = (
                "–" if err is None else f"{err:.1e}" + (" ⚠" if r.get("correct") is False else "")
            )
            rows.append([
                r.get("label", "?"), f"{ms:.2f}" if ms else "–", t_ratio, mib(peak), p_ratio,
                mib(plan.get("compiled_peak_bytes") or plan.get("predicted_peak_bytes")),
                mib(r.get("saved_bytes_measured")),
                mib(plan.get("saved_bytes")), f"{r.get('first_step_s', 0):.1f}", err_text,
            ])  # fmt: skip
        header = ["variant", "step ms", "time / tc", "act. peak MiB", "peak / tc",
                  "predicted MiB", "saved MiB", "plan saved MiB", "first step s", "error"]  # fmt: skip
        lines.append(table(header, rows))
        derived = m.get("derived", {})
        rows = []
        for name, d in derived.items():
            r = vs.get(name, {})
            same = d.get("tc_same_peak")
            ratio = d.get("time_ratio_vs_tc_same_peak")
            rows.append([
                r.get("label", name), mib(d.get("budget_bytes")), yes(d.get("predicted_fits_budget")),
                yes(d.get("measured_fits_budget")),
                f"{d['measured_over_predicted']:.2f}" if d.get("measured_over_predicted") else "–",
                vs[same]["label"] if same else "none this low" if "tc_same_peak" in d else "–",
                f"{ratio:.2f}×" if ratio else "–",
            ])  # fmt: skip
        if rows:
            on = next(iter(derived.values())).get("matched_on", "act_peak_bytes")
            what = "measured activation peak" if on == "act_peak_bytes" else "measured saved bytes"
            lines += [
                f"Budgets, and the fastest torch.compile variant whose {what} is at most magi's "
                "(time magi / it: below 1 means magi is faster at no more memory):",
                "",
                table(["magi variant", "budget MiB", "predicted fits", "measured fits",
                        "measured / predicted", "tc at ≤ the same peak", "time magi / it"], rows),
            ]  # fmt: skip
    return "\n".join(lines) + "\n"
