"""The two decorators: :func:`magi_compile` and :func:`magi_register_custom_op`.

``magi_compile`` accepts what MagiCompiler's does: a module class, a module instance, a bound
method or a plain function, used bare (``@magi_compile``), parametrised
(``@magi_compile(dynamic_arg_dims=...)``), imperatively (``magi_compile(model)``) or as a
factory (``c = magi_compile(model_tag="x"); c(Model)``). See docs/api.md.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable

import torch
from torch import nn

from magi_compiler import config as _config
from magi_compiler._backend import make_backend
from magi_compiler._logging import logger
from magi_compiler.config import CompileConfig, CompileMode

_DynamicDims = dict[str, "int | list[int]"]


def _normalise_dims(spec: Any) -> list[int]:
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, (list, tuple)) and all(isinstance(d, int) for d in spec):
        return list(spec)
    raise TypeError(f"dynamic_arg_dims values must be an int or a list of ints, got {spec!r}")


class _CompiledCallable:
    """One compiled entry point: the original function, its config, and the torch.compile
    wrapper that captures it with our backend. Shared by every instance of a decorated class,
    so instances of one layer type reuse Dynamo's cache entries."""

    def __init__(
        self,
        fn: Callable,
        config: CompileConfig,
        dynamic_arg_dims: _DynamicDims | None,
        model_tag: str | None,
        skip_first: bool,
    ):
        self.fn = fn
        self.config = config
        self.model_tag = model_tag or getattr(fn, "__qualname__", "model")
        self.signature = inspect.signature(fn)
        self.skip_first = skip_first  # `self` of a method is not an argument to mark
        self.dynamic_arg_dims = (
            None
            if dynamic_arg_dims is None
            else {k: _normalise_dims(v) for k, v in dynamic_arg_dims.items()}
        )
        params = list(self.signature.parameters)
        for name in self.dynamic_arg_dims or {}:
            if name not in params:
                raise ValueError(
                    f"dynamic_arg_dims names {name!r}, which is not a parameter of "
                    f"{self.model_tag}; parameters: {', '.join(params)}"
                )
        self.captured = False
        self._compiled: Callable | None = None

    def _compiled_fn(self) -> Callable:
        if self._compiled is None:
            if self.config.compile_mode == CompileMode.TORCH_COMPILE:
                self._compiled = torch.compile(self.fn)
            else:

                def on_lowered(kind: str, fn: Any) -> None:
                    self.captured = True

                self._compiled = torch.compile(
                    self.fn,
                    fullgraph=True,
                    dynamic=False,
                    backend=make_backend(self.config, on_lowered),
                )
        return self._compiled

    def _dims_for(self, name: str, value: Any) -> list[int]:
        if not isinstance(value, torch.Tensor):
            return []
        if self.dynamic_arg_dims is not None:
            return self.dynamic_arg_dims.get(name, [])
        d = self.config.dynamic_dim_default
        return [] if d is None or value.dim() == 0 else [d]

    def _mark_dynamic(self, args: tuple, kwargs: dict) -> None:
        bound = self.signature.bind(*args, **kwargs)
        items = list(bound.arguments.items())
        if self.skip_first:
            items = items[1:]
        for name, value in items:
            for d in self._dims_for(name, value):
                dim = d + value.dim() if d < 0 else d
                if not 0 <= dim < value.dim():
                    raise ValueError(
                        f"dynamic_arg_dims: dim {d} of argument {name!r} is out of range for a "
                        f"tensor of rank {value.dim()}"
                    )
                if value.shape[dim] <= 1:
                    if not self.captured:
                        raise ValueError(
                            f"{self.model_tag}: dynamic dim {dim} of argument {name!r} has size "
                            f"{value.shape[dim]} on the first call; PyTorch specialises sizes 0 "
                            "and 1, so the first call must use a size >= 2 for every dynamic dim "
                            f"(or make the dim static: dynamic_arg_dims={{'{name}': []}})"
                        )
                    continue  # a later size-1 call gets its own specialised capture
                torch._dynamo.mark_dynamic(value, dim)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)  # inside an outer capture: trace through
        self._mark_dynamic(args, kwargs)
        return self._compiled_fn()(*args, **kwargs)


def _resolve_config(config_patch: dict[str, Any] | None) -> CompileConfig:
    # Looked up through the module so tests and users can swap the process default.
    cfg = _config.patched(_config.get_compile_config(), config_patch)
    _config.warn_not_yet_acted_on(cfg)
    return cfg


def _compile_instance(module: nn.Module, entry: _CompiledCallable, method_name: str) -> None:
    wrapper = functools.wraps(entry.fn)(lambda *a, **k: entry(module, *a, **k))
    object.__setattr__(module, method_name, wrapper)
    module._magi_compiled = entry  # type: ignore[attr-defined]


def magi_compile(
    obj: Any = None,
    *,
    model_tag: str | None = None,
    dynamic_arg_dims: _DynamicDims | None = None,
    enable_if: Callable[[], bool] | None = None,
    config_patch: dict[str, Any] | None = None,
    method_name: str = "forward",
) -> Any:
    """Compiles a module class, module instance, bound method or function with magi-compiler.

    Args:
        obj: what to compile. Omitted: returns a decorator taking it.
        model_tag: a name for logs, dumps and caches (default: the function's qualified name).
        dynamic_arg_dims: ``{argument name: dim or [dims]}`` made dynamic (negative dims count
            from the end). Default: dim 0 of every tensor argument. ``{}``: fully static.
        enable_if: called at decoration time; when it returns False, ``obj`` is returned as is.
        config_patch: overrides of :class:`~magi_compiler.config.CompileConfig` fields.
        method_name: the method of a module class or instance to compile.
    """
    if obj is None:
        return functools.partial(
            magi_compile,
            model_tag=model_tag,
            dynamic_arg_dims=dynamic_arg_dims,
            enable_if=enable_if,
            config_patch=config_patch,
            method_name=method_name,
        )
    if enable_if is not None and not enable_if():
        return obj
    cfg = _resolve_config(config_patch)
    if cfg.compile_mode == CompileMode.NONE:
        return obj

    if isinstance(obj, type):
        if not issubclass(obj, nn.Module):
            raise TypeError(
                f"magi_compile takes an nn.Module class, a module, a method or a function; "
                f"{obj.__name__} is a class that is not an nn.Module"
            )
        fn = getattr(obj, method_name, None)
        if not callable(fn):
            raise ValueError(f"{obj.__name__} has no method {method_name!r} to compile")
        entry = _CompiledCallable(fn, cfg, dynamic_arg_dims, model_tag or obj.__name__, True)
        original_init = obj.__init__

        @functools.wraps(original_init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            # Subclasses of a decorated class compile their own override only if decorated.
            if getattr(type(self), method_name) is fn:
                _compile_instance(self, entry, method_name)

        obj.__init__ = __init__
        logger.debug("magi_compile: class %s, method %s", obj.__name__, method_name)
        return obj

    if isinstance(obj, nn.Module):
        fn = getattr(type(obj), method_name, None)
        if not callable(fn):
            raise ValueError(f"{type(obj).__name__} has no method {method_name!r} to compile")
        tag = model_tag or type(obj).__name__
        _compile_instance(obj, _CompiledCallable(fn, cfg, dynamic_arg_dims, tag, True), method_name)
        return obj

    if inspect.ismethod(obj) or inspect.isfunction(obj):
        if method_name != "forward":
            raise ValueError(
                "method_name applies to module classes and instances; for a function or a bound "
                "method, pass the callable itself"
            )
        if inspect.ismethod(obj):
            owner, fn = obj.__self__, obj.__func__
            entry = _CompiledCallable(fn, cfg, dynamic_arg_dims, model_tag, True)
            bound = types.MethodType(functools.wraps(fn)(lambda s, *a, **k: entry(s, *a, **k)), owner)
            object.__setattr__(owner, fn.__name__, bound)
            return bound
        entry = _CompiledCallable(obj, cfg, dynamic_arg_dims, model_tag, False)
        return functools.wraps(obj)(lambda *a, **k: entry(*a, **k))

    raise TypeError(
        f"magi_compile cannot compile {type(obj).__name__!s} objects; pass an nn.Module class or "
        "instance, a bound method or a function"
    )
