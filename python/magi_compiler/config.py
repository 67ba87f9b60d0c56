"""Compile configuration: :class:`CompileConfig` and the process default.

Field names and defaults follow MagiCompiler's, so existing configs carry over. Every field can
be overridden from the environment as ``MAGI_COMPILE_<FIELD>`` (upper case); nested fields use a
double underscore (``MAGI_COMPILE_OFFLOAD_CONFIG__MODEL_CPU_OFFLOAD=1``) and a whole nested
config can be given as JSON (``MAGI_COMPILE_OFFLOAD_CONFIG='{"model_cpu_offload": true}'``).
Precedence: a decorator's ``config_patch`` > environment > defaults. ``sys.argv`` is never read.
See docs/config.md for every field.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class CompileMode(enum.Enum):
    NONE = "NONE"  # no compilation: the module runs eagerly
    TORCH_COMPILE = "TORCH_COMPILE"  # plain torch.compile (Inductor): the comparison baseline
    MAGI_COMPILE = "MAGI_COMPILE"  # capture with Dynamo/AOTAutograd, run on magi's C++ runtime


class CudaGraphMode(enum.Enum):
    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"


class OffloadPolicy(enum.Enum):
    BASE = "BASE"
    COST_EFFECTIVE = "COST_EFFECTIVE"
    HEURISTIC = "HEURISTIC"


class RecomputePolicy(enum.Enum):
    HEURISTIC = "HEURISTIC"
    HANDCRAFT = "HANDCRAFT"
    AUTOSEARCH = "AUTOSEARCH"


@dataclass
class OffloadConfig:
    model_cpu_offload: bool = False
    gpu_resident_weight_ratio: float = 0.3
    offload_policy: OffloadPolicy = OffloadPolicy.COST_EFFECTIVE
    bandwidth_safety_factor: float = 0.9


@dataclass
class RecomputeConfig:
    recompute_policy: RecomputePolicy = RecomputePolicy.HEURISTIC
    custom_compute_sensitive_ops: list[str] = field(default_factory=list)
    memory_budget: float = 0.5  # HANDCRAFT: fraction of the no-recompute plan's saved bytes
    memory_budget_bytes: int = 0  # AUTOSEARCH: simulated activation peak to fit, in bytes


@dataclass
class PassConfig:
    # Passes of the C++ pipeline to skip, by name (same as MAGI_DISABLE_PASSES).
    disabled_passes: list[str] = field(default_factory=list)
    # MagiCompiler's Inductor pass switches: accepted so its configs load; a warning says
    # what they mean here when set (MAGI_COMPAT_FIELDS).
    enable_sage_attn: bool = False
    enable_mm_epilogue_fusion: bool = False


@dataclass
class CompileConfig:
    # "magi": our C++ runtime ("inductor", MagiCompiler's default, means the same here);
    # "eager": captured FX graphs run in Python.
    backend: str = "magi"
    compile_mode: CompileMode = CompileMode.MAGI_COMPILE
    cache_root_dir: str = field(
        default_factory=lambda: os.path.join(os.path.expanduser("~"), ".cache", "magi_compiler")
    )
    aot: bool = False
    disable_cache: bool = False
    offload_config: OffloadConfig = field(default_factory=OffloadConfig)
    compile_sizes: list[int] = field(default_factory=list)
    splitting_ops: list[str] = field(default_factory=list)
    pass_config: PassConfig = field(default_factory=PassConfig)
    recompute_config: RecomputeConfig = field(default_factory=RecomputeConfig)
    cudagraph_mode: CudaGraphMode = CudaGraphMode.NONE
    # MagiCompiler's Inductor options: accepted so its configs load (MAGI_COMPAT_FIELDS).
    enable_inductor_max_autotune: bool = False
    enable_inductor_coordinate_descent_tuning: bool = False
    post_grad_pass: str = "post_grad_custom_post_pass"
    custom_partitioner_fn: str = "custom_partitioner_fn"
    # ours
    dynamic_dim_default: int | None = 0  # dim made dynamic when none are given; None: static
    strict: bool = False  # raise on code we cannot compile instead of running it eagerly
    max_recaptures: int = 8  # input signatures per compiled entry before a warning
    max_cuda_graphs: int = 64  # CUDA graphs (input signatures) per compiled graph or piece
    # CUDA graphs: run a batch in the graph of the next larger size of compile_sizes (or the
    # default ladder 1, 2, 4, 8, 16, ..., 256) when the graph's rows are independent.
    cudagraph_padding: bool = True
    # Kernel behind CUDA attention (SDPA) calls of inference graphs: "auto" times the backends
    # at the first call of each shape and keeps the fastest; "graph" keeps the traced one;
    # "flash", "cudnn", "efficient" name one.
    attention_backend: str = "auto"
    # Inference calls matching a captured signature skip Dynamo and AOTAutograd and go straight
    # to the compiled graph (after one ordinary call per signature and module instance).
    fast_dispatch: bool = True
    # What a direct call checks besides the compact signature: "dynamo" evaluates the guards
    # of Dynamo's cache entry once per argument layout and again whenever Python state the
    # guard tree reads moved (_guard_watch.py; every call for a tree it cannot follow);
    # "arguments" evaluates them once per argument
    # layout (sizes, strides, aliasing) and process state and trusts that verdict afterwards,
    # so Python state the forward reads (module attributes, globals) is assumed not to change
    # after the capture (MagiCompiler's contract). See docs/api.md#direct-dispatch.
    fast_dispatch_guards: str = "dynamo"
    # Inference graphs: a stretch of row-wise work whose intermediates are wider than what it
    # reads and returns (a transformer's MLP) runs in chunks of at most this many rows (tokens)
    # when a call has more, so long prompts hold one chunk's intermediates at a time
    # (the chunk_rows pass, docs/passes.md). 0: never.
    chunk_rows: int = 8192


# Fields that are accepted and documented but not acted on yet: setting one warns once.
NOT_YET_ACTED_ON: set[str] = set()
# MagiCompiler fields that configure Inductor, which magi_compile does not run: accepted, and
# a value away from the default warns once with what happens instead.
MAGI_COMPAT_FIELDS = {
    "enable_inductor_max_autotune": "our kernels are shape-generic and need no autotuning",
    "enable_inductor_coordinate_descent_tuning": "our kernels are shape-generic and need no "
    "autotuning",
    "post_grad_pass": "graph passes are our C++ pipeline (pass_config.disabled_passes)",
    "custom_partitioner_fn": "the partition is our C++ recompute planner (recompute_config)",
    "pass_config.enable_sage_attn": "attention runs through the attention_backend choice",
    "pass_config.enable_mm_epilogue_fusion": "matmuls stay library calls; their pointwise "
    "epilogues fuse into our generated kernels",
}
BACKENDS = ("magi", "inductor", "eager")
_warned: set[str] = set()

_ENV_PREFIX = "MAGI_COMPILE_"
ATTENTION_BACKENDS = ("auto", "graph", "flash", "cudnn", "efficient")
FAST_DISPATCH_GUARDS = ("dynamo", "arguments")


def _list_element(value: Any, element_type: type, name: str) -> Any:
    if element_type is int and isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError(f"{name}: list element {value!r} is not an int") from None
    if isinstance(value, element_type) and not isinstance(value, bool):
        return value
    raise ValueError(f"{name}: list element {value!r} is not a {element_type.__name__}")


def _coerce(value: Any, annotation: Any, name: str, element_type: type = str) -> Any:
    """Converts ``value`` (often a string from the environment) to the field's type."""
    default = annotation
    if isinstance(default, enum.Enum):
        enum_type = type(default)
        if isinstance(value, enum_type):
            return value
        try:
            return enum_type[str(value).strip().upper()]
        except KeyError:
            choices = ", ".join(m.name for m in enum_type)
            raise ValueError(f"{name}={value!r} is not one of {choices}") from None
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}={value!r} is not a boolean (use 1/0, true/false)")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            return type(default)(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} is not a {type(default).__name__}") from None
    if isinstance(default, list):
        items = value
        if not isinstance(value, (list, tuple)):
            text = str(value).strip()
            if text.startswith("["):
                try:
                    items = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{name}={value!r} is not valid JSON: {e}") from None
            else:
                items = [v.strip() for v in text.split(",") if v.strip()]
        return [_list_element(v, element_type, name) for v in items]
    return value


def _optional_int(value: Any, name: str) -> int | None:
    if value is None or str(value).strip().lower() in ("none", "null", ""):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an int or None") from None


def _apply(cfg: Any, key: str, value: Any, origin: str) -> None:
    """Sets ``key`` (possibly ``a__b`` for nested) on ``cfg``, validating the value."""
    head, _, rest = key.partition("__")
    names = {f.name for f in dataclasses.fields(cfg)}
    if head not in names:
        raise ValueError(
            f"{origin}: {type(cfg).__name__} has no field {head!r}; fields: {', '.join(sorted(names))}"
        )
    current = getattr(cfg, head)
    if rest:
        if not dataclasses.is_dataclass(current):
            raise ValueError(f"{origin}: {head!r} has no nested fields")
        _apply(current, rest, value, origin)
        return
    if dataclasses.is_dataclass(current):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"{origin}: expected a JSON object for {head!r}: {e}") from None
        if isinstance(value, dict):
            for k, v in value.items():
                _apply(current, k, v, origin)
            return
        if isinstance(value, type(current)):
            setattr(cfg, head, value)
            return
        raise ValueError(f"{origin}: {head!r} expects a {type(current).__name__} or a dict")
    if current is None or head == "dynamic_dim_default":
        value = _optional_int(value, origin)
    else:
        element_type = typing.get_args(typing.get_type_hints(type(cfg))[head]) or (str,)
        value = _coerce(value, current, origin, element_type[0])
    setattr(cfg, head, value)


def _from_env(environ: dict[str, str] | None = None) -> CompileConfig:
    environ = os.environ if environ is None else environ
    cfg = CompileConfig()
    for var in sorted(environ):
        if var.startswith(_ENV_PREFIX):
            _apply(cfg, var[len(_ENV_PREFIX) :].lower(), environ[var], var)
    return cfg


def patched(base: CompileConfig, patch: dict[str, Any] | None) -> CompileConfig:
    """A deep copy of ``base`` with ``patch`` applied (keys may use ``a__b`` or nested dicts)."""
    cfg = _deepcopy(base)
    for key, value in (patch or {}).items():
        _apply(cfg, key, value, f"config_patch[{key!r}]")
    return cfg


def _deepcopy(cfg: CompileConfig) -> CompileConfig:
    import copy

    return copy.deepcopy(cfg)


def _field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def warn_not_yet_acted_on(cfg: CompileConfig) -> None:
    """Warns once per field that is set away from its default but has no effect here: fields
    not implemented yet, and MagiCompiler's Inductor options."""
    default = CompileConfig()
    for name in sorted(NOT_YET_ACTED_ON):
        if getattr(cfg, name) != getattr(default, name) and name not in _warned:
            _warned.add(name)
            warnings.warn(
                f"magi_compiler: CompileConfig.{name} is accepted but not acted on in this "
                "version; it has no effect yet (see docs/config.md)",
                stacklevel=5,
            )
    for name, instead in MAGI_COMPAT_FIELDS.items():
        if _field(cfg, name) != _field(default, name) and name not in _warned:
            _warned.add(name)
            warnings.warn(
                f"magi_compiler: CompileConfig.{name} is a MagiCompiler option for Inductor, "
                f"which magi_compile does not run; it has no effect: {instead} "
                "(see docs/config.md)",
                stacklevel=5,
            )


def resolve(
    base: CompileConfig,
    owner_patch: dict[str, Any] | None,
    config_patch: dict[str, Any] | Callable[[CompileConfig], CompileConfig] | None,
) -> CompileConfig:
    """``base`` (deep-copied) with a class's ``magi_compile_config`` dict and then the
    decorator's ``config_patch`` applied: a dict of field overrides, or MagiCompiler's form, a
    callable that takes a copy of the config and returns the config to use."""
    cfg = patched(base, owner_patch)
    if callable(config_patch):
        result = config_patch(cfg)
        if not isinstance(result, CompileConfig):
            raise ValueError(
                "config_patch: a callable config_patch must return the CompileConfig to use "
                f"(it is given a copy it may change and return); it returned {type(result).__name__}"
            )
        cfg = result
    else:
        cfg = patched(cfg, config_patch)
    validate(cfg)
    warn_not_yet_acted_on(cfg)
    return cfg


def validate(cfg: CompileConfig) -> None:
    """Rejects values no compile could use, at decoration time rather than at the first
    training call (the C++ planner checks the same bounds)."""
    from magi_compiler.errors import UserError

    if cfg.backend not in BACKENDS:
        raise UserError(
            f"backend={cfg.backend!r} is not one of {', '.join(BACKENDS)} (docs/config.md)"
        )
    if cfg.attention_backend.lower() not in ATTENTION_BACKENDS:
        raise UserError(
            f"attention_backend={cfg.attention_backend!r} is not one of "
            f"{', '.join(ATTENTION_BACKENDS)} (docs/config.md)"
        )
    if cfg.fast_dispatch_guards not in FAST_DISPATCH_GUARDS:
        raise UserError(
            f"fast_dispatch_guards={cfg.fast_dispatch_guards!r} is not one of "
            f"{', '.join(FAST_DISPATCH_GUARDS)} (docs/config.md)"
        )
    bad_sizes = [s for s in cfg.compile_sizes if not isinstance(s, int) or s < 1]
    if bad_sizes:
        raise UserError(
            f"compile_sizes={cfg.compile_sizes!r}: {bad_sizes[0]!r} is not a batch size (an int "
            ">= 1); compile_sizes are the batch sizes CUDA graphs are captured for (docs/config.md)"
        )
    if not isinstance(cfg.chunk_rows, int) or cfg.chunk_rows < 0:
        raise UserError(
            f"chunk_rows={cfg.chunk_rows!r} is not a row count (an int >= 0; 0 turns chunking "
            "off); it is how many tokens the MLP of a long prompt computes at a time "
            "(docs/config.md)"
        )
    oc = cfg.offload_config
    if not 0.0 <= oc.gpu_resident_weight_ratio <= 1.0:
        raise UserError(
            f"offload_config.gpu_resident_weight_ratio={oc.gpu_resident_weight_ratio} is outside "
            "[0, 1]; it is the share of weight bytes kept on the GPU (docs/offload.md)"
        )
    if not 0.0 < oc.bandwidth_safety_factor <= 1.0:
        raise UserError(
            f"offload_config.bandwidth_safety_factor={oc.bandwidth_safety_factor} is outside "
            "(0, 1]; it is the share of the measured host link rate HEURISTIC plans with "
            "(docs/offload.md)"
        )
    rc = cfg.recompute_config
    policy = rc.recompute_policy
    if policy is RecomputePolicy.HANDCRAFT and not 0.0 <= rc.memory_budget <= 1.0:
        raise UserError(
            f"recompute_config.memory_budget={rc.memory_budget} is outside [0, 1]; it is the "
            "fraction of the no-recompute plan's saved bytes (docs/training.md)"
        )
    if policy is RecomputePolicy.AUTOSEARCH and rc.memory_budget_bytes <= 0:
        raise UserError(
            "recompute_policy=AUTOSEARCH needs recompute_config.memory_budget_bytes > 0 (the "
            f"activation peak to fit, in bytes); got {rc.memory_budget_bytes}"
        )


_default: CompileConfig | None = None


def get_compile_config() -> CompileConfig:
    """The process default: defaults overridden by ``MAGI_COMPILE_*`` variables (read once)."""
    global _default
    if _default is None:
        _default = _from_env()
    return _default


def set_compile_config(cfg: CompileConfig | None) -> None:
    """Replaces the process default (None: re-read the environment on next use)."""
    global _default
    _default = cfg
