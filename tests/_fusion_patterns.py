"""Fusible patterns shared by the CPU (tests/python/test_fusion.py) and CUDA
(tests/gpu/test_fusion_cuda.py) fusion tests.

Each :class:`Pattern` is a small function the way a model writes it, a maker of fresh random
inputs for a batch size, the dims that are dynamic, and the ATen ops that must end up together
in one generated kernel. :func:`run_pattern` compiles it with ``magi_compile``, runs it at two
batch sizes against eager and returns the lowered graphs (``_backend.lower_graph``'s results)
so a test can look at what was fused.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from blocks import apply_rotary

F32, BF16, F16, F64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
DTYPES = (F32, BF16, F16)
DTYPE_IDS = {F32: "f32", BF16: "bf16", F16: "f16", F64: "f64"}
RTOL = {F32: 1e-5, F64: 1e-5, BF16: 1e-2, F16: 1e-2}
BATCHES = (3, 5)  # dim 0 is dynamic: the second batch size reuses the first one's kernels


@dataclass
class Pattern:
    name: str
    fn: Callable
    make: Callable[[int, torch.dtype, str], tuple]  # (batch, dtype, device) -> inputs
    ops: tuple[str, ...]  # ATen ops ("aten::mean") that must share one kernel
    dynamic: dict[str, int] = field(default_factory=lambda: {"x": 0})
    dtypes: tuple[torch.dtype, ...] = DTYPES
    batches: tuple[int, ...] = BATCHES
    casts: bool = False  # expects aten::_to_copy in the kernel unless the dtype is float32


def _rand(*shape, dtype, device):
    return torch.randn(*shape, dtype=dtype, device=device)


def _inputs(*shapes):
    """A maker of random inputs of `shapes`; a shape entry "B" is the batch size."""

    def make(batch, dtype, device):
        return tuple(
            _rand(*[batch if d == "B" else d for d in s], dtype=dtype, device=device)
            for s in shapes
        )

    return make


# ---- the patterns ------------------------------------------------------------------------


def rmsnorm(x, w):
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(variance + 1e-6) * w.float()).to(x.dtype)


def add_rmsnorm(x, r, w):
    h = x + r
    return rmsnorm(h, w), h


def layer_norm_affine(x, r, w, b):
    return F.layer_norm(x + r, (x.shape[-1],), w, b, 1e-5)


def layer_norm_plain(x, y):
    return F.layer_norm(x, (x.shape[-1],)) * y


def softmax(x):
    return F.softmax(x * 0.125, dim=-1)


def softmax_causal(x, mask):
    return F.softmax(x + mask, dim=-1)


def log_softmax(x):
    return F.log_softmax(x / 0.7, dim=-1)


def rotary(x, cos, sin):
    return apply_rotary(x, cos, sin)


def silu_mul(x, u):
    return F.silu(x) * u


def swiglu_chunk(x):
    gate, up = x.chunk(2, dim=-1)  # strided halves of one tensor
    return F.silu(gate) * up


def gelu(x, b):
    return F.gelu(x + b)


def gelu_tanh(x, b):
    return F.gelu(x + b, approximate="tanh")


def residual_chain(x, y, z):
    h = x + y
    h = h * 0.5 + z
    return torch.relu(h) - x


def cast_roundtrip(x, y):
    return (x.float() * y.float() + 1.0).to(x.dtype)


def bias_relu(x, b):
    return torch.relu(x + b) * 2.0


def row_scale(x, s, y):
    return x * s + y  # s is [..., 1]: one value per row


def row_and_column(x, s, b):
    return torch.sigmoid(x * s + b)


def transposed(x, y):
    return x.transpose(0, 1) * y + 1.0


def permuted(x, y):
    return torch.sigmoid(x.permute(0, 2, 1) + y)


def sliced(x, y):
    return x[:, :, ::2] * y + y


def transposed_rmsnorm(x, w):
    return rmsnorm(x.transpose(1, 2), w)


def odd_pointwise(x, y):
    return torch.sigmoid(x * y) + x


def broadcast_leading_one(x, y):
    return torch.tanh(x + y) * y  # y is [1, S, C]


def size_one_sum(x):
    return (x * 2.0).sum(-1)  # rows of length 1


def where_mask(m, x, y):
    return torch.where(m, x * 2.0, y)


def where_compare(x):
    return torch.where(x > 0, x, x * 0.1)


def amax_keepdim(x):
    return x - x.amax(-1, keepdim=True)


def amax_nokeep(x, y):
    return (x * y).amax(-1)


def amin_keepdim(x):
    h = x * 3.0
    return h - h.amin(-1, keepdim=True)


def amin_nokeep(x, y):
    return (x - y).amin(-1)


def sum_keepdim(x):
    return x / (x.abs().sum(-1, keepdim=True) + 1.0)


def sum_nokeep(x, y):
    return (x * y).sum(-1)


def mean_keepdim(x):
    return x - x.mean(-1, keepdim=True)


def mean_nokeep(x, y):
    return (x - y).pow(2).mean(-1)


def scalar_constants(x):
    return (x * 0.125 - 3.5) / 7.0 + 2


def unary_zoo(x):
    return torch.sigmoid(torch.tanh(torch.log1p(torch.exp(-x.abs())))) * x


def roots(x):
    return torch.rsqrt(torch.sqrt(x * x + 1.0).reciprocal() + 1.0)


def max_min(x, y):
    return torch.minimum(torch.maximum(x, y) * 0.5, y) - x


def powers(x):
    return x.pow(3) + x.abs().pow(0.5) + (x.abs() + 1.0).pow(1.7)


def erf_expm1_trig(x, y):
    return torch.sin(torch.cos(torch.expm1(torch.erf(x) * 0.5)) * y)


def _causal_mask(batch, dtype, device):
    s = 8
    x = _rand(batch, 2, s, s, dtype=dtype, device=device)
    mask = torch.full((s, s), -math.inf, dtype=dtype, device=device).triu(1)
    return x, mask


def _rotary_inputs(batch, dtype, device):
    seq, heads, dim = 6, 2, 16
    pos = torch.arange(seq, dtype=torch.float32, device=device)[:, None]
    freq = torch.arange(dim // 2, dtype=torch.float32, device=device)[None, :]
    emb = (pos * 10000.0 ** (-2.0 * freq / dim)).repeat(1, 2)
    x = _rand(batch, seq, heads, dim, dtype=dtype, device=device)
    return x, emb.cos().to(dtype), emb.sin().to(dtype)


def _where_inputs(batch, dtype, device):
    x, y = (_rand(batch, 4, 24, dtype=dtype, device=device) for _ in range(2))
    return torch.rand(batch, 4, 24, device=device) > 0.5, x, y


C = 32
ROWS = ("B", 4, C)


def var_biased_nokeep(x, y):
    return torch.var(x + y, -1, unbiased=False) * 2.0


def var_mean_rows(x):
    # Upcast as models write norms: in bf16 throughout, eager's rounding of var, then of
    # x - mean and of rsqrt, turns a last-bit difference of var (two-pass vs eager's algorithm)
    # into 2 ulps of the output, just over the bf16 tolerance (3 draws in 40).
    xf = x.float()
    var, mean = torch.var_mean(xf * 2.0, -1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + 1e-5)).to(x.dtype)


def sibling_chains(x, y):
    return torch.exp(x) * torch.sin(y)


def reduction_and_independent_chain(x):
    return x.amin(-1, keepdim=True) + x * 3.0


def masked_softmax(m, x):
    return F.softmax(x.masked_fill(m, -math.inf), -1)


def slices_of_two_inputs(x, y):
    # pieces of different widths, from two inputs, each with its own op
    return torch.cat([torch.exp(y[..., :4]), x[..., 4:] * 2.0], -1) + x


def rotate_computed(x, y):
    # slices of a value the kernel computes: h is evaluated again at each piece's offset
    h = x * y + 1.0
    return torch.cat([h[..., C // 2 :], -h[..., : C // 2]], -1) * h


def rotary_grad(g, cos, sin):
    # The backward of apply_rotary as autograd emits it, with magi's decomposition of
    # slice_backward (zeros around the slice's gradient) into constant_pad_nd.
    half = g.shape[-1] // 2
    cos, sin = cos[:, None, :], sin[:, None, :]
    gs = g * sin
    pad = torch.ops.aten.constant_pad_nd
    return pad(-gs[..., :half], [half, 0], 0.0) + pad(gs[..., half:], [0, half], 0.0) + g * cos


def silu_grad(g, x):
    # A SwiGLU backward: the gate's gradient from the up projection's, as autograd emits it.
    return torch.ops.aten.silu_backward(g * x.sigmoid(), x)


def sigmoid_tanh_grads(g, x):
    aten = torch.ops.aten
    return aten.sigmoid_backward(g, torch.sigmoid(x)) + aten.tanh_backward(g, torch.tanh(x))


def gelu_grads(g, x):
    aten = torch.ops.aten
    return aten.gelu_backward(g, x) - 0.5 * aten.gelu_backward(g, x, approximate="tanh")


def column_sum(x, y):
    return (x * y).sum(0)


def column_bias_grad(g, h):
    # The backward of h * sigmoid(h) followed by a bias gradient: a full-size and a per-column
    # output of one kernel, summed over both leading dims, upcast as autocast would.
    sig = torch.sigmoid(h)
    gh = g * (sig * (1.0 + h * (1.0 - sig)))
    return gh, gh.float().sum((0, 1)).to(g.dtype)


def column_mean_scaled(x, w):
    # keepdim, an operand of the per-column ops ([C]), and a mean's divisor (the row count)
    return x.mean((0, 1), keepdim=True) * w + 1.0


def column_amax_amin(x, y):
    d = (x - y).abs()
    return d.amax(0), d.amin(0) * 2.0


def column_sum_transposed(x, y):
    return (x.transpose(0, 1) * y).sum(0)  # a strided operand


def column_sum_odd(x):
    return torch.tanh(x).sum(0)


# Views between computations: the values before a view are computed at the element the view
# maps to the index space, their operands read through the view's strides.


def view_heads(x, y):
    b, s, h = x.shape
    return (x * 2.0 + 1.0).view(b, s, 4, h // 4) * y  # y [C // 4]: read after the view


def transpose_between(x, y):
    return (torch.sigmoid(x) * 3.0).transpose(1, 2) + y


def heads_rmsnorm(x, r, w):
    # qk-norm: a residual add, the heads split off by a view, RMSNorm per head
    b, s, h = x.shape
    q = (x + r).view(b, s, 4, h // 4).float()
    return (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)


def flatten_column_sum(g, h):
    # a gradient flattened to 2-D for its matmul, and its bias gradient
    gh = g * torch.sigmoid(h)
    flat = gh.view(-1, gh.shape[-1])
    return flat, flat.sum(0)


def unsqueeze_read_twice(x, w):
    return ((x * w).unsqueeze(1) + 1.0) * w  # w is read before and after the view


def permute_heads(x, y):
    return (x.exp() * 0.5).permute(0, 2, 1, 3) - y


PATTERNS = [
    Pattern("rmsnorm", rmsnorm, _inputs(ROWS, (C,)), ("aten::pow", "aten::mean", "aten::rsqrt"),
            casts=True),
    Pattern("add_rmsnorm", add_rmsnorm, _inputs(ROWS, ROWS, (C,)),
            ("aten::add", "aten::pow", "aten::mean", "aten::rsqrt", "aten::mul"),
            dynamic={"x": 0, "r": 0}, casts=True),
    Pattern("layer_norm_affine", layer_norm_affine, _inputs(ROWS, ROWS, (C,), (C,)),
            ("aten::add", "aten::native_layer_norm"), dynamic={"x": 0, "r": 0}),
    Pattern("layer_norm_plain", layer_norm_plain, _inputs(ROWS, ROWS),
            ("aten::native_layer_norm", "aten::mul"), dynamic={"x": 0, "y": 0}),
    Pattern("softmax", softmax, _inputs(ROWS), ("aten::mul", "aten::_softmax")),
    Pattern("softmax_causal", softmax_causal, _causal_mask, ("aten::add", "aten::_softmax")),
    Pattern("log_softmax", log_softmax, _inputs(ROWS), ("aten::div", "aten::_log_softmax")),
    Pattern("rotary", rotary, _rotary_inputs,
            ("aten::slice", "aten::neg", "aten::cat", "aten::mul", "aten::add")),
    Pattern("rotary_grad", rotary_grad, _rotary_inputs,
            ("aten::slice", "aten::neg", "aten::constant_pad_nd", "aten::mul", "aten::add"),
            dynamic={"g": 0}),
    Pattern("silu_mul", silu_mul, _inputs(ROWS, ROWS), ("aten::silu", "aten::mul"),
            dynamic={"x": 0, "u": 0}),
    Pattern("swiglu_chunk", swiglu_chunk, _inputs(("B", 4, 2 * C)), ("aten::silu", "aten::mul")),
    Pattern("gelu", gelu, _inputs(ROWS, (C,)), ("aten::add", "aten::gelu")),
    Pattern("gelu_tanh", gelu_tanh, _inputs(ROWS, (C,)), ("aten::add", "aten::gelu")),
    Pattern("silu_grad", silu_grad, _inputs(ROWS, ROWS), ("aten::sigmoid", "aten::silu_backward"),
            dynamic={"g": 0, "x": 0}),
    Pattern("sigmoid_tanh_grads", sigmoid_tanh_grads, _inputs(ROWS, ROWS),
            ("aten::sigmoid_backward", "aten::tanh_backward", "aten::add"), dynamic={"g": 0, "x": 0}),
    Pattern("gelu_grads", gelu_grads, _inputs(ROWS, ROWS), ("aten::gelu_backward", "aten::sub"),
            dynamic={"g": 0, "x": 0}),
    Pattern("residual_chain", residual_chain, _inputs(ROWS, ROWS, ROWS),
            ("aten::add", "aten::mul", "aten::relu", "aten::sub"),
            dynamic={"x": 0, "y": 0, "z": 0}),
    Pattern("cast_roundtrip", cast_roundtrip, _inputs(ROWS, ROWS), ("aten::mul", "aten::add"),
            dynamic={"x": 0, "y": 0}, casts=True),
    Pattern("bias_relu", bias_relu, _inputs(ROWS, (C,)), ("aten::add", "aten::relu")),
    Pattern("row_scale", row_scale, _inputs(ROWS, ("B", 4, 1), ROWS), ("aten::mul", "aten::add"),
            dynamic={"x": 0, "s": 0, "y": 0}),
    Pattern("row_and_column", row_and_column, _inputs(ROWS, ("B", 4, 1), (C,)),
            ("aten::mul", "aten::add", "aten::sigmoid"), dynamic={"x": 0, "s": 0}),
    Pattern("transposed", transposed, _inputs((4, "B", C), ROWS), ("aten::mul", "aten::add"),
            dynamic={"x": 1, "y": 0}),
    Pattern("permuted", permuted, _inputs(("B", C, 4), ROWS), ("aten::add", "aten::sigmoid"),
            dynamic={"x": 0, "y": 0}),
    Pattern("sliced", sliced, _inputs(("B", 4, 2 * C), ROWS), ("aten::mul", "aten::add"),
            dynamic={"x": 0, "y": 0}),
    Pattern("transposed_rmsnorm", transposed_rmsnorm, _inputs(("B", C, 4), (C,)),
            ("aten::pow", "aten::mean", "aten::rsqrt"), casts=True),
    Pattern("odd_7x13", odd_pointwise, _inputs(("B", 13), ("B", 13)),
            ("aten::mul", "aten::sigmoid", "aten::add"), dynamic={"x": 0, "y": 0}, batches=(7, 11)),
    Pattern("rmsnorm_cols_1023", rmsnorm, _inputs(("B", 1023), (1023,)),
            ("aten::pow", "aten::mean", "aten::rsqrt"), casts=True),
    Pattern("softmax_cols_4097", softmax, _inputs(("B", 4097)), ("aten::mul", "aten::_softmax"),
            batches=(2, 3)),
    Pattern("layer_norm_prime", layer_norm_plain, _inputs(("B", 3, 97), ("B", 3, 97)),
            ("aten::native_layer_norm", "aten::mul"), dynamic={"x": 0, "y": 0}),
    Pattern("size_one_rows", add_rmsnorm, _inputs(("B", 1, C), ("B", 1, C), (C,)),
            ("aten::add", "aten::pow", "aten::mean", "aten::rsqrt"), dynamic={"x": 0, "r": 0},
            casts=True),
    Pattern("size_one_broadcast", broadcast_leading_one, _inputs(ROWS, (1, 4, C)),
            ("aten::add", "aten::tanh", "aten::mul")),
    Pattern("size_one_last_dim", size_one_sum, _inputs(("B", 6, 1)), ("aten::mul", "aten::sum")),
    Pattern("where_mask", where_mask, _where_inputs, ("aten::where", "aten::mul"),
            dynamic={"m": 0, "x": 0, "y": 0}),
    Pattern("where_compare", where_compare, _inputs(ROWS), ("aten::where", "aten::mul")),
    Pattern("amax_keepdim", amax_keepdim, _inputs(ROWS), ("aten::amax", "aten::sub")),
    Pattern("amax_nokeep", amax_nokeep, _inputs(ROWS, ROWS), ("aten::mul", "aten::amax"),
            dynamic={"x": 0, "y": 0}),
    Pattern("amin_keepdim", amin_keepdim, _inputs(ROWS), ("aten::mul", "aten::amin", "aten::sub")),
    Pattern("amin_nokeep", amin_nokeep, _inputs(ROWS, ROWS), ("aten::sub", "aten::amin"),
            dynamic={"x": 0, "y": 0}),
    Pattern("sum_keepdim", sum_keepdim, _inputs(ROWS), ("aten::abs", "aten::sum", "aten::div")),
    Pattern("sum_nokeep", sum_nokeep, _inputs(ROWS, ROWS), ("aten::mul", "aten::sum"),
            dynamic={"x": 0, "y": 0}),
    Pattern("mean_keepdim", mean_keepdim, _inputs(ROWS), ("aten::mean", "aten::sub")),
    Pattern("mean_nokeep", mean_nokeep, _inputs(ROWS, ROWS), ("aten::pow", "aten::mean"),
            dynamic={"x": 0, "y": 0}),
    Pattern("scalar_constants", scalar_constants, _inputs(ROWS),
            ("aten::mul", "aten::sub", "aten::div", "aten::add")),
    Pattern("unary_zoo", unary_zoo, _inputs(ROWS),
            ("aten::abs", "aten::neg", "aten::exp", "aten::log1p", "aten::tanh", "aten::sigmoid")),
    Pattern("roots", roots, _inputs(ROWS), ("aten::mul", "aten::sqrt", "aten::reciprocal", "aten::rsqrt")),
    Pattern("max_min", max_min, _inputs(ROWS, ROWS), ("aten::maximum", "aten::minimum"),
            dynamic={"x": 0, "y": 0}),
    Pattern("powers", powers, _inputs(ROWS), ("aten::pow", "aten::abs", "aten::add")),
    Pattern("erf_expm1_trig", erf_expm1_trig, _inputs(ROWS, ROWS),
            ("aten::erf", "aten::expm1", "aten::cos", "aten::sin"), dynamic={"x": 0, "y": 0}),
    Pattern("sibling_chains", sibling_chains, _inputs(ROWS, ROWS),
            ("aten::exp", "aten::sin", "aten::mul"), dynamic={"x": 0, "y": 0}),
    Pattern("var_mean", var_mean_rows, _inputs(ROWS), ("aten::var_mean", "aten::rsqrt")),
    Pattern("var_biased_nokeep", var_biased_nokeep, _inputs(ROWS, ROWS),
            ("aten::add", "aten::var"), dynamic={"x": 0, "y": 0}),
    # Two chains from x meet: the pointwise one (x * 3) merges into the row kernel.
    Pattern("reduction_and_independent_chain", reduction_and_independent_chain, _inputs(ROWS),
            ("aten::amin", "aten::mul", "aten::add")),
    Pattern("masked_softmax", masked_softmax, lambda b, d, dev: _where_inputs(b, d, dev)[:2],
            ("aten::masked_fill", "aten::_softmax"), dynamic={"m": 0, "x": 0}),
    Pattern("slices_of_two_inputs", slices_of_two_inputs, _inputs(ROWS, ROWS),
            ("aten::slice", "aten::exp", "aten::mul", "aten::cat", "aten::add"),
            dynamic={"x": 0, "y": 0}),
    Pattern("rotate_computed", rotate_computed, _inputs(ROWS, ROWS),
            ("aten::mul", "aten::add", "aten::slice", "aten::neg", "aten::cat"),
            dynamic={"x": 0, "y": 0}),
    # Column reductions: over leading dims, as weight and bias gradients need.
    Pattern("column_sum", column_sum, _inputs(ROWS, ROWS), ("aten::mul", "aten::sum"),
            dynamic={"x": 0, "y": 0}),
    Pattern("column_bias_grad", column_bias_grad, _inputs(ROWS, ROWS),
            ("aten::sigmoid", "aten::mul", "aten::sum"), dynamic={"g": 0, "h": 0}, casts=True),
    Pattern("column_mean_scaled", column_mean_scaled, _inputs(ROWS, (C,)),
            ("aten::mean", "aten::mul", "aten::add")),
    Pattern("column_amax_amin", column_amax_amin, _inputs(ROWS, ROWS),
            ("aten::sub", "aten::abs", "aten::amax", "aten::amin"), dynamic={"x": 0, "y": 0}),
    Pattern("column_sum_transposed", column_sum_transposed, _inputs((4, "B", C), ROWS),
            ("aten::mul", "aten::sum"), dynamic={"x": 1, "y": 0}),
    Pattern("column_sum_odd_rows", column_sum_odd, _inputs(("B", 37)), ("aten::tanh", "aten::sum"),
            batches=(301, 7)),
    Pattern("view_heads", view_heads, _inputs(ROWS, (C // 4,)),
            ("aten::mul", "aten::add", "aten::view")),
    Pattern("transpose_between", transpose_between, _inputs(ROWS, ("B", C, 4)),
            ("aten::sigmoid", "aten::mul", "aten::transpose", "aten::add"),
            dynamic={"x": 0, "y": 0}),
    Pattern("heads_rmsnorm", heads_rmsnorm, _inputs(ROWS, ROWS, (C // 4,)),
            ("aten::add", "aten::view", "aten::pow", "aten::mean", "aten::rsqrt"),
            dynamic={"x": 0, "r": 0}, casts=True),
    Pattern("flatten_column_sum", flatten_column_sum, _inputs(ROWS, ROWS),
            ("aten::sigmoid", "aten::mul", "aten::view", "aten::sum"), dynamic={"g": 0, "h": 0}),
    Pattern("unsqueeze_read_twice", unsqueeze_read_twice, _inputs(("B", C), (C,)),
            ("aten::mul", "aten::unsqueeze", "aten::add")),
    Pattern("permute_heads", permute_heads, _inputs(("B", 4, 6, 8), ("B", 6, 4, 8)),
            ("aten::exp", "aten::mul", "aten::permute", "aten::sub"), dynamic={"x": 0, "y": 0}),
]  # fmt: skip


# ---- regressions: each once wrong before a fix (see the comments) -------------------------


def int_operand(x, p):
    return (x * p).exp() + 1.0  # p is int64: kernels load only float and bool elements


def row_sum_times_rows(x, z):
    return (x * 2.0).sum(-1) * z  # z [B, 4] is per row; it was read as per element


def row_sum_times_scalar(x, t):
    return (x * 2.0).sum(-1) * t, (x * 2.0).amax(-1, keepdim=True) * t  # t is 0-dim


def row_means_added(x, y):
    return (x * 2.0).mean(-1) + y.mean(-1)


def f32_cast_in_f64(x):
    return (x.float() - x) * 1e6  # the float32 rounding error, computed in float64


def nan_inf_max(x):
    return torch.maximum(x * 2.0, x).amax(-1), F.softmax(x, -1)


def masked_fill_values(m, x, t):
    # A value eager rounds to the tensor's dtype (0.1), and a 0-dim tensor value (masked_fill.Tensor).
    return x.masked_fill(m, 0.1) * 2.0, (x + 1.0).masked_fill(~m, t) - x


def _masked_fill_inputs(batch, dtype, device):
    m, x, _ = _where_inputs(batch, dtype, device)
    return m, x, torch.tensor(-0.7, dtype=dtype, device=device)


def cat_of_inputs(x):
    # rotary's cos/sin table: a cat of values no group computes is not fused (its pieces
    # were once read as kernel inputs of the cat's width); what reads it still fuses.
    e = torch.cat([x, x * 2.0], -1)
    return e.cos() * e.sin()


def _nan_inf_inputs(batch, dtype, device):
    x = _rand(batch, 4, 8, dtype=dtype, device=device)
    x[0, 0, 3], x[0, 1, 5], x[-1, 2, 0] = math.nan, math.inf, -math.inf
    return (x,)


def _int_operand_inputs(batch, dtype, device):
    return _rand(batch, 4, 8, dtype=dtype, device=device), torch.arange(8, device=device)


def _scalar_tensor_inputs(batch, dtype, device):
    return _rand(batch, 4, 8, dtype=dtype, device=device), torch.tensor(3.0, device=device)


REGRESSIONS = [
    Pattern("int_operand", int_operand, _int_operand_inputs, ("aten::exp", "aten::add"),
            dtypes=(F32,)),
    # batch 4 = cols: the [B, 4] operand broadcast against [B, 4, 4] and gave wrong values.
    Pattern("row_sum_times_rows", row_sum_times_rows, _inputs(("B", 4, 4), ("B", 4)),
            ("aten::mul", "aten::sum"), dynamic={"x": 0, "z": 0}, dtypes=(F32,), batches=(3, 4)),
    Pattern("row_sum_times_scalar", row_sum_times_scalar, _scalar_tensor_inputs,
            ("aten::mul", "aten::sum"), dtypes=(F32, BF16)),
    Pattern("row_means_added", row_means_added, _inputs(ROWS, ROWS), ("aten::mul", "aten::mean"),
            dynamic={"x": 0, "y": 0}, dtypes=(F32,)),
    Pattern("f32_cast_in_f64", f32_cast_in_f64, _inputs(ROWS), ("aten::_to_copy", "aten::sub"),
            dtypes=(F64,)),
    Pattern("nan_inf", nan_inf_max, _nan_inf_inputs, ("aten::maximum", "aten::amax"),
            dtypes=(F32, BF16)),
    Pattern("cat_of_inputs", cat_of_inputs, _inputs(("B", 8)), ("aten::cos", "aten::sin", "aten::mul"),
            dtypes=(F32,)),
    Pattern("masked_fill_values", masked_fill_values, _masked_fill_inputs,
            ("aten::masked_fill", "aten::mul"), dynamic={"m": 0, "x": 0}, dtypes=(F32, BF16)),
]  # fmt: skip

BY_NAME = {p.name: p for p in PATTERNS + REGRESSIONS}

# Patterns also checked in float64 (kernels compute in double there).
FLOAT64 = ("rmsnorm", "add_rmsnorm", "layer_norm_affine", "softmax", "silu_mul", "sum_nokeep")


def cases(dtypes=DTYPES, float64=True):
    """(pattern, dtype) pairs for pytest.mark.parametrize, with readable ids."""
    import pytest

    out = [
        pytest.param(p, d, id=f"{p.name}-{DTYPE_IDS[d]}")
        for p in PATTERNS
        for d in dtypes
        if d in p.dtypes
    ]
    if float64:
        out += [pytest.param(BY_NAME[n], F64, id=f"{n}-f64") for n in FLOAT64]
    out += [
        pytest.param(p, d, id=f"{p.name}-{DTYPE_IDS[d]}")
        for p in REGRESSIONS
        for d in p.dtypes
        if d in dtypes or (float64 and d == F64)
    ]
    return out


def expected_ops(pattern: Pattern, dtype: torch.dtype) -> tuple[str, ...]:
    if pattern.casts and dtype != F32:
        return (*pattern.ops, "aten::_to_copy")
    return pattern.ops


@contextlib.contextmanager
def lowered_graphs():
    """Collects what ``_backend.lower_graph`` returns while active (the run callables, with
    ``magi_graph`` and ``magi_executable``)."""
    from magi_compiler import _backend

    runs: list = []
    original = _backend.lower_graph

    def spy(gm, kind, config):
        run = original(gm, kind, config)
        runs.append(run)
        return run

    _backend.lower_graph = spy
    try:
        yield runs
    finally:
        _backend.lower_graph = original


def _rounded_float32_reference(pattern: Pattern, inputs: tuple, expected):
    """``pattern.fn`` on the inputs with their half-precision tensors in float32, each output
    cast to the dtype eager's (``expected``) has."""

    def up(t):
        return t.float() if isinstance(t, torch.Tensor) and t.dtype in (BF16, F16) else t

    def like(t, e):
        return t.to(e.dtype) if isinstance(t, torch.Tensor) else t

    out = pattern.fn(*[up(t) for t in inputs])
    if isinstance(out, (tuple, list)):
        return type(out)(like(t, e) for t, e in zip(out, expected, strict=True))
    return like(out, expected)


def run_pattern(pattern: Pattern, dtype: torch.dtype, device: str, assert_close_rel) -> list:
    """Compiles `pattern`, checks it against eager at each of its batch sizes on fresh random
    inputs, and returns the lowered graphs of the capture."""
    from magi_compiler import magi_compile

    torch._dynamo.reset()
    with lowered_graphs() as runs, torch.no_grad():
        compiled = magi_compile(pattern.fn, dynamic_arg_dims=dict(pattern.dynamic))
        for batch in pattern.batches:
            inputs = pattern.make(batch, dtype, device)
            out, expected = compiled(*inputs), pattern.fn(*inputs)
            try:
                assert_close_rel(out, expected, RTOL[dtype])
            except AssertionError:
                if dtype not in (BF16, F16):
                    raise
                # A kernel rounds once where eager rounds after every op: on long chains at
                # large magnitudes the two differ by a few units in the last place. Then the
                # float32 result, rounded once, is the fairer reference.
                assert_close_rel(
                    out, _rounded_float32_reference(pattern, inputs, expected), RTOL[dtype]
                )
    torch._dynamo.reset()
    assert len(runs) == 1, f"{len(runs)} graphs lowered for {len(pattern.batches)} batch sizes"
    return runs


class NotFused(AssertionError):
    """The expected ops do not share one generated kernel (numerics errors stay plain
    AssertionErrors, so an xfail for a missing fusion cannot hide a wrong result)."""


def compile_counters(stats: dict) -> dict:
    """_C.compiler_stats() without its launch counters (which move with every call)."""
    return {k: v for k, v in stats.items() if not k.endswith("_launches")}


def assert_fused(run, pattern: Pattern, dtype: torch.dtype) -> list[dict]:
    """The expected ops share one generated kernel; returns the generated kernels."""
    exe = run.magi_executable
    kernels = exe.generated_kernels()
    want = expected_ops(pattern, dtype)

    def covers(k):
        return all(any(op == w or op.startswith(w + ".") for op in k["fused_ops"]) for w in want)

    if not any(covers(k) for k in kernels):
        raise NotFused(
            f"{exe.num_fusions} fusions; no kernel fuses all of {want}; kernels fuse "
            f"{[k['fused_ops'] for k in kernels]}\n{run.magi_graph}"
        )
    return kernels
