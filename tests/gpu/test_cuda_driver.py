"""The CUDA driver path of the compile drivers: NVRTC → cubin → module in the primary context
→ launch on torch's current stream, checked against eager arithmetic.
"""

from __future__ import annotations

import pytest
import torch
from magi_compiler import _C

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture
def fresh_cache(tmp_path):
    saved = _C.cache_dir()
    _C.set_cache_dir(str(tmp_path))
    _C.reset_compiler_stats()
    yield tmp_path
    _C.set_cache_dir(saved)


@pytest.mark.parametrize("n", [1, 1000, 1 << 20, 3_000_017])
def test_axpy_launch_matches_eager(fresh_cache, n):
    assert _C.cuda_driver_available()
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    _C._test_launch_axpy(1.5, x, y, out)
    torch.testing.assert_close(out, 1.5 * x + y, rtol=1e-6, atol=1e-6)


def test_launch_is_ordered_on_the_current_stream(fresh_cache):
    n = 1 << 22
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.zeros_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x.mul_(2.0)  # queued before the launch on the same stream
        _C._test_launch_axpy(1.0, x, y, out)
        result = out + 0.0
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(result, x + y)


def test_second_launch_compiles_nothing(fresh_cache):
    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    _C._test_launch_axpy(2.0, x, x, out)
    before = _C.compiler_stats()
    for _ in range(3):
        _C._test_launch_axpy(2.0, x, x, out)
    after = _C.compiler_stats()
    assert after["cuda_compiles"] == before["cuda_compiles"]
    torch.testing.assert_close(out, 3.0 * x)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_launch_on_a_second_device_keeps_the_current_device(fresh_cache):
    torch.cuda.set_device(0)
    x = torch.randn(1000, device="cuda:1")
    out = torch.empty_like(x)
    _C._test_launch_axpy(1.0, x, x, out)
    assert torch.cuda.current_device() == 0
    torch.testing.assert_close(out, 2.0 * x)


def test_bad_tensors_are_user_errors():
    import magi_compiler

    x = torch.randn(10)
    with pytest.raises(magi_compiler.UserError, match="float32 CUDA tensors"):
        _C._test_launch_axpy(1.0, x, x, x)


def test_generated_kernels_launch_as_dependents_on_hopper():
    """On sm_90+ (this torch build needs a CUDA 13 driver, past 12.3) every launch of a
    generated kernel is a programmatic dependent of the stream's previous kernel."""
    from magi_compiler import magi_compile

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("dependent launches need compute capability 9.0")

    def f(x, w):
        h = torch.nn.functional.silu(x) * x
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x = torch.randn(64, 1024, device="cuda")
    w = torch.randn(1024, device="cuda")
    g = magi_compile(f, config_patch={"cudagraph_mode": "NONE"})
    g(x, w)
    _C.reset_compiler_stats()
    for _ in range(3):
        out = g(x, w)
    torch.testing.assert_close(out, f(x, w), rtol=1e-4, atol=1e-4)
    s = _C.compiler_stats()
    assert _C.dependent_launch_available(torch.cuda.current_device())
    assert s["dependent_launches"] > 0 and s["plain_launches"] == 0, s
