"""Smoke test of the benchmark suite (benchmarks/run.py) and of benchmarks/report.py.

Runs a few workloads of the suite at tiny shapes on the CPU, in this process, with eager and
magi_compile only (torch.compile's CPU compile would take most of a minute): correctness and
first-call times, no timing and no thresholds on time. Then renders a report section from the
JSON, and checks that RESULTS.md and the README's headline are report.py's output on the runs kept
in benchmarks/results/.
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


def test_report_renders_a_suite_run(smoke_run):
    from benchmarks import report

    doc, _ = smoke_run
    text = report.suite_section(doc, "smoke.json")
    assert text.startswith("## CPU: whole models and kernels (smoke shapes)")
    assert "source `smoke.json`" in text and f"commit {report.stamp(doc)['commit']}" in text
    assert "Error against eager" in text and "magi_compile" in text
    # A run restricted to some workloads or variants is never reported as the latest.
    assert not report.is_complete(doc)


def _kept_runs():
    from benchmarks import report

    return report.latest_runs(sorted((ROOT / "benchmarks" / "results").glob("*.json")))


def test_results_md_is_generated_from_the_kept_runs():
    """benchmarks/RESULTS.md is report.py's output on benchmarks/results/, and every JSON kept
    there that report.py knows is the latest complete run of its benchmark and device kind
    (nothing stale)."""
    from benchmarks import report

    runs = _kept_runs()
    kept = [
        p
        for p in sorted((ROOT / "benchmarks" / "results").glob("*.json"))
        if report.benchmark_of(json.loads(p.read_text())) is not None
    ]
    assert sorted(p for _, p in runs.values()) == kept
    text = report.render(runs)
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == text, (
        "RESULTS.md is stale: run python benchmarks/report.py"
    )
    # Device, torch version, date and commit are stated once above each run's tables.
    for doc, path in runs.values():
        line = report.stamp_line(doc, f"benchmarks/results/{path.name}")
        assert line in text and "commit ?" not in line and "torch ?" not in line


def test_readme_shows_the_headline_table():
    from benchmarks import report

    head = report.headline(_kept_runs())
    assert head and head in (ROOT / "README.md").read_text(), (
        "README's numbers differ from python benchmarks/report.py --headline"
    )


def test_report_takes_the_latest_complete_run_per_device_kind(tmp_path):
    from benchmarks import report

    def suite(name: str, date: str, command: str) -> dict:
        meta = {"device": "cuda", "device_name": name, "date": date, "command": command}
        return {"meta": meta, "suite": {}, "workloads": []}

    docs = {
        "old.json": suite("NVIDIA H100 80GB HBM3", "2026-01-01T00:00:00", "run.py"),
        "new.json": suite("NVIDIA H100 PCIe", "2026-02-01T00:00:00", "run.py"),
        "partial.json": suite("NVIDIA H100", "2026-03-01T00:00:00", "run.py --only gpt2"),
        "h200.json": suite("NVIDIA H200", "2026-01-15T00:00:00", "run.py"),
        "bandwidth.json": {
            "meta": {"device": "cuda", "device_name": "NVIDIA H200", "date": "2026-01-02"},
            "bandwidth": {},
        },  # fmt: skip
        "unknown.json": {"benchmark": "something else"},
    }
    for name, doc in docs.items():
        (tmp_path / name).write_text(json.dumps(doc))
    runs = report.latest_runs(sorted(tmp_path.glob("*.json")))
    picked = {key: path.name for key, (_, path) in runs.items()}
    assert picked == {
        ("H100", "suite"): "new.json",
        ("H200", "suite"): "h200.json",
        ("H200", "bandwidth"): "bandwidth.json",
    }


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
