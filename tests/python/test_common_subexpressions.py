"""The eliminate_common_subexpressions pass end to end on CPU: a stack whose layers each build
the same rotary tables builds them once per call, and the results match eager; returned
duplicates stay two tensors; random ops and reads around an in-place update keep their
meaning."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from blocks import LlamaStack, init_weights_
from magi_compiler import magi_compile
from magi_compiler.inspection import last_compiled

OFF = {"pass_config": {"disabled_passes": ["eliminate_common_subexpressions"]}}


def _kernels_per_call(substring: str) -> int:
    kernels = last_compiled().executable.generated_kernels()
    return sum(substring in k["symbol"] for k in kernels)


@pytest.mark.parametrize("cse", [True, False])
def test_a_stack_builds_its_rotary_tables_once_per_call(cse, assert_close_rel):
    """Every layer of LlamaStack calls rotary_cos_sin with the same sizes; merged, one kernel
    computes the tables for all four layers (four without the pass). Three batch sizes share
    the capture."""
    eager = init_weights_(LlamaStack(4, hidden=64, n_heads=4, n_kv_heads=2, intermediate=128), 5)
    compiled = magi_compile(copy.deepcopy(eager), **({} if cse else {"config_patch": OFF}))
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 16, 64)
            # float32 through four layers, activations up to about 5e5: fused kernels sum in
            # another order than eager's ops.
            assert_close_rel(compiled(x), eager(x), 1e-4)
    assert _kernels_per_call("_cos_") == (1 if cse else 4)


def test_returned_duplicates_stay_two_tensors():
    def f(x):
        return x.exp(), x.exp(), x.sin() + x.sin()

    compiled = magi_compile(f, dynamic_arg_dims={"x": 0})
    x = torch.randn(6, 5)
    a, b, c = compiled(x)
    assert a.data_ptr() != b.data_ptr()
    torch.testing.assert_close(a, x.exp())
    a.zero_()  # the caller may change one without touching the other
    torch.testing.assert_close(b, x.exp())
    torch.testing.assert_close(c, 2 * x.sin())


def test_dropout_twice_draws_two_masks():
    def f(x):
        return F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True)

    compiled = magi_compile(f, dynamic_arg_dims={"x": 0})
    a, b = compiled(torch.ones(64, 64))
    assert set(a.unique().tolist()) == {0.0, 2.0}
    assert not torch.equal(a, b)


def test_reads_before_and_after_an_in_place_update_differ():
    def f(x, buf):
        before = buf.sum(-1)
        buf.add_(x)
        return before, buf.sum(-1)

    compiled = magi_compile(f, dynamic_arg_dims={"x": 0, "buf": 0})
    x, buf = torch.randn(4, 8), torch.randn(4, 8)
    want_buf = buf + x
    want = (buf.sum(-1), want_buf.sum(-1))
    got = compiled(x, buf)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(buf, want_buf)
