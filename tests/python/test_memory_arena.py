"""The memory arena on the CPU: a run's intermediates (generated kernels' outputs, matmuls) sit
in one block laid out by liveness, with eager's numbers; what the caller gets (outputs, views
of intermediates, tensors a custom op keeps) is never arena memory a later call overwrites;
``MAGI_DISABLE_PASSES=plan_memory_arena`` turns it off.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from blocks import LlamaStack, init_weights_
from magi_compiler import magi_compile, magi_register_custom_op

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _fusion_patterns import lowered_graphs  # noqa: E402

RTOL = 1e-5
LLAMA = dict(hidden=64, n_heads=4, n_kv_heads=2, intermediate=128)


def _llama_pair(seed: int):
    """A compiled Llama stack and its eager twin, captured afresh (Dynamo would otherwise run
    a new copy through an earlier copy's graph, lowered with the arena choice made then)."""
    torch._dynamo.reset()
    model = init_weights_(LlamaStack(2, **LLAMA), seed=seed)
    eager = init_weights_(LlamaStack(2, **LLAMA), seed=seed)
    return magi_compile(model), eager


def test_llama_intermediates_live_in_one_arena_sized_per_batch(assert_close_rel):
    model, eager = _llama_pair(seed=1)
    sizes = {}
    with lowered_graphs() as runs, torch.no_grad():
        for b in (2, 5, 3, 5):
            x = torch.randn(b, 16, LLAMA["hidden"])
            assert_close_rel(model(x), eager(x), RTOL)
            (run,) = runs
            stats = run.magi_executable.arena_stats
            sizes[b] = stats["last_bytes"]
            assert stats["last_bytes"] >= stats["last_peak_live"] > 0
    # Two layers of projections, norms and the MLP: dozens of values, one block per call.
    assert stats["planned_values"] >= 20, stats
    assert stats["runs"] == 4
    # Every alias of a planned value was foreseen (views, _unsafe_view): nothing copied off.
    assert stats["unplanned_copies"] == 0
    # The layout follows the batch: bigger for 5 rows than for 3, the same for both calls of 5.
    assert sizes[5] > sizes[3] > sizes[2]


def test_turned_off_nothing_is_planned(monkeypatch, assert_close_rel):
    monkeypatch.setenv("MAGI_DISABLE_PASSES", "plan_memory_arena")
    model, eager = _llama_pair(seed=2)
    with lowered_graphs() as runs, torch.no_grad():
        x = torch.randn(3, 16, LLAMA["hidden"])
        assert_close_rel(model(x), eager(x), RTOL)
    stats = runs[0].magi_executable.arena_stats
    assert (stats["planned_values"], stats["runs"], stats["last_bytes"]) == (0, 0, 0)


def _returns_views(x, w1, w2):
    h = x @ w1  # an intermediate, and (through a view) an output
    g = torch.relu(h * 2.0) @ w2
    g2 = torch.sigmoid(g * 3.0) @ w2  # a chain the arena places
    g3 = torch.tanh(g2 + 1.0) @ w2
    return g3 + 1.0, h.view(x.shape[0], 2, -1)[:, 1], torch.sigmoid(g)


def test_outputs_and_views_of_intermediates_stay_valid_across_calls(assert_close_rel):
    w1, w2 = torch.randn(16, 24), torch.randn(24, 24)
    compiled = magi_compile(_returns_views, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        held = []
        for rows in (4, 4, 7, 4):
            x = torch.randn(rows, 16)
            got, want = compiled(x, w1, w2), _returns_views(x, w1, w2)
            for a, e in zip(got, want, strict=True):
                assert_close_rel(a, e, RTOL)
            held.append((got, want))
    assert runs[0].magi_executable.arena_stats["runs"] == 4
    # Later calls (same size and others) left every earlier result as it was.
    for got, want in held:
        for a, e in zip(got, want, strict=True):
            assert_close_rel(a, e, RTOL)


_KEPT: list[torch.Tensor] = []


@magi_register_custom_op(name="magi_t_arena::keep", infer_output_meta_fn=["x"])
def _keep(x: torch.Tensor) -> torch.Tensor:
    """Keeps a reference to its input (as a cache would) and returns a new tensor."""
    _KEPT.append(x)
    return x * 0.5


def _through_keep(x, w):
    h = torch.tanh(x @ w) * 2.0 + 1.0  # a generated kernel's output
    k = _keep(h)  # h's last use: what follows could reuse its memory in the same call
    return (torch.sigmoid(k @ w) * 3.0 - 1.0) @ w


def test_a_custom_op_may_keep_its_input(assert_close_rel):
    w = torch.randn(16, 16)
    compiled = magi_compile(_through_keep, dynamic_arg_dims={"x": 0})
    expected = []
    _KEPT.clear()
    with torch.no_grad():
        for rows in (3, 3, 5):
            x = torch.randn(rows, 16)
            assert_close_rel(compiled(x, w), _through_keep(x, w), RTOL)
            expected.append(torch.tanh(x @ w) * 2.0 + 1.0)
    # The op saw each call's h (the eager reference calls appended too): what it kept from the
    # compiled calls still holds those values after the later calls ran.
    compiled_kept = _KEPT[0::2]
    assert len(compiled_kept) == 3
    for kept, want in zip(compiled_kept, expected, strict=True):
        assert_close_rel(kept, want, RTOL)


@pytest.mark.parametrize("policy", ["HEURISTIC", "HANDCRAFT"])
def test_training_graphs_keep_the_caching_allocator(policy, assert_close_rel):
    """Training graphs plan nothing into the arena (their backward frees saved inputs as it
    reads them, which the arena's peak estimate does not model: on the GPU, arena blocks
    raised the measured activation peak), and the step matches eager."""
    config = {"recompute_config": {"recompute_policy": policy, "memory_budget": 0.3}}
    torch._dynamo.reset()
    model = init_weights_(LlamaStack(2, **LLAMA), seed=3)
    eager = init_weights_(LlamaStack(2, **LLAMA), seed=3)
    magi_compile(model, config_patch=config)
    with lowered_graphs() as runs:
        for b in (2, 3):
            x = torch.randn(b, 16, LLAMA["hidden"])
            model.zero_grad()
            eager.zero_grad()
            model(x).square().mean().backward()
            eager(x).square().mean().backward()
            for p, q in zip(model.parameters(), eager.parameters(), strict=True):
                assert_close_rel(p.grad, q.grad, 1e-4)
    assert sorted(r.magi_kind for r in runs) == ["backward", "forward"]
    stats = [r.magi_executable.arena_stats for r in runs]
    assert all(s["planned_values"] == 0 and s["runs"] == 0 for s in stats), stats


def _chain(x, w):
    return torch.tanh(torch.sigmoid(x @ w * 2.0) @ w + 1.0) @ w


def test_sizes_that_keep_changing_stop_being_laid_out(assert_close_rel):
    """A decode-like run whose size changes on every call lays out 64 sets of sizes; later
    new sizes run without the arena (and stay correct), known ones keep theirs."""
    w = torch.randn(16, 16)
    compiled = magi_compile(_chain, dynamic_arg_dims={"x": 0})
    with lowered_graphs() as runs, torch.no_grad():
        for rows in range(2, 72):
            x = torch.randn(rows, 16)
            assert_close_rel(compiled(x, w), _chain(x, w), RTOL)
        exe = runs[0].magi_executable
        assert exe.arena_stats["runs"] == 64
        x = torch.randn(60, 16)  # laid out before, still cached: placed again
        assert_close_rel(compiled(x, w), _chain(x, w), RTOL)
        assert exe.arena_stats["runs"] == 65
