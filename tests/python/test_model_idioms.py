"""What real models do that our own blocks did not: register buffers or submodules inside
``forward``, take keyword arguments with defaults, tuples (``position_embeddings=(cos, sin)``)
and ``**kwargs``, return Hugging Face style output dataclasses. Each must capture as one graph
and, for inference, reach the C++ direct path. And importing magi_compiler must leave code
that never uses it exactly as it was: no global module hooks of ours.

Numerics compare against eager PyTorch on the same weights, fresh random float32 inputs.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from _api_helpers import RTOL, H, inputs
from magi_compiler import _C, get_counters, magi_compile
from torch import nn

pytestmark = pytest.mark.usefixtures("counters")  # fresh Dynamo caches, zeroed counters


def native_calls() -> int:
    """Calls that went from a compiled method's wrapper straight into C++ (_C.DirectEntry)."""
    return _C.direct_entry_calls()


# --------------------------------------------------------------------------------------------
# Importing us changes nothing for others
# --------------------------------------------------------------------------------------------


def test_no_global_module_hooks_of_ours():
    from torch.nn.modules import module as m

    tables = [
        m._global_module_registration_hooks,
        m._global_parameter_registration_hooks,
        m._global_buffer_registration_hooks,
        m._global_forward_pre_hooks,
        m._global_forward_hooks,
        m._global_backward_hooks,
        m._global_backward_pre_hooks,
    ]
    ours = [
        hook
        for table in tables
        for hook in table.values()
        if getattr(hook, "__module__", "").startswith("magi_compiler")
    ]
    assert ours == []


def test_dynamos_minifier_is_imported_only_when_configured(monkeypatch):
    """Our compile keeps Dynamo from importing its minifier's module (and AOTAutograd with it)
    while no minifier is configured: the backend gets a stand-in wrapper that calls it, and
    sys.modules is left as it was. A minifier configured by the time a graph arrives is used."""
    import importlib
    import sys

    import torch._dynamo.repro.after_dynamo as real
    from magi_compiler import _backend

    name = "torch._dynamo.repro.after_dynamo"
    seen = []

    def backend(gm, example_inputs):
        seen.append(len(example_inputs))
        return gm

    monkeypatch.delitem(sys.modules, name)  # as in a process that never loaded it
    load = importlib.import_module
    with _backend.without_minifier_import():
        from torch._dynamo.repro.after_dynamo import wrap_backend_debug

        wrapper = wrap_backend_debug(backend, None)
        # Anything else read from the module meanwhile comes from the real one, loaded then
        # (faked here: executing the real module twice would register its backend twice).
        with monkeypatch.context() as m:
            m.setattr(importlib, "import_module", lambda n: real if n == name else load(n))
            from torch._dynamo.repro.after_dynamo import WrapBackendDebug
    assert WrapBackendDebug is real.WrapBackendDebug
    assert name not in sys.modules
    assert wrapper._torchdynamo_orig_backend is backend
    gm = torch.fx.symbolic_trace(nn.Tanh())
    assert wrapper(gm, [torch.zeros(2)]) is gm and seen == [1]

    monkeypatch.setitem(sys.modules, name, real)
    minified = []
    monkeypatch.setattr(real, "wrap_backend_debug", lambda fn, _: minified.append(fn) or fn)
    with torch._dynamo.config.patch(repro_after="dynamo"):
        assert wrapper(gm, [torch.zeros(2), torch.zeros(2)]) is gm
    assert minified == [backend] and seen == [1, 2]


class AssignsInForward(nn.Module):
    """Assigns a submodule and registers a buffer inside forward, as some models do lazily."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.act = nn.SiLU()
        self.register_buffer("scale", torch.full((H,), 0.5), persistent=False)
        return self.act(self.fc(x)) * self.scale


def test_torch_compile_of_a_module_assigning_in_forward_is_untouched():
    # Before, our global registration hooks were traced by Dynamo and broke this graph for
    # code that never called magi_compile.
    model = AssignsInForward()
    x = inputs(3)
    expected = copy.deepcopy(model)(x)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), expected)


def test_magi_compile_of_a_module_assigning_in_forward_captures_once(assert_close_rel):
    eager = AssignsInForward()
    model = magi_compile(copy.deepcopy(eager))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # an eager fallback warns: fail on it
        for b in (1, 2, 3, 5):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
    assert model._magi_compiled.fallback_reason is None
    assert get_counters().captures == 2  # batch 1, then dim 0 dynamic


# --------------------------------------------------------------------------------------------
# A submodule replaced after the direct path was learned
# --------------------------------------------------------------------------------------------


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(H, H) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


@pytest.mark.parametrize("how", ["setattr", "item", "dict"])
def test_a_replaced_submodule_is_computed_with(how, assert_close_rel):
    eager = TwoLayers()
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (2, 3, 4, 5):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
        assert native_calls() >= 1
        other = nn.Linear(H, H)
        for target, layer in ((model, other), (eager, copy.deepcopy(other))):
            if how == "setattr":
                target.layers = nn.ModuleList([target.layers[0], layer])
            elif how == "item":
                target.layers[1] = layer
            else:
                target.layers._modules["1"] = layer  # no hook of any kind runs
        before = native_calls()
        for b in (4, 4, 6, 4):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
        assert native_calls() > before  # learned again, and direct again


# --------------------------------------------------------------------------------------------
# Keyword calls, defaults, tuples, **kwargs and output dataclasses reach the C++ path
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Output(OrderedDict):
    """Shaped like Hugging Face's ModelOutput: a dataclass that is also an ordered dict, whose
    unset (None) fields are left out."""

    last_hidden_state: torch.Tensor | None = None
    aux: torch.Tensor | None = None
    attentions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


class HFStyleLayer(nn.Module):
    """A decoder-layer-like forward: keyword arguments with defaults, a (cos, sin) tuple, an
    optional mask, **kwargs, a dataclass result."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(H, H)
        self.norm = nn.LayerNorm(H)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        use_cache: bool = False,
        **kwargs,
    ) -> Output:
        h = self.proj(self.norm(hidden_states))
        if position_embeddings is not None:
            cos, sin = position_embeddings
            h = h * cos + h.flip(-1) * sin
        if attention_mask is not None:
            h = h + attention_mask
        return Output(last_hidden_state=hidden_states + F.gelu(h), aux=h.mean(-1))


def _check_output(got: Output, want: Output, assert_close_rel) -> None:
    assert type(got) is Output and list(got.keys()) == list(want.keys())
    for key in want:
        assert_close_rel(got[key], want[key], RTOL)


def test_keyword_calls_with_tuples_and_defaults_go_direct(assert_close_rel):
    eager = HFStyleLayer()
    model = magi_compile(copy.deepcopy(eager))

    with torch.no_grad():
        for b in (1, 2, 3, 4, 5, 6):
            x = inputs(b)
            # As Hugging Face's rotary embedding builds them: batch 1, broadcast over x's.
            rope = (torch.randn(1, x.shape[1], H), torch.randn(1, x.shape[1], H))
            got = model(hidden_states=x, position_embeddings=rope, use_cache=False)
            _check_output(got, eager(hidden_states=x, position_embeddings=rope), assert_close_rel)
        # Batch 1 and 2 captured, 3 learned the direct path, 4-6 ran it from C++.
        assert native_calls() == 3
        assert get_counters().captures == 2

        # The same signature with the argument given positionally, or the default left out.
        x = inputs(4)
        rope = (torch.randn(1, x.shape[1], H), torch.randn(1, x.shape[1], H))
        _check_output(model(x, None, rope), eager(x, None, rope), assert_close_rel)
        _check_output(model(x, position_embeddings=rope), eager(x, None, rope), assert_close_rel)
        assert native_calls() == 5
        # An unknown keyword lands in **kwargs: Dynamo's guards on it decide (a new capture).
        _check_output(
            model(x, position_embeddings=rope, output_attentions=False),
            eager(x, position_embeddings=rope),
            assert_close_rel,
        )
    assert model._magi_compiled.fallback_reason is None


def test_a_keyword_call_with_a_mask_is_its_own_signature(assert_close_rel):
    eager = HFStyleLayer()
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (2, 3, 4, 2, 3):
            x = inputs(b)
            mask = torch.randn(b, 1, H)
            assert_close_rel(
                model(x, attention_mask=mask).last_hidden_state,
                eager(x, attention_mask=mask).last_hidden_state,
                RTOL,
            )
            assert_close_rel(model(x).aux, eager(x).aux, RTOL)
    assert native_calls() >= 4


class _Collector:
    """Like transformers' output collector: set on entry to forward, reset in a finally."""

    active = None


COLLECTOR = _Collector()


class SetsAndResets(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        COLLECTOR.active = "collecting"
        try:
            return torch.relu(self.fc(x))
        finally:
            COLLECTOR.active = None


class LeavesAMark(SetsAndResets):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        COLLECTOR.active = "left"
        return torch.relu(self.fc(x))


def test_an_attribute_set_and_reset_in_forward_is_no_side_effect(assert_close_rel):
    eager = SetsAndResets()
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (2, 3, 4, 5):
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
    assert native_calls() == 2 and COLLECTOR.active is None


def test_an_attribute_left_changed_keeps_the_ordinary_path(assert_close_rel):
    eager = LeavesAMark()
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (2, 3, 4, 5):
            COLLECTOR.active = None
            x = inputs(b)
            assert_close_rel(model(x), eager(x), RTOL)
            assert COLLECTOR.active == "left"  # Dynamo replays the write on every call
    assert native_calls() == 0
    COLLECTOR.active = None


def test_a_replaced_layer_frees_its_weights_at_the_first_collection(counters):
    """Instances of a compiled layer class each learn a direct path whose gatherer reads their
    parameter dicts. A layer replaced by a new one (a model surgery, a reload) frees its
    weights as soon as the collector frees the module, not one collection later (a CUDA
    graph keyed by those weights is erased only once they are gone)."""
    import gc
    import weakref

    from blocks import LlamaBlock

    compiled_class = magi_compile(type("Layer", (LlamaBlock,), {}))
    shape = dict(hidden=H, n_heads=2, n_kv_heads=1, intermediate=2 * H)
    layers = [compiled_class(**shape).eval() for _ in range(3)]

    def run():
        with torch.no_grad():
            x = inputs(2)
            for layer in layers:
                x = layer(x)

    for _ in range(3):
        run()
    assert get_counters().direct_calls > 0
    module = weakref.ref(layers[1])
    weight = weakref.ref(layers[1].q_proj.weight)
    layers[1] = compiled_class(**shape).eval()
    gc.collect()
    assert module() is None
    assert weight() is None
    run()


def test_cuda_graph_keys_are_the_parameters_and_buffers_dynamo_read(lowered):
    """CUDA graphs key a model's weights by identity (runtime/cuda_graph.h); which graph inputs
    those are comes from Dynamo's source names. On this torch, the inputs marked are exactly
    the parameters and buffers of the module, and no argument or size."""
    from magi_compiler import _backend

    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(H, H)
            self.register_buffer("scale", torch.ones(H))

        def forward(self, x):
            return self.fc(x) * self.scale

    model = magi_compile(WithBuffer())
    with torch.no_grad():
        model(inputs(2))
        model(inputs(3))
    run = next(r for r in lowered if r.magi_sources is not None)
    keyed = _backend.keyed_inputs({"sources": run.magi_sources})
    assert len(keyed) == run.magi_executable.num_inputs
    assert sum(keyed) == 3  # fc.weight, fc.bias, scale
    assert not any(k for k, s in zip(keyed, run.magi_sources, strict=True) if "L['x']" in s)
