"""The kernel tuning variables on CUDA: a mistyped value stops the compile with the UserError
docs/config.md promises, not a warning and ATen ops in place of every generated kernel (the
CUDA kernels are printed inside the fallback to ATen; the variables are read before it)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _kernel_env import VECTOR_IO_MODES, compile_with, compiled_cleanly  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("MAGI_ROW_CHUNKS", "0", "MAGI_ROW_CHUNKS=0 is not an integer in [1, 16]"),
        (
            "MAGI_ROW_GRID_LOOP",
            "sometimes",
            "MAGI_ROW_GRID_LOOP=sometimes is not one of auto, 0, 1",
        ),
    ],
)
def test_unknown_values_of_tuning_variables_are_user_errors_on_cuda(tmp_path, var, value, message):
    out = compile_with("cuda", var, value, tmp_path)
    assert f"USER ERROR: {message}" in out, out


# float32 rows held by a warp (64), by a block of 256 threads (4096), by a wide block of 512
# (8192), streamed (16384), and an odd length that takes narrower vectors (1001).
COLUMNS = (64, 4096, 8192, 16384, 1001)


def test_a_known_value_compiles_on_cuda(tmp_path):
    out = compile_with("cuda", "MAGI_ROW_CHUNKS", "3", tmp_path, columns=COLUMNS)
    assert compiled_cleanly(out, 1e-5), out


@pytest.mark.parametrize(("var", "value"), VECTOR_IO_MODES)
def test_every_vector_io_mode_matches_eager_on_cuda(tmp_path, var, value):
    """Each measuring mode of the vector loads and stores: RMSNorm, LayerNorm, softmax and a
    pointwise kernel over row lengths that take every row layout match eager."""
    out = compile_with("cuda", var, value, tmp_path, columns=COLUMNS)
    assert compiled_cleanly(out, 1e-5), out
