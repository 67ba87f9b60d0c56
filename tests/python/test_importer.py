"""FX → IR importer and the C++ executor, on ATen-level graphs made with ``make_fx``.

Each case is a function of tensors plus a factory ``make(n)`` for its inputs, where ``n`` is
the size that varies. The function is traced with ``make_fx`` (symbolic or real), imported
with ``_C.import_fx_graph``, checked (verifier, printer) and run by ``_C.Executable`` on fresh
random inputs, against eager PyTorch on the same inputs. Symbolic graphs are traced at
``n = TRACE_N`` and run at ``n = RUN_N``: placeholders are the tensors only and sizes come
from ``aten.sym_size`` nodes, so a graph that baked a size in would fail here. Fixed sizes in
the cases avoid TRACE_N and RUN_N so that duck sizing does not tie them to ``n``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import magi_compiler
import pytest
import torch
import torch.nn.functional as F
from magi_compiler import _C
from torch.fx.experimental.proxy_tensor import make_fx

TRACE_N = 3
RUN_N = 5
ATEN = torch.ops.aten


@dataclass
class Case:
    name: str
    fn: Callable
    make: Callable[[int], list]  # n -> inputs
    ops: tuple[str, ...] = ()  # op names the imported graph must contain
    rtol: float = 1e-6
    modes: tuple[str, ...] = ("symbolic", "real")


def trace(case: Case, mode: str) -> torch.fx.GraphModule:
    return make_fx(case.fn, tracing_mode=mode)(*case.make(TRACE_N))


# --------------------------------------------------------------------------------------------
# The functions
# --------------------------------------------------------------------------------------------


def matmuls(x, w, b, y):
    return torch.addmm(b, x, w), torch.mm(x, w), torch.bmm(y, y.transpose(1, 2)), F.linear(x, w.t())


def arith(x, y):
    return (
        x + y,
        x - y,
        x * y,
        x / (y.abs() + 1),
        torch.add(x, y, alpha=2),
        x + 1,
        2.5 * x,
        x / 3,
        1 - x,
        ATEN.add.Scalar(x, 2),
        ATEN.sub.Scalar(x, 0.5),
        ATEN.mul.Scalar(x, 3),
        ATEN.div.Scalar(x, 4.0),
        ATEN.add.Tensor(x, True),
    )


def activations(x):
    return (
        torch.relu(x),
        F.gelu(x),
        F.gelu(x, approximate="tanh"),
        F.silu(x),
        torch.tanh(x),
        torch.exp(x),
        torch.rsqrt(x.abs() + 1),
        x.pow(2),
        x.abs().pow(0.5),
        torch.pow(x, torch.full_like(x, 3.0)),
        torch.sigmoid(x),
    )


def reductions(x):
    return (
        x.sum(dim=[0, 2], keepdim=True),
        x.sum(),
        x.mean(-1, keepdim=True),
        x.mean(dim=[1, 2]),
        x.amax(-1),
        x.amax(dim=[0, 1], keepdim=True),
        x.sum(1, dtype=torch.float64),
    )


def softmaxes(x):
    return F.softmax(x, -1), F.log_softmax(x, dim=1), torch.softmax(x, 0, dtype=torch.float64)


def views(x):
    n = x.shape[0]
    return (
        x.view(n, -1),
        x.permute(2, 0, 1).reshape(-1, n),  # non-contiguous reshape copies
        x.permute(1, 2, 0),
        x.transpose(0, 1),
        x[:, :1].expand(n, 4, 6),
        x.unsqueeze(1).unsqueeze(-1),
        x[:, :1].squeeze(1),
        x[:, 1:3],
        x[..., ::2],
        x[:, 0],
        x.narrow(2, 1, 4),
        x.view(n * 4, 6),  # symbolic arithmetic on sizes
    )


def joins(x, y):
    a, b, c = torch.split(x, 2, dim=-1)
    p, q = torch.split(y, [2, 4], dim=1)
    u, v = torch.chunk(x, 2, dim=1)
    rows = torch.unbind(y, dim=1)
    return (
        torch.cat([x, y], dim=1),
        torch.stack([a, b, c], dim=0),
        a + c,
        p,
        q.sum(1),
        u * v,
        rows[2],
    )


def norms(x, w, b):
    ln = F.layer_norm(x, (6,), w, b, eps=1e-5)
    var, mean = torch.var_mean(x, dim=-1, keepdim=True)
    return ln, var, mean, x.var(0, unbiased=False), x.std(-1)


def selects(x, y):
    cond = x > y
    s = x.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    return (
        torch.where(cond, x, y),
        torch.where(cond, x, 0.0),
        x.masked_fill(~cond, float("-inf")),
        x.masked_fill(causal.logical_not(), -1e9),
        torch.maximum(x, y),
        x.eq(y) | cond,
    )


def casts(x):
    return (
        x.to(torch.float64) * 2,
        x.to(torch.int32),
        x.half().float(),
        x.to(torch.bfloat16),
        (x > 0).to(x.dtype),
        x.type_as(torch.empty(0, dtype=torch.float64)),
    )


def factories(x):
    n = x.shape[0]
    return (
        torch.arange(n, dtype=torch.float32, device=x.device) + x[:, 0],
        torch.arange(0, 8, 2, dtype=torch.int64, device="cpu"),
        torch.arange(1.0, 2.0, 0.25, device=torch.device("cpu")),
        torch.full((4,), 2.5, dtype=torch.float64, device="cpu"),
        torch.zeros(3, dtype=torch.bool),
        torch.ones_like(x, dtype=torch.float16),
        torch.zeros_like(x) + x,
        x.new_full((2, n), 7),
        x.sum(0, keepdim=False, dtype=None),
        x * n,  # a symbolic int read as a Tensor argument
    )


def attention(q, k, v):
    return (
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, scale=0.3),
    )


def lookups(idx, w):
    return (
        F.embedding(idx, w),
        torch.index_select(w, 0, idx.reshape(-1)),
        torch.cumsum(w, 0),
        torch.cumsum(w, dim=1, dtype=torch.float64),
        torch.clamp(w, -0.5, 0.5),
        torch.clamp(w, min=0.0),
        -w,
        torch.gather(w, 1, idx[:, :2] % 6),
    )


def promotion(h, i, b):
    # Python numbers are wrapped numbers: they never widen a tensor's dtype. Symbolic sizes
    # read as tensors must not either.
    n = h.shape[0]
    return (
        h * 2.5,
        h + 1,
        h / 3,
        h * n,
        h * (n / 2),  # a SymFloat
        i + 2.5,
        i / 2,
        i * n,
        b + True,
        b * 2,
        torch.where(b, h, 0.5),
    )


def input_views(x, y):
    # Views of inputs (and an input itself) as outputs, an output repeated, and a
    # non-tensor-producing path: the executor must keep aliasing exactly as eager.
    z = x * 2
    return x, x.view(-1), x.t(), y[0], z, z, y


def rope(x):
    b, s, h, d = x.shape
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    rot = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * cos + rot * sin


CASES = [
    Case(
        "matmuls",
        matmuls,
        lambda n: [torch.randn(n, 6), torch.randn(6, 8), torch.randn(8), torch.randn(n, 4, 6)],
        ("aten::mm", "aten::addmm", "aten::bmm", "aten::t"),
        rtol=1e-5,
    ),
    Case(
        "arith",
        arith,
        lambda n: [torch.randn(n, 4), torch.randn(n, 4)],
        ("aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor")
        + ("aten::add.Scalar", "aten::sub.Scalar", "aten::mul.Scalar", "aten::div.Scalar"),
    ),
    Case(
        "activations",
        activations,
        lambda n: [torch.randn(n, 4)],
        ("aten::relu", "aten::gelu", "aten::silu", "aten::tanh", "aten::exp", "aten::rsqrt")
        + ("aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", "aten::sigmoid"),
    ),
    Case(
        "reductions",
        reductions,
        lambda n: [torch.randn(n, 4, 6)],
        ("aten::sum.dim_IntList", "aten::sum", "aten::mean.dim", "aten::amax"),
        rtol=1e-5,
    ),
    Case(
        "softmaxes",
        softmaxes,
        lambda n: [torch.randn(n, 4, 6)],
        ("aten::_softmax", "aten::_log_softmax"),
    ),
    Case(
        "views",
        views,
        lambda n: [torch.randn(n, 4, 6)],
        ("aten::view", "aten::permute", "aten::transpose.int", "aten::expand")
        + ("aten::unsqueeze", "aten::squeeze.dim", "aten::slice.Tensor", "aten::select.int"),
    ),
    Case(
        "joins",
        joins,
        lambda n: [torch.randn(n, 4, 6), torch.randn(n, 6, 6)],
        ("aten::cat", "aten::stack", "aten::split.Tensor", "aten::split_with_sizes", "getitem"),
    ),
    Case(
        "norms",
        norms,
        lambda n: [torch.randn(n, 4, 6), torch.randn(6), torch.randn(6)],
        ("aten::native_layer_norm", "aten::var_mean.correction"),
        rtol=1e-5,
    ),
    Case(
        "selects",
        selects,
        lambda n: [torch.randn(n, 6, 6), torch.randn(n, 6, 6)],
        ("aten::where.self", "aten::masked_fill.Scalar", "aten::gt.Tensor"),
    ),
    Case("casts", casts, lambda n: [torch.randn(n, 4)], ("aten::_to_copy",)),
    Case(
        "factories",
        factories,
        lambda n: [torch.randn(n, 4)],
        ("aten::arange", "aten::arange.start_step", "aten::full", "aten::zeros", "aten::ones_like"),
    ),
    Case(
        "attention",
        attention,
        lambda n: [torch.randn(n, 2, 6, 8), torch.randn(n, 2, 6, 8), torch.randn(n, 2, 6, 8)],
        ("aten::_scaled_dot_product_flash_attention_for_cpu",),
        rtol=1e-5,
    ),
    Case(
        "lookups",
        lookups,
        lambda n: [torch.randint(0, 10, (n, 4)), torch.randn(10, 6)],
        ("aten::embedding", "aten::index_select", "aten::cumsum", "aten::clamp", "aten::neg"),
        rtol=1e-5,
    ),
    Case(
        "promotion",
        promotion,
        lambda n: [
            torch.randn(n, 4, dtype=torch.bfloat16),
            torch.randint(-9, 9, (n, 4), dtype=torch.int32),
            torch.rand(n, 4) > 0.5,
        ],
    ),
    Case("input_views", input_views, lambda n: [torch.randn(n, 4), torch.randn(n, 4)]),
    Case("rope", rope, lambda n: [torch.randn(n, 6, 2, 8)], ("aten::cos", "aten::sin"), 1e-5),
]
CASE_IDS = [c.name for c in CASES]


def run_and_compare(case: Case, mode: str, assert_close_rel, pipeline: bool) -> _C.Graph:
    gm = trace(case, mode)
    graph = _C.import_fx_graph(gm)
    assert graph.verify_errors() == []
    graph.verify()
    if pipeline:
        graph.run_pipeline()
        graph.verify()
    n = RUN_N if mode == "symbolic" else TRACE_N
    inputs = case.make(n)
    expected = case.fn(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    exe = _C.Executable(graph)
    actual = exe.run(list(inputs))
    assert isinstance(actual, list)
    assert len(actual) == graph.num_outputs == len(expected)
    assert_close_rel(actual, expected, case.rtol)
    return graph


@pytest.mark.parametrize("mode", ["symbolic", "real"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_import_and_run(case: Case, mode: str, assert_close_rel):
    if mode not in case.modes:
        pytest.skip(f"{case.name} is not traced in {mode} mode")
    graph = run_and_compare(case, mode, assert_close_rel, pipeline=False)
    names = set(graph.op_names())
    missing = [op for op in case.ops if op not in names]
    assert not missing, f"{case.name}: expected ops {missing} in {sorted(names)}"
    text = str(graph)
    for op in case.ops:
        if op != "getitem":
            assert f"{op}(" in text, f"printer output lacks {op}(:\n{text}"
    assert graph.num_inputs == len(case.make(TRACE_N))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_import_run_after_pipeline(case: Case, assert_close_rel):
    run_and_compare(case, "symbolic", assert_close_rel, pipeline=True)


def test_op_coverage():
    ops: set[str] = set()
    for case in CASES:
        for mode in case.modes:
            ops.update(_C.import_fx_graph(trace(case, mode)).op_names())
    aten = {op for op in ops if op.startswith("aten::")}
    assert len(aten) >= 25, sorted(aten)
    assert {"size", "getitem"} <= ops


# --------------------------------------------------------------------------------------------
# What the imported graph says
# --------------------------------------------------------------------------------------------


def test_symbolic_dims_are_printed_as_symbols():
    gm = make_fx(lambda x, w: torch.mm(x, w).relu(), tracing_mode="symbolic")(
        torch.randn(TRACE_N, 6), torch.randn(6, 8)
    )
    graph = _C.import_fx_graph(gm)
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    sym = str(placeholder.meta["val"].shape[0])  # e.g. 's75'
    assert sym.startswith("s") and sym[1:].isdigit(), sym
    in_types = graph.input_types()
    assert in_types[0].startswith(f"f32[{sym}, "), in_types
    assert graph.output_types()[0].startswith(f"f32[{sym}, "), graph.output_types()
    text = str(graph)
    assert sym in text and "aten::mm(" in text and "aten::relu(" in text, text
    # Real tracing bakes the sizes in.
    real = _C.import_fx_graph(make_fx(lambda x: x.relu())(torch.randn(TRACE_N, 6)))
    assert real.input_types() == [f"f32[{TRACE_N}, 6]"]


def test_sym_size_nodes_and_symbolic_results():
    def f(x):
        n, m = x.shape
        return x.view(n * m), x.new_zeros(n // 2 + 1, m), x[: n - 1]

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4, 6))
    graph = _C.import_fx_graph(gm)
    assert graph.num_inputs == 1  # sizes are not placeholders
    assert "size" in graph.op_names()
    exe = _C.Executable(graph)
    for n in (2, 5, 9):
        x = torch.randn(n, 6)
        out = exe.run([x])
        expected = f(x)
        assert [tuple(o.shape) for o in out] == [tuple(e.shape) for e in expected]
        for o, e in zip(out, expected, strict=True):
            assert torch.equal(o, e)


def test_sym_sum_of_several_sizes():
    """torch.sym_sum([...]), Dynamo's form of a sum of several sizes, imports as adds."""

    def f(a, b, c):
        n = torch.sym_sum([a.shape[0], b.shape[0], c.shape[0]])
        return torch.cat([a, b, c]).view(n * 6)

    gm = make_fx(f, tracing_mode="symbolic")(
        torch.randn(3, 6), torch.randn(4, 6), torch.randn(5, 6)
    )
    assert any(n.target is torch.sym_sum for n in gm.graph.nodes)
    exe = _C.Executable(_C.import_fx_graph(gm))
    for sizes in ((2, 3, 4), (7, 1, 5)):
        args = [torch.randn(k, 6) for k in sizes]
        (out,) = exe.run(args)
        assert torch.equal(out, f(*args))


def test_printer_shows_constants():
    def f(x):
        return (
            torch.full((2,), 2.5, dtype=torch.float64, device="cpu"),
            x.sum(0, keepdim=True, dtype=None),
            torch.zeros(3, dtype=torch.bool),
        )

    text = str(_C.import_fx_graph(make_fx(f)(torch.randn(4, 6))))
    for piece in ("2.5", "torch.float64", "device('cpu')", "None", "True", "torch.bool", "[2]"):
        assert piece in text, f"{piece!r} missing from:\n{text}"


def test_nodes_record_fx_names():
    gm = make_fx(lambda x: torch.relu(x) + 1)(torch.randn(4))
    graph = _C.import_fx_graph(gm)
    rows = graph.nodes()
    assert all(len(r) == 5 for r in rows)
    fx_names = {r[3] for r in rows}
    assert {"relu", "add"} <= fx_names
    relu = next(r for r in rows if r[1] == "aten::relu")
    assert relu[2] == ["f32[4]"]


def test_multi_output_op_with_one_used_output():
    def f(x, w, b):
        return F.layer_norm(x, (6,), w, b) * 2

    gm = make_fx(f, tracing_mode="symbolic")(
        torch.randn(TRACE_N, 6), torch.randn(6), torch.randn(6)
    )
    graph = _C.import_fx_graph(gm)
    assert graph.op_names().count("aten::native_layer_norm") == 1
    graph.run_pipeline()
    graph.verify()
    x, w, b = torch.randn(RUN_N, 6), torch.randn(6), torch.randn(6)
    (out,) = _C.Executable(graph).run([x, w, b])
    torch.testing.assert_close(out, f(x, w, b))


def test_outputs_alias_inputs_like_eager():
    gm = make_fx(input_views, tracing_mode="symbolic")(
        torch.randn(TRACE_N, 4), torch.randn(TRACE_N, 4)
    )
    graph = _C.import_fx_graph(gm)
    x, y = torch.randn(RUN_N, 4), torch.randn(RUN_N, 4)
    out = _C.Executable(graph).run([x, y])
    assert out[0] is x or out[0].data_ptr() == x.data_ptr()
    assert out[1].data_ptr() == x.data_ptr() and out[1].shape == (RUN_N * 4,)
    assert out[2].data_ptr() == x.data_ptr() and out[2].stride() == (1, 4)
    assert out[3].data_ptr() == y.data_ptr()
    assert out[4].data_ptr() == out[5].data_ptr()
    assert out[6].data_ptr() == y.data_ptr()


def test_get_attr_tensor_constant(assert_close_rel):
    table = torch.randn(4, 6)

    def f(x):
        return x @ table.t() + table.sum()

    gm = make_fx(f)(torch.randn(3, 6))
    assert any(n.op == "get_attr" for n in gm.graph.nodes), gm.graph
    graph = _C.import_fx_graph(gm)
    graph.verify()
    x = torch.randn(3, 6)
    assert_close_rel(_C.Executable(graph).run([x]), [f(x)], 1e-6)


def test_whole_llama_block_through_make_fx(assert_close_rel):
    from blocks import LlamaBlock, init_weights_

    block = init_weights_(LlamaBlock(hidden=64, n_heads=4, n_kv_heads=2, intermediate=96), seed=0)
    names = [name for name, _ in block.named_parameters()]
    params = [p.detach() for _, p in block.named_parameters()]

    def f(x, *ps):
        return torch.func.functional_call(block, dict(zip(names, ps, strict=True)), (x,))

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(TRACE_N, 8, 64), *params)
    graph = _C.import_fx_graph(gm)
    graph.run_pipeline()
    graph.verify()
    x = torch.randn(RUN_N, 8, 64)
    with torch.no_grad():
        expected = block(x)
    assert_close_rel(_C.Executable(graph).run([x, *params]), [expected], 1e-5)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def _fx_graph(build: Callable[[torch.fx.Graph], object], root=None) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    g.output(build(g))
    return torch.fx.GraphModule(root if root is not None else torch.nn.Module(), g)


def test_call_module_is_unsupported():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(x).relu()

    gm = torch.fx.symbolic_trace(M())
    node = next(n for n in gm.graph.nodes if n.op == "call_module")
    with pytest.raises(magi_compiler.UnsupportedError, match=f"'{node.name}'.*call_module"):
        _C.import_fx_graph(gm)
    assert issubclass(magi_compiler.UnsupportedError, NotImplementedError)


def test_non_operator_call_is_unsupported():
    gm = _fx_graph(lambda g: g.call_function(math.sqrt, (g.placeholder("x"),)))
    with pytest.raises(magi_compiler.UnsupportedError, match="sqrt"):
        _C.import_fx_graph(gm)


def test_missing_required_argument_is_a_user_error():
    gm = _fx_graph(lambda g: g.call_function(ATEN.mm.default, (g.placeholder("x"),)))
    with pytest.raises(magi_compiler.UserError, match="mat2"):
        _C.import_fx_graph(gm)


def test_too_many_positional_arguments_is_a_user_error():
    def build(g):
        x = g.placeholder("x")
        return g.call_function(ATEN.neg.default, (x, x))

    with pytest.raises(magi_compiler.UserError, match="positional"):
        _C.import_fx_graph(_fx_graph(build))
    assert issubclass(magi_compiler.UserError, ValueError)


def test_get_attr_of_a_non_tensor_is_a_user_error():
    root = torch.nn.Module()
    root.scale = 3.0
    gm = _fx_graph(lambda g: g.get_attr("scale"), root)
    with pytest.raises(magi_compiler.UserError, match="scale"):
        _C.import_fx_graph(gm)


def test_getitem_on_python_sizes_tuple():
    # aten ops returning a tuple are read through operator.getitem; so are lists.
    def build(g):
        x = g.placeholder("x")
        parts = g.call_function(ATEN.split.Tensor, (x, 2))
        return g.call_function(operator.getitem, (parts, 1))

    graph = _C.import_fx_graph(_fx_graph(build))
    x = torch.randn(4, 3)
    (out,) = _C.Executable(graph).run([x])
    assert torch.equal(out, x[2:])


def test_executable_rejects_bad_inputs():
    graph = _C.import_fx_graph(make_fx(lambda x: x + 1)(torch.randn(3)))
    exe = _C.Executable(graph)
    with pytest.raises(magi_compiler.UserError):
        exe.run(["not a tensor"])
    with pytest.raises(magi_compiler.UserError):
        exe.run([])


def test_none_for_a_non_optional_tensor_is_an_undefined_tensor():
    # AOTAutograd's CUDA backward of SDPA passes None as attn_bias, whose schema type is
    # Tensor (not Tensor?); PyTorch reads that None as an undefined tensor.
    op = ATEN._scaled_dot_product_efficient_attention_backward.default
    attn_bias = next(a for a in op._schema.arguments if a.name == "attn_bias")
    assert str(attn_bias.type) == "Tensor"

    def build(g):
        q, out, lse, seed, offset = (
            g.placeholder(n) for n in ("q", "out", "lse", "seed", "offset")
        )
        args = (out, q, q, q, None, out, lse, seed, offset, 0.0, [True, True, True, False], True)
        grads = g.call_function(op, args)
        return tuple(g.call_function(operator.getitem, (grads, i)) for i in range(3))

    graph = _C.import_fx_graph(_fx_graph(build))
    assert graph.verify_errors() == []
    graph.run_pipeline()
    graph.verify()
    assert "aten::_scaled_dot_product_efficient_attention_backward(" in str(graph)
