"""Smoke test of benchmarks/bandwidth.py on the CPU at tiny shapes: every workload's
magi_compile result matches eager, the table's numbers are filled in, and the compile-latency
workers (two fresh processes sharing one kernel cache directory) show a cold process compiling
and a warm one compiling nothing. No thresholds on time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.mark.slow
def test_bandwidth_smoke(tmp_path):
    from benchmarks import bandwidth

    out = tmp_path / "bandwidth.json"
    argv = ["--device", "cpu", "--quick", "--rows", "64", "--cols", "256", "--hidden", "128"]
    doc = bandwidth.main([*argv, "--seq", "8", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc, default=str))

    bw = doc["bandwidth"]
    assert bw["copy"]["gbps"] > 0
    assert [w["workload"] for w in bw["workloads"]] == [w.name for w in bandwidth.WORKLOADS]
    for w in bw["workloads"]:
        for variant in ("eager", "magi_compile"):
            r = w["variants"][variant]
            assert r["status"] == "ok", f"{w['workload']}/{variant}: {r}"
            assert r["correct"], f"{w['workload']}/{variant}: error {r['rel_error']:.2e}"
            assert r["gbps"] > 0 and r["pct_of_copy"] > 0

    cold, warm = doc["compile_latency"]["cold"], doc["compile_latency"]["warm"]
    assert cold["status"] == "ok", cold
    assert warm["status"] == "ok", warm
    assert cold["stats"]["cpu_compiles"] >= 1 and cold["stats"]["disk_hits"] == 0
    assert warm["stats"]["cpu_compiles"] == 0, warm["stats"]
    assert warm["stats"]["disk_hits"] == cold["stats"]["cpu_compiles"]
