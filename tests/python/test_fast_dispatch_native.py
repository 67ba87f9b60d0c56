"""Direct calls made from C++ (``_C.DirectCall``, ``_C.DirectEntry``) on CPU, and
``fast_dispatch_guards``: positional calls go from the compiled method's wrapper to the graph
without Python of ours, checking Dynamo's guards on every call or once per argument layout;
parameter dicts are re-read when they change; a deep copy and concurrent calls stay correct.

Every numeric check compares against eager PyTorch on the same weights on fresh random float32
inputs (relative error <= 1e-5).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from _api_helpers import RTOL, SEQ, H, Tiny, inputs
from _fast_dispatch_helpers import (
    LLAMA,
    compiled_with_eager,
    direct_calls,
    llama_inputs,
    warm_up,
)
from blocks import LlamaStack, init_weights_
from magi_compiler import _C, get_counters, magi_compile
from magi_compiler.errors import UserError
from torch import nn

pytestmark = pytest.mark.usefixtures("counters")  # fresh Dynamo caches, zeroed counters


# --------------------------------------------------------------------------------------------
# Direct calls from C++ (_C.DirectCall) and fast_dispatch_guards
# --------------------------------------------------------------------------------------------


class Scaled(nn.Module):
    """A linear layer times a float attribute the guards compare."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.scale = 2.0

    def forward(self, x):
        return self.fc(x) * self.scale


def native_of(model: nn.Module):
    """The C++ direct call learned for ``model``'s one signature."""
    (path,) = model._magi_compiled._direct.get(model).paths
    assert path.native is not None
    return path.native


def llama_with_native(assert_close_rel, seed: int, **config):
    """(compiled Llama stack, eager copy, its C++ direct call) after the three calls that
    capture (batch 2), learn (3) and make the first direct call (4), each matching eager."""
    model, eager = compiled_with_eager(
        init_weights_(LlamaStack(2, **LLAMA), seed=seed), config_patch=config or None
    )
    for b in (2, 3, 4):
        x = llama_inputs(b)
        assert_close_rel(model(x), eager(x), RTOL)
    return model, eager, native_of(model)


def test_positional_calls_run_from_cpp_and_reuse_dynamos_verdict_while_nothing_moved(
    assert_close_rel,
):
    """Default mode: Dynamo's guards run for each new argument layout, and again whenever
    Python state the guard tree reads moved; in between their verdict is reused."""
    with torch.no_grad():
        model, eager, native = llama_with_native(assert_close_rel, seed=4)
        # (self, x); call 3 checked the guards, listed what they read, and checked them again
        assert (native.arity, native.num_guard_checks) == (2, 2)
        assert native.guard_reuse == "watched"
        # Batch 4 was checked by the first direct call; 2 was the capture's, never checked here.
        for n, (b, checks) in enumerate(
            zip((4, 5, 2, 5, 9, 4), (2, 3, 4, 4, 5, 5), strict=True), start=2
        ):
            x = llama_inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
            assert native.num_guard_checks == checks, (b, native.num_guard_checks)
            assert direct_calls() == n
        # A keyword call is bound in C++ too: batch 3 is a layout this direct call has not
        # checked yet, so the guards run once for it.
        x = llama_inputs(3)
        assert_close_rel(model(x=x), eager(x), RTOL)
        assert (direct_calls(), native.num_guard_checks) == (8, 6)
        assert_close_rel(model(x=x), eager(x), RTOL)
        assert (direct_calls(), native.num_guard_checks) == (9, 6)
        # A module attribute the guards compare moved: checked again (and passed: an equal
        # value, another float object), listed anew and checked once more.
        model.layers[0].input_norm.eps = eager.layers[0].input_norm.eps = float("1e-6")
        x = llama_inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)
        assert (direct_calls(), native.num_guard_checks) == (10, 8)
        assert_close_rel(model(x), eager(x), RTOL)
        assert (direct_calls(), native.num_guard_checks) == (11, 8)


def test_arguments_mode_checks_dynamos_guards_once_per_argument_layout(assert_close_rel):
    with torch.no_grad():
        model, eager, native = llama_with_native(
            assert_close_rel, seed=5, fast_dispatch_guards="arguments"
        )
        # Batch 4 was checked by the first direct call; 3 was seen only by the ordinary call.
        for b, checks in zip((4, 4, 6, 6, 3, 4), (1, 1, 2, 2, 3, 3), strict=True):
            x = llama_inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
            assert native.num_guard_checks == checks, (b, native.num_guard_checks)
        # Process state Dynamo guards is part of the layout: a new thread count checks again.
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(max(1, threads - 1) if threads > 1 else 2)
            x = llama_inputs(4)
            assert_close_rel(model(x), eager(x), RTOL)
            assert native.num_guard_checks == 4
        finally:
            torch.set_num_threads(threads)
        # Parameters are still read from their dicts on every call.
        weight = torch.randn_like(model.layers[0].q_proj.weight)
        model.layers[0].q_proj._parameters["weight"] = nn.Parameter(weight.clone())
        eager.layers[0].q_proj._parameters["weight"] = nn.Parameter(weight.clone())
        x = llama_inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)


def test_dynamo_mode_sees_a_module_attribute_the_forward_reads(assert_close_rel):
    model, eager = compiled_with_eager(Scaled())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)
        model.scale = eager.scale = 3.0  # a plain attribute: no registration hook fires
        for b in (3, 3, 3):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)


SHIFT = 1.0  # a global the next test's forward reads


def test_default_mode_sees_a_global_the_forward_reads(assert_close_rel):
    global SHIFT

    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)

        def forward(self, x):
            return self.fc(x) + SHIFT

    model, eager = compiled_with_eager(Shifted())
    try:
        with torch.no_grad():
            warm_up(model, eager, assert_close_rel)
            native = native_of(model)
            assert native.guard_reuse == "watched"
            SHIFT = 5.0
            for b in (3, 4, 4):
                x = inputs(b)
                assert_close_rel(model(x), eager(x), RTOL)
    finally:
        SHIFT = 1.0


def test_a_guard_tree_read_through_a_list_is_checked_on_every_call(assert_close_rel):
    """The forward reads a float from a list attribute: the watch cannot follow a list's
    items, so Dynamo's guards run on every direct call and see the in-place change."""

    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)
            self.scales = [2.0]

        def forward(self, x):
            return self.fc(x) * self.scales[0]

    model, eager = compiled_with_eager(Listed())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)
        native = native_of(model)
        assert native.guard_reuse == "unwatched"
        checks = native.num_guard_checks
        x = inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == checks + 1
        model.scales[0] = eager.scales[0] = 3.0
        for b in (4, 4):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)


def test_a_submodule_replaced_in_its_dict_is_computed_with(assert_close_rel):
    """``model._modules['fc'] = other`` runs no hook. Dynamo's guards pass (the same type and
    shapes), but the direct call gathered the old module's weights: the routes to the
    parameter dicts see the dict move and drop the direct calls, so the new weights are used."""

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)

        def forward(self, x):
            return self.fc(x) * 2.0

    other = nn.Linear(H, H)  # built before the warm-up: building registers parameters
    other_eager = copy.deepcopy(other)
    model, eager = compiled_with_eager(Wrapped())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)
        model._modules["fc"] = other
        eager._modules["fc"] = other_eager
        for b in (4, 4, 5, 4):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)


def test_guard_watch_keeps_no_module_alive():
    """The watch reaches module dicts through their modules and holds modules weakly: a
    freed module's weights are freed."""
    import gc
    import weakref

    def run_once() -> weakref.ref:
        model = magi_compile(LlamaStack(1, **LLAMA))
        with torch.no_grad():
            for b in (2, 3, 4, 4):
                model(llama_inputs(b))
        native = native_of(model)
        assert native.guard_reuse == "watched"
        return weakref.ref(model.layers[0].q_proj.weight)

    refs = [run_once() for _ in range(3)]
    gc.collect()
    assert sum(r() is not None for r in refs[:-1]) == 0  # the last may stay in Dynamo's cache


def test_guard_watch_keeps_no_module_alive_through_a_back_reference():
    """A child that refers back to its parent (here in a list, as a hook's bound method
    would): the watch reads the parent's ``_modules`` without holding it, so the model is
    freed once its last reference goes."""
    import gc
    import weakref

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.child = nn.Linear(H, H)
            self.child.back = [self]  # not a submodule: no registration, no guard

        def forward(self, x):
            return self.child(x) * 2.0

    def run_once() -> weakref.ref:
        model = magi_compile(Parent())
        with torch.no_grad():
            for b in (2, 3, 4, 4):
                model(inputs(b))
        native = native_of(model)
        assert native.guard_reuse == "watched"
        return weakref.ref(model.child.weight)

    refs = [run_once() for _ in range(3)]
    gc.collect()
    assert sum(r() is not None for r in refs[:-1]) == 0  # the last may stay in Dynamo's cache


def test_state_that_moves_every_call_stops_the_watch(assert_close_rel):
    """An attribute the guards compare that is a new (equal) object on every call: the watch
    fails each time it is listed, so after a few walks the guards run on every call instead."""

    model, eager = compiled_with_eager(Scaled())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)
        native = native_of(model)
        assert native.guard_reuse == "watched"
        for _ in range(8):
            model.scale = float("2.0")  # equal, another object: the dict moved
            x = inputs(4)
            assert_close_rel(model(x), eager(x), RTOL)
        assert native.guard_reuse == "unwatched"
        checks = native.num_guard_checks
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == checks + 1


def test_a_module_with_a_buffer_is_watched_and_its_aliasing_checked(assert_close_rel):
    """A registered buffer adds Dynamo's tensor-aliasing guard (the argument must not be the
    buffer): the tree is watched, and a call passing the buffer itself checks the guards.
    Direct calls match eager, also after the buffer is written in place."""

    class Buffered(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)
            self.register_buffer("shift", torch.randn(H))

        def forward(self, x):
            return self.fc(x) + self.shift

    model, eager = compiled_with_eager(Buffered())
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)
        native = native_of(model)
        assert native.guard_reuse == "watched"
        for m in (model, eager):
            m.shift.mul_(3.0)
        for b in (4, 4, 5):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
        checks = native.num_guard_checks
        x = inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == checks
        # The buffer as the argument, laid out as a batch-4 input: the fingerprint is one
        # already passed, the aliasing is not.
        shift = model.shift
        # A buffer of another shape: Dynamo's guards fail, the call captures again and learns
        # a second direct call for the same signature.
        model.shift = torch.randn(4, SEQ, H)
        eager.shift = model.shift.clone()
        for b in (4, 4, 4):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
        native = model._magi_compiled._direct.get(model).paths[-1].native
        checks = native.num_guard_checks
        assert_close_rel(model(model.shift), eager(eager.shift), RTOL)
        assert native.num_guard_checks > checks
        del shift


class _Config:
    """A plain config object, as models keep their hyperparameters in."""

    def __init__(self, scale: float) -> None:
        self.scale = scale


class Configured(nn.Module):
    """A linear layer scaled by ``cfg.scale``, read from a config object on every call."""

    def __init__(self, cfg: object) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.cfg = cfg

    def forward(self, x):
        return self.fc(x) * self.cfg.scale


@pytest.mark.parametrize(
    "make_config", [_Config, lambda s: SimpleNamespace(scale=s)], ids=["class", "SimpleNamespace"]
)
def test_an_attribute_of_a_config_object_is_watched(assert_close_rel, make_config):
    """The forward reads ``self.cfg.scale``: the tree is watched through the config's
    ``__dict__``; a new value, and a new config object, each make the guards run again."""
    model, eager = compiled_with_eager(Configured(make_config(2.0)))
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)
        native = native_of(model)
        assert native.guard_reuse == "watched"
        x = inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)
        checks = native.num_guard_checks
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == checks  # reused
        model.cfg.scale = eager.cfg.scale = 3.0
        assert_close_rel(model(x), eager(x), RTOL)
        model.cfg = make_config(5.0)
        eager.cfg = make_config(5.0)
        for b in (4, 4):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)


def test_a_config_class_changed_later_is_seen(assert_close_rel):
    """A property added to the config's class takes over ``cfg.scale`` although the instance
    dict is unchanged: the class's version tag moved, so the guards run again."""

    class Config:
        def __init__(self) -> None:
            self.scale = 2.0

    model, eager = compiled_with_eager(Configured(Config()))
    with torch.no_grad():
        warm_up(model, eager, assert_close_rel)
        native = native_of(model)
        assert native.guard_reuse == "watched"
        x = inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)
        Config.scale = property(lambda self: 7.0)  # shared by both models' configs
        for _ in range(2):
            assert_close_rel(model(x), eager(x), RTOL)


def _double(x):
    return x * 2.0


def _triple(x):
    return x * 3.0


def test_a_helpers_code_replaced_is_seen(assert_close_rel):
    """The forward calls a global helper; its ``__code__`` replaced in place (no dict write)
    is seen by the identity pin, and the result follows the new code."""
    saved = _double.__code__

    class Helped(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)

        def forward(self, x):
            return _double(self.fc(x))

    model, eager = compiled_with_eager(Helped())
    try:
        with torch.no_grad():
            warm_up(model, eager, assert_close_rel)
            native = native_of(model)
            assert native.guard_reuse == "watched"
            x = inputs(4)
            assert_close_rel(model(x), eager(x), RTOL)
            _double.__code__ = _triple.__code__
            for _ in range(2):
                assert_close_rel(model(x), eager(x), RTOL)
    finally:
        _double.__code__ = saved


def test_an_argument_marked_dynamic_checks_the_guards():
    """``torch._dynamo.mark_dynamic`` gives the argument an attribute Dynamo's guards say it
    lacks: the call checks the guards instead of reusing their verdict."""
    with torch.no_grad():
        model = magi_compile(LlamaStack(1, **LLAMA))
        for b in (2, 3, 4, 4):
            model(llama_inputs(b))
        native = native_of(model)
        assert native.guard_reuse == "watched"
        checks = native.num_guard_checks
        x = llama_inputs(4)
        model(x)
        assert native.num_guard_checks == checks
        torch._dynamo.mark_dynamic(x, 0)
        model(x)
        assert native.num_guard_checks > checks


def test_a_closure_variable_rebound_is_seen(assert_close_rel):
    """A compiled function reads a variable of its closure; rebinding it (a cell write, no
    dict) is seen by the cell's pin."""
    weight = torch.randn(H, H)

    def make():
        scale = 2.0

        def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return (x @ w) * scale

        def rebind(value: float) -> None:
            nonlocal scale
            scale = value

        return scaled, rebind

    scaled, rebind = make()
    compiled = magi_compile(scaled, dynamic_arg_dims={"x": 0})
    with torch.no_grad():
        for b in (2, 3, 4, 4):
            x = inputs(b)
            assert_close_rel(compiled(x, weight), scaled(x, weight), RTOL)
        (native,) = [p.native for p in compiled._magi_compiled._direct.get(None).paths]
        assert native.guard_reuse == "watched"
        rebind(5.0)
        for _ in range(2):
            x = inputs(4)
            assert_close_rel(compiled(x, weight), scaled(x, weight), RTOL)


def test_fast_dispatch_guards_must_be_a_known_mode():
    with pytest.raises(UserError) as info:
        magi_compile(Tiny(), config_patch={"fast_dispatch_guards": "none"})
    assert str(info.value) == (
        "fast_dispatch_guards='none' is not one of dynamo, arguments (docs/config.md)"
    )


def assert_direct_path_stays_in_python(model, eager, assert_close_rel) -> torch.Tensor:
    """After the warm-up, the learned direct path has no C++ call, and the next call still
    goes direct (through Python), matching eager. Returns that call's input."""
    warm_up(model, eager, assert_close_rel)
    (path,) = model._magi_compiled._direct.get(model).paths
    assert path.native is None
    x = inputs(3)
    assert_close_rel(model(x), eager(x), RTOL)
    assert direct_calls() == 2
    return x


def test_dumps_keep_direct_calls_in_python(assert_close_rel, tmp_path, monkeypatch):
    """Dumps wrap a graph's run to count its first calls (reports rewritten until the fourth):
    a C++ direct call would bypass that, so with dumps on direct calls stay in Python."""
    from magi_compiler import _dump

    monkeypatch.setenv(_dump.ENABLE_ENV, "1")
    monkeypatch.setenv(_dump.DIR_ENV, str(tmp_path))
    model, eager = compiled_with_eager(Tiny())
    with torch.no_grad():
        assert_direct_path_stays_in_python(model, eager, assert_close_rel)


def test_arguments_mode_fingerprints_the_parameters_too(assert_close_rel):
    """A parameter changed in place (no registration hook, the argument unchanged) gives a new
    fingerprint, so Dynamo's guards run again instead of a remembered verdict."""
    with torch.no_grad():
        model, eager, native = llama_with_native(
            assert_close_rel, seed=6, fast_dispatch_guards="arguments"
        )
        x = llama_inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 1
        model.layers[1].up_proj.weight.requires_grad_(False)
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 2
        weight = model.layers[0].o_proj.weight
        weight.data = weight.data.t().contiguous().t()  # same values, column-major strides
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 3
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 3


def test_keyword_only_parameters_keep_direct_calls_in_python(assert_close_rel):
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)

        def forward(self, x, *, scale=2.0):
            return self.fc(x) * scale

    model, eager = compiled_with_eager(Scaled())
    with torch.no_grad():
        x = assert_direct_path_stays_in_python(model, eager, assert_close_rel)
        with pytest.raises(TypeError):
            model(x, 3.0)  # scale is keyword-only, as in eager


# --------------------------------------------------------------------------------------------
# The C++ entry: a compiled method's wrapper tries the direct calls before any Python runs
# --------------------------------------------------------------------------------------------


def test_direct_calls_of_a_module_run_without_the_python_entry(assert_close_rel, monkeypatch):
    """Once learned, a positional call goes from the wrapper to the C++ direct call: the
    compiled entry's Python method is not reached (it would raise here)."""
    with torch.no_grad():
        model, eager, _ = llama_with_native(assert_close_rel, seed=7)
        entry = model._magi_compiled
        assert len(entry._direct.native_entry(model)) == 1

        def not_reached(*args, **kwargs):
            raise AssertionError("the Python entry ran")

        monkeypatch.setattr(entry, "call", not_reached)
        for n, b in enumerate((3, 6), start=2):
            x = llama_inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
            assert direct_calls() == n
        monkeypatch.undo()
        # A keyword call, and a call of another signature, go through the Python entry.
        x = llama_inputs(5)
        assert_close_rel(model(x=x), eager(x), RTOL)
        assert direct_calls() == 4
        x = torch.randn(2, 6, LLAMA["hidden"])  # another static size: a capture of its own
        assert_close_rel(model(x), eager(x), RTOL)
        assert direct_calls() == 4


def test_compiled_function_goes_direct_from_cpp(assert_close_rel):
    weight = torch.randn(H, H)

    def gate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.silu(x @ w) * x

    compiled = magi_compile(gate, dynamic_arg_dims={"x": 0})
    with torch.no_grad():
        for i, b in enumerate((2, 3, 4, 7)):
            x = inputs(b)
            assert_close_rel(compiled(x, weight), gate(x, weight), RTOL)
            assert direct_calls() == max(0, i - 1)
    assert len(compiled._magi_compiled._direct.native_entry(None)) == 1


def test_parameters_dict_write_in_arguments_mode_checks_the_guards_again(assert_close_rel):
    """The C++ call re-reads a parameter dict only when the dict changed: a write of a tensor
    of another shape is seen (Dynamo's guards run again and refuse, so the call captures
    anew), and so is a write of one with the same layout (guards run again and pass)."""
    with torch.no_grad():
        model, eager, native = llama_with_native(
            assert_close_rel, seed=8, fast_dispatch_guards="arguments"
        )
        x = llama_inputs(4)
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 1
        for m in (model, eager):
            m.layers[1].down_proj._parameters["weight"] = nn.Parameter(
                m.layers[1].down_proj.weight.detach() * 2.0
            )
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 2
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 2

        captures = get_counters().captures
        wider = torch.randn(LLAMA["hidden"], LLAMA["intermediate"] // 2)
        for m in (model, eager):
            m.layers[1].down_proj._parameters["weight"] = nn.Parameter(wider.clone())
            m.layers[1].up_proj._parameters["weight"] = nn.Parameter(
                m.layers[1].up_proj.weight[: LLAMA["intermediate"] // 2].clone()
            )
            m.layers[1].gate_proj._parameters["weight"] = nn.Parameter(
                m.layers[1].gate_proj.weight[: LLAMA["intermediate"] // 2].clone()
            )
        assert_close_rel(model(x), eager(x), RTOL)
        assert native.num_guard_checks == 3  # the remembered verdict was not reused
        assert get_counters().captures == captures + 1


def test_deep_copy_of_a_module_with_direct_calls(assert_close_rel):
    """copy.deepcopy of a compiled module that already makes direct calls: the copy is
    compiled too (the same captures serve it) and computes with its own weights, and the
    original keeps its own."""
    with torch.no_grad():
        model, eager, _ = llama_with_native(assert_close_rel, seed=9)
        twin = copy.deepcopy(model)
        halved = copy.deepcopy(eager)
        for p in (*twin.parameters(), *halved.parameters()):
            p.mul_(0.5)
        captures = get_counters().captures
        for b in (4, 3, 4, 4):
            x = llama_inputs(b)
            assert_close_rel(twin(x), halved(x), RTOL)
            assert_close_rel(model(x), eager(x), RTOL)
        assert get_counters().captures == captures
        assert direct_calls() >= 5  # the original's, and the copy's once it learned them
        assert twin._magi_compiled is model._magi_compiled
        assert len(model._magi_compiled._direct.native_entry(twin)) == 1


def test_concurrent_calls_while_paths_are_dropped_and_learned(assert_close_rel):
    """Two threads call one compiled module while a third keeps dropping every direct path
    (as a replaced submodule does; the next call learns it again).
    The C++ entry holds the direct calls it is running, and a call made while another holds
    the shared buffers uses buffers of its own: every result matches eager."""
    import threading

    with torch.no_grad():
        model, eager, _ = llama_with_native(
            assert_close_rel, seed=10, fast_dispatch_guards="arguments"
        )
        xs = [llama_inputs(b) for b in (2, 3, 4)]
        expected = [eager(x) for x in xs]
    errors: list[BaseException] = []
    stop = threading.Event()

    def call(offset: int) -> None:
        try:
            with torch.no_grad():
                for i in range(40):
                    k = (i + offset) % len(xs)
                    assert_close_rel(model(xs[k]), expected[k], RTOL)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def register() -> None:
        while not stop.wait(0.005):  # a few drops per call, leaving room for direct calls
            _C.bump_registration_epoch()  # what a replaced submodule does

    threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
    bumper = threading.Thread(target=register)
    bumper.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    bumper.join()
    assert not errors, errors[0]
    # Beyond the warm-up's one, some of the 80 calls went direct between drops, and some were
    # ordinary (they learned the path again after a drop).
    assert 1 < direct_calls() < 81
