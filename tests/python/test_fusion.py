"""Fusion and code generation on the CPU, end to end through ``magi_compile``.

Every pattern of ``tests/_fusion_patterns.py`` (norms, softmax, rotary, SiLU·mul, GELU, casts,
broadcasts, strided inputs, odd sizes, size-1 dims, where, row reductions, float64) runs in
float32, bfloat16 and float16 against eager on fresh random inputs, and must really be fused:
its ops in one generated kernel. ``MAGI_VERIFY_CUDA_CODEGEN=1`` is set for the whole module, so
every CPU kernel variant is also printed as CUDA and NVRTC-compiled for sm_90; a variant that
fails to compile falls back to ATen with a warning on stderr, which fails the test.

Kernels go to the configured disk cache (``MAGI_CACHE_DIR`` or the default), shared by all
tests: a warm cache makes a re-run much faster. The test that proves NVRTC really runs uses a
fresh cache directory of its own. Kernel outputs written over dying inputs are in
test_fusion_writes.py.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from _fusion_patterns import (
    BY_NAME,
    RTOL,
    _rotary_inputs,
    assert_fused,
    cases,
    compile_counters,
    lowered_graphs,
    run_pattern,
)
from blocks import RMSNorm, apply_rotary, init_weights_
from magi_compiler import _C, _logging, magi_compile, magi_register_custom_op

FALLBACK_WARNING = "could not be compiled"


@pytest.fixture(autouse=True)
def _verify_cuda_codegen(monkeypatch):
    monkeypatch.setenv("MAGI_VERIFY_CUDA_CODEGEN", "1")


@pytest.fixture
def no_fallback(capfd):
    """Fails the test if a kernel variant fell back to ATen (its compile failed)."""
    yield
    err = capfd.readouterr().err
    assert FALLBACK_WARNING not in err, err


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize(("pattern", "dtype"), cases())
def test_pattern_matches_eager_and_is_fused(pattern, dtype, assert_close_rel):
    (run,) = run_pattern(pattern, dtype, "cpu", assert_close_rel)
    kernels = assert_fused(run, pattern, dtype)
    assert all(k["target"] == "cpu" for k in kernels)


@pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom")
def test_variance_with_a_correction_past_the_row_length_matches_eager():
    """Regression: the divisor is max(cols - correction, 0) as in eager (inf, not a negative
    variance), and a one-element row with the default correction gives NaN."""

    def fn(x, y):
        return torch.var(x * 2.0, -1, correction=3), torch.var(y + 1.0, -1)

    x, y = torch.randn(5, 2), torch.randn(5, 1)
    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0, "y": 0})
    with lowered_graphs() as runs, torch.no_grad():
        got = compiled(x, y)
    want = fn(x, y)
    assert runs and runs[0].magi_executable.num_fusions >= 1
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_slice_read_outside_its_group_is_not_fused_and_right(assert_close_rel):
    """A slice's value is only computed inside a kernel, at the columns a cat asks for: when
    the caller also reads it, the slices and cat stay ATen calls (the rest still fuses)."""

    def fn(x):
        s = x[..., :8]
        return torch.cat([s, -x[..., 8:]], -1) * 2.0, s + 1.0

    x = torch.randn(3, 4, 16)
    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        got = compiled(x)
    for g, w in zip(got, fn(x), strict=True):
        assert_close_rel(g, w, RTOL[torch.float32])
    assert "aten::cat" in runs[0].magi_graph.op_names(), runs[0].magi_graph


def test_view_of_a_value_also_read_outside_is_not_fused_and_right(assert_close_rel):
    """The values before a view are computed only at the elements the view maps to the index
    space: when the caller also reads one, the view stays an ATen call."""

    def fn(x, y):
        a = x * 2.0
        return a, (a.view(-1, 8) + y).exp()

    x, y = torch.randn(3, 4, 8), torch.randn(8)
    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        got = compiled(x, y)
    for g, w in zip(got, fn(x, y), strict=True):
        assert_close_rel(g, w, RTOL[torch.float32])
    assert "aten::view" in runs[0].magi_graph.op_names(), runs[0].magi_graph


def test_value_read_before_and_after_a_view_is_right(assert_close_rel):
    """Regression: a group with a view merged with another group (or adopted a lone cast) whose
    value was read both before the view and after it; the kernel computed that value once, at
    the elements the view maps to, and the read after the view got it transposed."""

    def through_cast(x, w):
        c = w.float()
        return (x * c).t() + c

    def through_merge(x, y):
        c = y.sin()
        return (x * c).transpose(1, 2).squeeze(0) + c

    cases = [
        (through_cast, (torch.randn(4, 4), torch.randn(4, dtype=torch.bfloat16))),
        (through_merge, (torch.randn(1, 4, 4), torch.randn(4, 4))),
    ]
    for fn, args in cases:
        compiled = magi_compile(fn, dynamic_arg_dims={})
        with torch.no_grad():
            assert_close_rel(compiled(*args), fn(*args), RTOL[torch.float32])


def test_operand_without_strides_through_a_view_runs_through_aten(assert_close_rel, capfd):
    """An operand whose layout has no strided form through the view (a transposed input
    flattened) cannot be read in the index space: the kernel's ops run through ATen, right,
    and the debug log says why."""

    def fn(x, y):
        return (x * 2.0).reshape(-1) + y

    compiled = magi_compile(fn, dynamic_arg_dims={})
    x, y = torch.randn(6, 4), torch.randn(24)
    with lowered_graphs() as runs, torch.no_grad():
        assert_close_rel(compiled(x, y), fn(x, y), RTOL[torch.float32])  # traced contiguous
        xt = torch.randn(4, 6).t()
        _logging.set_level("debug")
        try:
            assert_close_rel(compiled(xt, y), fn(xt, y), RTOL[torch.float32])
        finally:
            _logging.init_from_env()
    assert runs[0].magi_graph.op_names() == [], runs[0].magi_graph
    assert "is not addressable with strides through its views" in capfd.readouterr().err


def test_chain_with_more_operands_than_kernel_arguments_splits(assert_close_rel):
    """Regression: a chain over 17 inputs has 18 operands, more than a kernel's argument block
    holds (16). The fusion pass splits it into groups that fit, each a generated kernel, with
    eager's numbers (it used to make one group that ran op by op through ATen)."""

    def fn(t):
        xs = t.unbind(0)  # 17 views, each an operand of the group
        out = xs[0]
        for x in xs[1:]:
            out = out * 0.5 + x
        return out

    t = torch.randn(17, 4, 8)
    compiled = magi_compile(fn, dynamic_arg_dims={"t": 1})
    with lowered_graphs() as runs, torch.no_grad():
        assert_close_rel(compiled(t), fn(t), RTOL[torch.float32])
    (run,) = runs
    assert run.magi_executable.num_fusions >= 2
    kernels = run.magi_executable.generated_kernels()
    assert len(kernels) == run.magi_executable.num_fusions  # each group a kernel, none fell back
    assert sum(len(k["fused_ops"]) for k in kernels) == 2 * 16  # every mul and add fused


def test_new_batch_sizes_compile_nothing(assert_close_rel, counters):
    """Three batch sizes: one capture, and the kernels of the first serve the other two."""
    pattern = BY_NAME["add_rmsnorm"]
    compiled = magi_compile(pattern.fn, dynamic_arg_dims=dict(pattern.dynamic))
    with lowered_graphs() as runs, torch.no_grad():
        stats = []
        for batch in (2, 3, 5):
            inputs = pattern.make(batch, torch.bfloat16, "cpu")
            assert_close_rel(compiled(*inputs), pattern.fn(*inputs), RTOL[torch.bfloat16])
            stats.append(compile_counters(_C.compiler_stats()))
    (run,) = runs
    assert stats[0] == stats[1] == stats[2], stats
    assert len(run.magi_executable.generated_kernels()) == 1
    assert counters().compiles == 1


def test_cuda_form_of_every_variant_is_nvrtc_compiled(tmp_path, monkeypatch, assert_close_rel):
    """With an empty cache, a CPU run compiles each variant twice: host compiler and NVRTC."""
    if not _C.nvrtc_available():
        pytest.skip("NVRTC is not available")
    saved = _C.cache_dir()
    _C.set_cache_dir(str(tmp_path))
    _C._clear_kernel_memory_cache()
    try:
        for verify, expected_cuda in (("0", 0), ("1", 1)):
            monkeypatch.setenv("MAGI_VERIFY_CUDA_CODEGEN", verify)
            _C.reset_compiler_stats()
            (run,) = run_pattern(BY_NAME["softmax"], torch.float32, "cpu", assert_close_rel)
            stats = _C.compiler_stats()
            assert stats["cpu_compiles"] + stats["memory_hits"] >= 1, stats
            assert stats["cuda_compiles"] == expected_cuda, stats
    finally:
        _C.set_cache_dir(saved)
        _C._clear_kernel_memory_cache()


def _rms_norm(x, w):  # a per-column weight every row reads again
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _layer_norm(x, w):
    return F.layer_norm(x, x.shape[-1:], w, w * 0.5)


def _softmax(x, w):
    return torch.softmax(x * w, -1)


def _gated(x, w):  # pointwise only
    return F.silu(x) * (x + w)


_ROW_FUNCTIONS = [_rms_norm, _layer_norm, _softmax, _gated]


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("fn", _ROW_FUNCTIONS, ids=lambda f: f.__name__.strip("_"))
def test_row_kernels_over_short_long_and_odd_rows_match_eager(fn, assert_close_rel):
    """RMSNorm, LayerNorm, softmax and a pointwise kernel over rows of 64, 1001 and 8192 float32
    values match eager, and every CUDA form of each (rows in warps, held by a block or a wide
    block, streamed; whole and narrower vectors) NVRTC-compiles for sm_90."""
    compiled = magi_compile(fn)
    with torch.no_grad():
        for cols in (64, 1001, 8192):
            x, w = torch.randn(6, cols), torch.randn(cols)
            assert_close_rel(compiled(x, w), fn(x, w), 1e-5)


def _cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit, or the copy Triton's wheel (a dependency of torch) has."""
    import shutil
    from pathlib import Path

    found = shutil.which("cuobjdump")
    if found is not None:
        return found
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(path) if path.exists() else None


@pytest.mark.usefixtures("no_fallback")
def test_row_kernel_stores_are_whole_16_byte_stores(tmp_path, assert_close_rel):
    """In the sm_90 machine code of the bf16 kernels (RMSNorm, LayerNorm, softmax over rows of
    8192 values, and a pointwise one), every store of a form that moves vectors of 8 values is
    one 16-byte STG: assigned through a uint4*, ptxas had split half of an RMSNorm kernel's plain
    stores into four 4-byte ones."""
    tool = _cuobjdump()
    if tool is None or not _C.nvrtc_available():
        pytest.skip("needs NVRTC and cuobjdump (from the CUDA toolkit or Triton)")
    saved = _C.cache_dir()
    _C.set_cache_dir(str(tmp_path))
    _C._clear_kernel_memory_cache()
    try:
        with torch.no_grad():
            for fn in _ROW_FUNCTIONS:
                torch._dynamo.reset()
                x = torch.randn(6, 8192, dtype=torch.bfloat16)
                w = torch.randn(8192, dtype=torch.bfloat16)
                assert_close_rel(magi_compile(fn)(x, w), fn(x, w), 2e-2)
    finally:
        _C.set_cache_dir(saved)
        _C._clear_kernel_memory_cache()
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


# ---- training: fused forward, column reductions in the backward --------------------------


class NormBlock(torch.nn.Module):
    """Linear → LayerNorm → SiLU → Linear → RMSNorm, plus a residual."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, hidden)
        self.ln = torch.nn.LayerNorm(hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.rms = RMSNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.ln(self.fc1(x)))
        return self.rms(self.fc2(h) + x)


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_training_gradients_match_eager(dtype, assert_close_rel, counters):
    """Gradients of a Linear+LayerNorm+RMSNorm block. The RMSNorm weight gradient is a column
    reduction (tangent * normalized, summed over both leading dims): one column kernel. Without
    recomputation: a backward that recomputes the norm (HEURISTIC) puts the product in the
    norm's row group, and the column sum then runs as a column kernel of its own."""
    eager = init_weights_(NormBlock(), seed=0).to(dtype)
    no_recompute = {"recompute_config": {"recompute_policy": "HANDCRAFT", "memory_budget": 1.0}}
    compiled = magi_compile(copy.deepcopy(eager), config_patch=no_recompute)
    rtol = RTOL[dtype]
    with lowered_graphs() as runs:
        for batch in (3, 5):
            x = torch.randn(batch, 6, 32, dtype=dtype)
            x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
            g = torch.randn(batch, 6, 32, dtype=dtype)
            out_eager, out_compiled = eager(x_eager), compiled(x_compiled)
            assert_close_rel(out_compiled, out_eager, RTOL[dtype])
            out_eager.backward(g)
            out_compiled.backward(g)
            assert_close_rel(x_compiled.grad, x_eager.grad, rtol)
            for p, q in zip(compiled.parameters(), eager.parameters(), strict=True):
                assert_close_rel(p.grad, q.grad, rtol)
                p.grad = q.grad = None
    assert len(runs) == 2, "one forward and one backward graph for both batch sizes"
    forward, backward = runs
    assert forward.magi_executable.num_fusions >= 1
    assert backward.magi_executable.num_fusions >= 1
    column = [
        k
        for k in backward.magi_executable.generated_kernels()
        if "column kernel" in k["source"].splitlines()[0]
    ]
    assert column, backward.magi_graph
    assert "aten::sum.dim_IntList" in column[0]["fused_ops"]
    # The Linear bias gradients sum a view of the graph's input: lone sums over the leading
    # dims, column kernels of their own, so no sum is left to ATen.
    assert len(column) >= 3, [k["symbol"] for k in column]
    assert "aten::sum.dim_IntList" not in backward.magi_graph.op_names(), backward.magi_graph


class SandwichNorm(torch.nn.Module):
    """Gemma-2's RMSNorm: ``x * rsqrt(mean(x^2) + eps) * (1 + w)``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.w)


class SandwichStack(torch.nn.Module):
    """Layers that norm each sublayer's output before the residual add (Gemma 2 and 3): in the
    backward the fusion groups of consecutive norms interleave, and fusing the earlier one moves
    members of the later one past its own fused kernel."""

    def __init__(self, hidden: int = 32, layers: int = 3) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList(SandwichNorm(hidden) for _ in range(4 * layers))
        self.linears = torch.nn.ModuleList(
            torch.nn.Linear(hidden, hidden, bias=False) for _ in range(2 * layers)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, linear in enumerate(self.linears):
            h = h + self.norms[2 * i + 1](linear(self.norms[2 * i](h)))
        return h


@pytest.mark.usefixtures("no_fallback")
def test_interleaved_groups_of_sandwich_norms_train_like_eager(assert_close_rel):
    eager = SandwichStack()
    with torch.no_grad():
        for p in eager.parameters():
            p.normal_(0.0, 0.2)
    compiled = magi_compile(copy.deepcopy(eager))
    x = torch.randn(2, 8, 32)
    weights = torch.randn(2, 8, 32)
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    ((eager(x_eager) * weights).sum()).backward()
    ((compiled(x_compiled) * weights).sum()).backward()
    assert_close_rel(x_compiled.grad, x_eager.grad, RTOL[torch.float32])
    for p, q in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert_close_rel(p.grad, q.grad, RTOL[torch.float32])


class RotaryBlock(torch.nn.Module):
    """A projection to heads, rotary embedding, a projection back: the rotary backward takes
    the gradient of both slices of rotate_half (slice_backward, decomposed to zero pads)."""

    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.q = torch.nn.Linear(hidden, hidden, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        q = self.q(x).view(b, s, self.heads, h // self.heads)
        return self.o(apply_rotary(q, cos, sin).reshape(b, s, h))


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_rotary_backward_is_one_kernel(dtype, assert_close_rel, capfd):
    """The rotary gradient (two zero pads, a negation, products with cos and sin, the sum) is
    one generated kernel over a dynamic batch: no slice_backward, pad, zero fill or copy left
    to ATen, and no run through ATen because its output is flattened for the next matmul."""
    eager = init_weights_(RotaryBlock(), seed=0).to(dtype)
    compiled = magi_compile(copy.deepcopy(eager), dynamic_arg_dims={"x": 0})
    _logging.set_level("debug")
    try:
        with lowered_graphs() as runs:
            for batch in (3, 5):
                _, cos, sin = _rotary_inputs(batch, dtype, "cpu")  # tables of seq 6, dim 16
                x = torch.randn(batch, 6, 32, dtype=dtype)
                x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
                g = torch.randn(batch, 6, 32, dtype=dtype)
                eager(x_eager, cos, sin).backward(g)
                compiled(x_compiled, cos, sin).backward(g)
                assert_close_rel(x_compiled.grad, x_eager.grad, RTOL[dtype])
                for p, q in zip(compiled.parameters(), eager.parameters(), strict=True):
                    assert_close_rel(p.grad, q.grad, RTOL[dtype])
                    p.grad = q.grad = None
    finally:
        _logging.init_from_env()
    backward = runs[-1]
    ops = backward.magi_graph.op_names()
    for op in ("aten::slice_backward", "aten::constant_pad_nd", "aten::neg", "aten::add.Tensor"):
        assert op not in ops, (op, backward.magi_graph)
    rotary = [
        k for k in backward.magi_executable.generated_kernels()
        if "aten::constant_pad_nd" in k["fused_ops"]
    ]  # fmt: skip
    assert len(rotary) == 1 and rotary[0]["fused_ops"].count("aten::constant_pad_nd") == 2
    assert "not addressable with strides" not in capfd.readouterr().err


def test_group_flattened_twice_computes_in_its_own_shape(assert_close_rel, capfd):
    """Regression: a transposed operand scaled, made contiguous and flattened twice (to heads
    merged, then to rows for a matmul) had the last flattening's shape as its index space, where
    the operand has no strides: every call ran through ATen. Both views now leave the group."""

    def fn(x, w):
        y = (x.transpose(1, 2) * 2.0).contiguous().view(x.shape[0], x.shape[2], -1)
        return y @ w

    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0})
    w = torch.randn(32, 8)
    _logging.set_level("debug")
    try:
        with lowered_graphs() as runs, torch.no_grad():
            for batch in (2, 3):
                x = torch.randn(batch, 4, 16, 8)
                assert_close_rel(compiled(x, w), fn(x, w), RTOL[torch.float32])
    finally:
        _logging.init_from_env()
    kernels = runs[0].magi_executable.generated_kernels()
    assert any("aten::mul" in op for k in kernels for op in k["fused_ops"]), kernels
    assert "not addressable with strides" not in capfd.readouterr().err


def test_pointwise_output_keeps_the_traced_layout(assert_close_rel):
    """Regression: eager lays an elementwise result out like its input (here heads-major
    [b, h, s, d] stored as [b, s, h, d]), so the trace may view it back without a copy. The
    fused kernel wrote it contiguous and that view failed; it now writes the traced layout
    (its index space relabelled), and an output traced contiguous is made contiguous."""

    def fn(x, w):
        y = x * 2.0 + 1.0
        b, h, s, d = y.shape
        z = (y - 1.0).contiguous() * 3.0  # traced contiguous, computed beside y
        return y.transpose(1, 2).view(b, s, h * d) @ w, z.view(b, -1)

    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0})
    w = torch.randn(32, 8)
    with lowered_graphs() as runs, torch.no_grad():
        for batch in (2, 3):
            x = torch.randn(batch, 6, 4, 8).transpose(1, 2)
            got, want = compiled(x, w), fn(x, w)
            assert_close_rel(got[0], want[0], RTOL[torch.float32])
            assert_close_rel(got[1], want[1], RTOL[torch.float32])
    assert runs[0].magi_executable.num_fusions >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("group", [2, 4, 9])
def test_sum_over_a_middle_dim_fuses_when_short(group, dtype, assert_close_rel):
    """A sum over one middle dim (grouped-query attention's gradient of K and V, summed over
    the query heads sharing them) of 2 to 8 elements is a sum of views, fused with the
    transpose and copy after it; a longer one stays ATen's reduction. Both match eager."""

    def fn(x):
        b, kv, g, s, d = x.shape
        return x.sum(2).transpose(1, 2).reshape(b, s, kv * d) * 0.5

    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        for batch in (2, 3):
            x = torch.randn(batch, 2, group, 5, 8, dtype=dtype)
            assert_close_rel(compiled(x), fn(x), RTOL[dtype])
    ops = runs[0].magi_graph.op_names()
    if group <= 8:
        assert "aten::sum.dim_IntList" not in ops, runs[0].magi_graph
        assert runs[0].magi_executable.num_fusions == 1
    else:
        assert "aten::sum.dim_IntList" in ops, runs[0].magi_graph


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_lone_copy_of_a_strided_operand_is_a_kernel(dtype, assert_close_rel):
    """Grouped-query attention's repeat_kv (the clone of an expanded, transposed matmul output)
    and a cast of a transposed tensor into a contiguous result run as generated kernels reading
    through the operand's strides, and match eager; a copy of a contiguous tensor, or one that
    keeps the transposed layout, stays an ATen call."""

    def repeat_kv(x, w):
        b, s, _ = x.shape
        kv = (x @ w).view(b, s, 2, 8).transpose(1, 2)
        return kv[:, :, None].expand(b, 2, 3, s, 8).reshape(b, 6, s, 8)

    def cast_transposed(x):
        return x.transpose(1, 2).to(torch.float64, memory_format=torch.contiguous_format)

    def cast_keeping_layout(x):  # preserve_format: one dense pass in ATen
        return x.transpose(1, 2).to(torch.float64)

    def copy_contiguous(x):
        return x.clone()

    w = torch.randn(16, 16, dtype=dtype)
    for fn, args, fused in (
        (repeat_kv, lambda b: (torch.randn(b, 5, 16, dtype=dtype), w), True),
        (cast_transposed, lambda b: (torch.randn(b, 5, 7, dtype=dtype),), True),
        (cast_keeping_layout, lambda b: (torch.randn(b, 5, 7, dtype=dtype),), False),
        (copy_contiguous, lambda b: (torch.randn(b, 5, 7, dtype=dtype),), False),
    ):
        compiled = magi_compile(fn, dynamic_arg_dims={fn.__code__.co_varnames[0]: 0})
        with lowered_graphs() as runs, torch.no_grad():
            for batch in (2, 3):
                inputs = args(batch)
                assert_close_rel(compiled(*inputs), fn(*inputs), RTOL[dtype])
        (run,) = runs
        assert run.magi_executable.num_fusions == (1 if fused else 0), (fn, run.magi_graph)


@magi_register_custom_op(name="magi_t_fusion::double", infer_output_meta_fn=["x"])
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _swiglu(x, wg, wu):
    return F.silu(x @ wg) * (x @ wu)


def _swiglu_doubled(x, wg, wu):
    return _double(_swiglu(x, wg, wu))


@pytest.mark.parametrize("with_custom_op", [False, True])
def test_first_call_keeps_aotautograds_check_only_for_custom_ops(with_custom_op, monkeypatch):
    """AOTAutograd checks custom ops for aliasing under a dispatch mode on a graph's first call;
    a graph with a custom op still runs its first call under it (every op it makes passes the
    mode), one without runs it without (none does)."""
    from torch._functorch._aot_autograd import runtime_wrappers

    seen = []
    mode = runtime_wrappers._AnalyzeCustomOpInputOutputMode
    checked = mode.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return checked(self, func, types, args, kwargs)

    monkeypatch.setattr(mode, "__torch_dispatch__", counting)
    fn = _swiglu_doubled if with_custom_op else _swiglu
    wg, wu = torch.randn(24, 40), torch.randn(24, 40)
    compiled = magi_compile(fn, dynamic_arg_dims={})
    x = torch.randn(6, 24)
    with lowered_graphs() as runs, torch.no_grad():
        torch.testing.assert_close(compiled(x, wg, wu), fn(x, wg, wu))
    assert any(r.magi_executable.calls_custom_ops for r in runs) == with_custom_op
    if with_custom_op:
        assert any("magi_t_fusion" in f for f in seen), seen
    else:
        assert seen == []


@pytest.mark.parametrize(
    "activation",
    [torch.sigmoid, F.silu, lambda x: F.gelu(x, approximate="tanh"), F.gelu],
    ids=["sigmoid", "silu", "gelu_tanh", "gelu"],
)
def test_cpu_activations_match_eager_at_extreme_and_special_values(activation):
    """The C++ kernels' sigmoid, SiLU, tanh-GELU and GELU evaluate e^v with the preamble's
    vectorizable magi_expf instead of libm's expf (GELU's erf through it too): float32 results
    against eager's float64 ones rounded to float32, on random values and on the extremes of
    the range (infinities, NaN, where e^v overflows or underflows, signed zeros). Eager's own
    float32 GELU is not the reference there: its vectorized path gives NaN at +inf and inf at
    3e38 (its one-element path gives inf and 3e38)."""

    def fn(x, y):
        return activation(x) * y + y

    special = [float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0]
    special += [88.0, -88.0, 88.8, -88.8, 100.0, -100.0, 1e4, -1e4, 1e20, -1e20, 3.0e38, -3.0e38]
    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0, "y": 0})
    with lowered_graphs() as runs, torch.no_grad():
        for rows in (3, 5):
            x = torch.randn(rows, 97) * 8
            x[0, : len(special)] = torch.tensor(special)
            y = torch.rand(rows, 97) + 0.5
            expected = fn(x.double(), y.double()).float()
            torch.testing.assert_close(
                compiled(x, y), expected, rtol=2e-6, atol=1e-6, equal_nan=True
            )
    assert runs[0].magi_executable.num_fusions == 1, runs[0].magi_graph


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_row_reductions_keep_nan_and_infinities_in_every_lane(dtype):
    """The C++ row kernels accumulate in vectorized lanes (``#pragma omp simd reduction``) and
    combine the lanes' partial maxima and minima with magi_max / magi_min, so a NaN wins wherever
    it sits in the row; exp of a float is the preamble's magi_expf. Row r of a 1000-column
    input holds a NaN at column 17r (lane position r of a 16-lane vector, every lane of narrower ones), other rows an inf
    or a -inf, the last rows none: amax, amin, sum and softmax against eager."""

    def fn(x):  # each reduction fused with a pointwise producer into a row kernel
        y = x * 2.0
        return torch.maximum(y, x).amax(-1), torch.minimum(y, x).amin(-1), y.sum(-1), y.softmax(-1)

    rows, cols = 40, 1000
    x = torch.randn(rows, cols, dtype=dtype) * 4
    for r in range(16):
        x[r, 17 * r] = float("nan")  # column 17r: lane position r of 16
    for r in range(16, 24):
        x[r, cols - 1 - r] = float("inf")
    for r in range(24, 32):
        x[r, r] = -float("inf")
    compiled = magi_compile(fn, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        got, want = compiled(x), fn(x)
    assert runs[0].magi_executable.num_fusions == 1, runs[0].magi_graph
    for g, w in zip(got, want, strict=True):
        # NaN and infinities exactly where eager has them; the finite values as the fusion tests
        # compare (a vectorized sum adds in another order: relative to the largest value)
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.isinf(), w.isinf())
        assert torch.equal(g[w.isinf()], w[w.isinf()])
        finite = w.isfinite()
        err = (g[finite].double() - w[finite].double()).abs().max() / w[finite].abs().max()
        assert err <= RTOL[dtype], (err, g, w)


def test_cpu_kept_values_that_do_not_fit_raise_memory_error():
    """A C++ row kernel allocates the values it keeps between passes for each call, before its
    parallel loop: when that fails (here an OpenMP team of 2^30 threads asks for 4 TiB), the call
    raises a MemoryError naming the kernel, and the process and the kernel work on. Run in a
    child: the thread count is the process's OpenMP setting, which torch shares."""
    script = textwrap.dedent(
        """
        import ctypes
        import torch
        from magi_compiler import magi_compile

        def fn(x):
            return torch.softmax(x, -1)

        f = magi_compile(fn, dynamic_arg_dims={"x": [0]})
        x = torch.randn(64, 1003)
        torch.testing.assert_close(f(x), fn(x))
        y = torch.randn(65, 1003)  # before the setting: torch's ops share the OpenMP runtime
        omp = ctypes.CDLL("libgomp.so.1")
        threads = omp.omp_get_max_threads()
        omp.omp_set_num_threads(1 << 30)
        try:
            f(y)
        except MemoryError as e:
            print("MEMORY ERROR:", e)
        omp.omp_set_num_threads(threads)
        torch.testing.assert_close(f(x), fn(x))
        print("STILL CORRECT")
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MEMORY ERROR: the C++ kernel fused_softmax_" in done.stdout, done.stdout
    assert (
        "could not allocate the values it keeps between passes over a row: 1003 columns per kept"
        " value for each of its OpenMP threads (OMP_NUM_THREADS)" in done.stdout
    ), done.stdout
    assert done.stdout.rstrip().endswith("STILL CORRECT"), done.stdout


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_row_passes_keep_costly_values_for_later_passes(dtype, assert_close_rel):
    """A C++ row kernel computes each exp or sin once per element: the pass that first computes
    it keeps it in a row of the kernel's kept-values buffer (one per thread, allocated per call)
    for the later passes, which read it there instead of the input. Here e = exp(x - max) is computed in the sum pass and read by
    the second sum and the outputs, s = sin(x) is computed in the second sum and read by the
    outputs; softmax keeps its exponentials the same way."""

    def fn(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        total = e.sum(-1, keepdim=True)
        s = torch.sin(x) * 0.5 + 1.0
        weighted = (e * s).sum(-1, keepdim=True)
        return e * s / (total * weighted), torch.softmax(x, -1)

    compiled = magi_compile(fn, dynamic_arg_dims={"x": [0, 1]})
    with lowered_graphs() as runs, torch.no_grad():
        # rows and columns dynamic: one kernel whose buffers grow with the row; 64 x 1003 runs
        # its rows on several threads (the loop is parallel past 32768 elements)
        for rows, cols in ((3, 1003), (64, 1003), (5, 4099), (64, 517)):
            x = torch.randn(rows, cols, dtype=dtype) * 3
            assert_close_rel(compiled(x), fn(x), RTOL[dtype])
    kernels = {k["symbol"]: k["source"] for k in runs[0].magi_executable.generated_kernels()}
    (src,) = [text for symbol, text in kernels.items() if "_sin_" in symbol]
    (soft,) = [text for symbol, text in kernels.items() if "softmax" in symbol]
    assert src.count("= kept.get() + (") == 2 and soft.count("= kept.get() + (") == 1
    assert "kept(new A[(size_t)magi_max_threads() * 2 *" in src, src
    for text, kept in ((src, 2), (soft, 1)):
        assert text.count("magi_exp(") == 1 and text.count("sin(") == (kept == 2), text
        # the output pass reads the kept values and no input
        out_pass = text[text.rindex("for (long long col0") :]
        assert "in0[" not in out_pass and out_pass.count("[col0 + j];") == kept, out_pass
