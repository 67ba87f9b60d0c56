"""The eliminate_common_subexpressions pass end to end on CPU: a stack whose layers each build
the same rotary tables builds them once per call, and the results match eager; returned
duplicates stay two tensors; random ops and reads around an in-place update keep their
meaning."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from blocks import LlamaStack
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
    torch.manual_seed(5)  # PyTorch's default initialisation: activations of a few units
    eager = LlamaStack(4, hidden=64, n_heads=4, n_kv_heads=2, intermediate=128)
    compiled = magi_compile(copy.deepcopy(eager), **({} if cse else {"config_patch": OFF}))
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 16, 64)
            assert_close_rel(compiled(x), eager(x), 1e-5)
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


def test_list_views_of_a_repeat_stay_two_buffers():
    """unbind returns views of its input: merging the two additions would return two views of
    one buffer."""

    def f(x):
        return (x + 1).unbind(0)[0], (x + 1).unbind(0)[0]

    compiled = magi_compile(f, dynamic_arg_dims={"x": 1})
    x = torch.randn(3, 5)
    a, b = compiled(x)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    a.add_(1)
    torch.testing.assert_close(b, x[0] + 1)


class _Stacked(torch.nn.Module):
    """Two stacks times the same input: their gradients are the same product, unbound into
    the four parameters' gradients (views the backward graph returns)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Parameter(torch.randn(5)) for _ in range(4))

    def forward(self, x):
        return torch.stack([self.a, self.b]) * x + torch.stack([self.c, self.d]) * x


def test_gradients_of_alike_backward_products_stay_separate_and_accumulate():
    eager = _Stacked()
    compiled = magi_compile(copy.deepcopy(eager), dynamic_arg_dims={})
    for _ in range(2):  # the second backward accumulates into .grad
        x, g = torch.randn(2, 5), torch.randn(2, 5)
        eager(x).backward(g)
        compiled(x).backward(g)
        for name in "abcd":
            torch.testing.assert_close(getattr(compiled, name).grad, getattr(eager, name).grad)
    grads = [getattr(compiled, name).grad.untyped_storage().data_ptr() for name in "abcd"]
    assert grads[0] != grads[2] and grads[1] != grads[3]
