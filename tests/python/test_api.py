"""The ``magi_compile`` surface on CPU: target kinds × usage styles, errors, ``enable_if`` and
compile mode NONE, dynamic dims and their inference (also under ``from __future__ import
annotations``), fully static mode and the counters API. What happens at call time (guards,
eager fallback, nesting, training) is in test_api_runtime.py.

Every numeric check compares against eager PyTorch on fresh random float32 inputs (relative
error ≤ 1e-5). Models are tiny: the file must stay fast on 2 cores.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import typing

import _future_annotations_model as future_models
import pytest
import torch
from _api_helpers import BATCHES, RTOL, SEQ, H, Tiny, captures, inputs, pointwise, tiny_fn
from magi_compiler import get_counters, magi_compile, reset_counters


@pytest.fixture(autouse=True)
def _fresh_counters(counters):
    """Every test starts with empty Dynamo caches and zeroed counters (tests/conftest.py)."""
    yield


# --------------------------------------------------------------------------------------------
# Target kinds × usage styles
# --------------------------------------------------------------------------------------------

KINDS = ["class", "instance", "bound_method", "function"]
STYLES = ["bare", "parametrised", "imperative", "factory"]


def apply_style(style: str, obj):
    if style == "bare":
        return magi_compile(obj)
    if style == "parametrised":
        return magi_compile(model_tag="tiny", dynamic_arg_dims={"x": 0})(obj)
    if style == "imperative":
        return magi_compile(obj, dynamic_arg_dims={"x": [0]})
    factory = magi_compile(model_tag="tiny")
    return factory(obj)


def compile_target(kind: str, style: str):
    """Compiles one target; returns (compiled callable, eager callable)."""
    if kind == "function":
        weight, bias = torch.randn(H, H) / H**0.5, torch.randn(H)
        compiled = apply_style(style, tiny_fn)
        assert compiled is not tiny_fn and callable(compiled)
        assert compiled.__wrapped__ is tiny_fn and compiled.__name__ == "tiny_fn"
        return (
            functools.partial(compiled, weight=weight, bias=bias),
            functools.partial(tiny_fn, weight=weight, bias=bias),
        )
    if kind == "class":
        cls = type("TinyCompiled", (Tiny,), {})
        assert apply_style(style, cls) is cls  # the class itself comes back
        model = cls()
        assert "forward" in vars(model)  # compiled after __init__
        eager = Tiny()
        eager.load_state_dict(model.state_dict())
        return model, eager
    model = Tiny()
    eager = copy.deepcopy(model)
    if kind == "instance":
        assert apply_style(style, model) is model  # the same object comes back
        return model, eager
    bound = apply_style(style, model.forward)
    assert bound.__self__ is model and bound.__func__ is not Tiny.forward
    assert model.forward == bound  # the owner is patched: model(x) runs the compiled method
    return model, eager


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("kind", KINDS)
def test_kinds_and_styles_match_eager(kind, style, assert_close_rel):
    compiled, eager = compile_target(kind, style)
    with torch.no_grad():
        for b in BATCHES:
            x = inputs(b)
            assert_close_rel(compiled(x), eager(x), RTOL)
    c = get_counters()
    assert (c.captures, c.compiles, c.guard_misses) == (1, 1, 0), c


def test_decorator_syntax(assert_close_rel):
    @magi_compile
    class Bare(Tiny):
        pass

    @magi_compile(dynamic_arg_dims={"x": 0}, model_tag="param")
    class Parametrised(Tiny):
        pass

    @magi_compile
    def bare_fn(x):
        return pointwise(x)

    @magi_compile(dynamic_arg_dims={"x": 0})
    def param_fn(x):
        return pointwise(x)

    for cls in (Bare, Parametrised):
        model = cls()
        eager = Tiny()
        eager.load_state_dict(model.state_dict())
        with torch.no_grad():
            for b in BATCHES:
                x = inputs(b)
                assert_close_rel(model(x), eager(x), RTOL)
    for fn in (bare_fn, param_fn):
        for b in BATCHES:
            x = inputs(b)
            assert_close_rel(fn(x), pointwise(x), RTOL)
    assert captures() == 4  # one per function and one per class (Dynamo guards on the type)


def test_factory_compiles_a_class_and_an_instance(assert_close_rel):
    factory = magi_compile(dynamic_arg_dims={"x": 0}, model_tag="factory")
    cls = factory(type("FromFactory", (Tiny,), {}))
    model_a, model_b = cls(), factory(Tiny())
    for model in (model_a, model_b):
        eager = Tiny()
        eager.load_state_dict(model.state_dict())
        with torch.no_grad():
            for b in BATCHES:
                x = inputs(b)
                assert_close_rel(model(x), eager(x), RTOL)


def test_method_name_compiles_one_method_only(assert_close_rel):
    class TwoMethods(Tiny):
        def forward_batched(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
            return [self.forward(x) for x in xs]

        def encode(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc1(x).relu()

    model = magi_compile(TwoMethods(), method_name="encode")
    assert set(vars(model)["_magi_compiled_methods"]) == {"encode"}
    assert "forward" not in vars(model) and "forward_batched" not in vars(model)
    with torch.no_grad():
        x = inputs(3)
        assert_close_rel(model.encode(x), TwoMethods.encode(model, x), RTOL)
        assert_close_rel(model(x), Tiny.forward(model, x), RTOL)
    assert captures() == 1


def test_default_valued_settings_add_no_capture(assert_close_rel):
    class Defaults(Tiny):
        magi_compile_config = {"strict": False}

    models = [
        magi_compile(Tiny()),
        magi_compile(Tiny(), config_patch={"dynamic_dim_default": 0, "max_recaptures": 8}),
        magi_compile(Defaults()),
    ]
    with torch.no_grad():
        for b in BATCHES:
            x = inputs(b)
            for model in models:
                assert_close_rel(model(x), Tiny.forward(model, x), RTOL)
    assert captures() == 2  # Tiny's instances share one capture; Defaults is another class


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class NothingToCall:
    def helper(self, x):
        return x


@pytest.mark.parametrize(
    "obj, words",
    [
        (42, ["cannot compile a int", "nn.Module class or instance"]),
        ("forward", ["cannot compile a str"]),
        (NothingToCall, ["NothingToCall has neither forward nor __call__", "method_name"]),
    ],
    ids=["int", "str", "class_without_forward_or_call"],
)
def test_unsupported_object_is_a_type_error(obj, words):
    with pytest.raises(TypeError) as info:
        magi_compile(obj)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("target", ["function", "bound_method"])
def test_method_name_with_function_or_bound_method_is_a_value_error(target):
    obj = tiny_fn if target == "function" else Tiny().forward
    with pytest.raises(ValueError) as info:
        magi_compile(obj, method_name="forward")
    assert "method_name applies to module classes and instances" in str(info.value)
    assert "pass it directly" in str(info.value)


def test_missing_method_is_a_value_error():
    with pytest.raises(ValueError, match="Tiny has no method 'decode' to compile"):
        magi_compile(Tiny(), method_name="decode")


def test_dynamic_arg_dims_errors():
    with pytest.raises(ValueError) as info:
        magi_compile(Tiny(), dynamic_arg_dims={"y": 0})
    assert "names 'y', which is not a parameter" in str(info.value)
    assert "parameters: x" in str(info.value)
    with pytest.raises(TypeError, match=r"dynamic_arg_dims\['x'\]: expected an int or a list"):
        magi_compile(Tiny(), dynamic_arg_dims={"x": "0"})
    with pytest.raises(TypeError, match="expected an int or a list of ints"):
        magi_compile(Tiny(), dynamic_arg_dims={"x": [0, True]})
    model = magi_compile(Tiny(), dynamic_arg_dims={"x": -4})
    with pytest.raises(ValueError, match="dim -4 of argument 'x' is out of range .* rank 3"):
        model(inputs(2))


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("size", [0, 1])
def test_size_zero_or_one_on_first_call_specialises_then_goes_dynamic(size, explicit, caplog):
    dims = {"x": 0} if explicit else None
    compiled = magi_compile(pointwise, dynamic_arg_dims=dims)
    with caplog.at_level(logging.INFO, logger="magi_compiler"):
        x = inputs(size)
        torch.testing.assert_close(compiled(x), pointwise(x))
    assert captures() == 1
    logged = f"dynamic dim 0 of 'x' has size {size} on the first call" in caplog.text
    assert logged == explicit  # only a dim the user named is worth a log line
    for b in (2, 3, 17, size, 4):
        x = inputs(b)
        torch.testing.assert_close(compiled(x), pointwise(x))
    assert captures() == 2


def test_rotary_table_of_batch_one_beside_a_larger_batch():
    # A [1, 1, S, D] argument's dim 0 is inferred dynamic and is 1 on every call: it stays
    # static while x's batch is dynamic.
    def rotate(x, table):
        return x * table.cos() + x.flip(-1) * table.sin()

    compiled = magi_compile(rotate)
    for b in (4, 1, 6):
        x, table = torch.randn(b, 2, 8, 16), torch.randn(1, 1, 8, 16)
        torch.testing.assert_close(compiled(x, table), rotate(x, table))
    assert captures() == 2  # batch 4 with dim 0 dynamic, batch 1 as it is; 6 reuses the first


def test_config_patch_errors():
    with pytest.raises(ValueError, match=r"config_patch\['nope'\]: CompileConfig has no field"):
        magi_compile(Tiny(), config_patch={"nope": 1})
    with pytest.raises(ValueError, match="is not one of NONE, TORCH_COMPILE, MAGI_COMPILE"):
        magi_compile(Tiny(), config_patch={"compile_mode": "fast"})


# --------------------------------------------------------------------------------------------
# enable_if and compile mode NONE
# --------------------------------------------------------------------------------------------


def raw_target(kind: str):
    if kind == "function":
        return tiny_fn, None
    if kind == "class":
        return type("Untouched", (Tiny,), {}), None
    model = Tiny()
    return (model, model) if kind == "instance" else (model.forward, model)


def assert_untouched(kind, obj, returned, owner):
    assert returned is obj or (kind == "bound_method" and returned == obj)
    if kind == "class":
        assert "__init__" not in vars(obj) and "forward" not in vars(obj())
    if owner is not None:
        assert "forward" not in vars(owner) and "_magi_compiled_methods" not in vars(owner)


@pytest.mark.parametrize("kind", KINDS)
def test_enable_if_false_returns_the_object_unchanged(kind):
    obj, owner = raw_target(kind)
    calls = []
    returned = magi_compile(obj, enable_if=lambda: calls.append(1) or False)
    assert calls == [1]  # asked once, at decoration time
    assert_untouched(kind, obj, returned, owner)
    returned = magi_compile(enable_if=lambda: False)(obj)
    assert_untouched(kind, obj, returned, owner)


@pytest.mark.parametrize("kind", KINDS)
def test_compile_mode_none_returns_the_object_unchanged(kind):
    obj, owner = raw_target(kind)
    returned = magi_compile(obj, config_patch={"compile_mode": "NONE"})
    assert_untouched(kind, obj, returned, owner)


def test_compile_mode_none_from_the_class_attribute():
    class Off(Tiny):
        magi_compile_config = {"compile_mode": "none"}

    assert magi_compile(Off) is Off and "__init__" not in vars(Off)
    model = Off()
    assert magi_compile(model) is model and "forward" not in vars(model)


def test_enable_if_true_compiles():
    model = magi_compile(Tiny(), enable_if=lambda: True)
    with torch.no_grad():
        model(inputs(2))
    assert captures() == 1


# --------------------------------------------------------------------------------------------
# Dynamic dims
# --------------------------------------------------------------------------------------------


def run_shapes(compiled, eager, shapes, assert_close_rel, **kwargs):
    for shape in shapes:
        x = torch.randn(*shape)
        assert_close_rel(compiled(x, **kwargs), eager(x, **kwargs), RTOL)


def test_dynamic_dims_int_and_list(assert_close_rel):
    shapes = [(2, 3, H), (3, 5, H), (4, 7, H)]
    run_shapes(
        magi_compile(pointwise, dynamic_arg_dims={"x": [0, 1]}), pointwise, shapes, assert_close_rel
    )
    assert captures() == 1  # batch and sequence both symbolic
    # Entries of one function share Dynamo's cache (one per code object), which now holds a
    # graph with both dims symbolic: start afresh to see what {"x": 0} alone captures.
    torch._dynamo.reset()
    reset_counters()
    run_shapes(
        magi_compile(pointwise, dynamic_arg_dims={"x": 0}), pointwise, shapes, assert_close_rel
    )
    assert captures() == 3  # the sequence length is static: one capture per value


def test_negative_dynamic_dims(assert_close_rel):
    run_shapes(
        magi_compile(pointwise, dynamic_arg_dims={"x": [-3, -1]}),
        pointwise,
        [(2, SEQ, 3), (5, SEQ, 6), (3, SEQ, 9)],
        assert_close_rel,
    )
    assert captures() == 1


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor


class Holder:
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


def combine(batch, scale: float = 0.5):
    get = batch.get if isinstance(batch, dict) else functools.partial(getattr, batch)
    return get("x") * scale + get("y").sum(-1, keepdim=True)


@pytest.mark.parametrize("container", ["dataclass", "object", "dict"])
def test_dotted_paths(container, assert_close_rel):
    make = {"dataclass": Batch, "object": Holder, "dict": lambda x, y: {"x": x, "y": y}}[container]
    compiled = magi_compile(combine, dynamic_arg_dims={"batch.x": 0, "batch.y": 0})
    for b in BATCHES:
        batch = make(torch.randn(b, H), torch.randn(b, 6))
        assert_close_rel(compiled(batch), combine(batch), RTOL)
    c = get_counters()
    assert (c.captures, c.guard_misses) == (1, 0), c
    batch = make(torch.randn(3, H), torch.randn(3, 7))  # a static dim behind a path changed
    assert_close_rel(compiled(batch), combine(batch), RTOL)
    c = get_counters()
    assert (c.captures, c.guard_misses) == (2, 1), c


def with_bias(x, bias=None):
    return x * 2 if bias is None else x * 2 + bias


def test_none_arguments_are_skipped(assert_close_rel):
    compiled = magi_compile(with_bias, dynamic_arg_dims={"x": 0, "bias": 0})
    for b in BATCHES:
        x = inputs(b)
        assert_close_rel(compiled(x), with_bias(x), RTOL)
        assert_close_rel(compiled(x, None), with_bias(x), RTOL)
    assert captures() == 1
    for b in BATCHES:  # a tensor where there was None: a new signature, captured once
        x, bias = inputs(b), inputs(b)
        assert_close_rel(compiled(x, bias=bias), with_bias(x, bias), RTOL)
    c = get_counters()
    assert (c.captures, c.guard_misses) == (2, 1), c


def test_fully_static_with_empty_dynamic_arg_dims(assert_close_rel):
    compiled = magi_compile(pointwise, dynamic_arg_dims={})
    run_shapes(compiled, pointwise, [(2, SEQ, H), (2, SEQ, H)], assert_close_rel)
    assert captures() == 1
    run_shapes(compiled, pointwise, [(1, SEQ, H), (3, SEQ, H)], assert_close_rel)  # size 1 is fine
    c = get_counters()
    assert (c.captures, c.guard_misses) == (3, 2), c


def test_fully_static_with_config_switch(assert_close_rel):
    model = magi_compile(Tiny(), config_patch={"dynamic_dim_default": None})
    assert vars(model)["_magi_compiled"].dynamic_arg_dims == {}
    eager = copy.deepcopy(model)
    with torch.no_grad():
        for b, expected in ((2, 1), (2, 1), (3, 2), (1, 3)):
            x = inputs(b)
            assert_close_rel(model(x), Tiny.forward(eager, x), RTOL)
            assert captures() == expected


def test_other_dynamic_dim_default(assert_close_rel):
    compiled = magi_compile(tiny_fn, config_patch={"dynamic_dim_default": 1})
    weight, bias = torch.randn(H, H), torch.randn(H)
    for s in (3, 5, 8):
        x = inputs(2, s, H)
        assert_close_rel(compiled(x, weight, bias), tiny_fn(x, weight, bias), RTOL)
    assert captures() == 1  # inferred from the annotation of x, with dim 1 instead of 0


# --------------------------------------------------------------------------------------------
# Inference from annotations, including ``from __future__ import annotations``
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, dims, make_args",
    [
        (future_models.Plain, {"x": [0]}, lambda b: (inputs(b),)),
        (
            future_models.WithOptional,
            {"x": [0], "mask": [0]},
            lambda b: (inputs(b), inputs(b, SEQ)),
        ),
        (future_models.WithUnion, {"x": [0], "residual": [0]}, lambda b: (inputs(b), inputs(b))),
        (future_models.TypeCheckingOnly, {"x": [0]}, lambda b: (inputs(b),)),
    ],
    ids=["Tensor", "Optional", "union_none", "type_checking_only"],
)
def test_inference_under_future_annotations(cls, dims, make_args, assert_close_rel):
    model = magi_compile(cls())
    entry = vars(model)["_magi_compiled"]
    assert entry.dims_inferred and entry.dynamic_arg_dims == dims
    for b in BATCHES:
        args = make_args(b)
        assert_close_rel(model(*args), cls.forward(model, *args), RTOL)
    assert captures() == 1


def test_inferred_dims_leave_unannotated_tensors_static(assert_close_rel):
    model = magi_compile(future_models.WithOptional())
    table = torch.randn(4, 3)
    eager = functools.partial(future_models.WithOptional.forward, model)
    for b in BATCHES:
        x, mask = inputs(b), inputs(b, SEQ)
        assert_close_rel(model(x, mask, table), eager(x, mask, table), RTOL)
    assert captures() == 1
    table = torch.randn(5, 3)  # `table` is not annotated: its dims are static
    x, mask = inputs(2), inputs(2, SEQ)
    assert_close_rel(model(x, mask, table), eager(x, mask, table), RTOL)
    assert captures() == 2


class TypedAnnotations(torch.nn.Module):
    """Annotated as Hugging Face annotates: typed tensor names, Optional of them."""

    def forward(
        self,
        x: torch.FloatTensor,
        mask: typing.Optional[torch.FloatTensor] = None,  # noqa: UP045 - HF's spelling
    ) -> torch.Tensor:
        return torch.tanh(x) + mask


def test_typed_tensor_annotations_get_dim_0(assert_close_rel):
    model = magi_compile(TypedAnnotations())
    entry = vars(model)["_magi_compiled"]
    assert entry.dims_inferred and entry.dynamic_arg_dims == {"x": [0], "mask": [0]}
    for b in BATCHES:
        x, mask = inputs(b), inputs(b)
        assert_close_rel(model(x, mask), torch.tanh(x) + mask, RTOL)
    assert captures() == 1  # the mask's batch moves with x's: both dynamic


def test_no_tensor_annotation_makes_dim_0_of_every_tensor_dynamic(assert_close_rel):
    compiled = magi_compile(with_bias)
    assert not compiled._magi_compiled.dims_inferred
    for b in BATCHES:
        x, bias = inputs(b), inputs(b)
        assert_close_rel(compiled(x, bias), with_bias(x, bias), RTOL)
    assert captures() == 1


# --------------------------------------------------------------------------------------------
# Counters
# --------------------------------------------------------------------------------------------


def test_counters_api():
    c = get_counters()
    assert c.as_dict() == {
        "captures": 0,
        "compiles": 0,
        "guard_misses": 0,
        "cache_hits": 0,
        "direct_calls": 0,
        "disk_cache_hits": 0,
        "disk_cache_misses": 0,
        "disk_cache_writes": 0,
        "cache_loaded_graphs": 0,
    }
    compiled = magi_compile(pointwise)
    compiled(inputs(2))
    snapshot = get_counters()
    compiled(inputs(3, 7, H))  # static dim 1 changed
    assert snapshot["captures"] == 1 and snapshot.compiles == 1  # a snapshot does not move
    assert get_counters().captures == 2 and get_counters().guard_misses == 1
    reset_counters()
    assert get_counters().as_dict() == dict.fromkeys(c.as_dict(), 0)
