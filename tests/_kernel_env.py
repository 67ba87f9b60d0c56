"""Runs small row and pointwise kernels through magi_compile in a fresh process with one kernel
tuning variable set (docs/config.md, "Kernel code generation"), for
tests/python/test_kernel_env.py (CPU) and tests/gpu/test_kernel_env_cuda.py (CUDA). Each
variable is read once per process, hence the process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# The vector load and store modes besides the default (MAGI_VECTOR_IO=auto),
# each as (variable, value).
VECTOR_IO_MODES = [
    ("MAGI_VECTOR_IO", m)
    for m in ("cs", "ldcs", "ldg", "asm", "plain", "stcs", "l2last", "l2last_l1", "l2last_cs")
] + [("MAGI_KEEP_LOADS", "l1last")]

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch.nn.functional as F
    from magi_compiler import UserError, magi_compile

    def norm(x, w):  # RMSNorm with a weight: a per-column input every row reads again
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def layer_norm(x, w):
        return F.layer_norm(x, x.shape[-1:], w, w * 0.5)

    def softmax(x, w):
        return torch.softmax(x * w, -1)

    def gated(x, w):  # pointwise only
        return F.silu(x) * (x + w)

    device, columns = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
    dtype = getattr(torch, sys.argv[3])
    worst = 0.0
    try:
        for fn in (norm, layer_norm, softmax, gated):
            compiled = magi_compile(fn)
            for cols in columns:
                x = torch.randn(6, cols, device=device, dtype=dtype)
                w = torch.randn(cols, device=device, dtype=dtype)
                got, want = compiled(x, w).float(), fn(x, w).float()
                worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    except Exception as e:  # Dynamo may wrap it; the cause chain holds ours
        while e is not None and not isinstance(e, UserError):
            e = e.__cause__
        print("USER ERROR:", e)
    else:
        print("COMPILED, worst relative error", worst)
    """
)


def compile_with(
    device: str, var: str, value: str, cache_dir, columns=(64,), dtype: str = "float32"
) -> str:
    """The child's stdout (``USER ERROR: <message>`` or ``COMPILED, worst relative error E``
    against eager over every kernel and row length in `columns`, inputs of `dtype`) and stderr,
    where a kernel that failed to compile leaves its warning (the child logs at warning level
    whatever the caller's MAGI_LOGGING_LEVEL); a crashed child fails."""
    env = dict(os.environ, MAGI_VERIFY_CUDA_CODEGEN="1", MAGI_CACHE_DIR=str(cache_dir))
    env["MAGI_LOGGING_LEVEL"] = "warning"
    env[var] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, device, ",".join(str(c) for c in columns), dtype],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def compiled_cleanly(out: str, rtol: float) -> bool:
    """Whether the child compiled every kernel (none fell back to ATen) and matched eager."""
    if "could not be compiled" in out or "COMPILED, worst relative error" not in out:
        return False
    worst = float(out.split("COMPILED, worst relative error", 1)[1].split()[0])
    return worst <= rtol
