"""``CompileConfig``: MagiCompiler's fields and defaults, ``MAGI_COMPILE_*`` environment
spellings (nested, JSON, enums, bools, lists), precedence (config_patch > class attribute
``magi_compile_config`` > environment > default), errors naming the variable, the once-only
warning for fields not acted on yet, and how the process default is looked up.

Nothing here captures a graph: configs are read off the compiled entry that ``magi_compile``
builds at decoration time.
"""

from __future__ import annotations

import os
import sys
import warnings

import magi_compiler
import pytest
import torch
from magi_compiler import CompileConfig, magi_compile
from magi_compiler import config as config_module
from magi_compiler.config import (
    CompileMode,
    CudaGraphMode,
    OffloadConfig,
    OffloadPolicy,
    PassConfig,
    RecomputeConfig,
    RecomputePolicy,
)
from torch import nn


@pytest.fixture(autouse=True)
def clean_config(monkeypatch):
    """No MAGI_COMPILE_* variable from outside, a default re-read from the environment on
    next use, and a fresh once-only warning set."""
    for var in list(os.environ):
        if var.startswith("MAGI_COMPILE_"):
            monkeypatch.delenv(var)
    monkeypatch.setattr(config_module, "_warned", set())
    config_module.set_compile_config(None)
    yield
    config_module.set_compile_config(None)


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def compiled_config(obj=None, **kwargs) -> CompileConfig:
    """The config magi_compile resolves for ``obj`` (default: a fresh ``Model``)."""
    obj = Model() if obj is None else obj
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = magi_compile(obj, **kwargs)
    if isinstance(compiled, nn.Module):
        return vars(compiled)["_magi_compiled"].config
    return compiled._magi_compiled.config


def env_config(monkeypatch, **variables) -> CompileConfig:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    config_module.set_compile_config(None)
    return config_module.get_compile_config()


# --------------------------------------------------------------------------------------------
# Fields and defaults
# --------------------------------------------------------------------------------------------


def test_magicompiler_fields_and_defaults():
    cfg = CompileConfig()
    assert cfg.backend == "magi"  # MagiCompiler: "inductor" (we never run Inductor)
    assert cfg.compile_mode is CompileMode.MAGI_COMPILE
    assert cfg.cache_root_dir == os.path.expanduser("~/.cache/magi_compiler")
    assert cfg.aot is False and cfg.disable_cache is False
    assert cfg.offload_config == OffloadConfig(
        model_cpu_offload=False,
        gpu_resident_weight_ratio=0.3,
        offload_policy=OffloadPolicy.COST_EFFECTIVE,
        bandwidth_safety_factor=0.9,
    )
    assert cfg.compile_sizes == [] and cfg.splitting_ops == []
    assert cfg.pass_config == PassConfig(disabled_passes=[])
    assert cfg.recompute_config == RecomputeConfig(
        recompute_policy=RecomputePolicy.HEURISTIC,
        custom_compute_sensitive_ops=[],
        memory_budget=0.5,
    )
    assert cfg.cudagraph_mode is CudaGraphMode.NONE
    # ours
    assert cfg.dynamic_dim_default == 0 and cfg.strict is False and cfg.max_recaptures == 8


def test_enum_members():
    assert [m.name for m in CompileMode] == ["NONE", "TORCH_COMPILE", "MAGI_COMPILE"]
    assert [m.name for m in CudaGraphMode] == ["NONE", "PIECEWISE", "FULL"]
    assert [m.name for m in OffloadPolicy] == ["BASE", "COST_EFFECTIVE", "HEURISTIC"]
    assert [m.name for m in RecomputePolicy] == ["HEURISTIC", "HANDCRAFT", "AUTOSEARCH"]


def test_defaults_are_not_shared_between_instances():
    a, b = CompileConfig(), CompileConfig()
    a.compile_sizes.append(8)
    a.offload_config.model_cpu_offload = True
    assert b.compile_sizes == [] and b.offload_config.model_cpu_offload is False


def test_top_level_exports():
    assert magi_compiler.CompileConfig is CompileConfig
    assert magi_compiler.get_compile_config is config_module.get_compile_config


# --------------------------------------------------------------------------------------------
# Environment spellings
# --------------------------------------------------------------------------------------------


def test_env_scalars(monkeypatch):
    cfg = env_config(
        monkeypatch,
        MAGI_COMPILE_BACKEND="eager",
        MAGI_COMPILE_CACHE_ROOT_DIR="/tmp/magi-cache",
        MAGI_COMPILE_MAX_RECAPTURES="3",
        MAGI_COMPILE_DYNAMIC_DIM_DEFAULT="none",
    )
    assert cfg.backend == "eager" and cfg.cache_root_dir == "/tmp/magi-cache"
    assert cfg.max_recaptures == 3 and cfg.dynamic_dim_default is None
    assert env_config(monkeypatch, MAGI_COMPILE_DYNAMIC_DIM_DEFAULT="1").dynamic_dim_default == 1


@pytest.mark.parametrize(
    "text, value",
    [("1", True), ("0", False), ("true", True), ("false", False), ("TRUE", True), ("False", False)],
)
def test_env_bools(monkeypatch, text, value):
    cfg = env_config(monkeypatch, MAGI_COMPILE_AOT=text, MAGI_COMPILE_STRICT=text)
    assert cfg.aot is value and cfg.strict is value


@pytest.mark.parametrize("text", ["NONE", "none", "None", " none "])
def test_env_enums_by_name_case_insensitive(monkeypatch, text):
    assert env_config(monkeypatch, MAGI_COMPILE_COMPILE_MODE=text).compile_mode is CompileMode.NONE


def test_env_enums_of_every_kind(monkeypatch):
    cfg = env_config(
        monkeypatch,
        MAGI_COMPILE_COMPILE_MODE="torch_compile",
        MAGI_COMPILE_CUDAGRAPH_MODE="Piecewise",
        MAGI_COMPILE_OFFLOAD_CONFIG__OFFLOAD_POLICY="base",
        MAGI_COMPILE_RECOMPUTE_CONFIG__RECOMPUTE_POLICY="autosearch",
    )
    assert cfg.compile_mode is CompileMode.TORCH_COMPILE
    assert cfg.cudagraph_mode is CudaGraphMode.PIECEWISE
    assert cfg.offload_config.offload_policy is OffloadPolicy.BASE
    assert cfg.recompute_config.recompute_policy is RecomputePolicy.AUTOSEARCH


@pytest.mark.parametrize("text", ["1,2,4", "[1, 2, 4]", " 1 , 2 , 4 "])
def test_env_int_lists(monkeypatch, text):
    assert env_config(monkeypatch, MAGI_COMPILE_COMPILE_SIZES=text).compile_sizes == [1, 2, 4]


@pytest.mark.parametrize(
    "text", ["athena::flash_attn,athena::rms", '["athena::flash_attn", "athena::rms"]']
)
def test_env_str_lists(monkeypatch, text):
    cfg = env_config(monkeypatch, MAGI_COMPILE_SPLITTING_OPS=text)
    assert cfg.splitting_ops == ["athena::flash_attn", "athena::rms"]


def test_env_nested_field(monkeypatch):
    cfg = env_config(
        monkeypatch,
        MAGI_COMPILE_OFFLOAD_CONFIG__MODEL_CPU_OFFLOAD="1",
        MAGI_COMPILE_OFFLOAD_CONFIG__OFFLOAD_POLICY="heuristic",
        MAGI_COMPILE_RECOMPUTE_CONFIG__MEMORY_BUDGET="0.25",
        MAGI_COMPILE_PASS_CONFIG__DISABLED_PASSES="eliminate_dead_code",
    )
    assert cfg.offload_config.model_cpu_offload is True
    assert cfg.offload_config.offload_policy is OffloadPolicy.HEURISTIC
    assert cfg.offload_config.gpu_resident_weight_ratio == 0.3  # untouched fields keep defaults
    assert cfg.recompute_config.memory_budget == 0.25
    assert cfg.pass_config.disabled_passes == ["eliminate_dead_code"]


def test_env_nested_json(monkeypatch):
    cfg = env_config(
        monkeypatch,
        MAGI_COMPILE_OFFLOAD_CONFIG='{"model_cpu_offload": true, "gpu_resident_weight_ratio": 0.5}',
        MAGI_COMPILE_RECOMPUTE_CONFIG=(
            '{"recompute_policy": "handcraft", "custom_compute_sensitive_ops": ["athena::mm"]}'
        ),
    )
    assert cfg.offload_config.model_cpu_offload is True
    assert cfg.offload_config.gpu_resident_weight_ratio == 0.5
    assert cfg.offload_config.offload_policy is OffloadPolicy.COST_EFFECTIVE
    assert cfg.recompute_config.recompute_policy is RecomputePolicy.HANDCRAFT
    assert cfg.recompute_config.custom_compute_sensitive_ops == ["athena::mm"]


def test_env_nested_field_wins_over_json(monkeypatch):
    cfg = env_config(
        monkeypatch,
        MAGI_COMPILE_OFFLOAD_CONFIG='{"model_cpu_offload": true, "bandwidth_safety_factor": 0.5}',
        MAGI_COMPILE_OFFLOAD_CONFIG__MODEL_CPU_OFFLOAD="0",
    )
    assert cfg.offload_config.model_cpu_offload is False
    assert cfg.offload_config.bandwidth_safety_factor == 0.5


def test_env_is_read_once_until_reset(monkeypatch):
    assert config_module.get_compile_config().max_recaptures == 8
    monkeypatch.setenv("MAGI_COMPILE_MAX_RECAPTURES", "5")
    assert config_module.get_compile_config().max_recaptures == 8  # cached
    config_module.set_compile_config(None)
    assert config_module.get_compile_config().max_recaptures == 5


def test_sys_argv_is_never_parsed(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "--backend", "eager", "--aot", "--strict"])
    cfg = config_module.get_compile_config()
    assert cfg.backend == "magi" and cfg.aot is False and cfg.strict is False


# --------------------------------------------------------------------------------------------
# Invalid values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "var, value, words",
    [
        ("MAGI_COMPILE_AOT", "maybe", ["is not a boolean", "1/0, true/false"]),
        ("MAGI_COMPILE_COMPILE_MODE", "fast", ["is not one of NONE, TORCH_COMPILE, MAGI_COMPILE"]),
        ("MAGI_COMPILE_CUDAGRAPH_MODE", "half", ["is not one of NONE, PIECEWISE, FULL"]),
        ("MAGI_COMPILE_MAX_RECAPTURES", "2.5", ["is not a int"]),
        ("MAGI_COMPILE_DYNAMIC_DIM_DEFAULT", "batch", ["is not an int or None"]),
        ("MAGI_COMPILE_COMPILE_SIZES", "1,two", ["list element 'two' is not an int"]),
        ("MAGI_COMPILE_COMPILE_SIZES", "[1,", ["is not valid JSON"]),
        ("MAGI_COMPILE_OFFLOAD_CONFIG__GPU_RESIDENT_WEIGHT_RATIO", "most", ["is not a float"]),
        ("MAGI_COMPILE_OFFLOAD_CONFIG__OFFLOAD_POLICY", "cheap", ["BASE, COST_EFFECTIVE"]),
        (
            "MAGI_COMPILE_OFFLOAD_CONFIG",
            "{not json",
            ["expected a JSON object for 'offload_config'"],
        ),
        (
            "MAGI_COMPILE_OFFLOAD_CONFIG",
            "[1]",
            ["'offload_config' expects a OffloadConfig or a dict"],
        ),
        ("MAGI_COMPILE_OFFLOAD_CONFIG", '{"cpu": 1}', ["OffloadConfig has no field 'cpu'"]),
        ("MAGI_COMPILE_AOT__ON", "1", ["'aot' has no nested fields"]),
    ],
)
def test_invalid_env_values_name_the_variable(monkeypatch, var, value, words):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as info:
        config_module.get_compile_config()
    message = str(info.value)
    assert var in message, message
    for w in words:
        assert w in message, message


def test_unknown_env_field_lists_the_fields(monkeypatch):
    monkeypatch.setenv("MAGI_COMPILE_CUDA_GRAPHS", "1")
    with pytest.raises(ValueError) as info:
        config_module.get_compile_config()
    message = str(info.value)
    assert "MAGI_COMPILE_CUDA_GRAPHS: CompileConfig has no field 'cuda_graphs'" in message
    assert "cudagraph_mode" in message  # the list of fields shows the right spelling


def test_invalid_env_value_fails_at_decoration(monkeypatch):
    monkeypatch.setenv("MAGI_COMPILE_STRICT", "sometimes")
    with pytest.raises(ValueError, match="MAGI_COMPILE_STRICT='sometimes' is not a boolean"):
        magi_compile(Model())


def test_unknown_and_invalid_config_patch_keys():
    with pytest.raises(
        ValueError, match=r"config_patch\['cuda_graph'\]: CompileConfig has no field"
    ):
        compiled_config(config_patch={"cuda_graph": "FULL"})
    with pytest.raises(ValueError, match=r"config_patch\['offload_config'\]: OffloadConfig has no"):
        compiled_config(config_patch={"offload_config": {"ratio": 1}})
    with pytest.raises(ValueError, match=r"config_patch\['strict'\]='yes please' is not a boolean"):
        compiled_config(config_patch={"strict": "yes please"})


# --------------------------------------------------------------------------------------------
# config_patch spellings and precedence
# --------------------------------------------------------------------------------------------


def test_config_patch_spellings():
    cfg = compiled_config(
        config_patch={
            "cudagraph_mode": "piecewise",
            "offload_config": {"model_cpu_offload": True},
            "recompute_config__memory_budget": 0.75,
            "pass_config": PassConfig(disabled_passes=["eliminate_dead_code"]),
            "strict": "1",
        }
    )
    assert cfg.cudagraph_mode is CudaGraphMode.PIECEWISE
    assert cfg.offload_config.model_cpu_offload is True
    assert cfg.recompute_config.memory_budget == 0.75
    assert cfg.pass_config.disabled_passes == ["eliminate_dead_code"]
    assert cfg.strict is True


def test_precedence(monkeypatch):
    class Configured(Model):
        magi_compile_config = {"max_recaptures": 4, "strict": True}

    assert compiled_config().max_recaptures == 8  # default
    monkeypatch.setenv("MAGI_COMPILE_MAX_RECAPTURES", "3")
    monkeypatch.setenv("MAGI_COMPILE_OFFLOAD_CONFIG__BANDWIDTH_SAFETY_FACTOR", "0.7")
    config_module.set_compile_config(None)
    assert compiled_config().max_recaptures == 3  # environment > default
    cfg = compiled_config(Configured())
    assert cfg.max_recaptures == 4 and cfg.strict is True  # class attribute > environment
    assert cfg.offload_config.bandwidth_safety_factor == 0.7  # other fields keep the env's
    cfg = compiled_config(Configured(), config_patch={"max_recaptures": 5})
    assert cfg.max_recaptures == 5 and cfg.strict is True  # config_patch > class attribute
    cfg = compiled_config(Model(), config_patch={"max_recaptures": 6})
    assert cfg.max_recaptures == 6  # config_patch > environment


def test_class_attribute_applies_to_every_target_kind():
    class Configured(Model):
        magi_compile_config = {"max_recaptures": 4}

    assert compiled_config(Configured()).max_recaptures == 4
    assert compiled_config(Configured().forward).max_recaptures == 4
    cls = magi_compile(type("Sub", (Configured,), {}))
    assert vars(cls())["_magi_compiled"].config.max_recaptures == 4


def test_patches_do_not_leak_into_the_default_or_other_modules():
    compiled_config(config_patch={"strict": True, "offload_config": {"model_cpu_offload": True}})
    default = config_module.get_compile_config()
    assert default.strict is False and default.offload_config.model_cpu_offload is False
    assert compiled_config().strict is False


# --------------------------------------------------------------------------------------------
# The process default is looked up at decoration time
# --------------------------------------------------------------------------------------------


def test_set_compile_config_is_used_at_decoration_time():
    config_module.set_compile_config(CompileConfig(max_recaptures=2, strict=True))
    cfg = compiled_config()
    assert cfg.max_recaptures == 2 and cfg.strict is True


def test_get_compile_config_is_looked_up_through_the_module(monkeypatch):
    replacement = CompileConfig(max_recaptures=11)
    monkeypatch.setattr(config_module, "get_compile_config", lambda: replacement)
    assert compiled_config().max_recaptures == 11


def test_mutating_the_default_affects_later_decorations_only():
    before = compiled_config()
    config_module.get_compile_config().max_recaptures = 9
    assert compiled_config().max_recaptures == 9
    assert before.max_recaptures == 8  # resolved configs are copies


# --------------------------------------------------------------------------------------------
# Fields not acted on yet
# --------------------------------------------------------------------------------------------


# A non-default value for every field that may be on the not-yet-acted-on list.
NON_DEFAULT = {
    "backend": "eager",
    "cache_root_dir": "/tmp/magi-cache",
    "aot": True,
    "disable_cache": True,
    "offload_config": {"model_cpu_offload": True},
    "compile_sizes": [8, 16],
    "splitting_ops": ["athena::flash_attn"],
    "pass_config": {"disabled_passes": ["eliminate_dead_code"]},
    "recompute_config": {"recompute_policy": "AUTOSEARCH"},
    "cudagraph_mode": "FULL",
}


@pytest.mark.parametrize("field", ["aot", "compile_sizes"])
def test_fields_not_acted_on_warn_once(field, monkeypatch):
    # Every field is acted on today; the warning is for a field added before its feature.
    monkeypatch.setattr(config_module, "NOT_YET_ACTED_ON", {field})
    patch = {field: NON_DEFAULT[field]}
    with pytest.warns(UserWarning, match=f"CompileConfig.{field} is accepted but not acted on"):
        magi_compile(Model(), config_patch=patch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        magi_compile(Model(), config_patch=patch)  # once per process


def test_fields_acted_on_do_not_warn(monkeypatch):
    monkeypatch.setenv("MAGI_COMPILE_BACKEND", "eager")
    config_module.set_compile_config(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        magi_compile(
            Model(),
            config_patch={"strict": True, "max_recaptures": 2, "dynamic_dim_default": None},
        )
        magi_compile(Model(), config_patch={"pass_config": {"disabled_passes": ["x"]}})


def test_env_set_field_not_acted_on_warns_at_first_decoration(monkeypatch):
    monkeypatch.setattr(config_module, "NOT_YET_ACTED_ON", {"aot"})
    monkeypatch.setenv("MAGI_COMPILE_AOT", "1")
    config_module.set_compile_config(None)
    with pytest.warns(UserWarning, match="CompileConfig.aot is accepted but not acted on"):
        magi_compile(Model())


# --------------------------------------------------------------------------------------------
# Other environment variables
# --------------------------------------------------------------------------------------------


def test_invalid_logging_level_names_the_variable(monkeypatch):
    from magi_compiler import _logging

    monkeypatch.setenv("MAGI_LOGGING_LEVEL", "chatty")
    with pytest.raises(ValueError, match="MAGI_LOGGING_LEVEL: log level 'chatty' is not one of"):
        _logging.init_from_env()


def test_disable_passes_from_env(monkeypatch, counters):
    monkeypatch.setenv("MAGI_DISABLE_PASSES", "eliminate_dead_code")
    compiled = magi_compile(Model())
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), x * 2)
    assert counters().compiles == 1
