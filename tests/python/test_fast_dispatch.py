"""Direct dispatch (``_fast_dispatch.py``) on CPU: after one ordinary call per (guard
signature, module instance), inference calls skip Dynamo and AOTAutograd and run the compiled
graph directly (``get_counters().direct_calls``).

Covers: when direct calls start and that they keep matching eager across batch sizes; weights
and buffers changed every supported way (attribute assignment, ``_parameters[...]``,
``.data``, ``copy_``); two instances of one decorated class; what never goes direct (grad
mode, autocast, dict results, forwards with Python side effects, ``fast_dispatch=False``);
keyword arguments with defaults and int arguments whose value changes.

Every numeric check compares against eager PyTorch on the same weights (a copy made before
``magi_compile``) on fresh random float32 inputs (relative error ≤ 1e-5, gradients ≤ 1e-4, bf16 autocast
≤ 2e-2).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _api_helpers import RTOL, H, Tiny, assert_training_step_matches, inputs
from _fast_dispatch_helpers import (
    LLAMA,
    compiled_with_eager,
    direct_calls,
    llama_inputs,
    warm_up,
)
from blocks import LlamaStack, init_weights_
from magi_compiler import get_counters, magi_compile
from torch import nn

pytestmark = pytest.mark.usefixtures("counters")  # fresh Dynamo caches, zeroed counters


# --------------------------------------------------------------------------------------------
# When direct calls start
# --------------------------------------------------------------------------------------------


def test_llama_stack_goes_direct_from_the_third_call(assert_close_rel):
    model, eager = compiled_with_eager(init_weights_(LlamaStack(2, **LLAMA), seed=0))
    with torch.no_grad():
        for i, b in enumerate((2, 3, 5, 4, 2, 7, 3)):
            x = llama_inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
            # Call 0 captures, call 1 is ordinary (and learns the path), then one per call.
            assert direct_calls() == max(0, i - 1), (i, get_counters())
    c = get_counters()
    assert (c.captures, c.compiles, c.guard_misses) == (1, 1, 0), c


def test_direct_call_returns_fresh_outputs(assert_close_rel):
    model, eager = compiled_with_eager(Tiny())
    with torch.no_grad():
        outs, xs = [], []
        for b in (2, 3, 3, 3):
            xs.append(inputs(b))
            outs.append(model(xs[-1]))
        assert direct_calls() == 2
        # Earlier results are not overwritten by later direct calls.
        for x, out in zip(xs, outs, strict=True):
            assert_close_rel(out, eager(x), RTOL)


# --------------------------------------------------------------------------------------------
# Weights and buffers changed after the direct path was set up
# --------------------------------------------------------------------------------------------


def test_parameter_assignment_is_used_by_the_next_direct_call(assert_close_rel):
    model, eager = compiled_with_eager(init_weights_(LlamaStack(2, **LLAMA), seed=1))
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel, llama_inputs)

        weight = torch.randn_like(model.layers[1].q_proj.weight)
        model.layers[1].q_proj.weight = nn.Parameter(weight.clone())
        eager.layers[1].q_proj.weight = nn.Parameter(weight.clone())
        # The parameter dict's version tag moved: the direct call reads the new weight (and
        # checks Dynamo's guards again, the fixed inputs being new).
        for n, b in enumerate((3, 2, 5, 3), start=2):
            x = llama_inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
            assert direct_calls() == n
    assert get_counters().captures == 1


def test_parameters_dict_write_is_seen_by_the_next_direct_call(assert_close_rel):
    model, eager = compiled_with_eager(Tiny())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)

        before = copy.deepcopy(eager)
        weight = torch.randn_like(model.fc1.weight)
        model.fc1._parameters["weight"] = nn.Parameter(weight.clone())  # no registration hook
        eager.fc1._parameters["weight"] = nn.Parameter(weight.clone())
        x = inputs(3)
        out = model(x)
        assert direct_calls() == 2  # still direct, and already with the new weight
        assert_close_rel(out, eager(x), RTOL)
        assert not torch.allclose(out, before(x), rtol=1e-3, atol=1e-3)  # the old weight's


def test_parameter_data_and_copy_are_followed(assert_close_rel):
    model, eager = compiled_with_eager(Tiny())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)

        weight = torch.randn_like(model.fc2.weight)
        model.fc2.weight.data = weight.clone()
        eager.fc2.weight.data = weight.clone()
        x = inputs(5)
        assert_close_rel(model(x), eager(x), RTOL)
        assert direct_calls() == 2

        bias = torch.randn_like(model.fc1.bias)
        model.fc1.bias.copy_(bias)
        eager.fc1.bias.copy_(bias)
        model.norm.weight.mul_(3.0)
        eager.norm.weight.mul_(3.0)
        x = inputs(2)
        assert_close_rel(model(x), eager(x), RTOL)
        assert direct_calls() == 3


class Scaled(nn.Module):
    """A linear layer followed by a per-channel scale held in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.register_buffer("scale", torch.randn(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def test_buffer_assignment_is_followed(assert_close_rel):
    model, eager = compiled_with_eager(Scaled())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)

        scale = torch.randn(H) * 10
        model.scale = scale.clone()
        eager.scale = scale.clone()
        for b in (3, 2, 5):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
        # The buffer dict's version tag moved: the next direct call reads the new buffer.
        assert direct_calls() == 4
    assert get_counters().captures == 1


# --------------------------------------------------------------------------------------------
# Instances of one decorated class
# --------------------------------------------------------------------------------------------


def test_two_instances_interleaved_each_use_their_own_weights(assert_close_rel):
    @magi_compile
    class DecoratedTiny(Tiny):
        pass

    models = [init_weights_(DecoratedTiny(), seed=i) for i in (10, 11)]
    eagers = [init_weights_(Tiny(), seed=i) for i in (10, 11)]
    rounds = 6
    with torch.no_grad():
        for _ in range(rounds):
            for model, eager in zip(models, eagers, strict=True):
                x = inputs(3)
                assert_close_rel(model(x), eager(x), RTOL)
    # First instance: capture, ordinary, then direct; second: ordinary, then direct.
    assert direct_calls() == (rounds - 2) + (rounds - 1)
    assert get_counters().captures == 1


# --------------------------------------------------------------------------------------------
# What never goes direct
# --------------------------------------------------------------------------------------------


def test_grad_enabled_never_goes_direct_and_gradients_match(assert_close_rel):
    model, eager = compiled_with_eager(Tiny())  # parameters require grad
    for b in (2, 3, 3, 4):
        assert_training_step_matches(model, eager, eager, inputs(b), assert_close_rel)
    assert direct_calls() == 0


class Pair(Tiny):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = super().forward(x)
        return y, y.amax(-1)


class Named(Tiny):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = super().forward(x)
        return {"y": y, "peak": y.amax(-1)}


def test_tuple_result_goes_direct(assert_close_rel):
    model, eager = compiled_with_eager(Pair())
    with torch.no_grad():
        for b in (2, 3, 4, 5):
            x = inputs(b)
            out = model(x)
            assert type(out) is tuple and len(out) == 2
            assert_close_rel(out, eager(x), RTOL)
    assert direct_calls() == 2


class HandsBiasOn(Tiny):
    """T5's block idiom: the attention bias a layer was given (and used) comes back in its
    result, as it is, for the next layer."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor | None = None):
        y = super().forward(x) + bias
        if scale is None:
            return y, bias
        return y * scale, (bias, scale)


@pytest.mark.parametrize("dumps", [False, True], ids=["cpp", "python"])
def test_inputs_returned_as_they_are_go_direct(dumps, assert_close_rel, tmp_path, monkeypatch):
    """Dynamo hands an input back from the frame, not from the graph: the direct call returns
    the caller's own tensor there, in C++ and in the Python path (dumps on)."""
    from magi_compiler import _dump

    if dumps:
        monkeypatch.setenv(_dump.ENABLE_ENV, "1")
        monkeypatch.setenv(_dump.DIR_ENV, str(tmp_path))
    model, eager = compiled_with_eager(HandsBiasOn())
    with torch.no_grad():
        for b in (2, 3, 4, 5):
            x, bias, scale = inputs(b), torch.randn(H), torch.randn(H)
            y, passed = model(x, bias)
            assert passed is bias
            assert_close_rel(y, eager(x, bias)[0], RTOL)
            y, (passed, kept) = model(x, bias, scale=scale)
            assert passed is bias and kept is scale
            assert_close_rel(y, eager(x, bias, scale=scale)[0], RTOL)
    paths = model._magi_compiled._direct.get(model).paths
    assert len(paths) == 2 and all((p.native is None) is dumps for p in paths)
    sources = [[p.run.magi_sources[j] for j in p.through] for p in paths]
    assert sources == [["L['bias']"], ["L['bias']", "L['scale']"]]
    # Two signatures (with and without scale), each direct from its third call.
    assert direct_calls() == 2 * 2


def test_dict_result_stays_ordinary(assert_close_rel):
    model, eager = compiled_with_eager(Named())
    with torch.no_grad():
        for b in (2, 3, 4, 5):
            x = inputs(b)
            out, expected = model(x), eager(x)
            assert type(out) is dict and out.keys() == expected.keys()
            for key in expected:
                assert_close_rel(out[key], expected[key], RTOL)
    assert direct_calls() == 0


class Counting(Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


def test_forward_with_a_side_effect_stays_ordinary(assert_close_rel):
    model, eager = compiled_with_eager(Counting())
    batches = (2, 3, 4, 5, 3, 2)
    with torch.no_grad():
        for b in batches:
            x = inputs(b)
            assert_close_rel(model(x), Tiny.forward(eager, x), RTOL)
    assert model.calls == len(batches)  # Dynamo replayed the increment on every call
    assert direct_calls() == 0


def test_fast_dispatch_off(assert_close_rel):
    model, eager = compiled_with_eager(
        init_weights_(LlamaStack(2, **LLAMA), seed=2), config_patch={"fast_dispatch": False}
    )
    with torch.no_grad():
        for b in (2, 3, 4, 5, 2):
            x = llama_inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
    c = get_counters()
    assert (c.captures, c.direct_calls) == (1, 0), c


class Mlp(nn.Module):
    """Ends in a linear layer, so under bf16 autocast its result is bf16."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def test_cpu_autocast_never_goes_direct(assert_close_rel):
    model, eager = compiled_with_eager(Mlp())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for b in (2, 3, 4, 5):
            x = inputs(b)
            out, expected = model(x), eager(x)
            assert out.dtype == expected.dtype == torch.bfloat16
            assert_close_rel(out, expected, 2e-2)
    assert direct_calls() == 0, get_counters()


def test_cpu_autocast_results_match(assert_close_rel):
    # Every call under autocast is right, and turning autocast off again selects the float32
    # graph (autocast is in the guard signature).
    model, eager = compiled_with_eager(Mlp())
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for b in (2, 3, 4, 5):
                x = inputs(b)
                out, expected = model(x), eager(x)
                assert out.dtype == expected.dtype == torch.bfloat16
                assert_close_rel(out, expected, 2e-2)
        for b in (2, 3, 4):
            x = inputs(b)
            out = model(x)
            assert out.dtype == torch.float32
            assert_close_rel(out, eager(x), RTOL)


# --------------------------------------------------------------------------------------------
# Plain functions: keyword defaults and scalar arguments
# --------------------------------------------------------------------------------------------


def shifted(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    return torch.tanh(x) * scale + x.mean(-1, keepdim=True)


def test_keyword_default_goes_direct_with_and_without_it(assert_close_rel):
    compiled = magi_compile(shifted)
    with torch.no_grad():
        for b in (2, 3, 4, 5):  # omitted: capture, ordinary, then direct
            x = inputs(b)
            assert_close_rel(compiled(x), shifted(x), RTOL)
        assert direct_calls() == 2, get_counters()
        for b in (2, 3, 4, 5):
            x = inputs(b)
            assert_close_rel(compiled(x, scale=2.0), shifted(x, scale=2.0), RTOL)
        assert direct_calls() >= 4, get_counters()


def test_keyword_default_results_match_with_and_without_it(assert_close_rel):
    # Regression: omitted arguments count as their defaults in the guard signature, so f(x)
    # and f(x, scale=2.0) share a signature and other values get their own.
    compiled = magi_compile(shifted)
    with torch.no_grad():
        for b in (2, 3, 4, 5):
            x = inputs(b)
            assert_close_rel(compiled(x), shifted(x), RTOL)
        for b in (2, 3, 4, 5):
            x = inputs(b)
            assert_close_rel(compiled(x, scale=2.0), shifted(x, scale=2.0), RTOL)
            assert_close_rel(compiled(x, 3.0), shifted(x, 3.0), RTOL)
    assert direct_calls() >= 4, get_counters()


def scaled_or_default(x: torch.Tensor, scale: float | None = 2.0) -> torch.Tensor:
    return x * (5.0 if scale is None else scale) + 1


def test_explicit_none_is_not_the_default(assert_close_rel):
    # Regression: f(x) and f(x, scale=None) shared a signature, and f(x)'s graph ran for None.
    compiled = magi_compile(scaled_or_default)
    with torch.no_grad():
        x = inputs(3)
        assert_close_rel(compiled(x, scale=None), scaled_or_default(x, scale=None), RTOL)
        x = inputs(3)
        assert_close_rel(compiled(x), scaled_or_default(x), RTOL)
        for b in (2, 3, 4):
            x = inputs(b)
            assert_close_rel(compiled(x, scale=None), scaled_or_default(x, scale=None), RTOL)


def repeated(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.sin(x) * n + n


def test_int_argument_values_each_get_their_own_path(assert_close_rel):
    compiled = magi_compile(repeated)
    values = (2, 3, 5, 7)
    with torch.no_grad():
        for n in values:
            for b in (2, 3, 4):
                x = inputs(b)
                assert_close_rel(compiled(x, n), repeated(x, n), RTOL)
        c = get_counters()
        assert c.guard_misses == len(values) - 1, c
        assert c.direct_calls == len(values), c  # the third call of each value
        # Back to earlier values: their direct paths, never another value's graph.
        for n in (5, 2, 7, 3, 2):
            x = inputs(4)
            assert_close_rel(compiled(x, n), repeated(x, n), RTOL)
    c = get_counters()
    assert (c.guard_misses, c.direct_calls) == (len(values) - 1, len(values) + 5), c
    assert c.captures == len(values), c


# --------------------------------------------------------------------------------------------
# Regressions from review: what Dynamo's guards catch, a direct call must catch too
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("guards", ["dynamo", "arguments"])
def test_branch_on_a_dynamic_size_is_guarded(assert_close_rel, guards):
    def branchy(x):
        return x * 2 if x.shape[0] > 4 else x * 3

    compiled = magi_compile(
        branchy, dynamic_arg_dims={"x": 0}, config_patch={"fast_dispatch_guards": guards}
    )
    with torch.no_grad():
        for n in (8, 8, 8, 3, 3, 8):
            x = torch.randn(n, 4)
            assert_close_rel(compiled(x), branchy(x), RTOL)


@pytest.mark.parametrize("guards", ["dynamo", "arguments"])
def test_tuple_argument_values_are_guarded(assert_close_rel, guards):
    def scaled(x, scale):
        return x * scale[0]

    compiled = magi_compile(scaled, config_patch={"fast_dispatch_guards": guards})
    with torch.no_grad():
        for s in ((2,), (2,), (2,), (5,), (2,)):
            x = inputs(3)
            assert_close_rel(compiled(x, s), scaled(x, s), RTOL)


def test_changed_argument_structure_falls_back_to_an_ordinary_call(assert_close_rel):
    def maybe_add(x, extra=None):
        return x if extra is None else x + extra[0]

    compiled = magi_compile(maybe_add, dynamic_arg_dims={"x": []})
    with torch.no_grad():
        x, y = inputs(3), inputs(3)
        for _ in range(3):
            assert_close_rel(compiled(x, (y,)), x + y, RTOL)
        assert_close_rel(compiled(x, None), x, RTOL)


def test_module_converted_to_half_is_guarded():
    model = nn.Sequential(nn.Linear(H, H), nn.GELU())
    eager = copy.deepcopy(model)
    compiled = magi_compile(model)
    with torch.no_grad():
        for _ in range(3):
            compiled(inputs(3))
        compiled.half()
        eager.half()
        x = inputs(3).half()
        out = compiled(x)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out, eager(x), rtol=2e-2, atol=2e-2)


def test_freed_modules_free_their_weights():
    import gc
    import weakref

    @magi_compile
    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(H, H)

        def forward(self, x):
            return self.fc(x)

    refs = []
    for _ in range(3):
        m = Small()
        refs.append(weakref.ref(m.fc.weight))
        with torch.no_grad():
            for _ in range(3):
                m(inputs(2))
        del m
        gc.collect()
    assert direct_calls() >= 3
    assert sum(r() is not None for r in refs[:-1]) == 0  # the last may stay in Dynamo's cache


def test_path_table_remembers_the_last_owner_without_keeping_it_alive():
    """PathTable.get answers a repeated owner from its last lookup; the owner's death drops
    that pair, so its paths (and the parameter dicts they reach) are freed with it."""
    import gc
    import weakref

    from magi_compiler import _fast_dispatch

    table = _fast_dispatch.PathTable()
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    paths = table.fresh(first)
    assert table.get(first) is paths and table.get(first) is paths
    assert table.get(second) is None
    assert table.get(first) is paths
    replaced = table.fresh(first)
    assert table.get(first) is replaced
    freed = weakref.ref(replaced)
    del first, paths, replaced
    gc.collect()
    assert freed() is None
    assert table.get(second) is None


class ReturnsASize(nn.Module):
    """Returns a size beside its tensors: a number in the result may change per call."""

    def forward(self, x: torch.Tensor):
        y = torch.tanh(x)
        return y, [y * 2, x.shape[0]]


def test_a_number_in_the_result_is_not_frozen_by_a_direct_path():
    compiled = magi_compile(ReturnsASize())
    with torch.no_grad():
        for batch in (4, 5, 6, 7, 8, 6):
            x = torch.randn(batch, 3)
            y, (y2, size) = compiled(x)
            assert size == batch
            torch.testing.assert_close(y2, torch.tanh(x) * 2)
