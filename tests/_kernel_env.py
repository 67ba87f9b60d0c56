"""Runs one small RMSNorm through magi_compile in a fresh process with one kernel tuning
variable set (docs/config.md, "Kernel code generation"), for tests/python/test_kernel_env.py
(CPU) and tests/gpu/test_kernel_env_cuda.py (CUDA). Each variable is read once per process,
hence the process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from magi_compiler import UserError, magi_compile

    def norm(x, w):
        h = torch.nn.functional.silu(x) * x
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    try:
        x = torch.randn(4, 64, device=sys.argv[1])
        magi_compile(norm)(x, torch.randn(64, device=sys.argv[1]))
    except Exception as e:  # Dynamo may wrap it; the cause chain holds ours
        while e is not None and not isinstance(e, UserError):
            e = e.__cause__
        print("USER ERROR:", e)
    else:
        print("COMPILED")
    """
)


def compile_with(device: str, var: str, value: str, cache_dir) -> str:
    """The child's stdout (``USER ERROR: <message>`` or ``COMPILED``) and stderr, where a kernel
    that failed to compile leaves its warning; a crashed child fails."""
    env = dict(os.environ, MAGI_VERIFY_CUDA_CODEGEN="1", MAGI_CACHE_DIR=str(cache_dir))
    env[var] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, device],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr
