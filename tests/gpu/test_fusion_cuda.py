"""Fusion and code generation on CUDA: the CPU tier's patterns
(``tests/_fusion_patterns.py``) as NVRTC kernels, in float32 (TF32 off), bfloat16 and float16,
against eager on fresh random inputs; plus the vector widths the launcher picks (16-byte
accesses when the row length allows, scalar ones for odd rows) and rows too long for the
register-cached row schedule (65536 columns: two passes over global memory).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from _fusion_patterns import (
    BF16,
    BY_NAME,
    F16,
    F32,
    RTOL,
    Pattern,
    _inputs,
    assert_fused,
    cases,
    compile_counters,
    layer_norm_plain,
    lowered_graphs,
    rmsnorm,
    run_pattern,
    silu_mul,
    softmax,
)
from magi_compiler import _C, magi_compile

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FALLBACK_WARNING = "could not be compiled"


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def no_fallback(capfd):
    """Fails the test if a kernel variant fell back to ATen (its compile or load failed)."""
    yield
    err = capfd.readouterr().err
    assert FALLBACK_WARNING not in err, err


def vector_widths(kernels) -> set[int]:
    # The width follows the access classes: _v8, then the variant's other suffixes (_w, _s, _r4n,
    # _sv, _p2...).
    return {int(re.findall(r"_v(\d+)(?=_|$)", k["symbol"])[-1]) for k in kernels}


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize(("pattern", "dtype"), cases())
def test_pattern_matches_eager_and_is_fused(pattern, dtype, assert_close_rel):
    (run,) = run_pattern(pattern, dtype, "cuda", assert_close_rel)
    kernels = assert_fused(run, pattern, dtype)
    assert all(k["target"] == "cuda" for k in kernels)


# ---- vector widths and long rows ------------------------------------------------------------

# 16-byte accesses: 8 bf16/f16 or 4 f32 elements per thread access when the row length allows.
FULL_WIDTH = {F32: 4, BF16: 8, F16: 8}
DTYPES = pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
WIDTH_PATTERNS = {
    "silu_mul": (silu_mul, ("aten::silu", "aten::mul"), {"x": 0, "u": 0}, 2),
    "rmsnorm": (rmsnorm, ("aten::pow", "aten::mean", "aten::rsqrt"), {"x": 0}, 1),
    "softmax": (softmax, ("aten::mul", "aten::_softmax"), {"x": 0}, 1),
    "layer_norm": (layer_norm_plain, ("aten::native_layer_norm",), {"x": 0, "y": 0}, 2),
}


def width_pattern(name: str, cols: int, rows: int = 3) -> Pattern:
    fn, ops, dynamic, full_inputs = WIDTH_PATTERNS[name]
    shapes = [("B", rows, cols)] * full_inputs
    if name == "rmsnorm":
        shapes.append((cols,))
    return Pattern(f"{name}_{cols}", fn, _inputs(*shapes), ops, dynamic=dynamic, casts=False)


@pytest.mark.usefixtures("no_fallback")
@DTYPES
@pytest.mark.parametrize("name", sorted(WIDTH_PATTERNS))
@pytest.mark.parametrize(
    ("cols", "widths"),
    [(1024, "full"), (1000, "full"), (1001, "one"), (7, "one")],
    ids=["cols1024", "cols1000", "cols1001", "cols7"],
)
def test_vector_width(name, cols, widths, dtype, assert_close_rel):
    """Rows divisible by the full width get 16-byte accesses (1000 = 8 * 125 too); odd rows
    scalar ones; the numbers are right either way."""
    pattern = width_pattern(name, cols)
    (run,) = run_pattern(pattern, dtype, "cuda", assert_close_rel)
    kernels = assert_fused(run, pattern, dtype)
    want = FULL_WIDTH[dtype] if widths == "full" else 1
    assert vector_widths(kernels) == {want}, [k["symbol"] for k in kernels]


@pytest.mark.usefixtures("no_fallback")
@DTYPES
@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layer_norm"])
@pytest.mark.parametrize("cols", [65536, 65535, 16384, 9000, 6144, 4095])
def test_long_rows(name, cols, dtype, assert_close_rel):
    """Beyond the row 256 threads hold in registers (4 chunks of 16 bytes each: 8192 bf16 or
    4096 f32 elements; odd rows, one element per access, 1024): rows that 512 threads hold are
    held by a wide block (symbol suffix _h), longer ones streamed (_s), every pass reading the
    row, K vectors ahead, under L2 eviction hints; both printed without the loop over rows (_g)
    up to 64 KiB of row."""
    pattern = width_pattern(name, cols, rows=2)
    pattern.batches = (2, 3)
    (run,) = run_pattern(pattern, dtype, "cuda", assert_close_rel)
    kernels = assert_fused(run, pattern, dtype)
    two_bytes = dtype != torch.float32
    suffix = {  # wide blocks of up to 512 threads; no loop over wide rows and short streamed ones
        65536: "_s",
        65535: "_s",
        16384: "_h_g" if two_bytes else "_s_g",
        9000: "_h_g" if two_bytes else "_s_g",
        6144: "_v8" if two_bytes else "_h_g",  # bf16: a block of 192 threads (6 warps)
        4095: "_s_g",
    }[cols]
    assert all(k["symbol"].endswith(suffix) for k in kernels), [k["symbol"] for k in kernels]


@pytest.mark.usefixtures("no_fallback")
def test_one_kernel_launches_wide_and_streamed_rows_with_and_without_the_row_loop(assert_close_rel):
    """The row layout and the loop over rows are chosen at each launch from
    the row length: one compiled RMSNorm over a dynamic row length holds rows of 32 KiB in a
    wide block (_h_g), streams rows of 64 KiB without the loop (_s_g) and rows of 128 KiB with
    it (_s), three variants of one kernel, each matching eager."""

    def norm(x, w):  # a code object of its own: Dynamo's cache is per code object
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)

    from magi_compiler.inspection import last_compiled

    compiled = magi_compile(norm, dynamic_arg_dims={"x": [0, 1], "w": [0]})
    for cols in (16384, 32768, 65536):
        x = torch.randn(3, cols, dtype=BF16, device="cuda")
        w = torch.randn(cols, dtype=BF16, device="cuda")
        assert_close_rel(compiled(x, w), norm(x, w), RTOL[BF16])
    symbols = [k["symbol"] for k in last_compiled().executable.generated_kernels()]
    stem = symbols[0][: symbols[0].rindex("_v8_") + 3]
    assert sorted(symbols) == [stem + "_h_g", stem + "_s", stem + "_s_g"], symbols


def test_unaligned_views_fall_back_to_narrow_accesses(assert_close_rel):
    """A view starting one element into its storage is not 16-byte aligned: the kernel must
    use scalar accesses for it, not misaligned vector loads."""
    pattern = BY_NAME["silu_mul"]
    compiled = magi_compile(pattern.fn, dynamic_arg_dims=dict(pattern.dynamic))
    with lowered_graphs() as runs, torch.no_grad():
        for batch in (3, 5):
            base = torch.randn(batch * 4 * 32 + 1, dtype=BF16, device="cuda")
            x = base[1:].view(batch, 4, 32)
            u = torch.randn(batch, 4, 32, dtype=BF16, device="cuda")
            assert_close_rel(compiled(x, u), pattern.fn(x, u), RTOL[BF16])
    (run,) = runs
    assert 1 in vector_widths(run.magi_executable.generated_kernels())


@pytest.mark.usefixtures("no_fallback")
def test_unit_strided_inputs_load_whole_vectors(assert_close_rel):
    """The rotary's cos and sin, broadcast over the heads, step by 1 along the row from aligned
    rows: the kernel loads their vectors whole (its name ends in _sv). Tables starting one row
    of 8 values into their storage still qualify. Tables starting one element in, or rows 33
    values apart (a slice of wider rows whose starts are not multiples of 8), do not: the same
    kernel then runs a variant that checks each load. All match eager."""
    pattern = BY_NAME["rotary"]
    for offset, pitch, whole in ((0, 32, True), (8, 32, True), (1, 32, False), (0, 33, False)):
        torch._dynamo.reset()  # each case compiles anew: its kernels are its own
        compiled = magi_compile(pattern.fn, dynamic_arg_dims=dict(pattern.dynamic))
        with lowered_graphs() as runs, torch.no_grad():
            x = torch.randn(3, 6, 4, 32, dtype=BF16, device="cuda")
            tables = torch.randn(2, 6 * pitch + offset, dtype=BF16, device="cuda")
            cos, sin = (t[offset:].view(6, pitch)[:, :32] for t in tables)
            assert_close_rel(compiled(x, cos, sin), pattern.fn(x, cos, sin), RTOL[BF16])
        (run,) = runs
        (kernel,) = run.magi_executable.generated_kernels()
        assert ("sv" in kernel["symbol"].split("_")) == whole, (offset, pitch, kernel["symbol"])


def _fma(x, y, z):
    return x * y + z


def _diff(x, y, z):
    return x - y * z


def _halves(x, y, z):
    return (x + y) * 0.5 - z


def test_packed_bf16_pairs_match_eager_bit_for_bit():
    """A bf16 rotary, its backward (zero pads), and products and sums of bf16 tensors (one with
    a scale of 0.5) run on packed pairs (kernel names end in _p2) and give eager's bits exactly,
    as the float body does; over every bf16 bit pattern too, NaN encodings aside."""
    from _fusion_patterns import _rotary_inputs
    from magi_compiler.inspection import last_compiled

    torch.manual_seed(0)

    def three(b):
        return [torch.randn(b, 64, 256, dtype=BF16, device="cuda") for _ in range(3)]

    def tables(b):
        return _rotary_inputs(b, BF16, "cuda")

    rotary, rotary_grad = BY_NAME["rotary"].fn, BY_NAME["rotary_grad"].fn
    for fn, make in (
        (rotary, tables),
        (rotary_grad, tables),
        (_fma, three),
        (_diff, three),
        (_halves, three),
    ):
        torch._dynamo.reset()
        compiled = magi_compile(fn, dynamic_arg_dims={})
        for b in (3, 5):
            args = make(b)
            got, want = compiled(*args), fn(*args)
            assert torch.equal(got, want), (fn.__name__, (got.float() - want.float()).abs().max())
        symbols = [k["symbol"] for k in last_compiled().executable.generated_kernels()]
        assert symbols and all(s.endswith("_p2") for s in symbols), symbols

    # Every bf16 bit pattern (zeros, subnormals, infinities, NaNs) against random ones: the same
    # bits as eager, or NaN on both sides (NaN encodings may differ).
    def bits(t):
        return t.to(torch.int16).view(torch.bfloat16).reshape(4, 64, 256)

    x = bits(torch.arange(65536, dtype=torch.int32, device="cuda"))
    y, z = (bits(torch.randint(-32768, 32768, (65536,), device="cuda")) for _ in range(2))
    for fn in (_fma, _diff, _halves):
        torch._dynamo.reset()
        got, want = magi_compile(fn, dynamic_arg_dims={})(x, y, z), fn(x, y, z)
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        assert bool(same.all()), (fn.__name__, int((~same).sum()))


@pytest.mark.usefixtures("no_fallback")
def test_cpu_scalar_tensor_operand(assert_close_rel):
    """Eager takes a CPU 0-dim tensor beside CUDA tensors; the op reading it stays an ATen
    call (a kernel cannot load it) and the rest still fuses."""

    def fn(x, t):
        return torch.sigmoid(torch.exp(x * t) * 0.5 + x)

    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        for batch in (3, 5):
            x, t = torch.randn(batch, 4, 32, device="cuda"), torch.tensor(0.25)
            assert_close_rel(compiled(x, t), fn(x, t), RTOL[F32])
    (run,) = runs
    assert run.magi_executable.num_fusions >= 1


def test_new_batch_sizes_compile_nothing(assert_close_rel, counters):
    pattern = BY_NAME["add_rmsnorm"]
    compiled = magi_compile(pattern.fn, dynamic_arg_dims=dict(pattern.dynamic))
    with lowered_graphs() as runs, torch.no_grad():
        stats = []
        for batch in (2, 3, 5):
            inputs = pattern.make(batch, BF16, "cuda")
            assert_close_rel(compiled(*inputs), pattern.fn(*inputs), RTOL[BF16])
            stats.append(compile_counters(_C.compiler_stats()))
    (run,) = runs
    assert stats[0] == stats[1] == stats[2], stats
    assert len(run.magi_executable.generated_kernels()) == 1
    assert counters().compiles == 1


def test_first_call_finds_its_kernels_precompiled(tmp_path, assert_close_rel, no_fallback):
    """Lowering compiles every kernel the first call needs at once, on a thread pool: with an
    empty kernel cache, compiles happen during lowering and none during the first call."""
    from blocks import LlamaBlock, init_weights_
    from magi_compiler import _backend

    block = LlamaBlock(hidden=256, n_heads=4, n_kv_heads=2, intermediate=512)
    block = init_weights_(block, seed=0).to(device="cuda", dtype=BF16)
    x = torch.randn(2, 24, 256, device="cuda", dtype=BF16)
    saved = _C.cache_dir()
    _C.set_cache_dir(str(tmp_path))
    _C._clear_kernel_memory_cache()
    after_lowering: list[dict] = []
    original = _backend.lower_graph

    def spy(gm, kind, config):
        run = original(gm, kind, config)
        after_lowering.append(_C.compiler_stats())
        return run

    _backend.lower_graph = spy
    try:
        torch._dynamo.reset()
        _C.reset_compiler_stats()
        with lowered_graphs() as runs, torch.no_grad():
            out = magi_compile(block)(x)
            after_call = _C.compiler_stats()
        expected = block(x)
    finally:
        _backend.lower_graph = original
        _C.set_cache_dir(saved)
        _C._clear_kernel_memory_cache()
    assert_close_rel(out, expected, RTOL[BF16])
    (run,) = runs
    sources = {k["source"] for k in run.magi_executable.generated_kernels()}
    assert len(sources) >= 3  # the two RMSNorms and SiLU·mul at least
    assert after_lowering[0]["cuda_compiles"] == len(sources), after_lowering
    assert after_call["cuda_compiles"] == after_lowering[0]["cuda_compiles"], after_call


def test_fast_division_keeps_huge_and_tiny_divisors_exact(assert_close_rel, no_fallback):
    """Regression: kernels whose outputs are all bf16 use the GPU's fast division, a multiply
    by an approximate reciprocal. __fdividef gave 0 for divisors above 2^126 (a user's x / y,
    and silu's 1 + exp(-x) for x near -88), and an unscaled reciprocal of a subnormal divisor
    is inf (1e-3 / 1e-39 gave inf on an H200): the reciprocal keeps subnormal results and a
    subnormal divisor is scaled first."""

    def fn(x, y, z, u, t):  # each a group of two ops, all outputs bf16
        return (x / y) * 0.5, F.silu(z) * 2.0, (u / t) * 0.5

    shape = (4, 64)
    x = (torch.randn(shape, device="cuda") * 1e37).to(BF16)
    y = (torch.rand(shape, device="cuda") * 1e38 + 1e38).to(BF16)  # 1e38..2e38 > 2^126
    z = (torch.rand(shape, device="cuda") * 0.8 - 88.3).to(BF16)  # 1 + exp(-z) > 2^126
    u = torch.randn(shape, device="cuda", dtype=BF16) * 1e-3
    t = torch.full(shape, 1e-39, device="cuda", dtype=BF16)  # subnormal
    dims = {name: 0 for name in "xyzut"}
    compiled = magi_compile(fn, dynamic_arg_dims=dims)
    with lowered_graphs() as runs, torch.no_grad():
        got = compiled(x, y, z, u, t)
    want = fn(x, y, z, u, t)
    assert runs[0].magi_executable.num_fusions == 3
    for g, w in zip(got, want, strict=True):
        assert_close_rel(g, w, RTOL[BF16])


def test_softmax_of_a_fully_masked_row_is_uniform(assert_close_rel, no_fallback):
    """Regression (review of the fast forms): a row whose every value is bf16's lowest (an
    attention mask filled with torch.finfo(bf16).min) has its maximum there; exp(x - m) must
    be exp(0) = 1 for each element, not the inf (then NaN) of folding m * log2(e), which
    overflows, into the exponent."""

    def fn(x, mask):
        return torch.softmax(x.masked_fill(mask, torch.finfo(x.dtype).min), dim=-1)

    x = torch.randn(4, 6, 256, device="cuda", dtype=BF16)
    mask = torch.zeros(4, 6, 256, device="cuda", dtype=torch.bool)
    mask[:, 1] = True  # every value of row 1 masked
    mask[:, 3, 17:] = True
    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0, "mask": 0})
    with lowered_graphs() as runs, torch.no_grad():
        got = compiled(x, mask)
    want = fn(x, mask)
    kernels = runs[0].magi_executable.generated_kernels()
    assert any(k["target"] == "cuda" for k in kernels), "softmax ran outside a generated kernel"
    assert torch.isfinite(got.float()).all()
    assert_close_rel(got, want, RTOL[BF16])


class _SwiGLU(torch.nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(hidden, inner, bias=False)
        self.up = torch.nn.Linear(hidden, inner, bias=False)
        self.down = torch.nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _peak_above_start(fn, x) -> int:
    """Bytes allocated at the peak of one call above what was allocated before it."""
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(x)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def _give_the_stream_a_cublas_workspace() -> None:
    """Makes cuBLAS's workspace of the current stream (32 MiB on Hopper) exist. A CUDA-graph
    capture clears the workspaces and makes a new one in its runner's pool
    (CudaGraphRunner::capture): with one already counted before the call, that replacement
    frees as much as it allocates, and the call's peak above its start is what the graph's
    own tensors take."""
    a = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(16, device="cuda", dtype=torch.bfloat16)
    torch.addmm(bias, a, a)
    torch.mm(a, a)  # cuBLASLt and cuBLAS, as a graph's matmuls call them
    torch.cuda.synchronize()


@pytest.mark.parametrize("cudagraph_mode", ["NONE", "FULL"])
def test_swiglu_product_takes_the_gate_buffer(cudagraph_mode, assert_close_rel):
    """silu(gate) * up writes over gate (both die there): a call's peak holds two of the wide
    [tokens, inner] buffers (gate and up), not three (and a new product). With CUDA graphs the
    second call is the capture, whose peak sizes the graph's memory pool."""
    tokens, hidden, inner = 512, 256, 4096
    mlp = _SwiGLU(hidden, inner).cuda().to(torch.bfloat16)
    compiled = magi_compile(
        mlp, dynamic_arg_dims={}, config_patch={"cudagraph_mode": cudagraph_mode}
    )
    wide = tokens * inner * 2
    xs = [torch.randn(1, tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    with lowered_graphs() as runs, torch.no_grad():
        assert_close_rel(compiled(xs[0]), mlp(xs[0]), RTOL[BF16])
        before = runs[0].magi_executable.num_in_place_outputs
        _give_the_stream_a_cublas_workspace()  # the second call captures (FULL)
        peak = _peak_above_start(compiled, xs[1])
        assert runs[0].magi_executable.num_in_place_outputs == before + 1
        for x in xs[1:]:
            assert_close_rel(compiled(x), mlp(x), RTOL[BF16])
    assert wide < peak < 2 * wide + wide // 4, (peak, wide)
