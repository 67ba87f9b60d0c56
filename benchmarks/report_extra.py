"""The sections of ``benchmarks/RESULTS.md`` for the benchmarks other than ``run.py``'s suite:
generated kernels' bandwidth and compile latency (``bandwidth.py``), host time per call
(``host_overhead.py``), recomputation in training (``recompute.py``), weight offload
(``offload.py``), the model zoo (``zoo.py``) and the warm start (``warm_start.py``); the
sequence-length benchmarks' sections are in ``report_sequences.py``. ``report.py`` picks the
runs and calls ``other_section`` for each.
"""

from __future__ import annotations


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def other_section(bench: str, doc: dict, kind: str, stamp: str, profile: dict | None = None) -> str:
    """One section of RESULTS.md: ``bench`` names the script, ``kind`` the device kind and
    ``stamp`` the line with device, torch version, date, commit and source file; ``profile``:
    the same device kind's ``tools/kernel_profile.py --zoo`` result, which explains slower zoo rows."""
    from benchmarks import report_sequences  # it uses this module's table and _line

    if bench == "zoo":
        return _zoo_section(doc, kind, stamp, profile)
    sections = {
        "bandwidth": _bandwidth_section,
        "host_overhead": _host_section,
        "recompute": _recompute_section,
        "offload": _offload_section,
        "zoo": _zoo_section,
        "zoo_profile": _zoo_profile_section,
        "warm_start": _warm_start_section,
        "long_prefill": report_sequences.long_prefill_section,
        "decode": report_sequences.decode_section,
        "attention": report_sequences.attention_section,
    }
    return sections[bench](doc, kind, stamp)


def _host_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/host_overhead.py: host time per call of a small-batch stack."""
    m = doc["model"]
    lines = [
        f"## {kind}: host time per call",
        "",
        stamp,
        "",
        f"`benchmarks/host_overhead.py` · {doc['dtype']}. {m['class']} ({m['n_layers']} layers, "
        f"hidden {m['hidden']}, {m['n_heads']}/{m['n_kv_heads']} heads, intermediate "
        f"{m['intermediate']}) at batch {doc['batch']} x {doc['tokens']} tokens, {doc['iters']} "
        "calls per measurement"
        + (
            f", taking {doc['inputs']} input tensors in turn"
            if doc.get("inputs") is not None
            else ", on one input tensor"
        )
        + ". *Host* is the wall time of the Python call (the GPU kept from being the bottleneck), "
        "*host, GPU busy* the same with the calls queued behind a sleep kernel instead of a "
        "synchronise before each, *device* the CUDA-event time of one call, *back-to-back* the "
        "mean time of calls issued without syncs. A variant named twice was measured twice, in "
        "the order listed: the first variant measured in a process tends to run slower.",
        "",
    ]
    header = ["variant", "host µs (median)", "host µs (p90)", "host, GPU busy µs", "device µs",
              "back-to-back µs", "first call s"]  # fmt: skip
    rows = []
    for r in doc["results"]:
        if r.get("error"):
            rows.append([r["label"], f"failed: {r['error']}"] + [""] * 5)
            continue
        busy = r.get("host_us_busy")
        rows.append([
            r["label"], f"{r['host_us_median']:.1f}", f"{r['host_us_p90']:.1f}",
            "–" if busy is None else f"{busy:.1f}", f"{r['device_us_median']:.1f}",
            f"{r['back_to_back_us']:.1f}", f"{r['first_call_s']:.2f}",
        ])  # fmt: skip
    return "\n".join(lines) + "\n" + table(header, rows)


def _bandwidth_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/bandwidth.py: generated kernels against the device copy; compile latency."""
    lines = []
    bw = doc.get("bandwidth")
    if bw:
        variants = _bw_variants(bw)
        lines += [
            f"## {kind}: generated kernels' bandwidth",
            "",
            stamp,
            "",
            f"`benchmarks/bandwidth.py` · {bw['rows']} x {bw['cols']} {bw['dtype']}; device copy "
            f"{bw['copy']['gbps']:,.0f} GB/s. Bytes read + written at the least (each input and "
            "output once), over the median time.",
            "",
        ]
        rows = []
        for w in bw["workloads"]:
            cells = []
            for v in variants:
                r = w["variants"].get(v, {})
                ok = r.get("status") == "ok"
                cells.append(f"{r['gbps']:,.0f} ({r['pct_of_copy']:.1f}%)" if ok else "–")
            rows.append([w["workload"]] + cells)
        lines.append(table(["kernel"] + [f"{v} GB/s (% of copy)" for v in variants], rows))
    latency = doc.get("compile_latency")
    if latency:
        lines += [
            f"## {kind}: kernel compile latency",
            "",
            stamp,
            "",
            f"All kernels of one LlamaBlock (hidden {latency['hidden']}, sequence "
            f"{latency['seq']}), each case in a fresh process: *cold* with an empty kernel cache "
            "directory, *warm* loading from the one the cold process filled. *Lowering + "
            "kernels* is magi's part of the first call (import, passes, kernel compiles or "
            "loads, one run less a steady-state run); *capture* is Dynamo and AOTAutograd.",
            "",
        ]
        rows = []
        for case in ("cold", "warm"):
            r = latency.get(case, {})
            if r.get("status") != "ok":
                rows.append([case, "failed", "", "", "", ""])
                continue
            st = r["stats"]
            rows.append([
                case, f"{r['lowering_and_kernels_s']:.3f}", f"{r['capture_s']:.2f}",
                f"{r['first_call_s']:.2f}", str(st["cuda_compiles"]), str(st["disk_hits"]),
            ])  # fmt: skip
        header = ["case", "lowering + kernels s", "capture s", "first call s", "CUDA compiles",
                  "disk hits"]  # fmt: skip
        lines.append(table(header, rows))
    return "\n".join(lines)


def _bw_variants(bw: dict) -> list[str]:
    seen: list[str] = []
    for w in bw["workloads"]:
        for v in w["variants"]:
            if v not in seen:
                seen.append(v)
    return seen


def _offload_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/offload.py: a DiT stack with weights offloaded, beside all-resident and
    synchronous offload."""
    m = doc["model"]
    lines = [
        f"## {kind}: weight offload",
        "",
        stamp,
        "",
        f"`benchmarks/offload.py` · {m['dtype']}. DiT-style stack: {m['layers']} blocks, hidden "
        f"{m['hidden']}, {m['heads']} heads, MLP {m['mlp']}x, {m['weight_bytes'] / 1e9:.2f} GB of "
        f"weights; pinned host-to-device copies measured at {doc['link_gbps']:.1f} GB/s. One call "
        "is one forward at batch 1. Offloaded variants keep "
        f"{doc['settings']['ratio']:.0%} of the weight bytes resident (BASE: none) and run their "
        "calibration calls before the timing; `sync_pageable` copies each block's weights from "
        "ordinary CPU memory right before the block runs (a plain CPU offload), `sync_pinned` the "
        f"same from pinned memory. Median of {doc['settings']['iters']} calls (CUDA events). "
        "*Peak*: `max_memory_allocated` during one call less what was allocated before the "
        "variant was built. *Overlap*: the share of the copy time hidden behind compute, measured "
        "(predicted by the plan).",
        "",
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


def _recompute_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/recompute.py: training steps with recomputation, one table pair per model."""
    meta, st = doc.get("meta", {}), doc.get("settings", {})

    def mib(b: float | None) -> str:
        return "–" if b is None else f"{b / 2**20:,.0f}" if b >= 2**24 else f"{b / 2**20:,.2f}"

    def yes(flag: bool | None) -> str:
        return "–" if flag is None else "yes" if flag else "**no**"

    lines = [
        f"## {kind}: recomputation in training",
        "",
        stamp,
        "",
        f"`{meta.get('command')}` · {meta.get('dtype')}. One training step (forward, loss "
        f"`{st.get('loss', '?')}`, backward; no optimizer), median of {st.get('steps')} steps "
        f"after {st.get('warmup')} warm-up. *Act. peak*: `max_memory_allocated` during a step less "
        "what was allocated before it (activations, backward temporaries and the gradients "
        "produced). *Predicted*: the simulated activation peak of the compiled forward and "
        "backward graphs, fusion groups included. *Saved*: bytes autograd saved for the backward "
        "(measured through saved-tensor hooks), beside the plan's. `tc`: torch.compile, "
        "`budget b`: its `activation_memory_budget`; AUTOSEARCH budgets (`AUTOSEARCH f`) are the "
        "floor plus f of the range from the floor (the lowest predicted peak the planner found) "
        "to the no-recompute plan's predicted peak. Error: worst normwise gradient error against "
        "eager.",
        "",
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


# --------------------------------------------------------------------------------------------
# benchmarks/zoo.py
# --------------------------------------------------------------------------------------------

ZOO_FAMILIES = ("llama", "qwen3", "gpt2", "bert", "vit", "t5")  # zoo_models.FAMILIES
ZOO_SCENARIOS = ("whole", "layers", "cache")
ZOO_WITHOUT_CACHE = ("bert", "vit")  # zoo_models.FAMILIES' has_cache=False
ZOO_LABELS = {
    "eager": "eager",
    "inductor": "torch.compile",
    "inductor_ro": "reduce-overhead",
    "magi": "magi",
    "magi_cg": "magi CUDA graphs",
}
# (magi variant, its torch.compile counterpart): ratio = counterpart ms / magi ms.
ZOO_PAIRS = (("magi", "inductor"), ("magi_cg", "inductor_ro"))


def zoo_gaps(doc: dict) -> list[str]:
    """The family scenarios a ``zoo.py`` file has no row for (a family with no row at all and
    no recorded failure: the whole family), in table order."""
    done = {(r.get("model"), r.get("scenario")) for r in doc.get("rows", [])}
    failed = {f.get("model") for f in doc.get("failures", [])}
    gaps = []
    for family in ZOO_FAMILIES:
        if family in failed:
            continue
        wanted = [s for s in ZOO_SCENARIOS if s != "cache" or family not in ZOO_WITHOUT_CACHE]
        missing = [s for s in wanted if (family, s) not in done]
        if len(missing) == len(wanted):
            gaps.append(f"{family} (every scenario)")
        elif missing:
            gaps.append(f"{family} {', '.join(missing)}")
    return gaps


def _line(text: object, limit: int = 200) -> str:
    """One line of ``text`` for a table cell or a list item, at most ``limit`` characters."""
    flat = " ".join(str(text).split()).replace("|", "/").replace("`", "'")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _first_line(text: object) -> str:
    """The first line of an error, or where Dynamo wraps a backend's error ("... raised:"), the
    wrapped one's first line (after zoo.py's "build: " or "timing: ")."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()] or [""]
    if lines[0].endswith(" raised:") and len(lines) > 1:
        stage = lines[0].split(": ", 1)[0]
        return (f"{stage}: " if stage in ("build", "timing") else "") + lines[1]
    return lines[0]


def _zoo_ms(rec: dict | None) -> float | None:
    return rec.get("ms") if rec and "error" not in rec else None


def _zoo_ms_cell(rec: dict | None) -> str:
    if rec is None:
        return "–"
    if "error" in rec:
        return "failed"
    return f"{rec['ms']:.3f}" if rec.get("ms") is not None else "–"


def _zoo_ratio(base: float | None, magi: float | None) -> str:
    if not base or not magi:
        return "–"
    text = f"{base / magi:.2f}"
    return f"{text}×" + (" **slower**" if float(text) < 1.0 else "")


def _zoo_fallbacks(rec: dict | None) -> str:
    if not rec or "fallbacks" not in rec:
        return "–"
    if not rec["fallbacks"]:
        return "0"
    reasons = "; ".join(rec.get("fallback_reasons") or [])
    return _line(f"{rec['fallbacks']}: {reasons}" if reasons else rec["fallbacks"], 160)


def _zoo_order(row: dict) -> tuple:
    model, scenario = row.get("model"), row.get("scenario")
    return (
        ZOO_FAMILIES.index(model) if model in ZOO_FAMILIES else len(ZOO_FAMILIES),
        str(model),
        str(row.get("size")),
        ZOO_SCENARIOS.index(scenario) if scenario in ZOO_SCENARIOS else len(ZOO_SCENARIOS),
        str(scenario),
        row.get("batch") or 0,
    )


def _zoo_failures(doc: dict, rows: list[dict]) -> list[str]:
    """Each failure once: a variant's error with the scenarios and batches it hit (the
    baselines are shared by the whole and layers rows), then the models that could not run."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        for v, rec in r.get("variants", {}).items():
            if rec.get("error"):
                key = (r.get("model"), ZOO_LABELS.get(v, v), _line(_first_line(rec["error"])))
                where = f"{r.get('scenario')} b{r.get('batch')}"
                if where not in seen.setdefault(key, []):
                    seen[key].append(where)
    out = [f"**{m}** {v} ({', '.join(w)}): `{e}`" for (m, v, e), w in seen.items()]
    for f in doc.get("failures", []):
        out.append(f"**{f.get('model')}** could not be run: `{_line(_first_line(f.get('error')))}`")
    return out


def _why_slower(rec: dict, pair: tuple[str, str], profile: dict | None) -> str | None:
    """Why magi's variant of a zoo row is slower than its counterpart, from the profile of the
    same row: GPU time per kernel kind, or a GPU left waiting on the host."""
    if profile is None:
        return None
    key = (rec.get("model"), rec.get("scenario"), rec.get("batch"))
    row = next(
        (r for r in profile.get("rows", []) if (r["model"], r["scenario"], r["batch"]) == key),
        None,
    )
    variants = (row or {}).get("variants", {})
    mine, theirs = variants.get(pair[0]), variants.get(pair[1])
    if mine is None or theirs is None:
        return None
    busy, other = mine["busy_us"] / 1e3, theirs["busy_us"] / 1e3
    text = (
        f"GPU busy {busy:.3f} vs {other:.3f} ms, wall {mine['wall_us'] / 1e3:.3f} vs "
        f"{theirs['wall_us'] / 1e3:.3f} ms, {mine['kernels_per_step']:.0f} vs "
        f"{theirs['kernels_per_step']:.0f} kernels"
    )
    if busy <= other * 1.02:
        idle = mine["idle_us"] / 1e3
        return text + f": the GPU waits on the host ({idle:.3f} ms idle between kernels)"
    gaps = sorted(
        ((mine["kinds_us"].get(k, 0.0) - theirs["kinds_us"].get(k, 0.0)) / 1e3, k)
        for k in PROFILE_KINDS
    )
    worse = [f"{k} +{d:.3f} ms" for d, k in reversed(gaps) if d > 0.005][:3]
    return text + ("; more GPU time in " + ", ".join(worse) if worse else "")


def _zoo_section(doc: dict, kind: str, stamp: str, profile: dict | None = None) -> str:
    """benchmarks/zoo.py: Hugging Face models as users bring them, magi_compile beside eager and
    torch.compile, one row per model, scenario and batch."""
    meta = doc.get("meta", {})
    rows = sorted(doc.get("rows", []), key=_zoo_order)
    present = {v for r in rows for v in r.get("variants", {})}
    vs = [v for v in ZOO_LABELS if v in present]
    pairs = [(m, t) for m, t in ZOO_PAIRS if m in vs and t in vs]
    sizes = sorted({str(r.get("size")) for r in rows})
    lines = [
        f"## {kind}: model zoo",
        "",
        stamp,
        "",
        f"`{meta.get('command')}` (the latest write: a run split with `--models` and `--append` "
        f"gathers its rows in one file) · {meta.get('dtype')} · transformers "
        f"{meta.get('transformers')}. Hugging Face models built from their configs with random "
        "weights (`benchmarks/zoo_models.py`: Llama-3.2-1B, Qwen3-0.6B, GPT-2, BERT-base, "
        f"ViT-base and T5-small shapes; size {', '.join(sizes) or '?'}), one forward per call "
        "with keyword arguments. *whole*: `magi_compile(model)`; *layers*: the layer class "
        "decorated; *cache*: a prefill with `use_cache=True`. torch.compile and reduce-overhead "
        "compile the whole model with the scenario's call. Each variant's first call at each "
        "batch (capture and compile included, host clock; batch 1 first) is checked against "
        "eager, then the variants are timed in interleaved rounds: median ms per call. "
        "*Captures*, *fallbacks* (entries running eagerly, with the reason) and *first call*: "
        "magi's at that batch; *magi error*: max |magi − eager| over max |eager|, worst output "
        "tensor."
        + (
            " Ratios: "
            + " and ".join(f"{ZOO_LABELS[t]} ms / {ZOO_LABELS[m]} ms" for m, t in pairs)
            + ", above 1.00× magi is faster; **slower** marks where it is not."
            if pairs
            else ""
        ),
        "",
    ]
    header = ["model", "scenario", "batch", "captures", "fallbacks", "magi error",
              "magi first call s"] + [f"{ZOO_LABELS[v]} ms" for v in vs]  # fmt: skip
    header += [f"{ZOO_LABELS[m]} vs {ZOO_LABELS[t]}" for m, t in pairs]
    body = []
    reasons: list[str] = []  # slower rows the profile explains
    unprofiled: list[str] = []
    slower = {m: [0, 0] for m, _ in pairs}  # magi variant: [rows slower, rows compared]
    for r in rows:
        rec = r.get("variants", {})
        magi = rec.get("magi") or {}
        fallbacks = _zoo_fallbacks(rec.get("magi"))
        cg = _zoo_fallbacks(rec.get("magi_cg"))
        if cg not in ("–", "0", fallbacks):
            fallbacks = _line(f"{fallbacks} · CUDA graphs: {cg}", 200)
        err, first = magi.get("rel_err"), magi.get("first_call_s")
        model = r.get("model", "?") + (f" ({r.get('size')})" if len(sizes) > 1 else "")
        row = [
            model, str(r.get("scenario", "?")), str(r.get("batch", "?")),
            str(magi.get("captures", "–")), fallbacks,
            "–" if err is None else f"{err:.1e}", "–" if first is None else f"{first:.2f}",
        ]  # fmt: skip
        row += [_zoo_ms_cell(rec.get(v)) for v in vs]
        for m, t in pairs:
            cell = _zoo_ratio(_zoo_ms(rec.get(t)), _zoo_ms(rec.get(m)))
            row.append(cell)
            if cell != "–":
                slower[m][1] += 1
                slower[m][0] += "slower" in cell
        body.append(row)
        for m, t in pairs:
            if "slower" in row[len(row) - len(pairs) + pairs.index((m, t))]:
                why = _why_slower(r, (m, t), profile)
                label = f"**{r.get('model')} {r.get('scenario')} b{r.get('batch')}**"
                vs_ = f"{ZOO_LABELS[m]} vs {ZOO_LABELS[t]}"
                if why is not None:
                    reasons.append(f"- {label}, {vs_}: {why}.")
                else:
                    unprofiled.append(f"{r.get('model')} {r.get('scenario')} b{r.get('batch')}")
    lines.append(table(header, body))
    summary = [
        f"{ZOO_LABELS[m]} is slower than {ZOO_LABELS[t]} in {slower[m][0]} of {slower[m][1]} "
        "rows compared"
        for m, t in pairs
    ]
    if summary:
        lines += ["; ".join(summary) + ".", ""]
    if reasons:
        lines += [
            "Where the slower rows lose (`tools/kernel_profile.py --zoo`, section below):",
            "",
        ]
        lines += reasons + [""]
    if unprofiled and profile is not None:
        lines += [f"Slower rows not profiled: {', '.join(dict.fromkeys(unprofiled))}.", ""]
    commits: dict[str, list[str]] = {}
    for r in rows:
        where = f"{r.get('model')} {r.get('scenario')}"
        seen = commits.setdefault(r.get("git_commit") or meta.get("git_commit") or "?", [])
        if where not in seen:
            seen.append(where)
    if len(commits) > 1:
        lines += [
            "Rows measured at different commits: "
            + "; ".join(f"{c}: {', '.join(w)}" for c, w in commits.items())
            + ".",
            "",
        ]
    gaps = zoo_gaps(doc)
    if gaps:
        lines += [f"Not measured in this run: {'; '.join(gaps)}.", ""]
    fails = _zoo_failures(doc, rows)
    lines += ["### Failures", ""]
    lines += [f"- {x}" for x in fails] if fails else ["- none in this run"]
    return "\n".join(lines) + "\n"


PROFILE_KINDS = ("GEMM", "attention", "generated", "copy", "other")


def _short_kernel(name: str, limit: int = 60) -> str:
    """A kernel's name without template arguments and namespaces, for a table cell."""
    base = name.split("<", 1)[0].split("(", 1)[0].strip()
    base = base.rsplit("::", 1)[-1] or name
    return _line(base.replace("|", "/"), limit)


def _zoo_profile_section(doc: dict, kind: str, stamp: str) -> str:
    """tools/kernel_profile.py --zoo: where the GPU time of zoo rows goes, per variant."""
    meta = doc.get("meta", {})
    lines = [
        f"## {kind}: model zoo, where the GPU time goes",
        "",
        stamp,
        "",
        f"`{meta.get('command')}` · torch.profiler over {meta.get('steps', '?')} calls of the "
        "zoo's call at that batch, after a warm-up, per call. *Wall*: CUDA events around one "
        "call; *GPU busy*: the sum of kernel times; *idle*: gaps of more than 3 µs between "
        "kernels. GPU ms per kernel kind by name: *GEMM* (cuBLAS/CUTLASS), *attention* (SDPA's "
        "flash, memory-efficient and cuDNN kernels), *generated* (magi_compile's fused kernels, "
        "Inductor's Triton kernels), *copy*, *other* (ATen's own elementwise, reduction, index "
        "and norm kernels). A call whose wall time is well above its GPU busy time is waiting "
        "on the host.",
        "",
    ]
    header = ["model", "scenario", "batch", "variant", "wall ms", "GPU busy ms", "idle ms",
              "kernels"] + [f"{k} ms" for k in PROFILE_KINDS] + ["largest kernel"]  # fmt: skip
    body = []
    for r in doc.get("rows", []):
        for name, t in r.get("variants", {}).items():
            kinds = t.get("kinds_us", {})
            top = (t.get("kernels") or [{}])[0]
            largest = (
                f"{_short_kernel(top['name'])} {top['us'] / 1e3:.3f} ms × {top['calls']:.0f}"
                if top
                else "–"
            )
            body.append(
                [str(r.get("model")), str(r.get("scenario")), str(r.get("batch")),
                 ZOO_LABELS.get(name, name), f"{t['wall_us'] / 1e3:.3f}",
                 f"{t['busy_us'] / 1e3:.3f}", f"{t['idle_us'] / 1e3:.3f}",
                 f"{t['kernels_per_step']:.0f}"]
                + [f"{kinds.get(k, 0.0) / 1e3:.3f}" for k in PROFILE_KINDS]
                + [largest]
            )  # fmt: skip
    lines.append(table(header, body))
    return "\n".join(lines) + "\n"


def _warm_start_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/warm_start.py: the first call in a fresh process, cold and warm caches."""
    meta = doc.get("meta", {})
    labels = {"magi": "magi_compile", "inductor": "torch.compile"}
    models = {
        "stack": "4-layer Llama stack",
        "llama": "HF LlamaForCausalLM",
        "stack_train": "4-layer Llama stack, training step",
    }
    lines = [
        f"## {kind}: warm start",
        "",
        stamp,
        "",
        f"`benchmarks/warm_start.py` (size {meta.get('size', '?')}; real: hidden 2048, the HF "
        "model at the Llama-3.2-1B shape; tiny: hidden 64): the first compiled call of "
        "a fresh process (host clock, synchronised; capture, compile or cache load included), "
        "with empty caches (cold) and with the caches the cold process left (warm): "
        "magi_compile's compiled-module cache (docs/cache.md) and torch.compile's own on-disk "
        "caches (Inductor's FX graph cache and AOTAutograd's cache; Dynamo traces again). "
        "The training step is a forward and the backward of the output's sum. "
        "*steady*: median of the next 20 calls; *error*: max |compiled − eager| over max "
        "|eager| in the warm process; *captures/compiles*: magi's in the warm process."
        + (
            " This machine's Python has no cached bytecode for torch (no .pyc): every module a "
            "first call imports is compiled from source, in both compilers' columns."
            if meta.get("bytecode_cached") is False
            else ""
        )
        + (
            f" This run measured {', '.join(sorted(labels[c] for c in compilers))} only."
            if (compilers := {r["compiler"] for r in doc.get("rows", [])}) != set(labels)
            else ""
        ),
        "",
    ]
    header = ["model", "compiler", "cold first call s", "warm first call s", "warm / cold",
              "warm vs torch.compile warm", "steady ms (warm)", "error", "captures/compiles",
              "entry"]  # fmt: skip
    rows = doc.get("rows", [])
    warm_of = {(r["model"], r["compiler"]): r.get("warm", {}).get("first_call_s") for r in rows}
    body = []
    for r in rows:
        cold, warm = r.get("cold", {}), r.get("warm", {})
        if "error" in cold or "error" in warm:
            why = _line(" ".join(cold.get("error") or warm.get("error") or ["?"]), 120)
            body.append([models.get(r["model"], r["model"]), labels.get(r["compiler"], "?"),
                         f"failed: {why}", "", "", "", "", "", "", ""])  # fmt: skip
            continue
        c, w = cold["first_call_s"], warm["first_call_s"]
        other = warm_of.get((r["model"], "inductor"))
        versus = f"{w / other:.2f}×" if r["compiler"] == "magi" and other else "–"
        counters = warm.get("counters", {})
        cc = (
            f"{counters.get('captures')}/{counters.get('compiles')}"
            if r["compiler"] == "magi"
            else "–"
        )
        size = r.get("entry_bytes")
        body.append([
            models.get(r["model"], r["model"]), labels.get(r["compiler"], r["compiler"]),
            f"{c:.2f}", f"{w:.2f}", f"{w / c:.2f}", versus, f"{warm['steady_ms']:.3f}",
            f"{warm['max_rel_error']:.1e}", cc,
            "–" if not size else f"{size / 2**20:.1f} MiB",
        ])  # fmt: skip
    lines.append(table(header, body))
    if not meta.get("complete", True):
        done = {(r["model"], r["compiler"]) for r in rows}
        asked = [tuple(p) for p in meta.get("pairs", [])] or [
            (m, c) for m in dict.fromkeys(r["model"] for r in rows) for c in labels
        ]
        missing = [f"{models.get(m, m)} {labels.get(c, c)}" for m, c in asked if (m, c) not in done]
        if missing:
            lines += [f"Not measured (the run was cut short): {'; '.join(missing)}."]
    return "\n".join(lines) + "\n"
