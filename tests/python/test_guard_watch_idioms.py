"""What the guard trees of whole Hugging Face models read, as a direct call watches it
(_guard_watch.py): each test builds a small module with one idiom of transformers' forwards,
checks that the direct call reuses Dynamo's verdict (``guard_reuse == "watched"``), then
changes what the guards read in a way no argument shows and checks that the next calls give
eager's result.

Idioms: a config whose class has its own ``__getattribute__`` and properties (read as
``object.__getattribute__``, a base's ``__getattribute__`` through ``type(x).__mro__``), the
same config reached through two modules (an identity guard between the two), a registry read
through its class (``type(x).__dict__``), a helper's keyword-only defaults, a decorator's
closure, and an empty ``**kwargs``. (A ``__class__`` read, which Llama's tree has, is covered
by tests/python/test_zoo.py.)

Numerics compare against eager PyTorch on the same weights, fresh random float32 inputs.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from _api_helpers import RTOL, H, inputs
from magi_compiler import magi_compile
from torch import nn

pytestmark = pytest.mark.usefixtures("counters")  # fresh Dynamo caches, zeroed counters


def compiled(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    eager = copy.deepcopy(model)
    return magi_compile(model), eager


def native_of(model: nn.Module):
    (path,) = model._magi_compiled._direct.get(model).paths
    assert path.native is not None
    return path.native


def calls(model, eager, assert_close_rel, n: int = 1, **kwargs) -> None:
    for _ in range(n):
        x = inputs(4)
        with torch.no_grad():
            assert_close_rel(model(x, **kwargs), eager(x, **kwargs), RTOL)


def watched(model, eager, assert_close_rel, **kwargs):
    """Captures (batch 2), learns (3), then checks the verdict is reused; the direct call."""
    with torch.no_grad():
        for b in (2, 3):
            x = inputs(b)
            assert_close_rel(model(x, **kwargs), eager(x, **kwargs), RTOL)
    calls(model, eager, assert_close_rel, **kwargs)
    native = native_of(model)
    assert native.guard_reuse == "watched"
    checks = native.num_guard_checks
    calls(model, eager, assert_close_rel, n=2, **kwargs)
    assert native.num_guard_checks == checks
    return native


# --- a config with its own __getattribute__ and properties, shared by two modules ------------
class Mixin:
    """A base with its own ``__getattribute__`` (transformers' heterogeneity mixin)."""

    def __getattribute__(self, key: str):
        return super().__getattribute__(key)


class Config(Mixin):
    """Like transformers' PreTrainedConfig: attribute_map aliases, a property; its
    ``super().__getattribute__`` is found through the subclass's ``__mro__``."""

    attribute_map = {"act_scale": "scale_"}

    def __init__(self) -> None:
        self.scale_ = 2.0
        self._gelu = False

    def __getattribute__(self, key: str):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    @property
    def gelu(self) -> bool:
        return self._gelu


class ModelConfig(Config):
    pass


class Inner(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return torch.nn.functional.gelu(h) if self.config.gelu else torch.tanh(h)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = ModelConfig()
        self.inner = Inner(self.config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.config.act_scale


def test_a_config_read_through_its_getattribute_is_watched(assert_close_rel):
    model, eager = compiled(Outer())
    watched(model, eager, assert_close_rel)
    # A value in the instance dict, through the alias.
    model.config.scale_ = eager.config.scale_ = 3.0
    calls(model, eager, assert_close_rel, n=2)
    # A value a property computes: read again on every call.
    model.config._gelu = eager.config._gelu = True
    calls(model, eager, assert_close_rel, n=2)


def test_a_base_class_method_found_through_the_mro_replaced_is_seen(assert_close_rel):
    model, eager = compiled(Outer())
    watched(model, eager, assert_close_rel)
    saved = Mixin.__getattribute__

    def doubled(self, key: str):
        value = saved(self, key)
        return value * 2 if key == "scale_" else value

    try:
        Mixin.__getattribute__ = doubled  # the subclass's version tag moves with it
        calls(model, eager, assert_close_rel, n=2)
    finally:
        Mixin.__getattribute__ = saved


def test_the_same_config_reached_twice_is_an_identity_watched(assert_close_rel):
    model, eager = compiled(Outer())
    watched(model, eager, assert_close_rel)
    other = ModelConfig()
    other.scale_ = 5.0
    model.inner.config = other  # the two modules no longer share it
    eager.inner.config = copy.deepcopy(other)
    calls(model, eager, assert_close_rel, n=2)
    model.inner.config._gelu = eager.inner.config._gelu = True
    calls(model, eager, assert_close_rel, n=2)


# --- a registry read through its class, a base's method through the MRO --------------------
class Interface:
    def get(self, key: str, default):
        return self[key] if key in self else default


class Registry(Interface):
    """Like transformers' AttentionInterface: a class-level mapping, an instance override."""

    _global_mapping = {"act": torch.tanh}

    def __init__(self) -> None:
        self._local_mapping: dict = {}

    def __contains__(self, key: str) -> bool:
        return key in self._global_mapping or key in self._local_mapping

    def __getitem__(self, key: str):
        if key in self._local_mapping:
            return self._local_mapping[key]
        return self._global_mapping[key]


REGISTRY = Registry()


class UsesRegistry(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return REGISTRY.get("act", torch.relu)(self.fc(x))


@pytest.fixture
def registry():
    saved = dict(Registry._global_mapping)
    yield
    Registry._global_mapping = saved
    REGISTRY._local_mapping.clear()


def test_a_class_attribute_read_through_the_type_is_watched(assert_close_rel, registry):
    model, eager = compiled(UsesRegistry())
    watched(model, eager, assert_close_rel)
    Registry._global_mapping["act"] = torch.sigmoid  # a write to the class-level dict
    calls(model, eager, assert_close_rel, n=2)
    Registry._global_mapping = {"act": torch.nn.functional.silu}  # the class modified
    calls(model, eager, assert_close_rel, n=2)
    REGISTRY._local_mapping["act"] = torch.tanh  # the instance's override
    calls(model, eager, assert_close_rel, n=2)


# --- a helper's keyword-only defaults -----------------------------------------------------
def scaled(x: torch.Tensor, *, scale: float = 2.0) -> torch.Tensor:
    return x * scale


class UsesHelper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled(self.fc(x))


def test_keyword_only_defaults_changed_are_seen(assert_close_rel):
    saved = scaled.__kwdefaults__
    try:
        model, eager = compiled(UsesHelper())
        watched(model, eager, assert_close_rel)
        scaled.__kwdefaults__["scale"] = 3.0  # a write to the defaults' dict
        calls(model, eager, assert_close_rel, n=2)
        scaled.__kwdefaults__ = {"scale": 4.0}  # a new dict
        calls(model, eager, assert_close_rel, n=2)
    finally:
        scaled.__kwdefaults__ = saved


# --- a forward under two decorators ------------------------------------------------------
def forwarding(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(H, H) for _ in range(3)])

    @forwarding
    @forwarding
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:2]:
            x = torch.tanh(layer(x))
        return x


def test_a_decorators_closure_is_watched(assert_close_rel):
    model, eager = compiled(Decorated())
    watched(model, eager, assert_close_rel)
    # The inner decorator's closure now holds another forward.
    inner = type(model).forward.__closure__[0].cell_contents
    saved = inner.__closure__[0].cell_contents
    try:
        inner.__closure__[0].cell_contents = lambda self, x: torch.sigmoid(self.layers[2](x))
        calls(model, eager, assert_close_rel, n=2)
    finally:
        inner.__closure__[0].cell_contents = saved


# --- an empty **kwargs -------------------------------------------------------------------
class TakesKeywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        h = self.fc(x)
        return h * 2 if kwargs.get("double") else h


def test_an_empty_kwargs_is_watched_and_a_keyword_in_it_is_seen(assert_close_rel):
    model, eager = compiled(TakesKeywords())
    native = watched(model, eager, assert_close_rel)
    checks = native.num_guard_checks
    calls(model, eager, assert_close_rel, n=2, double=True)
    calls(model, eager, assert_close_rel, n=2)
    assert native.num_guard_checks > checks


# --- a number Dynamo made symbolic: another instance of the class had another value --------
class Dropped(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.tanh(self.fc(x))) * (1 + self.drop.p)


def test_a_number_read_as_a_symbolic_float_is_watched(assert_close_rel):
    """The first instance captures with p = 0.0; the second, p = 0.1, shares the forward's
    code object, so Dynamo's automatic dynamic reads its p as a symbolic float and guards
    ``___as_tensor(L['self']._modules['drop'].p).item() == 0.1`` (as for a BERT compiled
    after a ViT in one process). The direct call watches the attribute; a new p is seen."""
    first, first_eager = compiled(Dropped(0.0).eval())
    with torch.no_grad():
        for b in (2, 3):
            x = inputs(b)
            assert_close_rel(first(x), first_eager(x), RTOL)
    model, eager = compiled(Dropped(0.1).eval())
    watched(model, eager, assert_close_rel)
    model.drop.p = eager.drop.p = 0.3
    calls(model, eager, assert_close_rel, n=3)
