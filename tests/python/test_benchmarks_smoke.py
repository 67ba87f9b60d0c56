"""Smoke test of the benchmark suite (benchmarks/run.py and report.py).

Runs a few workloads of the suite at tiny shapes on the CPU, in this process, with eager and
magi_compile only (torch.compile's CPU compile would take most of a minute): correctness and
first-call times, no timing and no thresholds on time. Then renders a report from the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKLOADS = ["micro_add_rmsnorm", "gpt2_decode", "llama_train"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    from benchmarks import run

    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    argv = ["--device", "cpu", "--smoke", "--in-process", "--only", ",".join(WORKLOADS)]
    argv += ["--variants", "eager,magi", "--out", str(out)]
    doc = run.main(argv)
    return doc, out


def test_suite_checks_magi_against_eager(smoke_run):
    doc, out = smoke_run
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc, default=str))
    assert sorted(w["name"] for w in doc["workloads"]) == sorted(WORKLOADS)
    for w in doc["workloads"]:
        assert "error" not in w, w["error"]
        for variant in ("eager", "magi"):
            r = w["variants"][variant]
            assert r["status"] == "ok", f"{w['name']}/{variant}: {r}"
            assert r["correct"], f"{w['name']}/{variant}: error {r['norm_rel_err']:.2e}"
            assert r["first_call_s"] > 0
    assert doc["meta"]["torch"] and doc["meta"]["device"] == "cpu"


def test_report_renders(smoke_run, tmp_path):
    from benchmarks import report

    _, out = smoke_run
    md = tmp_path / "RESULTS.md"
    report.main([str(out), "--out", str(md), "--plots", str(tmp_path / "plots")])
    text = md.read_text()
    assert "## " in text and "smoke shapes" in text
    assert "Error against eager" in text and "magi_compile" in text


def test_unknown_workload_is_a_clear_error():
    from benchmarks import workloads

    with pytest.raises(SystemExit, match="unknown workload"):
        workloads.select("no_such_workload")


@pytest.mark.parametrize("rounds", [1, 2])
def test_recompute_benchmark_times_every_variant(rounds, tmp_path):
    """benchmarks/recompute.py at tiny shapes: eager and HEURISTIC checked against eager and
    timed, one after the other (rounds 1) or interleaved with all variants alive (rounds 2)."""
    from benchmarks import recompute

    out = tmp_path / "rc.json"
    argv = ["--device", "cpu", "--smoke", "--only", "llama4", "--variants", "magi_heuristic"]
    argv += ["--steps", "3", "--rounds", str(rounds), "--out", str(out)]
    doc = recompute.main(argv)
    assert json.loads(out.read_text())["settings"]["rounds"] == rounds
    (model,) = doc["models"]
    assert sorted(model["variants"]) == ["eager", "magi_heuristic"]
    for name, r in model["variants"].items():
        assert r["status"] == "ok", f"{name}: {r}"
        assert r["correct"], f"{name}: {r}"
        assert r["steps"] == 3 and 0 < r["min_ms"] <= r["median_ms"], r
    assert model["variants"]["magi_heuristic"]["plan"]["policy"] == "HEURISTIC"


def test_report_shows_device_memory_held_beside_the_allocated_peak():
    """GPU results with peak_reserved_bytes render a second table under the peak memory one
    (CUDA-graph replays keep intermediates in pools max_memory_allocated does not see)."""
    from benchmarks import report

    mib = 2**20

    def variant(peak: int, reserved: int | None) -> dict:
        r = {"status": "ok", "peak_mem_bytes": peak * mib}
        if reserved is not None:
            r["peak_reserved_bytes"] = reserved * mib
        return r

    doc = {
        "suite": {"variants": ["eager", "inductor_ro"]},
        "workloads": [
            {
                "name": "w",
                "title": "Workload W",
                "variants": {"eager": variant(800, 820), "inductor_ro": variant(496, 900)},
            }
        ],
    }
    text = report._memory(doc)
    allocated, _, held = text.partition("Device memory held")
    assert "496" in allocated and "900" not in allocated
    assert "900" in held and "820" in held
    for r in doc["workloads"][0]["variants"].values():
        del r["peak_reserved_bytes"]
    assert "Device memory held" not in report._memory(doc)
