"""examples/per_module_settings.py runs and shows its per-module settings in the counters:
the compiled forward is one capture for three batch sizes; the eager forward_batched captures
the fully static embedding once per batch size and the default-settings blocks once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "per_module_settings.py"


def test_per_module_settings_example():
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    run = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "forward compiled: True; forward_batched compiled: False" in out
    rows = {
        m.group(1): tuple(int(v) for v in m.group(2, 3, 4))
        for m in re.finditer(r"^(forward\w*), batches .*?(\d+) +(\d+) +(\d+)$", out, re.M)
    }
    assert rows == {"forward": (1, 1, 0), "forward_batched": (4, 4, 2)}, out
    assert out.rstrip().endswith("OK")
