"""The kernel tuning variables (docs/config.md, "Kernel code generation"): a value the code
generator does not know stops the compile with a UserError naming the variable and the values
it takes. Each is read once per process, so each case runs in a process of its own."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _kernel_env import VECTOR_IO_MODES, compile_with, compiled_cleanly  # noqa: E402


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        (
            "MAGI_VECTOR_IO",
            "fast",
            "MAGI_VECTOR_IO=fast is not one of auto, cs, ldcs, ldg, asm, plain, stcs, l2last, "
            "l2last_l1, l2last_cs",
        ),
        ("MAGI_ROW_BLOCK_ROUNDING", "odd", "MAGI_ROW_BLOCK_ROUNDING=odd is not one of warp, pow2"),
        ("MAGI_KEEP_LOADS", "l2", "MAGI_KEEP_LOADS=l2 is not one of ldg, l1last"),
        ("MAGI_ROW_HELD_THREADS", "384", "MAGI_ROW_HELD_THREADS=384 is not a power of two"),
        (
            "MAGI_ROW_HELD_THREADS",
            "2048",
            "MAGI_ROW_HELD_THREADS=2048 is not an integer in [32, 1024]",
        ),
    ],
)
def test_unknown_values_of_tuning_variables_are_user_errors(tmp_path, var, value, message):
    out = compile_with("cpu", var, value, tmp_path)
    assert f"USER ERROR: {message}" in out, out


def test_a_known_value_compiles(tmp_path):
    out = compile_with("cpu", "MAGI_ROW_BLOCK_ROUNDING", "pow2", tmp_path)
    assert compiled_cleanly(out, 1e-5), out


@pytest.mark.parametrize(("var", "value"), VECTOR_IO_MODES)
def test_every_vector_io_mode_compiles_with_nvrtc(tmp_path, var, value):
    """Each measuring mode's CUDA preamble (written-out PTX included) NVRTC-compiles for sm_90
    (MAGI_VERIFY_CUDA_CODEGEN) with RMSNorm, LayerNorm and softmax over rows held by a warp and
    by a block of 256 threads, and a pointwise kernel; the default mode is every CPU test's."""
    out = compile_with("cpu", var, value, tmp_path, columns=(64, 8192))
    assert compiled_cleanly(out, 1e-5), out
