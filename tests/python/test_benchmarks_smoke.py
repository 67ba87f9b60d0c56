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
