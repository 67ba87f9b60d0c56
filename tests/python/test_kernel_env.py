"""The kernel tuning variables (docs/config.md, "Kernel code generation"): a value the code
generator does not know stops the compile with a UserError naming the variable and the values
it takes. Each is read once per process, so each case runs in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch
    from magi_compiler import UserError, magi_compile

    def norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    try:
        magi_compile(norm)(torch.randn(4, 64))
    except Exception as e:  # Dynamo may wrap it; the cause chain holds ours
        while e is not None and not isinstance(e, UserError):
            e = e.__cause__
        print("USER ERROR:", e)
    else:
        print("COMPILED")
    """
)


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        (
            "MAGI_VECTOR_IO",
            "fast",
            "MAGI_VECTOR_IO=fast is not one of cs, ldcs, ldg, asm, plain, stcs",
        ),
        ("MAGI_ROW_BLOCK_ROUNDING", "odd", "MAGI_ROW_BLOCK_ROUNDING=odd is not one of warp, pow2"),
        ("MAGI_ROW_HELD_THREADS", "384", "MAGI_ROW_HELD_THREADS=384 is not a power of two"),
        (
            "MAGI_ROW_HELD_THREADS",
            "2048",
            "MAGI_ROW_HELD_THREADS=2048 is not an integer in [32, 1024]",
        ),
    ],
)
def test_unknown_values_of_tuning_variables_are_user_errors(tmp_path, var, value, message):
    env = dict(os.environ, MAGI_VERIFY_CUDA_CODEGEN="1", MAGI_CACHE_DIR=str(tmp_path))
    env[var] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"USER ERROR: {message}" in done.stdout, done.stdout + done.stderr[-3000:]
