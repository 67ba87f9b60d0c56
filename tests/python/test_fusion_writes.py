"""Generated kernels writing their output over an input that dies at the kernel, end to end
on the CPU through ``magi_compile``: which inputs may be written over (a dying product, the
base of a dying view, also in a training forward) and which may not (one still read elsewhere,
one read at a column shift), with eager's values every time.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _fusion_patterns import RTOL, lowered_graphs
from blocks import apply_rotary
from magi_compiler import magi_compile


def _swiglu(x, wg, wu):
    return F.silu(x @ wg) * (x @ wu)


def _swiglu_keeping_gate(x, wg, wu):
    gate, up = x @ wg, x @ wu
    return F.silu(gate) * up, gate, up


def _rotary_of_a_product(x, w, cos, sin):
    return apply_rotary((x @ w).unflatten(-1, (4, 16)), cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pointwise_output_is_written_over_a_dying_input(dtype, assert_close_rel):
    """silu(gate) * up: gate and up die at the kernel, so its output takes one of their buffers
    (two wide buffers at once instead of three), with eager's values."""
    wg, wu = torch.randn(24, 40, dtype=dtype), torch.randn(24, 40, dtype=dtype)
    compiled = magi_compile(_swiglu, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        counts = []
        for rows in (6, 9, 7):
            x = torch.randn(rows, 24, dtype=dtype)
            assert_close_rel(compiled(x, wg, wu), _swiglu(x, wg, wu), RTOL[dtype])
            counts.append(runs[0].magi_executable.num_in_place_outputs)
    # Every call writes over one of them, the first included (it runs without AOTAutograd's
    # custom-op check, which the graph has no custom op for).
    assert counts == [1, 2, 3], counts


def _scaled_product(x, w):
    return (x @ w) * 2.0 + 1.0


def test_an_output_written_over_an_input_takes_in_place_writes_in_training(assert_close_rel):
    """In a training forward the product dies at (x @ w) * 2 + 1 (the backward needs only x), so
    the result takes its buffer; it is a tensor of its own, not a view, so a caller's in-place
    write to it under autograd works and the gradient matches eager's."""

    def loss(fn, x, w):
        out = fn(x, w)
        out.add_(1.0)  # refused on a view created inside a custom autograd Function
        return (out * out).sum()

    w = torch.randn(24, 40, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    compiled = magi_compile(_scaled_product, dynamic_arg_dims={})
    with lowered_graphs() as runs:
        for _ in range(3):
            x = torch.randn(6, 24)
            w.grad = w_eager.grad = None
            loss(compiled, x, w).backward()
            loss(_scaled_product, x, w_eager).backward()
            assert_close_rel(w.grad, w_eager.grad, RTOL[torch.float32])
    assert sum(r.magi_executable.num_in_place_outputs for r in runs) >= 1


def test_inputs_still_read_elsewhere_are_not_written_over(assert_close_rel):
    """Gate and up are also returned: the kernel allocates, and both come back intact."""
    wg, wu = torch.randn(24, 40), torch.randn(24, 40)
    compiled = magi_compile(_swiglu_keeping_gate, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        for rows in (6, 9, 7):
            x = torch.randn(rows, 24)
            got, want = compiled(x, wg, wu), _swiglu_keeping_gate(x, wg, wu)
            for a, e in zip(got, want, strict=True):
                assert_close_rel(a, e, RTOL[torch.float32])
    (run,) = runs
    assert run.magi_executable.num_in_place_outputs == 0


def _scaled_view(x, w):
    return (x @ w).view(x.shape[0], 4, 10) * 2.0 + 1.0


def test_a_view_whose_base_dies_with_it_is_written_over(assert_close_rel):
    """The kernel reads a view of the product; the view's autograd record holds the product
    too, and nothing else does, so the result takes the product's buffer."""
    w = torch.randn(24, 40)
    compiled = magi_compile(_scaled_view, dynamic_arg_dims={})
    with lowered_graphs() as runs, torch.no_grad():
        counts = []
        for _ in range(3):
            x = torch.randn(6, 24)
            assert_close_rel(compiled(x, w), _scaled_view(x, w), RTOL[torch.float32])
            counts.append(runs[0].magi_executable.num_in_place_outputs)
    assert counts == [1, 2, 3], counts


def test_inputs_read_at_a_column_shift_are_not_written_over(assert_close_rel):
    """Rotary reads each row at two column offsets (rotate_half), so one lane's store could
    land where another lane still has to read: the dying product keeps its own buffer."""
    w, cos, sin = torch.randn(32, 64), torch.randn(5, 16), torch.randn(5, 16)
    compiled = magi_compile(_rotary_of_a_product, dynamic_arg_dims={})
    with lowered_graphs() as runs, torch.no_grad():
        for _ in range(3):
            x = torch.randn(5, 32)
            assert_close_rel(compiled(x, w, cos, sin), _rotary_of_a_product(x, w, cos, sin),
                             RTOL[torch.float32])  # fmt: skip
    (run,) = runs
    assert run.magi_executable.num_fusions >= 1
    assert run.magi_executable.num_in_place_outputs == 0
