"""``MAGI_MEMORY_TRACE=1``: each run of the C++ executor logs the most tensor memory its
registers held at once, where, and the largest tensors alive there. The variable is read once
per process, so each case runs a small script in a subprocess: a compiled MLP, one forward.

By hand: the MLP's hidden activation is [512, 1024] float32, 2 MiB, the most a run of it holds;
its input (0.5 MiB) and parameters (about 2 MiB) are the caller's and not counted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn
    from magi_compiler import inspection, magi_compile

    mlp = magi_compile(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)))
    with torch.no_grad():
        mlp(torch.randn(512, 256))
    print("instructions:", inspection.last_compiled().executable.num_instructions)
    """
)


def run_script(tmp_path, trace: bool) -> tuple[int, str]:
    """Runs SCRIPT; returns the executable's instruction count and what went to stderr."""
    script = tmp_path / "memory_trace_mlp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # as conftest.py sets it for the tests themselves
    env.pop("MAGI_LOGGING_LEVEL", None)  # the trace is printed whatever the level
    env.pop("MAGI_MEMORY_TRACE", None)
    if trace:
        env["MAGI_MEMORY_TRACE"] = "1"
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (count,) = re.findall(r"^instructions: (\d+)$", result.stdout, re.M)
    return int(count), result.stderr


TRACE = re.compile(
    r"^\[magi I\] memory trace: (\d+) instructions, peak (.+) of tensors after (\S+) .*"
    r"\(step \d+\), not counting the (.+) of inputs the caller keeps \(parameters\.\.\.\); "
    r"largest there:\n  (.+) from (\S+)",
    re.M,
)


def test_memory_trace_logs_each_run_peak(tmp_path):
    instructions, stderr = run_script(tmp_path, trace=True)
    found = TRACE.findall(stderr)
    assert len(found) == 1, stderr  # one run, one trace
    assert found[0] == (
        str(instructions),
        "2.0 MiB",  # the hidden activation
        "aten::addmm",
        "2.5 MiB",  # the input and the parameters
        "2.0 MiB",
        "aten::addmm",
    ), stderr


def test_no_memory_trace_without_the_variable(tmp_path):
    _, stderr = run_script(tmp_path, trace=False)
    assert "memory trace" not in stderr, stderr
