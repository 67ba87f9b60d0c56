"""``MAGI_MEMORY_TRACE=1`` on CUDA: besides the registers' peak, each run says during which
instruction the CUDA allocator's peak rose, and by how much above what was allocated when the
run began; that must be what ``torch.cuda.max_memory_allocated`` saw. In a subprocess, since the
variable is read once per process (tests/python/test_memory_trace.py has the CPU side)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn
    from magi_compiler import magi_compile

    mlp = magi_compile(
        nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    )
    x = torch.randn(512, 256, device="cuda")
    with torch.no_grad():
        mlp(x)  # compiles; its trace lines are not the ones checked
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        print("MEASURED", flush=True)
        out = mlp(x)
        torch.cuda.synchronize()
    print(f"rise {(torch.cuda.max_memory_allocated() - before) / 1048576:.1f} MiB", flush=True)
    """
)


def test_memory_trace_names_the_instruction_that_raised_the_allocator_peak(tmp_path):
    script = tmp_path / "memory_trace_cuda.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.pop("MAGI_LOGGING_LEVEL", None)
    env["MAGI_MEMORY_TRACE"] = "1"
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (rise,) = re.findall(r"^rise (\S+ MiB)$", result.stdout, re.M)
    lines = re.findall(
        r"memory trace: the CUDA allocator's peak rose to \S+ MiB, (\S+ MiB) above what was "
        r"allocated when the run began, during (\S+) .*\(step (\d+)\)",
        result.stderr,
    )
    # The measured run follows a reset of the peak, so it raises it: its line is the last one.
    assert lines, result.stderr
    above, where, _ = lines[-1]
    assert above == rise, result.stderr
    # The peak is the GELU (an ATen call or a generated kernel): its [512, 1024] float32 output
    # beside its input, 2 MiB each.
    assert where == "aten::gelu" or where.startswith("piece_"), result.stderr
    assert rise == "4.0 MiB", result.stderr
