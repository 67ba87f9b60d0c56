"""The kernel tuning variables (docs/config.md, "Kernel code generation"): a value the code
generator does not know stops the compile with a UserError naming the variable and the values
it takes. Each is read once per process, so each case runs in a process of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _kernel_env import VECTOR_IO_MODES, compile_with, compiled_cleanly  # noqa: E402


def _children(settings, root: Path, columns=(64,)) -> dict:
    """compile_with's output for each (variable, value) in `settings`, the children run a few at a
    time: each is mostly a single-threaded import followed by compiles, so two overlap well on
    the 2-core CI machine."""
    workers = max(1, min(4, os.cpu_count() or 1))

    def child(setting):
        var, value = setting
        return setting, compile_with("cpu", var, value, root / f"{var}={value}", columns)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(child, settings))


UNKNOWN_VALUES = [
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
]


@pytest.fixture(scope="module")
def unknown_value_outputs(tmp_path_factory):
    return _children([(v, x) for v, x, _ in UNKNOWN_VALUES], tmp_path_factory.mktemp("unknown"))


@pytest.fixture(scope="module")
def vector_io_outputs(tmp_path_factory):
    return _children(VECTOR_IO_MODES, tmp_path_factory.mktemp("modes"), columns=(64, 8192))


@pytest.mark.parametrize(("var", "value", "message"), UNKNOWN_VALUES)
def test_unknown_values_of_tuning_variables_are_user_errors(
    unknown_value_outputs, var, value, message
):
    out = unknown_value_outputs[(var, value)]
    assert f"USER ERROR: {message}" in out, out


def test_a_known_value_compiles(tmp_path):
    out = compile_with("cpu", "MAGI_ROW_BLOCK_ROUNDING", "pow2", tmp_path)
    assert compiled_cleanly(out, 1e-5), out


@pytest.mark.parametrize(("var", "value"), VECTOR_IO_MODES)
def test_every_vector_io_mode_compiles_with_nvrtc(vector_io_outputs, var, value):
    """Each measuring mode's CUDA preamble (written-out PTX included) NVRTC-compiles for sm_90
    (MAGI_VERIFY_CUDA_CODEGEN) with RMSNorm, LayerNorm and softmax over rows held by a warp and
    by a block of 256 threads, and a pointwise kernel; the default mode is every CPU test's."""
    out = vector_io_outputs[(var, value)]
    assert compiled_cleanly(out, 1e-5), out


def _cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit, or the copy Triton's wheel (a dependency of torch) has."""
    found = shutil.which("cuobjdump")
    if found is not None:
        return found
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(path) if path.exists() else None


@pytest.mark.parametrize("value", ["auto", "ldg"])
def test_row_kernel_stores_are_whole_16_byte_stores(tmp_path, value):
    """In the sm_90 machine code of the bf16 kernels (RMSNorm, LayerNorm, softmax over rows of
    8192 values, and a pointwise one), every store of a form that moves vectors of 8 values is
    one 16-byte STG: assigned through a uint4*, ptxas had split half of an RMSNorm kernel's plain
    stores into four 4-byte ones (2.5 store instructions per 16 bytes on the H200)."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("neither the CUDA toolkit nor Triton provides cuobjdump here")
    out = compile_with("cpu", "MAGI_VECTOR_IO", value, tmp_path, (8192,), "bfloat16")
    assert compiled_cleanly(out, 2e-2), out
    stores: dict[str, list[str]] = {}
    for cubin in sorted(tmp_path.rglob("*.cubin")):
        sass = subprocess.run(
            [tool, "-sass", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
        function = ""
        for line in sass.splitlines():
            if "Function :" in line:
                function = line.split("Function :", 1)[1].strip()
            elif " STG." in line:
                stores.setdefault(function, []).append(line.split(" STG.", 1)[1].split()[0])
    vector_forms = {f: ops for f, ops in stores.items() if "_v8" in f}
    assert {f.split("_")[1] for f in vector_forms} >= {"pow", "native", "mul", "silu"}, stores
    for function, opcodes in vector_forms.items():
        assert all(o.endswith("128") for o in opcodes), (function, opcodes)
