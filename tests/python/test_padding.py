"""The padding analysis behind CUDA-graph size buckets (runtime/padding.cpp), on the CPU:
which graphs may run a batch at a larger size and drop the extra rows, and, for those that
may not, the exact node and reason; plus the compile_sizes / cudagraph_padding settings. The
buckets themselves run on the GPU (tests/gpu/test_cuda_graph_padding.py)."""

from __future__ import annotations

import re

import pytest
import torch
from magi_compiler import _C, CompileConfig, UserError, _backend, config, inspection, magi_compile
from torch import nn


def _assert_rows_independent(module: nn.Module, x: torch.Tensor, extra: int = 2) -> None:
    """What an accepted plan promises, checked in eager PyTorch: the first rows of a run on
    a batch with random rows appended equal the run on the batch alone."""
    pad = torch.randn(extra, *x.shape[1:], dtype=x.dtype)
    with torch.no_grad():
        alone = module(x)
        padded = module(torch.cat([x, pad]))
    torch.testing.assert_close(padded[: x.shape[0]], alone, rtol=1e-5, atol=1e-6)


def _padding_of(module: nn.Module, x: torch.Tensor, compare: bool = True) -> str:
    inspection.clear()
    torch._dynamo.reset()
    compiled = magi_compile(module.eval())
    with torch.no_grad():
        y = compiled(x)
        if compare:
            torch.testing.assert_close(y, module(x))
    return inspection.last_compiled().executable.padding


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b.LlamaStack(2, hidden=64, n_heads=4, n_kv_heads=2, intermediate=128),
        lambda b: b.GPT2Stack(2, hidden=64, n_heads=4),
        lambda b: b.DiTStack(2, 64, 4),
    ],
    ids=["llama", "gpt2", "dit"],
)
def test_transformer_blocks_are_paddable(make):
    import blocks

    module = blocks.init_weights_(make(blocks), seed=0).eval()
    x = torch.randn(3, 8, 64)
    padding = _padding_of(module, x)
    _assert_rows_independent(module, x)
    # The activation (dim 0 = batch) and the batch size itself are padded; the output's first
    # dim is cut back.
    assert re.fullmatch(r"s\d+: inputs( \d+ \(x1\),?)+; outputs 0 \(dim 0, x1\)", padding), padding


def test_planning_is_a_step_disabled_by_name(monkeypatch):
    # plan_padding is a pipeline name: disabled, no graph is padded and the plan says why.
    import blocks

    module = blocks.init_weights_(
        blocks.LlamaStack(1, hidden=64, n_heads=4, intermediate=128), seed=0
    )
    monkeypatch.setenv("MAGI_DISABLE_PASSES", "plan_padding")
    assert _padding_of(module, torch.randn(3, 8, 64)) == "not padded: plan_padding is disabled"


class Lambda(nn.Module):
    def __init__(self, f) -> None:
        super().__init__()
        self.f = f
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


CASES = {
    # Each row of these depends on other rows or on the batch size.
    "sum_over_batch": (
        lambda m, x: m.lin(x) - m.lin(x).sum(0),
        "aten::sum.dim_IntList (test_padding.py:",
        "works across the batch dim (dim 0)",
    ),
    "mean_of_all": (
        lambda m, x: m.lin(x) * m.lin(x).mean(),
        "aten::mean",
        "reduces over every dim, the batch dim included",
    ),
    "divide_by_batch": (
        lambda m, x: m.lin(x) / x.shape[0],
        "aten::scalar_tensor",
        "takes the batch size as its argument",
    ),
    "softmax_over_batch": (
        lambda m, x: torch.softmax(m.lin(x), 0),
        "aten::_softmax",
        "works across the batch dim (dim 0)",
    ),
    "shift_rows": (
        lambda m, x: m.lin(x)[1:],
        "aten::slice.Tensor",
        "whose batch size is not k * s",
    ),
    "batch_not_outermost": (
        lambda m, x: m.lin(x).transpose(0, 1).reshape(-1, 8),
        "aten::_unsafe_view",
        "reshapes with the batch dim not outermost",
    ),
    "random": (
        lambda m, x: m.lin(x) + torch.randn_like(x),
        "aten::randn_like",
        "is not known to keep batch rows independent",
    ),
    "arange_from_batch": (  # values start at the batch size: padding shifts every row
        lambda m, x: (
            m.lin(x) + torch.arange(x.shape[0], 2 * x.shape[0], dtype=x.dtype)[:, None, None]
        ),
        "aten::arange.start",
        "takes the batch size as its argument 'start'",
    ),
    "contract_batch": (
        lambda m, x: m.lin(x).flatten(0, 1).t() @ x.flatten(0, 1),
        "aten::mm",
        "multiplies by a batched right operand or bias",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unpaddable_graphs_name_the_node_and_reason(name):
    f, node, reason = CASES[name]
    padding = _padding_of(Lambda(f), torch.randn(3, 4, 8), compare=name != "random")
    assert padding.startswith("not padded: " + node), padding
    assert reason in padding, padding


ACCEPTED = {
    "flatten_outermost": lambda m, x: m.lin(x.reshape(-1, 8)).view(x.shape) * 2,
    "arange_of_batch_length": lambda m, x: (
        m.lin(x) + torch.arange(x.shape[0], dtype=x.dtype)[:, None, None]
    ),
    "table_lookup": lambda m, x: m.lin(x) + m.lin.weight[(x[:, :, 0].abs() * 7).long() % 8],
    "per_row_norm": lambda m, x: torch.softmax(m.lin(x), -1) * x.pow(2).mean(-1, keepdim=True),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_graphs_keep_rows_independent(name):
    module = Lambda(ACCEPTED[name]).eval()
    x = torch.randn(3, 4, 8)
    assert _padding_of(module, x).startswith("s"), name
    _assert_rows_independent(module, x)


def test_static_graph_has_nothing_to_pad():
    m = nn.Linear(8, 8).eval()
    inspection.clear()
    torch._dynamo.reset()
    compiled = magi_compile(nn.Sequential(m), config_patch={"dynamic_dim_default": None})
    with torch.no_grad():
        compiled(torch.randn(3, 8))
    assert inspection.last_compiled().executable.padding == (
        "not padded: no tensor input has a dynamic dim 0"
    )


def test_bucket_ladder_settings():
    assert list(_C.default_bucket_ladder()) == [1, 2, 4] + list(range(8, 257, 8))
    assert _backend.bucket_ladder(CompileConfig()) == list(_C.default_bucket_ladder())
    assert _backend.bucket_ladder(CompileConfig(compile_sizes=[16, 4, 16])) == [4, 16]
    assert _backend.bucket_ladder(CompileConfig(compile_sizes=[4], cudagraph_padding=False)) == []


@pytest.mark.parametrize("sizes,bad", [([4, 0], "0"), ([-2], "-2"), ([4, "8"], "'8'")])
def test_compile_sizes_must_be_batch_sizes(sizes, bad):
    with pytest.raises(UserError) as e:
        config.validate(CompileConfig(compile_sizes=sizes))
    assert str(e.value) == (
        f"compile_sizes={sizes!r}: {bad} is not a batch size (an int >= 1); compile_sizes are the "
        "batch sizes CUDA graphs are captured for (docs/config.md)"
    )
