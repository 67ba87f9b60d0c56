"""The sections of ``benchmarks/RESULTS.md`` for the sequence-length benchmarks: long-context
prefill (``long_prefill.py``), KV-cache decode (``decode.py``) and range-mask attention
(``attention.py``). ``report_extra.other_section`` calls them.
"""

from __future__ import annotations

from benchmarks.report_extra import _line, table


def _commands(meta: dict, default: str) -> str:
    """The run's command, or each command of a run split with ``--append``, in backticks."""
    commands = meta.get("commands") or [meta.get("command") or default]
    return " + ".join(f"`{c}`" for c in commands)


def long_prefill_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/long_prefill.py: one prefill of 16k to 100k tokens, time and peak memory."""
    meta = doc.get("meta", {})
    labels = {"eager": "eager", "inductor": "torch.compile", "magi": "magi"}
    real = meta.get("size") == "real"
    models = {
        "block": "written-out attention block"
        + (" (hidden 2048, 16 heads, MLP 8192)" if real else " (hidden 64)"),
        "llama": "HF LlamaForCausalLM" + (", Llama-3.2-1B shape" if real else ", tiny config"),
    }
    clock = "CUDA events" if meta.get("device_type") == "cuda" else "host clock"
    lines = [
        f"## {kind}: long-context prefill",
        "",
        stamp,
        "",
        f"{_commands(meta, 'benchmarks/long_prefill.py')} · {meta.get('dtype', '?')} · "
        f"batch 1 · size {meta.get('size', '?')}. One forward over the prompt (the HF model "
        "with `use_cache=False, logits_to_keep=1`); *ms*: median of "
        f"{meta.get('runs', '?')} calls after a warm-up ({clock}); *GiB*: peak allocated "
        "device memory over those calls; *error*: magi's max |magi − eager| over max |eager|; "
        "*floor*: the prefill's matmul FLOPs (linear layers, causal attention at 2·S²·D per "
        "layer) at the bf16 matrix rate measured in the run"
        + (
            f" ({meta['matrix_tflops']:.0f} TFLOP/s)"
            if meta.get("matrix_tflops")
            else " (not measured on the CPU)"
        )
        + ". "
        "Eager runs the HF model's SDPA attention with is_causal, and the block's attention "
        "as written (S x S scores).",
        "",
    ]
    rows = doc.get("rows", [])
    by = {(r["model"], r["tokens"], r["variant"]): r for r in rows}

    def cell(r: dict | None) -> str:
        if r is None:
            return "not run"
        if "error" in r:
            return _line(r["error"], 60)
        peak = f", {r['peak_gib']:.1f} GiB" if "peak_gib" in r else ""
        return f"{r['ms']:.1f} ms{peak}"

    header = ["model", "tokens", "TFLOP", "floor ms", *(labels[v] for v in labels),
              "magi vs torch.compile", "lowest peak", "magi error"]  # fmt: skip
    body = []
    for model, tokens in dict.fromkeys((r["model"], r["tokens"]) for r in rows):
        cells = {v: by.get((model, tokens, v)) for v in labels}
        magi, ind = cells["magi"], cells["inductor"]
        ratio = "–"
        if magi and ind and "ms" in magi and "ms" in ind:
            ratio = f"{ind['ms'] / magi['ms']:.2f}×"
        peaks = {v: c["peak_gib"] for v, c in cells.items() if c and "peak_gib" in c}
        lowest = labels[min(peaks, key=peaks.get)] if peaks else "–"
        err = f"{magi['max_rel_err']:.1e}" if magi and "max_rel_err" in magi else "–"
        flop = next((c["flop"] for c in cells.values() if c and "flop" in c), None)
        rate = meta.get("matrix_tflops")
        floor = f"{flop / (rate * 1e12) * 1e3:.1f}" if flop and rate else "–"
        body.append([models.get(model, model), f"{tokens:,}",
                     f"{flop / 1e12:.1f}" if flop else "–", floor,
                     *(cell(cells[v]) for v in labels), ratio, lowest, err])  # fmt: skip
    lines.append(table(header, body))
    return "\n".join(lines)


def decode_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/decode.py: ms per token of greedy decode with a static KV cache."""
    meta = doc.get("meta", {})
    labels = {"eager": "eager", "inductor": "torch.compile reduce-overhead", "magi": "magi FULL"}
    rows = doc.get("rows", [])
    # The bandwidth each point was measured beside (older rows: the run's, in the meta).
    point_gbps = [r.get("copy_gbps", meta.get("copy_gbps")) for r in rows]
    measured = sorted({round(g) for g in point_gbps if g})
    gbps_text = " to ".join(f"{g:,} GB/s" for g in (measured[:1] + measured[-1:])[: len(measured)])
    model = "HF LlamaForCausalLM, " + (
        "Llama-3.2-1B shape" if meta.get("size") == "real" else "tiny config"
    )
    lines = [
        f"## {kind}: KV-cache decode",
        "",
        stamp,
        "",
        f"{_commands(meta, 'benchmarks/decode.py')} · {model} · {meta.get('dtype', '?')} · "
        f"Hugging Face's StaticCache of *context* slots, all read every step. A {meta.get('prompt', '?')}"
        f"-token prompt, then {meta.get('steps', '?')} greedy steps (`kv_cache.generate`); "
        f"*ms/token*: median over {meta.get('runs', '?')} generations of one step's time "
        "(one synchronisation per generation); *floor*: the bytes a step reads (every weight "
        "once, every cache slot's keys and values) at the copy bandwidth measured in the run"
        + (f" ({gbps_text})" if measured else " (not measured on the CPU)")
        + "; *agree*: the fraction of greedy tokens equal to eager's, reduce-overhead / magi (in bf16 a near tie "
        "between random logits can flip, and the sequences part from there on).",
        "",
    ]
    by = {(r["batch"], r["context"], r["variant"]): r for r in rows}

    def cell(r: dict | None) -> str:
        if r is None:
            return "not run"
        if "error" in r:
            return _line(r["error"], 60)
        return f"{r['ms_per_token']:.3f} ms ({r['tokens_per_s']:,.0f} tok/s)"

    header = ["batch", "context", "floor ms", *labels.values(), "magi vs reduce-overhead",
              "magi vs floor", "agree"]  # fmt: skip

    def agree(r: dict | None) -> str:
        return f"{r['tokens_agree']:.0%}" if r and "tokens_agree" in r else "–"

    body = []
    for batch, context in dict.fromkeys((r["batch"], r["context"]) for r in rows):
        cells = {v: by.get((batch, context, v)) for v in labels}
        magi, ro = cells["magi"], cells["inductor"]
        ok = [c for c in (magi, ro) if c and "ms_per_token" in c]
        ratio = f"{ro['ms_per_token'] / magi['ms_per_token']:.2f}×" if len(ok) == 2 else "–"
        nbytes = next((c["bytes"] for c in cells.values() if c and "bytes" in c), None)
        gbps = next((c.get("copy_gbps") for c in cells.values() if c), None) or meta.get(
            "copy_gbps"
        )
        floor = nbytes / (gbps * 1e9) * 1e3 if nbytes and gbps else None
        vs_floor = "–"
        if floor and magi and "ms_per_token" in magi:
            vs_floor = f"{magi['ms_per_token'] / floor:.2f}×"
        body.append([str(batch), f"{context:,}", f"{floor:.3f}" if floor else "–",
                     *(cell(cells[v]) for v in labels), ratio, vs_floor,
                     f"{agree(ro)} / {agree(magi)}"])  # fmt: skip
    lines.append(table(header, body))
    return "\n".join(lines)


def attention_section(doc: dict, kind: str, stamp: str) -> str:
    """benchmarks/attention.py: range_attention's TFLOP/s per mask against PyTorch's kernels."""
    meta = doc.get("meta", {})
    labels = {"magi": "magi", "cudnn": "cuDNN SDPA", "flash": "flash SDPA",
              "varlen": "varlen_attn", "flex": "FlexAttention"}  # fmt: skip
    lines = [
        f"## {kind}: range-mask attention",
        "",
        stamp,
        "",
        f"{_commands(meta, 'benchmarks/attention.py')} · {meta.get('dtype', '?')} · "
        f"{meta.get('heads', '?')} heads of {meta.get('head_dim', '?')} · packed tokens, one "
        "sequence. Cells: forward / backward TFLOP/s (FlashAttention's convention: 4 × visible "
        "pairs × head dim × heads forward, 2.5× that backward), from the median of "
        f"{meta.get('runs', '?')} calls each; *vs best*: magi over the fastest other variant "
        "that ran, forward / backward. Beside magi's numbers, where recorded, the kernels it ran "
        "forward / backward (cuDNN, flash in one call or in N calls merged, or the portable "
        "path). Masks and variants: `benchmarks/attention.py`.",
        "",
    ]
    rows = doc.get("rows", [])
    by = {(r["mask"], r["tokens"], r["variant"]): r for r in rows}
    variants = [v for v in labels if any(r["variant"] == v for r in rows)]

    def cell(r: dict | None) -> str:
        if r is None:
            return "–"
        if "error" in r:
            return _line(r["error"], 40)
        kernels = f" ({r['kernels']})" if "kernels" in r else ""
        return f"{r['forward_tflops']:.0f} / {r['backward_tflops']:.0f}{kernels}"

    def versus(magi: dict | None, others: list[dict], key: str) -> str:
        best = max((o[key] for o in others if key in o), default=None)
        if not magi or key not in magi or not best:
            return "–"
        return f"{magi[key] / best:.2f}×"

    body = []
    for mask, tokens in dict.fromkeys((r["mask"], r["tokens"]) for r in rows):
        cells = {v: by.get((mask, tokens, v)) for v in variants}
        others = [c for v, c in cells.items() if v != "magi" and c]
        magi = cells.get("magi")
        ratio = (
            f"{versus(magi, others, 'forward_tflops')} / {versus(magi, others, 'backward_tflops')}"
        )
        body.append(
            [mask.replace("_", " "), f"{tokens:,}", *(cell(cells[v]) for v in variants), ratio]
        )
    lines.append(table(["mask", "tokens", *(labels[v] for v in variants), "vs best"], body))
    return "\n".join(lines)
