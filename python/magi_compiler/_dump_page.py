"""The index page of a compile dump: one static HTML file (no scripts, nothing fetched) that
links every file of the dump, shows the final graph of each lowered graph inline and sums up
the compile. Rendered by :meth:`magi_compiler._dump.Report.write_all`."""

from __future__ import annotations

import collections
import datetime
import html
import os
import re
from typing import Any

import torch

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1240px; padding: 16px 24px;
       color: #222; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 2px; } h2 { font-size: 18px; margin: 28px 0 8px;
  border-bottom: 1px solid #ddd; padding-bottom: 4px; } h3 { font-size: 15px; margin: 16px 0 6px; }
.meta { color: #666; margin: 0 0 8px; }
nav a { margin-right: 14px; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #d4d4d4; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f7f7f7; border: 1px solid #e2e2e2; padding: 8px; overflow: auto; max-height: 420px; }
figure.graph { margin: 6px 0; border: 1px solid #ddd; overflow: auto; max-height: 820px; }
figure.graph svg { display: block; height: auto; }
.bar { display: inline-block; height: 10px; background: #4a90d9; vertical-align: middle; }
.error { background: #fde9e9; border: 1px solid #e06666; padding: 8px; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 8px; border: 1px solid #999;
  border-radius: 4px; font-size: 12px; }
details { margin: 4px 0; } .note { color: #666; }
td.src { white-space: nowrap; font-size: 12px; color: #444; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _link(path: str, text: str | None = None) -> str:
    return f'<a href="{_e(path)}">{_e(text or path)}</a>'


def _inline_svg(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            svg = f.read()
    except OSError:
        return None
    svg = svg[svg.find("<svg") :]
    # Fit the page's width (never wider than the picture's own size); the figure scrolls.
    match = re.match(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg)
    if match:
        svg = f'<svg width="100%" style="max-width:{match.group(1)}pt"' + svg[match.end() :]
    return svg


def _picture(directory: str, base: str, inline: bool) -> str:
    """A snapshot's picture: its SVG (inline or as <img>), or its DOT text without Graphviz."""
    svg_path = os.path.join(directory, base + ".svg")
    if os.path.exists(svg_path):
        if inline:
            svg = _inline_svg(svg_path)
            if svg is not None:
                return f'<figure class="graph">{svg}</figure>'
        return f'<figure class="graph"><img loading="lazy" src="{_e(base)}.svg" alt="{_e(base)}"></figure>'
    try:
        with open(os.path.join(directory, base + ".dot"), encoding="utf-8") as f:
            dot = f.read()
    except OSError:
        return '<p class="note">no picture</p>'
    return (
        '<p class="note">Graphviz\'s <code>dot</code> was not on PATH: the picture is shown as '
        "DOT (render it with <code>dot -Tsvg</code>).</p>"
        f'<figure class="graph"><pre class="dot">{_e(dot)}</pre></figure>'
    )


def _summary(report: Any) -> str:
    rows = []
    for lo in report.lowerings:
        s = lo.summary()
        if "ir_nodes" not in s:
            continue
        boundary = ", ".join(sorted(set(s["boundary_ops"]))) or "-"
        kernels = s["kernels_compiled"] if lo.first_run is not None else "after first run"
        rows.append(
            f"<tr><td>{_e(s['kind'])}</td><td class=num>{s['ir_nodes']}</td>"
            f"<td class=num>{s['pieces']} / {s['piece_calls']}</td><td>{_e(boundary)}</td>"
            f"<td class=num>{s['fusion_groups']}</td><td class=num>{s['fused_ops']}</td>"
            f"<td class=num>{_e(kernels)}</td><td class=num>{len(s['aten_fallbacks'])}</td>"
            f"<td class=num>{s['operator_calls']}</td><td class=num>{s['lowering_ms']:.1f}</td></tr>"
        )
    total = f"{report.total_ms:.1f} ms" if report.total_ms is not None else "unfinished"
    return (
        '<table id="summary"><tr><th>graph</th><th>IR nodes</th><th>pieces / piece calls</th>'
        "<th>boundary ops</th><th>fusion groups</th><th>ops fused</th><th>kernels compiled</th>"
        "<th>ATen calls (not fused)</th><th>dispatcher calls per run</th><th>lowering ms</th></tr>"
        + "".join(rows)
        + f'</table><p>Compile time: <b id="compile-time">{total}</b> '
        "(Dynamo capture to the backend's return; see the timeline).</p>"
    )


def _graphs(report: Any) -> str:
    out = [
        '<p class="legend"><span style="background:#fff">ATen call</span>'
        '<span style="background:#f4cccc;border-color:#c00">subgraph boundary</span>'
        '<span style="background:#fce5cd">custom op</span>'
        '<span style="background:#ffe0b2;border-color:#e65100">fused kernel (cluster)</span>'
        '<span style="background:#dbe9f6">piece (cluster, and its calls)</span>'
        f"detail: <code>{_e(report.detail)}</code></p>"
    ]
    for lo in report.lowerings:
        if not lo.snapshots:
            continue
        stage, base = lo.snapshots[-1]
        out.append(f"<h3>{_e(lo.kind)} graph after {_e(stage)}</h3>")
        out.append(_picture(report.dir, base, inline=True))
        items = []
        for stage, base in lo.snapshots:
            files = " ".join(
                _link(base + ext, ext[1:])
                for ext in (".txt", ".dot", ".svg")
                if os.path.exists(os.path.join(report.dir, base + ext))
            )
            items.append(
                f"<details><summary>{_e(stage)}: {files}</summary>"
                f"{_picture(report.dir, base, inline=False)}</details>"
            )
        out.append(
            f"<p>Our IR after import and after each pass that changed it "
            f"(ATen graph: {_link(lo.aten_file)}):</p>" + "".join(items)
        )
    return "".join(out) or '<p class="note">no graph was lowered</p>'


def _fallbacks(report: Any) -> str:
    rows = []
    for lo in report.lowerings:
        groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
        for f in lo.summary().get("aten_fallbacks", []):
            groups[(f["op"], f["reason"])].append(f)
        for (op, reason), calls in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            sources = sorted({c["source"] for c in calls if c["source"]})
            shown = "<br>".join(_e(s) for s in sources[:2])
            if len(sources) > 2:
                shown += f"<br>and {len(sources) - 2} more lines"
            rows.append(
                f"<tr><td>{_e(lo.kind)}</td><td><code>{_e(op)}</code></td>"
                f"<td class=num>{len(calls)}</td><td>{_e(reason)}</td><td class=src>{shown}</td></tr>"
            )
    if not rows:
        return '<p class="note">every operator runs in a generated kernel</p>'
    return (
        '<table id="fallbacks"><tr><th>graph</th><th>op</th><th>calls</th><th>why not fused</th>'
        "<th>user source</th></tr>" + "".join(rows) + "</table>"
    )


def _kernels(report: Any) -> str:
    rows = []
    pending = []
    for lo in report.lowerings:
        if lo.first_run is None:
            pending.append(lo.kind)
        for k in lo.kernels:
            rows.append(
                f"<tr><td>{_link(k['path'], k['symbol'])}</td><td>{_e(k['target'])}</td>"
                f"<td><code>{_e(', '.join(k['fused_ops']))}</code></td>"
                f"<td class=src>{'<br>'.join(_e(s) for s in k['from'])}</td></tr>"
            )
    note = (
        f'<p class="note">Kernels compile at a graph\'s first run; not run yet: '
        f"{_e(', '.join(pending))}.</p>"
        if pending
        else ""
    )
    if not rows:
        return note + '<p class="note">no kernel generated</p>'
    return (
        note + '<table id="kernels"><tr><th>kernel</th><th>target</th><th>fused ops</th>'
        "<th>user source</th></tr>" + "".join(rows) + "</table>"
    )


def _stage_rows(stages: list, scale: float) -> str:
    rows = []
    for s in stages:
        width = max(0.0, s.ms) / scale * 300 if scale > 0 else 0
        rows.append(
            f"<tr><td>{_e(s.name)}</td><td class=num>{s.ms:.2f}</td>"
            f'<td><span class="bar" style="width:{width:.0f}px"></span></td>'
            f"<td class=note>{_e(s.note)}</td></tr>"
        )
    return "".join(rows)


def _timeline(report: Any) -> str:
    header = "<tr><th>stage</th><th>ms</th><th></th><th>note</th></tr>"
    total = report.total_ms or 0.0
    out = (
        f'<table id="timeline">{header}{_stage_rows(report.stages, total)}'
        f"<tr><th>total (measured)</th><th class=num>{total:.2f}</th><th></th><th></th></tr>"
        "</table>"
    )
    if report.later:
        later = max((s.ms for s in report.later), default=0.0)
        out += (
            "<h3>After the compile (not in the total)</h3>"
            f'<table id="later">{header}{_stage_rows(report.later, later)}</table>'
        )
    return out


def _files(directory: str) -> str:
    items = []
    for folder, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(folder, name), directory)
            if rel != "index.html":
                items.append(f"<li>{_link(rel)}</li>")
    return "<ul>" + "".join(items) + "</ul>"


def _plans(report: Any) -> str:
    if report.recompute_plans:
        parts = [f"<pre>{_e(p['report'])}</pre>" for p in report.recompute_plans]
        recompute = "".join(parts)
    else:
        recompute = '<p id="plans-note">Recompute plan: none (not a training compile).</p>'
    offload = (
        '<p id="offload-note">Offload plan: made at the first calls of an inference graph with '
        "model_cpu_offload; written to offload/inference.json (none when the model does not "
        "offload).</p>"
    )
    return recompute + offload


def _decision(pattern: dict[str, Any]) -> str:
    if "pass" in pattern:
        return "mask replaced" if pattern["rewritten"] else "mask kept"
    return "rewritten" if pattern["rewritten"] else "left as written"


def _attention(report: Any) -> str:
    rows = [
        f"<tr><td>{_e(low.kind)}</td><td>{_e(p['where'])}</td>"
        f"<td>{_decision(p)}</td><td>{_e(p['detail'])}</td>"
        "</tr>"
        for low in report.lowerings
        for p in low.attention_patterns
    ]
    if not rows:
        return (
            '<p class="note">no softmax fed by a matmul and no attention mask built from token '
            "positions (recognize_attention, recognize_causal_masks: docs/passes.md)</p>"
        )
    return (
        '<p class="note">Attention written out as matmuls and a softmax: the recognize_attention '
        "pass's decision for each softmax; attention calls handed a mask built from token "
        "positions: recognize_causal_masks' decision (docs/passes.md).</p>"
        '<table id="attention"><tr><th>graph</th><th>where</th><th>decision</th><th>detail</th>'
        "</tr>" + "".join(rows) + "</table>"
    )


def _cache(report: Any) -> str:
    from magi_compiler import _compile_cache

    if report.config.disable_cache:
        return '<p class="note">off (<code>disable_cache=True</code>)</p>'
    rows = [
        f"<tr><td>{_e(datetime.datetime.fromtimestamp(when).strftime('%H:%M:%S'))}</td>"
        f"<td>{_e(what)}</td><td>{_e(detail)}</td></tr>"
        for when, what, detail in _compile_cache.events(report.cache_tag)
    ]
    if not rows:
        return '<p class="note">nothing read or written for this model in this process</p>'
    return (
        '<p class="note">What the compiled-module cache did for this model in this process '
        "(docs/cache.md).</p>"
        '<table id="cache"><tr><th>time</th><th>event</th><th>detail</th></tr>'
        + "".join(rows)
        + "</table>"
    )


def render(report: Any) -> str:
    from magi_compiler import _dump

    name = os.path.basename(report.dir)
    sections = [
        ("summary-section", "Summary", _summary(report)),
        ("graphs", "Graphs", _graphs(report)),
        ("fallbacks-section", "ATen calls left unfused", _fallbacks(report)),
        ("kernels-section", "Generated kernels", _kernels(report)),
        (
            "plans",
            "Recompute and offload plans",
            _plans(report),
        ),
        ("attention-section", "Written-out attention", _attention(report)),
        ("timeline-section", "Compile timeline", _timeline(report)),
        ("cache-section", "Compiled-module cache", _cache(report)),
        ("files", "Files", _files(report.dir)),
        ("config", "Config", f"<pre>{_e(_dump.config_json(report.config))}</pre>"),
    ]
    error = f'<p class="error">The compile failed: {_e(report.error)}</p>' if report.error else ""
    nav = "".join(f'<a href="#{sid}">{_e(title)}</a>' for sid, title, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{_e(t)}</h2>{c}</section>' for sid, t, c in sections)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>magi dump: {_e(name)}</title><style>{_CSS}</style></head><body>"
        f"<h1>magi-compiler dump: {_e(report.model_tag)}</h1>"
        f'<p class="meta">{_e(name)} &middot; written {when} &middot; torch {_e(torch.__version__)}'
        f"</p><nav>{nav}</nav>{error}{body}</body></html>\n"
    )
