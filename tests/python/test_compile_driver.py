"""The compile drivers' Python surface on the CPU: NVRTC to cubin, cache directory, counters."""

from __future__ import annotations

import pytest
from magi_compiler import _C

KERNEL = r"""
extern "C" __global__ void magi_py_scale(float* out, const float* in, float alpha, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = alpha * in[i];
}
"""

needs_nvrtc = pytest.mark.skipif(not _C.nvrtc_available(), reason="NVRTC is not installed")


@pytest.fixture
def fresh_cache(tmp_path):
    saved = _C.cache_dir()
    _C.set_cache_dir(str(tmp_path))
    _C._clear_kernel_memory_cache()
    _C.reset_compiler_stats()
    yield tmp_path
    _C.set_cache_dir(saved)
    _C._clear_kernel_memory_cache()


@needs_nvrtc
def test_cubin_is_elf_and_cached_on_disk(fresh_cache):
    cubin = _C.compile_cuda_to_cubin(KERNEL, "magi_py_scale", 90)
    assert cubin[:4] == b"\x7fELF"
    assert len(list(fresh_cache.glob("*.cubin"))) == 1
    _C._clear_kernel_memory_cache()
    assert _C.compile_cuda_to_cubin(KERNEL, "magi_py_scale", 90) == cubin
    assert _C.compiler_stats() == {
        "cuda_compiles": 1,
        "cpu_compiles": 0,
        "memory_hits": 0,
        "disk_hits": 1,
        "dependent_launches": 0,
        "plain_launches": 0,
    }


@needs_nvrtc
def test_compile_error_is_internal_error_with_log(fresh_cache):
    import magi_compiler

    with pytest.raises(magi_compiler.InternalError, match=r"(?s)magi_py_bad.*undefined"):
        _C.compile_cuda_to_cubin("__global__ void f() { nope; }", "magi_py_bad", 80)


def test_cache_dir_round_trips(fresh_cache):
    assert _C.cache_dir() == str(fresh_cache)
    _C.set_cache_dir("")
    assert _C.cache_dir() == ""
