"""``magi_register_custom_op`` and piecewise compilation at custom-op boundaries.

End to end on the CPU against eager PyTorch on fresh random inputs (float32, relative error
<= 1e-5): a Llama-style stack whose attention is a registered boundary op is cut into the
expected pieces, identical layers share one piece, and several batch sizes share one capture;
ops that mutate arguments, return two tensors, or have a backward; the README example as
written; registration after decoration; ``splitting_ops`` by name; and every registration error.

Operator names are unique per test (one process registers each name once).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from blocks import LlamaBlock, apply_rotary, init_weights_, rotary_cos_sin
from magi_compiler import _C, _logging, inspection, magi_compile, magi_register_custom_op
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
RTOL = 1e-5
BATCHES = (2, 3, 5)
SEQ, HIDDEN = 16, 64


# --------------------------------------------------------------------------------------------
# A Llama-style stack whose attention is a boundary op
# --------------------------------------------------------------------------------------------


@magi_register_custom_op(
    name="magi_t_co::llama_attention_backward",
    infer_output_meta_fn=["q", "k", "v"],
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def llama_attention_backward(
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel of causal attention, written out (FlashAttention ships its own)."""
    scale = q.shape[-1] ** -0.5
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    p = (q @ k.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf")).softmax(-1)
    dv = p.transpose(-1, -2) @ grad
    dp = grad @ v.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, dv


def _attention_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _attention_backward(ctx, grad):
    return llama_attention_backward(grad, *ctx.saved_tensors)


@magi_register_custom_op(
    name="magi_t_co::llama_attention",
    infer_output_meta_fn=["q"],
    setup_context_fn=_attention_setup,
    backward_fn=_attention_backward,
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def llama_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention on (B, H, S, D) tensors, as a FlashAttention build would be called."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class BoundaryLlamaBlock(LlamaBlock):
    """examples/blocks.py's LlamaBlock with its attention kernel behind the boundary op."""

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.shape
        q = self.q_proj(x).view(bsz, seq_len, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim)
        cos, sin = rotary_cos_sin(seq_len, self.head_dim, self.rope_base, x.device, x.dtype)
        q = apply_rotary(q, cos, sin).transpose(1, 2)
        k = apply_rotary(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        k = k.repeat_interleave(self.n_rep, dim=1)
        v = v.repeat_interleave(self.n_rep, dim=1)
        out = llama_attention(q, k, v).transpose(1, 2)
        return self.o_proj(out.reshape(bsz, seq_len, self.n_heads * self.head_dim))


class LlamaStack(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(
            BoundaryLlamaBlock(hidden=HIDDEN, n_heads=4, n_kv_heads=2, intermediate=128)
            for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("layers", [1, 4])
def test_llama_stack_splits_at_attention_and_matches_eager(layers, counters, assert_close_rel):
    eager = init_weights_(LlamaStack(layers), seed=0)
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.randn(batch, SEQ, HIDDEN)
            assert_close_rel(compiled(x), eager(x), RTOL)
    assert counters().captures == 1, "new batch sizes must not re-capture"
    info = inspection.last_compiled()
    assert info.kind == "inference"
    assert info.boundary_ops == ("magi_t_co::llama_attention",) * layers
    assert info.num_pieces == layers + 1
    # The pieces before the first attention and after the last differ from the middle ones,
    # which are all alike (o_proj, residual, MLP, next layer's norm, projections and RoPE).
    assert info.num_unique_pieces == min(layers + 1, 3)
    assert info.piece_sequence == (0,) + (1,) * (layers - 1) + ((2,) if layers > 1 else (1,))
    # Boundary calls stay in the top graph; the pieces hold everything else.
    graph = info.graph
    assert graph.boundary_op_names() == ["magi_t_co::llama_attention"] * layers
    assert all("magi_t_co::llama_attention" not in p.op_names() for p in graph.pieces)
    assert graph.verify_errors() == []


def test_llama_stack_trains_through_boundaries(counters, assert_close_rel):
    """Forward and backward graphs are both split: at the attention op and at its backward."""
    eager = init_weights_(LlamaStack(2), seed=1)
    compiled = magi_compile(copy.deepcopy(eager))
    for batch in (2, 3):
        x = torch.randn(batch, SEQ, HIDDEN)
        grad = torch.randn(batch, SEQ, HIDDEN)
        outputs = []
        for model in (eager, compiled):
            model.zero_grad()
            out = model(x)
            out.backward(grad)
            outputs.append(out)
        assert_close_rel(outputs[1], outputs[0], RTOL)
        for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
            assert_close_rel(q.grad, p.grad, RTOL)
    forward, backward = inspection.last_compiled("forward"), inspection.last_compiled("backward")
    assert forward.boundary_ops == ("magi_t_co::llama_attention",) * 2
    assert forward.num_pieces == 3
    assert backward.boundary_ops == ("magi_t_co::llama_attention_backward",) * 2
    assert backward.num_pieces == 3
    assert counters().captures == 1


# --------------------------------------------------------------------------------------------
# Ops that mutate, return two tensors, or have a backward
# --------------------------------------------------------------------------------------------


@magi_register_custom_op(name="magi_t_co::accumulate", mutates_args=("acc",))
def accumulate(x: torch.Tensor, acc: torch.Tensor) -> None:
    acc.add_(x * 2)


@magi_register_custom_op(
    name="magi_t_co::scaled_accumulate", mutates_args=("acc",), is_subgraph_boundary=True
)
def scaled_accumulate(x: torch.Tensor, acc: torch.Tensor, scale: float) -> torch.Tensor:
    acc.mul_(scale).add_(x)
    return x * scale


def test_op_with_mutates_args(counters, assert_close_rel):
    def fn(x, acc):
        h = x.sin()
        accumulate(h, acc)  # an input written in place
        buf = torch.zeros_like(x)
        accumulate(h[1:], buf[1:])  # a view of a fresh tensor
        y = scaled_accumulate(h, buf, 0.5)  # a boundary that also writes in place
        return acc * 3 + buf + y

    compiled = magi_compile(fn)
    for batch in (3, 4, 6):  # >= 3: at 2, buf[1:] would have the size 1 PyTorch specialises
        x, acc = torch.randn(batch, 8), torch.randn(batch, 8)
        acc_eager, acc_compiled = acc.clone(), acc.clone()
        expected = fn(x, acc_eager)
        assert_close_rel(compiled(x, acc_compiled), expected, RTOL)
        assert_close_rel(acc_compiled, acc_eager, RTOL)  # the caller sees the write
    info = inspection.last_compiled()
    assert info.boundary_ops == ("magi_t_co::scaled_accumulate",)
    assert info.num_pieces == 2
    assert "magi_t_co::accumulate" in info.graph.pieces[0].op_names()
    assert counters().captures == 1


@magi_register_custom_op(name="magi_t_co::scale_all", mutates_args=("xs",))
def scale_all(xs: list[torch.Tensor]) -> None:
    for t in xs:
        t.mul_(2)


def test_op_writing_a_list_orders_the_reads_of_its_tensors(counters, assert_close_rel):
    """A custom op that writes the tensors of a list argument: x * 3 and the + 1 after the
    call read the tensor it scales, so they are not one generated kernel (which would compute
    + 1 from the value before the call): 6x + 1, as eager."""

    def fn(x):
        y = x * 3
        scale_all([y])
        return y + 1

    compiled = magi_compile(fn)
    for batch in (3, 4):
        x = torch.randn(batch, 8)
        assert_close_rel(compiled(x), fn(x), RTOL)


@magi_register_custom_op(name="magi_t_co::sin_cos", infer_output_meta_fn=["x", "x"])
def sin_cos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.sin(), x.cos()


@magi_register_custom_op(name="magi_t_co::sum_prod", is_subgraph_boundary=True)
def sum_prod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a + b, a * b  # outputs shaped like a and b (the default)


def test_two_output_ops(counters, assert_close_rel):
    def fn(x, y):
        s, c = sin_cos(x)
        p, q = sum_prod(s, y.exp())
        return p * c, q - c

    compiled = magi_compile(fn)
    for batch in BATCHES:
        x, y = torch.randn(batch, 8), torch.randn(batch, 8)
        assert_close_rel(compiled(x, y), fn(x, y), RTOL)
    info = inspection.last_compiled()
    assert info.boundary_ops == ("magi_t_co::sum_prod",)
    assert info.num_pieces == 2
    assert counters().captures == 1


def _cube_setup(ctx, inputs, output):
    (x, scale) = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _cube_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * 3 * x * x * ctx.scale, None


@magi_register_custom_op(
    name="magi_t_co::cube",
    setup_context_fn=_cube_setup,
    backward_fn=_cube_backward,
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def cube(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * x * x * scale


class CubeMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(cube(torch.tanh(self.up(x)), 0.5)) + x


def test_op_with_backward_trains_like_eager(counters, assert_close_rel):
    eager = CubeMLP()
    compiled = magi_compile(copy.deepcopy(eager))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(compiled.parameters(), lr=0.1)
    for batch in (4, 6, 4):
        x = torch.randn(batch, 16, requires_grad=True)
        xe, xc = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        loss_e, loss_c = eager(xe).pow(2).mean(), compiled(xc).pow(2).mean()
        loss_e.backward()
        loss_c.backward()
        assert_close_rel(loss_c, loss_e, RTOL)
        assert_close_rel(xc.grad, xe.grad, RTOL)
        for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
            assert_close_rel(q.grad, p.grad, RTOL)
        opt_e.step()
        opt_c.step()
        opt_e.zero_grad()
        opt_c.zero_grad()
    assert inspection.last_compiled("forward").boundary_ops == ("magi_t_co::cube",)
    assert counters().captures == 1


# --------------------------------------------------------------------------------------------
# Registration order, config, flags
# --------------------------------------------------------------------------------------------


def test_registration_after_decoration_still_splits(counters, assert_close_rel):
    @magi_compile
    class Late(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return late_op(x.relu()) + 1  # noqa: F821 - defined below, after decoration

    @magi_register_custom_op(name="magi_t_co::late", is_subgraph_boundary=True)
    def late_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    globals()["late_op"] = late_op
    try:
        model = Late()
        x = torch.randn(3, 4)
        assert_close_rel(model(x), late_op(x.relu()) + 1, RTOL)
        info = inspection.last_compiled()
        assert info.boundary_ops == ("magi_t_co::late",)
        assert info.num_pieces == 2
    finally:
        del globals()["late_op"]


@magi_register_custom_op(name="magi_t_co::plain")
def plain(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@pytest.mark.filterwarnings("ignore:.*splitting_ops.*:UserWarning")
def test_splitting_ops_split_at_ops_named_in_the_config(counters, assert_close_rel, capfd):
    def fn(x):
        return plain(x.sin()).cos()

    compiled = magi_compile(fn, config_patch={"splitting_ops": ["magi_t_co::plain"]})
    x = torch.randn(4, 3)
    assert_close_rel(compiled(x), fn(x), RTOL)
    assert inspection.last_compiled().boundary_ops == ("magi_t_co::plain",)
    assert inspection.last_compiled().num_pieces == 2

    # Unknown names are ignored, with one warning per name and process.
    capfd.readouterr()
    _logging.set_level("warning")
    try:
        for _ in range(2):
            torch._dynamo.reset()
            patch = {"splitting_ops": ["magi_t_co::no_such_op"]}
            ignored = magi_compile(fn, config_patch=patch)
            assert_close_rel(ignored(x), fn(x), RTOL)
            assert inspection.last_compiled().num_pieces == 0
    finally:
        _logging.init_from_env()
    logged = capfd.readouterr().err
    assert logged.count("splitting_ops: ignoring 'magi_t_co::no_such_op'") == 1, logged


def test_flags_are_recorded_in_the_core_registry():
    assert _C.op_flags("magi_t_co::llama_attention") == {
        "compute_sensitive": True,
        "subgraph_boundary": True,
    }
    assert _C.op_flags("magi_t_co::accumulate") == {
        "compute_sensitive": False,
        "subgraph_boundary": False,
    }
    assert _C.op_flags("magi_t_co.cube.default")["compute_sensitive"] is True
    assert _C.op_flags("magi_t_co::never_registered") is None
    assert "magi_t_co::sum_prod" in _C.registered_op_names()


def test_compute_sensitivity_is_queryable_per_node():
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, w):
        h = torch.mm(x, w).relu()
        return cube(h, 2.0) + llama_attention(h[None, None], h[None, None], h[None, None])[0, 0]

    graph = _C.import_fx_graph(make_fx(fn)(torch.randn(4, 4), torch.randn(4, 4)))
    assert graph.compute_sensitive_op_names() == [
        "aten::mm",
        "magi_t_co::cube",
        "magi_t_co::llama_attention",
    ]
    assert _C.is_default_compute_sensitive("aten::_scaled_dot_product_flash_attention_for_cpu")
    assert not _C.is_default_compute_sensitive("aten::relu")


# --------------------------------------------------------------------------------------------
# Schemas, defaults, and the outputs check
# --------------------------------------------------------------------------------------------


def test_default_name_comes_from_the_file_and_the_function():
    @magi_register_custom_op()
    def default_named_op(x: torch.Tensor) -> torch.Tensor:
        return x.abs()

    assert torch.ops.test_custom_ops.default_named_op is not None
    x = torch.randn(3)
    assert torch.equal(default_named_op(x), x.abs())

    @magi_register_custom_op
    def bare_decorated_op(x: torch.Tensor) -> torch.Tensor:
        return x.neg()

    assert torch.equal(torch.ops.test_custom_ops.bare_decorated_op(x), -x)


def test_schema_covers_the_supported_annotations(counters, assert_close_rel):
    @magi_register_custom_op(name="magi_t_co::kitchen_sink", infer_output_meta_fn=["x"])
    def kitchen_sink(
        x: torch.Tensor,
        bias: torch.Tensor | None,
        extra: list[torch.Tensor],
        n: int,
        alpha: float,
        flag: bool,
        mode: str,
        maybe: Optional[float] = None,  # noqa: UP045 - typing.Optional works too
    ) -> torch.Tensor:
        y = x * alpha + n + sum(extra)
        if bias is not None:
            y = y + bias
        if flag and mode == "neg":
            y = -y
        return y if maybe is None else y * maybe

    schema = str(torch.ops.magi_t_co.kitchen_sink.default._schema)
    assert schema == (
        "magi_t_co::kitchen_sink(Tensor x, Tensor? bias, Tensor[] extra, SymInt n, float alpha, "
        "bool flag, str mode, float? maybe=None) -> Tensor"
    )

    def fn(x, b):
        return kitchen_sink(x, b, [x, b], 2, 0.5, True, "neg") + kitchen_sink(
            x, None, [b], 1, 2.0, False, "x", maybe=3.0
        )

    compiled = magi_compile(fn)
    for batch in (2, 3):
        x, b = torch.randn(batch, 4), torch.randn(batch, 4)
        assert_close_rel(compiled(x, b), fn(x, b), RTOL)


def test_string_annotations_need_no_imports():
    # Tensor is not imported in this module (and annotations are strings here, from
    # `from __future__ import annotations`): like torch.library, the decorator resolves it.
    @magi_register_custom_op(name="magi_t_co::stringly")
    def stringly(x: Tensor, k: Optional[int] = None) -> Tensor:  # noqa: F821, UP045
        return x * (k or 1)

    assert str(torch.ops.magi_t_co.stringly.default._schema) == (
        "magi_t_co::stringly(Tensor x, SymInt? k=None) -> Tensor"
    )
    assert torch.equal(stringly(torch.ones(2), k=3), torch.full((2,), 3.0))


@magi_register_custom_op(
    name="magi_t_co::row_norms",
    infer_output_meta_fn=lambda x, p: x.new_empty(x.shape[:-1]),
    is_subgraph_boundary=True,
)
def row_norms(x: torch.Tensor, p: float) -> torch.Tensor:
    return x.abs().pow(p).sum(-1).pow(1 / p)


def test_infer_output_meta_fn_as_a_function(counters, assert_close_rel):
    def fn(x):
        return row_norms(x.tanh(), 3.0)[:, None] * x

    compiled = magi_compile(fn)
    for batch in BATCHES:
        x = torch.randn(batch, 6)
        assert_close_rel(compiled(x), fn(x), RTOL)
    assert inspection.last_compiled().boundary_ops == ("magi_t_co::row_norms",)
    assert counters().captures == 1


def test_outputs_are_checked_against_the_declared_metadata():
    @magi_register_custom_op(name="magi_t_co::wrong_shape", infer_output_meta_fn=["x"])
    def wrong_shape(x: torch.Tensor) -> torch.Tensor:
        return x.sum(0)

    with pytest.raises(RuntimeError, match=r"output 0 is torch.float32\[4\].*parameter 'x'"):
        wrong_shape(torch.randn(3, 4))

    @magi_register_custom_op(name="magi_t_co::transposed", infer_output_meta_fn=["x"])
    def transposed(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).t().contiguous().t()  # same values, column-major

    x = torch.randn(3, 4)
    y = transposed(x)
    assert torch.equal(y, x * 2) and y.stride() == (4, 1)  # laid out like empty_like(x)


# --------------------------------------------------------------------------------------------
# Registration errors
# --------------------------------------------------------------------------------------------


def test_unsupported_annotations_are_type_errors_naming_the_parameter():
    def with_dict(x: torch.Tensor, options: dict) -> torch.Tensor: ...

    def with_tuple(x: torch.Tensor, sizes: tuple[int, int]) -> torch.Tensor: ...

    def unannotated(x: torch.Tensor, y) -> torch.Tensor: ...

    def varargs(x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor: ...

    def bad_return(x: torch.Tensor) -> dict: ...

    def no_return(x: torch.Tensor): ...

    cases = [
        (with_dict, r"parameter 'options' is annotated dict.*one parameter per entry"),
        (with_tuple, r"parameter 'sizes' is annotated tuple\[int, int\].*list"),
        (unannotated, r"parameter 'y' has no type annotation; annotate it with one of"),
        (varargs, r"parameter 'rest' is variadic positional"),
        (bad_return, r"return annotation dict cannot be expressed.*torch.Tensor"),
        (no_return, r"no return annotation"),
    ]
    for i, (fn, message) in enumerate(cases):
        with pytest.raises(TypeError, match=message):
            magi_register_custom_op(name=f"magi_t_co::bad_annotation_{i}")(fn)
        assert not hasattr(torch.ops.magi_t_co, f"bad_annotation_{i}"), "nothing registered"


def test_infer_output_meta_fn_mistakes_are_value_errors():
    def two_out(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def one_out(x: torch.Tensor, scale: float) -> torch.Tensor: ...

    def list_out(x: torch.Tensor) -> list[torch.Tensor]: ...

    cases = [
        (two_out, None, r"returns 2 tensor\(s\) but has only 1 tensor parameter\(s\) \(x\)"),
        (one_out, ["y"], r"names 'y', which is not a parameter; parameters: x, scale"),
        (one_out, ["scale"], r"names 'scale', which is not a tensor parameter"),
        (one_out, ["x", "x"], r"names 2 parameter\(s\) but the return annotation declares 1"),
        (list_out, None, r"list\[torch.Tensor\], whose length is only known when it runs"),
    ]
    for i, (fn, meta, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            magi_register_custom_op(name=f"magi_t_co::bad_meta_{i}", infer_output_meta_fn=meta)(fn)
    with pytest.raises(TypeError, match="infer_output_meta_fn must be None, a list"):
        magi_register_custom_op(infer_output_meta_fn=3)


def test_other_registration_mistakes():
    def fn(x: torch.Tensor, out: torch.Tensor) -> None: ...

    with pytest.raises(ValueError, match="setup_context_fn is given without backward_fn"):
        magi_register_custom_op(name="magi_t_co::no_bw", setup_context_fn=_cube_setup)
    with pytest.raises(ValueError, match=r"mutates_args names 'y', which is not a parameter"):
        magi_register_custom_op(name="magi_t_co::bad_mut", mutates_args=("y",))(fn)
    with pytest.raises(TypeError, match=r"write mutates_args=\('out',\)"):
        magi_register_custom_op(name="magi_t_co::bad_mut", mutates_args="out")
    with pytest.raises(ValueError, match="is not of the form 'namespace::op_name'"):
        magi_register_custom_op(name="no_namespace")(fn)
    with pytest.raises(ValueError, match="an operator of this name is already registered"):
        magi_register_custom_op(name="magi_t_co::plain")(fn)
    with pytest.raises(TypeError, match="decorates a function"):
        magi_register_custom_op(name="magi_t_co::not_a_function")(len)


# --------------------------------------------------------------------------------------------
# The README example, as written
# --------------------------------------------------------------------------------------------


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "README.md has no python code block"
    return match.group(1)


def test_readme_example_works_as_written(tmp_path):
    code = _readme_example()
    assert "magi_register_custom_op" in code and "scaled_dot_product_attention" in code
    # Run in a fresh interpreter (the example registers an operator, once per process), then
    # check what it compiled and compare with eager on the same weights.
    checks = textwrap.dedent(
        """
        from magi_compiler import get_counters, inspection

        info = inspection.last_compiled()
        assert info.boundary_ops == ("athena::attention",), info
        assert info.num_pieces == 2, info
        # Batch 1 is captured as it is; batch 2 makes the batch dynamic; 8 reuses it.
        assert get_counters().captures == 2, get_counters()
        with torch.no_grad():
            for batch in (1, 2, 5):
                x = torch.randn(batch, 64, 256)
                a, e = block(x), Block.forward(block, x)  # the class keeps the eager forward
                err = ((a - e).abs().max() / e.abs().max()).item()
                assert err <= 1e-5, err
        print("README OK")
        """
    )
    script = tmp_path / "readme_example.py"
    script.write_text(code + checks)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "README OK" in result.stdout
