"""Shared by the CPU tier (tests/python) and the GPU tier (tests/gpu).

- ``examples/`` and the repository root go on ``sys.path``, so tests can ``import blocks``
  and ``from benchmarks import zoo_models``.
- :func:`assert_close_rel` (also a fixture of the same name): relative error of whole tensors.
- ``counters``: resets Dynamo and magi's counters, so a test can count its own captures.
- The compiled-module cache on disk is off in the test process (for fixtures of any scope too):
  a warm entry from an earlier run would turn the captures tests count into loads. Its own
  tests (test_compile_cache.py) run it in child processes.
- Inputs are fresh random values on every run: the global RNG is reseeded from entropy
  before each test and the seed is printed, so a failure can be replayed with
  ``MAGI_TEST_SEED=<seed>``. Weights come from ``init_weights_(seed=...)`` where a test needs
  them reproducible.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from magi_compiler import _compile_cache

_compile_cache.entry_cache = lambda *args, **kwargs: None  # the disk cache is off here,
os.environ.setdefault("MAGI_COMPILE_DISABLE_CACHE", "1")  # and in the scripts tests run

_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(_ROOT / "examples"), str(_ROOT)):  # import blocks; from benchmarks import ...
    if _path not in sys.path:
        sys.path.insert(0, _path)


def _flatten(x) -> list:
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in _flatten(item)]
    return [x]


def _assert_close_rel(actual, expected, rtol: float) -> None:
    """Checks ``max|a - e| / max|e| <= rtol`` per tensor (tuples and lists element-wise).

    Shapes and dtypes must match; integer and bool tensors must be equal; non-tensors must
    compare equal. A tensor whose expected values are all zero is compared absolutely.
    """
    actual, expected = _flatten(actual), _flatten(expected)
    assert len(actual) == len(expected), f"{len(actual)} values, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if not isinstance(e, torch.Tensor):
            assert a == e, f"value {i}: {a!r} != {e!r}"
            continue
        assert isinstance(a, torch.Tensor), f"value {i}: got {type(a).__name__}, expected a tensor"
        assert a.shape == e.shape, f"value {i}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"value {i}: dtype {a.dtype} != {e.dtype}"
        assert a.device == e.device, f"value {i}: device {a.device} != {e.device}"
        if not (e.is_floating_point() or e.is_complex()):
            assert torch.equal(a, e), f"value {i}: {e.dtype} tensors differ"
            continue
        if e.numel() == 0:
            continue
        a64, e64 = a.detach().double(), e.detach().double()
        assert torch.equal(a64.isnan(), e64.isnan()), f"value {i}: NaNs differ"
        finite, inf = e64.isfinite(), e64.isinf()
        assert torch.equal(a64[inf], e64[inf]), f"value {i}: infinities differ"
        if not finite.any():
            continue
        err = (a64[finite] - e64[finite]).abs().max().item()
        scale = e64[finite].abs().max().item()
        rel = err / scale if scale > 0 else err
        assert rel <= rtol, f"value {i}: relative error {rel:.3e} > {rtol:.1e} (max|e| {scale:.3e})"


assert_close_rel = _assert_close_rel


@pytest.fixture(name="assert_close_rel")
def _assert_close_rel_fixture():
    return _assert_close_rel


@pytest.fixture
def counters():
    """Fresh Dynamo caches and zeroed counters; yields ``get_counters``."""
    import magi_compiler

    torch._dynamo.reset()
    magi_compiler.reset_counters()
    yield magi_compiler.get_counters
    torch._dynamo.reset()


@pytest.fixture
def lowered(monkeypatch):
    """Every boxed callable ``_backend.lower_graph`` returns, in order (its executable,
    CUDA-graph runner and graph hang off it as ``magi_*`` attributes)."""
    from magi_compiler import _backend

    runs = []
    original = _backend.lower_graph

    def spy(gm, kind, config):
        run = original(gm, kind, config)
        runs.append(run)
        return run

    monkeypatch.setattr(_backend, "lower_graph", spy)
    return runs


@pytest.fixture(autouse=True)
def _fresh_random_inputs(request):
    """Reseeds the global RNG from entropy (or MAGI_TEST_SEED) so inputs differ per run."""
    seed = int(os.environ.get("MAGI_TEST_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    request.node._magi_seed = seed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    seed = getattr(item, "_magi_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("random inputs", f"replay with MAGI_TEST_SEED={seed}"))
    return report
