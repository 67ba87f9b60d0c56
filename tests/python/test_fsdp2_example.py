"""examples/fsdp2_train.py on the CPU: two processes (gloo), each layer magi-compiled and
sharded with fully_shard, gradients compared with an uncompiled, unsharded copy."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_fsdp2_layers_train_like_the_uncompiled_model():
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", "29517", os.path.join(ROOT, "examples", "fsdp2_train.py"),
        "--device", "cpu", "--hidden", "64", "--seq", "16", "--steps", "2",
    ]  # fmt: skip
    env = dict(os.environ, MAGI_LOGGING_LEVEL="warning", OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    results = re.findall(
        r"rank (\d)/2: 2 magi-compiled layers under fully_shard on cpu, 2 steps, "
        r"recompute plan (\w+), worst gradient error \S+ \(tolerance \S+\): (ok|FAILED)",
        out,
    )
    assert sorted(results) == [("0", "HEURISTIC", "ok"), ("1", "HEURISTIC", "ok")], out[-4000:]
