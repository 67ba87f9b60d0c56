"""MagiCompiler's configs and code load unchanged: a callable ``config_patch``, callable classes
and instances that are not ``nn.Module``s, ``magi_compiler.api.get_compile_config`` patched the
way MagiCompiler's own tests patch it, and every MagiCompiler ``CompileConfig`` field (those
that configure Inductor are accepted with one warning saying what happens instead).

Numerics compare against eager PyTorch on fresh random float32 inputs.
"""

from __future__ import annotations

import copy
import warnings
from unittest import mock

import magi_compiler
import pytest
import torch
from _api_helpers import RTOL, H, inputs
from magi_compiler import CompileConfig, get_counters, magi_compile
from magi_compiler import config as config_module
from magi_compiler.config import CudaGraphMode

# test_config.py's autouse fixture: no MAGI_COMPILE_* variable from outside, a default re-read
# on next use, a fresh once-only warning set; and fresh Dynamo caches and counters.
from test_config import clean_config  # noqa: F401
from torch import nn

pytestmark = pytest.mark.usefixtures("counters")


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def config_of(compiled) -> CompileConfig:
    return vars(compiled)["_magi_compiled"].config


# --------------------------------------------------------------------------------------------
# config_patch as a callable
# --------------------------------------------------------------------------------------------


def test_callable_config_patch_gets_a_copy_and_its_result_is_used():
    seen = []

    def patch(cfg: CompileConfig) -> CompileConfig:
        seen.append(cfg)
        cfg.cudagraph_mode = CudaGraphMode.FULL
        cfg.max_recaptures = 3
        return cfg

    compiled = magi_compile(Model(), config_patch=patch)
    cfg = config_of(compiled)
    assert cfg.cudagraph_mode is CudaGraphMode.FULL and cfg.max_recaptures == 3
    assert seen[0] is not magi_compiler.get_compile_config()  # a copy
    assert magi_compiler.get_compile_config().max_recaptures == 8  # the default is untouched


def test_callable_config_patch_runs_after_the_class_attribute():
    class Tagged(Model):
        magi_compile_config = {"max_recaptures": 5}

    compiled = magi_compile(Tagged(), config_patch=lambda cfg: cfg)
    assert config_of(compiled).max_recaptures == 5


def test_callable_config_patch_must_return_a_config():
    with pytest.raises(ValueError, match="must return the CompileConfig to use.*returned NoneType"):
        magi_compile(Model(), config_patch=lambda cfg: None)


def test_callable_config_patch_result_is_validated():
    def bad(cfg):
        cfg.attention_backend = "fastest"
        return cfg

    with pytest.raises(magi_compiler.UserError, match="attention_backend='fastest' is not one of"):
        magi_compile(Model(), config_patch=bad)


# --------------------------------------------------------------------------------------------
# Callable classes and instances that are not modules
# --------------------------------------------------------------------------------------------


class Scorer:
    """A plain callable class holding its weight."""

    def __init__(self, scale: float) -> None:
        self.weight = torch.randn(H, H)
        self.scale = scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ self.weight * self.scale, dim=-1)


class Stepper:
    """A plain class with a forward, MagiCompiler's default target for non-modules."""

    def __init__(self) -> None:
        self.weight = torch.randn(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.weight)


def test_a_callable_class_is_compiled_through_its_call(assert_close_rel):
    Compiled = magi_compile(type("Scorer", (Scorer,), {}))
    scorer = Compiled(0.5)
    plain = copy.copy(scorer)
    plain.__class__ = Scorer
    for b in (1, 2, 3, 4):
        x = inputs(b)
        assert_close_rel(scorer(x), plain(x), RTOL)
    assert get_counters().captures == 2


def test_a_callable_instance_is_compiled_through_its_call(assert_close_rel):
    scorer = Scorer(2.0)
    plain = copy.copy(scorer)
    compiled = magi_compile(scorer)
    assert compiled is scorer and isinstance(scorer, Scorer)
    for b in (2, 3, 4):
        x = inputs(b)
        assert_close_rel(compiled(x), Scorer.__call__(plain, x), RTOL)
    assert get_counters().captures == 1
    other = Scorer(2.0)  # other instances of the class are untouched
    assert other(inputs(2)).shape == (2, *inputs(2).shape[1:-1], H)
    assert get_counters().captures == 1


def test_a_plain_class_with_forward_is_compiled_through_forward(assert_close_rel):
    Compiled = magi_compile(type("Stepper", (Stepper,), {}))
    stepper = Compiled()
    for b in (2, 3):
        x = inputs(b)
        assert_close_rel(stepper.forward(x), Stepper.forward(stepper, x), RTOL)
    assert get_counters().captures == 1


# --------------------------------------------------------------------------------------------
# get_compile_config patched as MagiCompiler's tests do
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["magi_compiler.api", "magi_compiler.config"])
def test_patched_get_compile_config_is_what_decoration_reads(where):
    replacement = CompileConfig(max_recaptures=13, cache_root_dir="/tmp/magi-test-cache")
    with mock.patch(f"{where}.get_compile_config") as get:
        get.return_value = replacement
        compiled = magi_compile(Model())
    assert get.called
    assert config_of(compiled).max_recaptures == 13
    assert config_of(compiled).cache_root_dir == "/tmp/magi-test-cache"


def test_api_get_compile_config_exists_and_returns_the_default():
    from magi_compiler import api

    assert api.get_compile_config() is config_module.get_compile_config()


# --------------------------------------------------------------------------------------------
# Every MagiCompiler field is accepted
# --------------------------------------------------------------------------------------------

# A MagiCompiler config as its users write it (its field names and value spellings).
MAGICOMPILER_FIELDS = {
    "backend": "inductor",
    "compile_mode": "MAGI_COMPILE",
    "cache_root_dir": "/tmp/magi-cache",
    "offload_config": {
        "model_cpu_offload": False,
        "gpu_resident_weight_ratio": 0.3,
        "offload_policy": "COST_EFFECTIVE",
        "bandwidth_safety_factor": 0.9,
    },
    "enable_inductor_max_autotune": True,
    "enable_inductor_coordinate_descent_tuning": True,
    "compile_sizes": [1, 2, 4],
    "splitting_ops": ["athena::flash_attn"],
    "post_grad_pass": "my_post_grad_pass",
    "custom_partitioner_fn": "my_partitioner",
    "pass_config": {"enable_sage_attn": True, "enable_mm_epilogue_fusion": True},
    "recompute_config": {
        "recompute_policy": "HEURISTIC",
        "custom_compute_sensitive_ops": [],
        "memory_budget": 0.5,
    },
    "cudagraph_mode": "NONE",
}


def test_every_magicompiler_field_is_accepted_as_a_patch_and_warns_once_each():
    with pytest.warns(UserWarning) as record:
        cfg = config_of(magi_compile(Model(), config_patch=MAGICOMPILER_FIELDS))
    messages = [str(w.message) for w in record]
    for name in config_module.MAGI_COMPAT_FIELDS:
        hits = [m for m in messages if f"CompileConfig.{name} is a MagiCompiler option" in m]
        assert len(hits) == 1, (name, messages)
        assert "no effect" in hits[0]
    assert cfg.pass_config.enable_sage_attn is True
    assert cfg.enable_inductor_max_autotune is True
    assert cfg.backend == "inductor"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        magi_compile(Model(), config_patch=MAGICOMPILER_FIELDS)  # once per process


def test_magicompiler_fields_from_the_environment(monkeypatch):
    monkeypatch.setenv("MAGI_COMPILE_BACKEND", "inductor")
    monkeypatch.setenv("MAGI_COMPILE_ENABLE_INDUCTOR_MAX_AUTOTUNE", "1")
    monkeypatch.setenv("MAGI_COMPILE_PASS_CONFIG__ENABLE_SAGE_ATTN", "true")
    config_module.set_compile_config(None)
    with pytest.warns(UserWarning, match="enable_inductor_max_autotune is a MagiCompiler option"):
        cfg = config_of(magi_compile(Model()))
    assert cfg.enable_inductor_max_autotune is True and cfg.pass_config.enable_sage_attn is True


def test_inductor_backend_runs_our_compiler(assert_close_rel):
    eager = Model()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"backend": "inductor"})
    with torch.no_grad():
        for b in (2, 3):
            x = inputs(b)
            assert_close_rel(compiled(x), eager(x), RTOL)
    assert get_counters().compiles >= 1  # our pipeline compiled it (Inductor would not count)


def test_an_unknown_backend_is_a_user_error():
    with pytest.raises(magi_compiler.UserError, match="backend='tvm' is not one of magi, inductor"):
        magi_compile(Model(), config_patch={"backend": "tvm"})
