"""The derived numbers and printed lines of benchmarks/recompute.py: each magi variant against
torch.compile and against its budget, and one text row per variant."""

from __future__ import annotations

import math
from typing import Any

MIB = 2**20


def predicted_peak(plan: dict) -> int | None:
    """The plan's predicted activation peak: the compiled graphs' (simulated with fusion, since
    2026-11-24 evening) where the plan has it, else the joint graph's."""
    return plan.get("compiled_peak_bytes") or plan.get("predicted_peak_bytes")


def _ok(variants: dict, name: str) -> dict | None:
    r = variants.get(name)
    return r if r and r.get("status") == "ok" else None


def derive(variants: dict[str, dict]) -> dict[str, Any]:
    """HEURISTIC against torch.compile; AUTOSEARCH against its budget; each magi variant
    against the fastest torch.compile variant whose memory is no higher ("tuned to the same
    peak"). Memory is the measured activation peak (CUDA), else the measured saved bytes."""
    out: dict[str, Any] = {}
    tc = _ok(variants, "tc") or {}
    tcs = {
        n: r for n, r in variants.items() if r.get("kind") in ("tc", "tc_amb") and _ok(variants, n)
    }
    metric = "act_peak_bytes"
    if not any(r.get(metric) is not None for r in variants.values()):
        metric = "saved_bytes_measured"  # no device memory statistics (CPU)
    for name, r in variants.items():
        if not r.get("kind", "").startswith("magi") or not _ok(variants, name):
            continue
        d: dict[str, Any] = {"matched_on": metric}
        peak, saved, ms = r.get("act_peak_bytes"), r.get("saved_bytes_measured"), r.get("median_ms")
        if peak and tc.get("act_peak_bytes"):
            d["act_saving_vs_tc"] = 1.0 - peak / tc["act_peak_bytes"]
        if saved is not None and tc.get("saved_bytes_measured"):
            d["saved_saving_vs_tc"] = 1.0 - saved / tc["saved_bytes_measured"]
        if ms and tc.get("median_ms"):
            d["time_ratio_vs_tc"] = ms / tc["median_ms"]
        plan = r.get("plan") or {}
        if saved is not None and plan.get("saved_bytes"):
            d["saved_measured_over_plan"] = saved / plan["saved_bytes"]
        budget = (r.get("recompute_config") or {}).get("memory_budget_bytes")
        if budget:
            d["budget_bytes"] = budget
            d["predicted_fits_budget"] = (predicted_peak(plan) or math.inf) <= budget
            d["planner_budget_met"] = plan.get("budget_met")
            if peak is not None:
                d["measured_fits_budget"] = peak <= budget
                d["measured_over_budget"] = peak / budget
        if peak and predicted_peak(plan):
            d["measured_over_predicted"] = peak / predicted_peak(plan)
        mine = r.get(metric)
        if mine is not None and tcs:
            fitting = [
                (t["median_ms"], n)
                for n, t in tcs.items()
                if t.get(metric) is not None and t[metric] <= mine and t.get("median_ms")
            ]
            if fitting:
                best_ms, best = min(fitting)
                d["tc_same_peak"] = best
                d["tc_same_peak_ms"] = best_ms
                d["tc_same_peak_bytes"] = tcs[best][metric]
                d["time_ratio_vs_tc_same_peak"] = ms / best_ms if ms else None
            else:
                d["tc_same_peak"] = None  # no torch.compile variant is this low
        out[name] = d
    return out


def mib(b: float | None) -> str:
    return "-" if b is None else f"{b / MIB:,.1f}"


HEADER = (
    f"{'variant':<26}{'first s':>8}{'step ms':>10}{'act MiB':>10}{'resv MiB':>10}"
    f"{'pred MiB':>10}{'saved MiB':>10}{'plan sv':>10}{'loss err':>10}{'grad err':>10}  status"
)


def row_text(r: dict) -> str:
    if r.get("status") != "ok":
        err = (r.get("error") or "").strip().splitlines() or [""]
        why = r.get("phase", "")
        return f"{r['label']:<26}  {r.get('status')} {('in ' + why) if why else ''}: {err[0][:160]}"
    plan = r.get("plan") or {}
    ms = r.get("median_ms")
    step = f"{ms:>10.2f}" if ms is not None else f"{'-':>10}"  # not timed yet
    return (
        f"{r['label']:<26}{r.get('first_step_s', math.nan):>8.1f}{step}"
        f"{mib(r.get('act_peak_bytes')):>10}{mib(r.get('reserved_peak_bytes')):>10}"
        f"{mib(plan.get('predicted_peak_bytes')):>10}{mib(r.get('saved_bytes_measured')):>10}"
        f"{mib(plan.get('saved_bytes')):>10}"
        f"{r.get('loss_rel_err', math.nan):>10.1e}{r.get('grad_rel_err_max', math.nan):>10.1e}"
        f"  {({True: 'ok', False: 'WRONG'}).get(r.get('correct'), 'unchecked')}"
        + (" (budget not met)" if plan and not plan.get("budget_met", True) else "")
    )


def derived_text(model: dict) -> list[str]:
    lines = []
    vs = model["variants"]
    for name, d in model.get("derived", {}).items():
        parts = []
        if "act_saving_vs_tc" in d:
            parts.append(f"activation peak {-100 * d['act_saving_vs_tc']:+.0f}% vs tc")
        if "saved_saving_vs_tc" in d:
            parts.append(f"saved tensors {-100 * d['saved_saving_vs_tc']:+.0f}% vs tc")
        if "time_ratio_vs_tc" in d:
            parts.append(f"time {d['time_ratio_vs_tc']:.2f}x tc")
        if "budget_bytes" in d:
            fits = d.get("measured_fits_budget")
            parts.append(f"budget {mib(d['budget_bytes'])} MiB: predicted "
                         f"{'fits' if d['predicted_fits_budget'] else 'over'}, measured "
                         f"{'-' if fits is None else ('fits' if fits else 'over')}")  # fmt: skip
        if d.get("tc_same_peak"):
            on = "peak" if d["matched_on"] == "act_peak_bytes" else "saved bytes"
            parts.append(f"tc at <= the same {on}: {vs[d['tc_same_peak']]['label']} "
                         f"({d['tc_same_peak_ms']:.2f} ms), magi/tc "
                         f"{d['time_ratio_vs_tc_same_peak']:.2f}x")  # fmt: skip
        elif "tc_same_peak" in d:
            parts.append("no tc variant is this low")
        lines.append(f"  {vs[name]['label']}: " + "; ".join(parts))
    return lines
