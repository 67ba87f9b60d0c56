"""A forward wrapped by a decorator that takes ``(self, *args, **kwargs)``, as Hugging Face
wraps whole models' forwards (``can_return_tuple``, ``check_model_inputs``): Dynamo traces the
wrapper, whose frame holds ``args`` and ``kwargs``, while calls bind to the inner forward's
parameters (_call_frame.py). After a warm-up such calls take the C++ direct path, keyword or
positional, and a call of another form (another keyword set, None for a tensor, another
static value) gets eager's result, never a wrong direct hit.

Numerics compare against eager PyTorch on the same weights, fresh random float32 inputs.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from _api_helpers import RTOL, H, inputs
from magi_compiler import _C, _call_frame, get_counters, magi_compile
from torch import nn

pytestmark = pytest.mark.usefixtures("counters")  # fresh Dynamo caches, zeroed counters


def passes_through(fn):
    """A decorator in Hugging Face's style: the owner named, everything else forwarded."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        kwargs.pop("return_dict", None)  # a write to the frame's own dict, as HF's does
        return fn(self, *args, **kwargs)

    return wrapper


def generic(fn):
    """A decorator that names nothing: the owner arrives as args[0]."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(H, H)
        self.norm = nn.LayerNorm(H)

    @passes_through
    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        scale: float = 1.0,
        gelu: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        h = self.proj(self.norm(x)) * scale
        if mask is not None:
            h = h + mask
        return torch.nn.functional.gelu(h) if gelu else torch.tanh(h)


class GenericallyWrapped(Wrapped):
    @generic
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tanh(self.proj(self.norm(x)) + (0 if mask is None else mask))


def direct_calls() -> int:
    return get_counters().direct_calls


def check(model, eager, assert_close_rel, *args, direct: bool | None = None, **kwargs) -> None:
    """One call of ``model`` against ``eager``; ``direct``: whether it must (or must not) take
    the direct path (one more direct call, made from C++)."""
    before, native = direct_calls(), _C.direct_entry_calls()
    with torch.no_grad():
        got = model(*args, **kwargs)
        want = eager(*args, **kwargs)
    assert_close_rel(got, want, RTOL)
    if direct is not None:
        assert (direct_calls() - before, _C.direct_entry_calls() - native) == (
            (1, 1) if direct else (0, 0)
        )


@pytest.fixture
def models():
    eager = Wrapped()
    return magi_compile(copy.deepcopy(eager)), eager


def test_the_frame_is_the_wrappers():
    frame, why = _call_frame.CallFrame.of(Wrapped.forward, method=True)
    assert frame is not None, why
    assert (frame.owner, frame.args, frame.kwargs) == ("self", "args", "kwargs")
    assert frame.to_bound("L['kwargs']['mask'].size()[0]") == "L['mask'].size()[0]"
    assert frame.to_bound("L['args'][0]") == "L['x']"
    assert frame.to_bound("L['kwargs']['extra']") == "L['kwargs']['extra']"  # **kwargs holds it
    assert frame.to_bound("L['self']._modules['proj']") == "L['self']._modules['proj']"
    assert frame.to_bound("len(L['args']) == 1") is None
    generic_frame, _ = _call_frame.CallFrame.of(GenericallyWrapped.forward, method=True)
    assert generic_frame.owner is None and generic_frame.to_bound("L['args'][1]") == "L['x']"
    assert generic_frame.to_bound("L['args'][0]._parameters") == "L['self']._parameters"


def test_keyword_calls_take_the_direct_path(models, assert_close_rel):
    model, eager = models
    for b in (2, 3):  # the capture, then the call that learns the direct path
        check(model, eager, assert_close_rel, x=inputs(b), direct=False)
    for b in (4, 2, 5, 3):
        check(model, eager, assert_close_rel, x=inputs(b), direct=True)
    assert get_counters().captures == 1


def test_positional_calls_take_the_direct_path(models, assert_close_rel):
    model, eager = models
    for b in (2, 3):
        check(model, eager, assert_close_rel, inputs(b), direct=False)
    for b in (4, 2, 5):
        check(model, eager, assert_close_rel, inputs(b), direct=True)
    # Mask given positionally: its own form, learned once, then direct.
    for b, direct in ((2, False), (3, False), (4, True), (5, True)):
        check(model, eager, assert_close_rel, inputs(b), torch.randn(b, 1, H), direct=direct)
    # The first form is still served directly.
    check(model, eager, assert_close_rel, inputs(6), direct=True)


def warm(model, eager, assert_close_rel) -> None:
    """Calls with x alone until the keyword path is learned and taken."""
    for b in (2, 3, 4):
        check(model, eager, assert_close_rel, x=inputs(b))
    check(model, eager, assert_close_rel, x=inputs(5), direct=True)


def test_another_form_or_keyword_set_is_never_a_wrong_hit(models, assert_close_rel):
    model, eager = models
    warm(model, eager, assert_close_rel)
    # The same values in another form: positional instead of keyword (Dynamo's guards on the
    # frame's args and kwargs decide; a new capture, not the keyword path's verdict).
    check(model, eager, assert_close_rel, inputs(5), direct=False)
    # Another keyword set, a tensor for the optional mask, then None for it.
    x, mask = inputs(3), torch.randn(3, 1, H)
    check(model, eager, assert_close_rel, x=x, mask=mask, direct=False)
    check(model, eager, assert_close_rel, x=x, mask=None, direct=False)
    # A keyword the inner forward takes through **kwargs, and one the wrapper consumes.
    check(model, eager, assert_close_rel, x=inputs(4), unused=1)
    check(model, eager, assert_close_rel, x=inputs(4), return_dict=True)
    # Each form is served directly once learned, the first one still.
    for _ in range(2):
        check(model, eager, assert_close_rel, x=inputs(4), mask=torch.randn(4, 1, H))
    check(model, eager, assert_close_rel, x=inputs(4), mask=torch.randn(4, 1, H), direct=True)
    check(model, eager, assert_close_rel, x=inputs(2), direct=True)


def test_another_static_value_is_never_a_wrong_hit(models, assert_close_rel):
    model, eager = models
    warm(model, eager, assert_close_rel)
    check(model, eager, assert_close_rel, x=inputs(4), scale=2.0)
    check(model, eager, assert_close_rel, x=inputs(4), scale=3.0)
    check(model, eager, assert_close_rel, x=inputs(4), gelu=True, direct=False)
    for _ in range(2):
        check(model, eager, assert_close_rel, x=inputs(5), gelu=True)
    check(model, eager, assert_close_rel, x=inputs(5), gelu=True, direct=True)
    check(model, eager, assert_close_rel, x=inputs(5), gelu=False)
    check(model, eager, assert_close_rel, x=inputs(2), direct=True)


def test_a_call_python_rejects_is_not_taken(models, assert_close_rel):
    model, _ = models
    x = inputs(3)
    for _ in range(3):
        model(x=x)
    with pytest.raises(TypeError):
        model(x, x=x)  # given twice: the inner forward raises
    with pytest.raises(TypeError):
        model(x=x, self=None)  # the owner again, by keyword: the wrapper raises


def test_an_owner_passed_as_args0_takes_the_direct_path(assert_close_rel):
    eager = GenericallyWrapped()
    model = magi_compile(copy.deepcopy(eager))
    for b in (2, 3):
        check(model, eager, assert_close_rel, inputs(b), direct=False)
    for b in (4, 5):
        check(model, eager, assert_close_rel, inputs(b), direct=True)
    for b in (2, 3):
        check(model, eager, assert_close_rel, x=inputs(b), mask=torch.randn(b, 1, H))
    check(model, eager, assert_close_rel, x=inputs(4), mask=torch.randn(4, 1, H), direct=True)


def test_a_wrapped_function_takes_the_direct_path(assert_close_rel):
    weight = torch.randn(H, H)

    @generic
    def fn(x: torch.Tensor, w: torch.Tensor, shift: float = 0.5) -> torch.Tensor:
        return torch.tanh(x @ w + shift)

    compiled = magi_compile(fn)
    for b, direct in ((2, False), (3, False), (4, True), (5, True)):
        check(compiled, fn, assert_close_rel, inputs(b), w=weight, direct=direct)
    check(compiled, fn, assert_close_rel, inputs(4), weight, direct=False)  # another form


def test_direct_calls_in_python_bind_the_frame_too(assert_close_rel, tmp_path, monkeypatch):
    """With dumps on, a graph's run is wrapped and direct calls stay in Python (DirectPath's
    gatherer): they too build the wrapper's frame from the call, keyword or positional."""
    from magi_compiler import _dump

    monkeypatch.setenv(_dump.ENABLE_ENV, "1")
    monkeypatch.setenv(_dump.DIR_ENV, str(tmp_path))
    eager = Wrapped()
    model = magi_compile(copy.deepcopy(eager))
    for b in (2, 3):
        check(model, eager, assert_close_rel, x=inputs(b))
    (path,) = model._magi_compiled._direct.get(model).paths
    assert path.native is None
    for b in (4, 5):
        before = direct_calls()
        check(model, eager, assert_close_rel, x=inputs(b))
        assert direct_calls() == before + 1
    before = direct_calls()
    check(model, eager, assert_close_rel, inputs(4))  # positional: another frame, not this path
    check(model, eager, assert_close_rel, x=inputs(4), mask=torch.randn(4, 1, H))
    assert direct_calls() == before


class FixesItsRows(nn.Module):
    """Dim 0 of x (inferred dynamic) is fixed by the code: it must match the table's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(4, H))

    @passes_through
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.table


def test_a_dim_the_wrapped_code_fixes_leaves_the_signature():
    # Dynamo names the input L['kwargs']['x']; the entry still learns that dim 0 of x is
    # static (so the next call of another batch is a miss of our signature, not a capture
    # that Dynamo's guards reject afterwards).
    module = FixesItsRows()
    compiled = magi_compile(copy.deepcopy(module))
    x = torch.randn(4, H)
    torch.testing.assert_close(compiled(x=x), module(x=x), rtol=RTOL, atol=0)
    assert compiled._magi_compiled.static_dims == {("x", 0)}
