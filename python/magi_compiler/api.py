"""The two decorators: :func:`magi_compile` and :func:`magi_register_custom_op`.

``magi_compile`` accepts what MagiCompiler's does: a module class, a module instance, a bound
method or a plain function, used bare (``@magi_compile``), parametrised
(``@magi_compile(dynamic_arg_dims=...)``), imperatively (``magi_compile(model)``) or as a
factory (``c = magi_compile(model_tag="x"); c(Model); c(model)``). See docs/api.md.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import threading
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

from magi_compiler import (
    _C,
    _backend,
    _call_frame,
    _capture_errors,
    _compile_cache,
    _counters,
    _dump,
    _dynamic_dims,
    _fast_dispatch,
    _offload,
)
from magi_compiler import config as _config
from magi_compiler._backend import make_backend
from magi_compiler._custom_op import magi_register_custom_op  # noqa: F401  (public API)
from magi_compiler._logging import logger
from magi_compiler.config import CompileConfig, CompileMode

# Class attribute through which a model author gives a module its own settings (a dict of
# CompileConfig overrides, like config_patch; the decorator's config_patch wins).
CONFIG_ATTRIBUTE = "magi_compile_config"

_tls = threading.local()  # depth of magi captures in progress on this thread


def _capture_depth() -> int:
    return getattr(_tls, "depth", 0)


@torch._dynamo.disable
def _opaque_call(entry: _CompiledCallable, args: tuple, kwargs: dict) -> Any:
    # Reached when an outer torch.compile traces into a magi-compiled module: the module runs
    # as a black box (with its own compiled graph) and the outer graph breaks around it.
    return entry(*args, **kwargs)


def _no_entry() -> None:
    return None


class _CompiledCallable:
    """One compiled entry point: the original function, its config and dynamic dims, the
    torch.compile wrapper that captures it with our backend, and the guard signatures it was
    captured for. One instance serves every instance of a decorated class, so layers of one
    type share captures and compiled graphs."""

    def __init__(
        self,
        fn: Callable,
        config: CompileConfig,
        dynamic_arg_dims: dict[str, Any] | None,
        model_tag: str | None,
        is_method: bool,
    ):
        self.fn = fn
        self.config = config
        self.model_tag = model_tag or getattr(fn, "__qualname__", "model")
        self.signature = inspect.signature(fn)
        self.is_method = is_method  # first parameter is `self`, not a graph input
        params = list(self.signature.parameters)
        self.param_names = params[1:] if is_method else params

        # Dims named by the user are an error when the code fixes them (_raise_if_fixed);
        # inferred ones (from annotations, or dim 0 of every tensor) are then left static
        # (_drop_fixed).
        self.dims_explicit = dynamic_arg_dims is not None
        # Sizes that change between captures become dynamic (docs/api.md), unless the user
        # said which dims are dynamic or that none are by default.
        self.automatic_dynamic = not self.dims_explicit and config.dynamic_dim_default is not None
        self.static_dims: set[tuple[str, int]] = set()
        if dynamic_arg_dims is None and config.dynamic_dim_default is not None:
            dims = _dynamic_dims.infer_from_annotations(fn, is_method, config.dynamic_dim_default)
            self.dims_inferred = dims is not None
            self.dynamic_arg_dims = dims  # None: dim `dynamic_dim_default` of every tensor
        else:
            self.dims_inferred = False
            self.dynamic_arg_dims = {
                name: _dynamic_dims.normalise(spec, f"dynamic_arg_dims[{name!r}]")
                for name, spec in (dynamic_arg_dims or {}).items()
            }
        for name in self.dynamic_arg_dims or {}:
            if name.split(".")[0] not in params:
                raise ValueError(
                    f"{self.model_tag}: dynamic_arg_dims names {name!r}, which is not a parameter"
                    f"; parameters: {', '.join(self.param_names)}"
                )
        self.paths = [p for p in (self.dynamic_arg_dims or {}) if "." in p]

        self.signatures: list[Any] = []  # _C.GuardSignature per capture
        # Direct calls (_fast_dispatch.py), per owner.
        self._direct = _fast_dispatch.PathTable()
        # Why calls run eagerly, per mode (the module's training flag, grad mode): a model
        # whose training step cannot be captured (transformers' LayerDrop draws a random
        # number and branches on it) still runs compiled in eval.
        self._fallbacks: dict[tuple[bool, bool], str] = {}
        self._warned_bound = False
        # Dims that changed size between captures, when no dynamic_arg_dims were given:
        # dynamic from then on (maybe-dynamic: the code may fix them), as torch.compile's
        # automatic dynamic does. {parameter or dotted path: dims}
        self._grown: dict[str, set[int]] = {}
        self._shapes: list[list[tuple[Any, ...] | None]] = []  # per signature: (dtype, shape)
        self._compiled: Callable | None = None
        self._seen_owners: set[int] = set()

    def __reduce__(self) -> tuple[Callable, tuple]:
        # Dynamo's guard serialiser (compiled-module cache) writes a module's attributes,
        # ours among them; what a compiled entry holds is process state, written as nothing.
        return _no_entry, ()

    # --- capture -----------------------------------------------------------------------
    def _compiled_fn(self) -> Callable:
        if self._compiled is None:
            if self.config.compile_mode == CompileMode.TORCH_COMPILE:
                self._compiled = torch.compile(self.fn)
            else:
                with _backend.without_minifier_import():
                    self._compiled = self._optimized()
        return self._compiled

    def _optimized(self) -> Callable:
        dynamic = None if self.automatic_dynamic else False
        if self._disk is None:
            # Automatic dynamic (Dynamo's, for tensors inside other arguments) unless the user
            # named the dynamic dims.
            return torch.compile(
                self.fn, fullgraph=True, dynamic=dynamic, backend=_backend_for(self.config)
            )
        # Dynamo records the guards and bytecode of each capture into the package (and, from a
        # warm cache, starts with the cached ones installed).
        return torch._dynamo.optimize(
            _backend_for(self.config),
            nopython=True,
            dynamic=dynamic,
            package=self._disk.package_for_compile(),
            guard_filter_fn=_compile_cache.serializable_guards,
        )(self.fn)

    @functools.cached_property
    def _disk(self) -> _compile_cache.EntryCache | None:
        """The compiled-module cache of this entry (None when off), set up at the first call,
        when the custom operators it may call are registered."""
        if (
            self.config.disable_cache
            or self.config.backend == "eager"
            or self.config.compile_mode == CompileMode.TORCH_COMPILE
        ):
            return None
        return _compile_cache.entry_cache(self.fn, self.config, self.model_tag)

    # --- inputs ------------------------------------------------------------------------
    def _flat_inputs(self, args: tuple, kwargs: dict) -> tuple[list[Any], list[list[int]]]:
        """The values the guard looks at (parameters in order, then dotted paths) and their
        dynamic dims."""
        bound = self.signature.bind(*args, **kwargs)
        # Left-out arguments count as their defaults: f(x) and f(x, scale=None) trace different
        # code when the default is not None.
        bound.apply_defaults()
        arguments = bound.arguments
        values, dims = [], []
        default = self.config.dynamic_dim_default
        for name in self.param_names:
            value = arguments.get(name)
            values.append(value)
            if not isinstance(value, torch.Tensor):
                dims.append([])
            elif self.dynamic_arg_dims is None:
                dims.append([] if default is None or value.dim() == 0 else [default])
            else:
                dims.append(list(self.dynamic_arg_dims.get(name, [])))
            if self._grown and name in self._grown and isinstance(value, torch.Tensor):
                dims[-1] = sorted(set(dims[-1]) | self._grown[name])
            if self.static_dims and dims[-1]:
                rank = value.dim()
                dims[-1] = [
                    d for d in dims[-1] if (name, d + rank if d < 0 else d) not in self.static_dims
                ]
        for path in self.paths:
            value = _dynamic_dims.resolve_path(arguments, path)
            values.append(value)
            dims.append(
                list(self.dynamic_arg_dims[path]) if isinstance(value, torch.Tensor) else []
            )
        return values, dims

    def _mark_dynamic(
        self, values: list[Any], dims: list[list[int]], first: bool
    ) -> list[list[int]]:
        names = self.param_names + self.paths
        marked = []
        for name, value, value_dims in zip(names, values, dims, strict=True):
            kept = []
            for d in value_dims:
                dim = d + value.dim() if d < 0 else d
                if not 0 <= dim < value.dim():
                    raise ValueError(
                        f"{self.model_tag}: dynamic_arg_dims: dim {d} of argument {name!r} is "
                        f"out of range for a tensor of rank {value.dim()}"
                    )
                if value.shape[dim] <= 1:
                    # PyTorch specialises sizes 0 and 1: this call is captured with the size
                    # fixed, and the first call with a larger size captures the dim dynamic
                    # (torch.compile's automatic dynamic), so batch 1 then 2..N is 2 captures.
                    if self.dims_explicit and first:
                        logger.info(
                            "%s: dynamic dim %d of %r has size %d on the first call; captured "
                            "with that size, and dynamic from the first call with a larger one",
                            self.model_tag, dim, name, value.shape[dim],
                        )  # fmt: skip
                    continue
                # Inferred dims may turn out fixed by the code (a weight's rows): Dynamo then
                # specialises them silently, in the same trace (_drop_fixed finds them);
                # dims the user named must stay dynamic, or Dynamo says why not.
                if self.dims_explicit:
                    torch._dynamo.mark_dynamic(value, dim)
                else:
                    torch._dynamo.maybe_mark_dynamic(value, dim)
                kept.append(dim)
            marked.append(kept)
        return marked

    @property
    def fallback_reason(self) -> str | None:
        """Why calls run eagerly: the latest reason of any mode, None when every call so far
        was compiled."""
        return next(reversed(self._fallbacks.values()), None)

    def _mode(self, args: tuple) -> tuple[bool, bool]:
        owner = args[0] if self.is_method and args else None
        return bool(getattr(owner, "training", False)), torch.is_grad_enabled()

    # --- call ---------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(args, kwargs)

    def call(self, args: tuple, kwargs: dict, natives_tried: bool = False) -> Any:
        """The call with these arguments (the owner first for a method). ``natives_tried``:
        the wrapper's _C.DirectEntry already tried the C++ direct calls of the owner."""
        if torch.compiler.is_compiling():
            if _capture_depth() > 0:
                return self.fn(*args, **kwargs)  # nested magi module: part of the outer graph
            return _opaque_call(self, args, kwargs)
        if self._fallbacks and self._mode(args) in self._fallbacks:
            return self.fn(*args, **kwargs)

        owner = args[0] if self.is_method else None
        paths = self._direct.get(owner)
        if paths is not None and paths.valid():
            for path in paths.paths:
                if not path.routes.hold():
                    _C.bump_registration_epoch()  # a submodule was replaced: relearn
                    break
                native = path.native
                if native is not None and not kwargs and len(args) == native.arity:
                    if natives_tried:
                        continue
                    result = native(args)
                    if result is not None:
                        _counters.count_direct_call()
                        return result
                    continue
                try:
                    values, inputs, frame = path.gather(*args, **kwargs)
                except Exception:  # noqa: BLE001 - arguments of another structure: not this path
                    continue
                training = bool(getattr(owner, "training", False))
                if path.signature.matches(values, training) and path.guards.check(frame):
                    _counters.count_direct_call()
                    return path.result(inputs)
        training = bool(getattr(owner, "training", False))
        values, dims = self._flat_inputs(args, kwargs)
        for sig in self.signatures:
            if sig.matches(values, training):
                if owner is not None and id(owner) not in self._seen_owners:
                    self._seen_owners.add(id(owner))
                    _counters.bump("cache_hits")
                return self._run_and_learn(sig, owner, args, kwargs)
        return self._miss(args, kwargs, values, dims, training, owner)

    def _run_and_learn(self, sig: Any, owner: Any, args: tuple, kwargs: dict) -> Any:
        """An ordinary call (through Dynamo) of a captured signature; when it qualifies, it
        also sets up the direct path of (signature, owner) for later calls."""
        paths = self._direct.get(owner)
        if paths is not None and not paths.valid():
            paths = self._direct.fresh(owner)
        if (
            not self.config.fast_dispatch
            or self.paths
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cuda")
            or torch.is_autocast_enabled("cpu")
            or (paths is not None and id(sig) in paths.refused)
        ):
            return self._run_hit(args, kwargs)
        with _fast_dispatch.Observation() as seen:
            result = self._run_hit(args, kwargs)
        path, why = self._direct_path(sig, args, kwargs, seen, result)
        if paths is None:
            paths = self._direct.fresh(owner)
            if paths is None:
                return result  # an owner without weak references gets no direct path
        if path is None:
            paths.refused.add(id(sig))
            _fast_dispatch.log_refusal(self.model_tag, why)
        else:
            paths.paths.append(path)
            self._direct.learned(owner, path)
            logger.debug("%s: direct dispatch for %s", self.model_tag, sig)
        return result

    def _direct_path(
        self, sig: Any, args: tuple, kwargs: dict, seen: Any, result: Any
    ) -> tuple[_fast_dispatch.DirectPath | None, str]:
        """(DirectPath, "") for the call just observed, or (None, why not)."""
        return _fast_dispatch.direct_path(
            self.fn,
            self.is_method,
            self.signature,
            self.param_names,
            sig,
            (args, kwargs),
            seen,
            result,
            memoize=self.config.fast_dispatch_guards == "arguments",
            tag=self.model_tag,
        )

    def _run_hit(self, args: tuple, kwargs: dict) -> Any:
        """A call whose signature matched, which Dynamo may still capture (its own guards
        failed): refused by Dynamo's per-code-object limit, it is made again as a capture. A
        capture that fails here (code only this call reaches, such as another instance's
        branch, breaks the graph) is handled as a new signature's would be (_capture_failed)."""
        try:
            return self._run(args, kwargs)
        except Exception as e:
            if _capture_errors.recompile_limit_hit(e):
                try:
                    return self._capture(args, kwargs)
                except Exception as again:  # noqa: BLE001 - filtered in _capture_failed
                    return self._capture_failed(again, args, kwargs)
            if _capture_errors.unsupported_reason(e) is None:
                raise
            return self._capture_failed(e, args, kwargs)

    def _run(self, args: tuple, kwargs: dict) -> Any:
        _tls.depth = _capture_depth() + 1
        try:
            with _dynamic_dims.integers_specialised():
                return self._compiled_fn()(*args, **kwargs)
        finally:
            _tls.depth -= 1
            if self._disk is not None and _backend.captured_since_last_asked():
                self._disk.explain_capture(args, kwargs)
                self._disk.after_capture()

    def _miss(self, args, kwargs, values, dims, training, owner) -> Any:
        first = not self.signatures
        if not first:
            _counters.bump("guard_misses")
            reasons = "; ".join(
                filter(None, (s.mismatch(values, training) for s in self.signatures))
            )
            logger.debug("%s: guard miss (%s)", self.model_tag, reasons)
            if len(self.signatures) >= self.config.max_recaptures and not self._warned_bound:
                self._warned_bound = True
                warnings.warn(
                    f"magi_compiler: {self.model_tag} has been captured for "
                    f"{len(self.signatures)} input signatures (max_recaptures="
                    f"{self.config.max_recaptures}); the latest change: {reasons}. Inputs whose "
                    "dtype or static sizes keep changing recompile each time; mark the changing "
                    "dims dynamic (dynamic_arg_dims) or raise max_recaptures",
                    stacklevel=3,
                )
        if not first and self.automatic_dynamic:
            dims = _dynamic_dims.grow(self._shapes, values, dims, self.param_names, self._grown)
        marked = self._mark_dynamic(values, dims, first)
        captures_before = _counters.captures()
        with _backend.recording_static_dims() as static_seen:
            try:
                result = self._capture(args, kwargs)
            except Exception as e:  # noqa: BLE001 - filtered in _raise_if_fixed / _capture_failed
                violation = _capture_errors.constraint_violation(e)
                self._raise_if_fixed(violation, e, values, marked)
                return self._capture_failed(e, args, kwargs)
        if not self.dims_explicit:
            marked = self._drop_fixed(values, marked, static_seen)
        self.signatures.append(_C.GuardSignature(values, marked, training))
        self._shapes.append(_dynamic_dims.shapes(values))
        if owner is not None:
            self._seen_owners.add(id(owner))
        if _counters.captures() == captures_before and owner is not None and not first:
            _counters.bump("cache_hits")
        if first and self.config.aot and self.config.compile_sizes and not self._fallbacks:
            self._precompile_sizes(args, kwargs, values, dims)
        return result

    def _precompile_sizes(self, args: tuple, kwargs: dict, values: list, dims: list) -> None:
        """``aot=True``: right after the first call, calls the entry once per size in
        ``compile_sizes`` with inputs of that size along their dynamic dims (zeros; ones for
        integer and bool tensors, valid token ids and masks), so every capture those sizes
        need happens now and goes to the compiled-module cache (and, with CUDA graphs, their
        graphs are captured)."""
        calls = _dynamic_dims.calls_of_sizes(
            self.signature, self.param_names, args, kwargs, values, dims, self.config.compile_sizes
        )
        if not calls:
            logger.info(
                "%s: aot: no input has a dynamic dim; nothing to precompile", self.model_tag
            )
            return
        start = time.perf_counter()
        for call_args, call_kwargs in calls:
            self.call(call_args, call_kwargs)
        logger.info(
            "%s: aot: precompiled batch sizes %s in %.1f s",
            self.model_tag, sorted(set(self.config.compile_sizes)), time.perf_counter() - start,
        )  # fmt: skip

    def _capture(self, args: tuple, kwargs: dict) -> Any:
        # Our guard decided that this call needs a capture; Dynamo's per-function limit
        # (8 by default) must not refuse it and turn the whole entry eager. torch._guards logs
        # a failing guard's traceback before raising it; it is silenced here because the
        # exception reaches the caller (or _raise_if_fixed, for named dims the code fixes) on its own.
        dynamo = torch._dynamo.config
        limit = max(dynamo.recompile_limit, dynamo.accumulated_recompile_limit)
        guards_log = logging.getLogger("torch._guards")
        level = guards_log.level
        guards_log.setLevel(logging.CRITICAL)
        try:
            with (
                dynamo.patch(recompile_limit=limit),
                _dump.capture(self.model_tag),
                _backend.gc_paused(),
            ):
                try:
                    return self._run(args, kwargs)
                except Exception as e:
                    if self._disk is None or not _compile_cache.is_unwritable_guards_failure(e):
                        raise
                    # A guard of this function cannot go to disk: compile it uncached.
                    logger.info(
                        "%s: not using the compiled-module cache: Dynamo cannot write a guard "
                        "of this function (see its 'package bypass' warning)",
                        self.model_tag,
                    )
                    self.__dict__["_disk"], self._compiled = None, None
                    return self._run(args, kwargs)
        finally:
            guards_log.setLevel(level)

    def _capture_failed(self, e: BaseException, args: tuple, kwargs: dict) -> Any:
        """Raises `e` (ours with their own type), or falls back to eager when it says the code
        cannot be compiled and the config allows it (the warning names the user's call)."""
        reason = _capture_errors.unsupported_reason(e)
        if reason is None or self.config.strict:
            ours = _capture_errors.magi_error(e)
            if ours is not None and ours is not e:
                # Dynamo wraps backend errors in BackendCompilerFailed; surface ours with
                # their own type (UserError is a ValueError, etc.) and message.
                raise ours.with_traceback(None) from e
            raise e
        self._fallbacks[self._mode(args)] = reason
        self._direct.forget_all()
        warnings.warn(
            f"magi_compiler: {self.model_tag} cannot be compiled and will run eagerly: "
            f"{reason} (set strict=True in its config to raise instead)",
            stacklevel=_capture_errors.user_stacklevel(),
        )
        return self.fn(*args, **kwargs)

    def _drop_fixed(
        self, values: list[Any], marked: list[list[int]], static_seen: dict[str, set[int]]
    ) -> list[list[int]]:
        """Inferred dynamic dims that a captured graph has static (the code fixed their size,
        and Dynamo specialised them, being only maybe-dynamic) are static for this entry from
        now on: dropped from the signature's dynamic dims and unmarked on the call's tensors."""
        static_seen = self._bound_sources(static_seen)
        for i, name in enumerate(self.param_names):
            static = static_seen.get(f"L['{name}']")
            if not static or not marked[i]:
                continue
            for dim in [d for d in marked[i] if d in static]:
                self.static_dims.add((name, dim))
                _dynamic_dims.unmark_dynamic(values[i], dim)
                logger.debug("%s: dim %d of %r stays static: the code fixes its size",
                             self.model_tag, dim, name)  # fmt: skip
            marked[i] = [d for d in marked[i] if d not in static]
        return marked

    def _bound_sources(self, by_source: dict[str, set[int]]) -> dict[str, set[int]]:
        """``by_source`` keyed by the bound parameter each source reads (a wrapped forward's
        ``L['kwargs']['x']`` as ``L['x']``, _call_frame.py)."""
        frame, _ = _call_frame.CallFrame.of(self.fn, self.is_method)
        if frame is None or not frame.varargs:
            return by_source
        out: dict[str, set[int]] = {}
        for source, dims in by_source.items():
            out.setdefault(frame.to_bound(source) or source, set()).update(dims)
        return out

    def _raise_if_fixed(
        self,
        violation: ConstraintViolationError | None,
        e: Exception,
        values: list[Any],
        marked: list[list[int]],
    ) -> None:
        """A dim named in dynamic_arg_dims that the traced code fixed (Dynamo's
        ConstraintViolationError) is a ValueError saying which and what to do. Inferred dims
        never get here: they are only maybe-dynamic, and Dynamo specialises them without
        raising (_drop_fixed)."""
        if violation is None or not self.dims_explicit:
            return
        frame, _ = _call_frame.CallFrame.of(self.fn, self.is_method)
        raise _capture_errors.fixed_dim_error(
            self.model_tag, violation, frame, self.param_names, values, marked
        ) from e


_backends: dict[str, Callable] = {}


def _backend_for(config: CompileConfig) -> Callable:
    """One backend object per distinct config. Dynamo keeps one cache per code object and
    recaptures when the backend object differs, so entries of one function (instances of a
    class compiled one by one) must hand it the same backend to share captures."""
    key = repr(config)
    if key not in _backends:
        _backends[key] = make_backend(config)
    return _backends[key]


def get_compile_config() -> CompileConfig:
    """The process default config that decoration starts from (``magi_compiler.config``'s).
    Decoration calls it through this module, so replacing either this function or the config
    module's (as MagiCompiler's tests do with ``unittest.mock.patch``) takes effect."""
    return _config.get_compile_config()


def _resolve_config(
    owner_patch: dict[str, Any] | None,
    config_patch: dict[str, Any] | Callable[[CompileConfig], CompileConfig] | None,
) -> CompileConfig:
    return _config.resolve(get_compile_config(), owner_patch, config_patch)


# What _install sets on a module instance, besides the compiled methods themselves.
_INSTALLED = ("_magi_compiled_methods", "_magi_compiled", "__deepcopy__")


def _install(module: nn.Module, entry: _CompiledCallable, method_name: str) -> None:
    """Makes ``module.<method_name>`` call ``entry`` with ``module`` as its owner (its weights
    moved to pinned host memory first when the config offloads them)."""
    if entry.config.offload_config.model_cpu_offload and isinstance(module, nn.Module):
        _offload.offload_module(module)
    compiled_method = functools.wraps(entry.fn)(
        _fast_dispatch.wrapper(entry, module, entry._direct)
    )
    object.__setattr__(module, method_name, compiled_method)
    compiled = dict(getattr(module, "_magi_compiled_methods", {}))
    compiled[method_name] = entry
    object.__setattr__(module, "_magi_compiled_methods", compiled)
    if method_name == "forward":
        object.__setattr__(module, "_magi_compiled", entry)
    # copy.deepcopy would copy the compiled method as it is (functions are not copied), and
    # the copy's calls would run this module's weights.
    object.__setattr__(module, "__deepcopy__", functools.partial(_deepcopy_compiled, module))


def _deepcopy_compiled(module: nn.Module, memo: dict) -> nn.Module:
    """copy.deepcopy of a compiled module: a copy of the plain module whose compiled methods
    call the same compiled entries (as a second instance of a decorated class does), each with
    the copy as its owner, so the copy computes with its own weights."""
    state = vars(module)
    compiled = state["_magi_compiled_methods"]
    saved = {k: state.pop(k) for k in (*compiled, *_INSTALLED) if k in state}
    try:
        twin = copy.deepcopy(module, memo)
    finally:
        state.update(saved)
    for name, entry in compiled.items():
        _install(twin, entry, name)  # with model_cpu_offload, the copy's weights go to the host
    return twin


def _is_routine(obj: Any) -> bool:
    return inspect.ismethod(obj) or inspect.isfunction(obj)


def _inherited_call(cls: type) -> Any:
    """The ``__call__`` defined by ``cls`` or a base class in Python (None for ``object``'s)."""
    return next((vars(base)["__call__"] for base in cls.__mro__ if "__call__" in vars(base)), None)


def _default_method(cls: type) -> str:
    """``forward`` for modules and classes that have one; ``__call__`` for other callables."""
    if issubclass(cls, nn.Module) or callable(getattr(cls, "forward", None)):
        return "forward"
    if inspect.isfunction(_inherited_call(cls)):
        return "__call__"
    raise TypeError(
        f"magi_compile takes an nn.Module class or instance, a callable class or instance, a "
        f"bound method or a function; {cls.__name__} has neither forward nor __call__ (pass "
        "method_name to name the method to compile)"
    )


def _instance_dunder_call(fn: Callable) -> Callable:
    """A type-level ``__call__`` that runs the instance's compiled ``__call__`` (installed in
    its ``__dict__``), or ``fn`` for an instance that has none (a subclass that overrides)."""

    @functools.wraps(fn)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        compiled = self.__dict__.get("__call__")
        if compiled is None:
            return fn(self, *args, **kwargs)
        return compiled(*args, **kwargs)

    return __call__


def _method_of(cls: type, method_name: str) -> Callable:
    fn = getattr(cls, method_name, None)
    if not callable(fn):
        raise ValueError(f"{cls.__name__} has no method {method_name!r} to compile")
    return fn


def magi_compile(
    obj: Any = None,
    *,
    model_tag: str | None = None,
    dynamic_arg_dims: dict[str, int | list[int]] | None = None,
    enable_if: Callable[[], bool] | None = None,
    config_patch: dict[str, Any] | Callable[[CompileConfig], CompileConfig] | None = None,
    method_name: str | None = None,
) -> Any:
    """Compiles a module class, module instance, bound method or function with magi-compiler.

    Args:
        obj: what to compile. Omitted: returns a decorator that takes it.
        model_tag: a name for logs, dumps and caches (default: the class or function name).
        dynamic_arg_dims: ``{argument: dim or [dims]}`` to make dynamic; negative dims count
            from the end, ``"arg.attr"`` reaches into an argument, ``None`` arguments are
            skipped, ``{}`` compiles fully static. Default: inferred from annotations
            (``Tensor`` and ``Optional[Tensor]`` parameters get dim 0), else dim 0 of every
            tensor argument.
        enable_if: called at decoration time; when it returns False, ``obj`` is returned as is.
        config_patch: overrides of :class:`~magi_compiler.config.CompileConfig` fields for this
            object only (they win over the class attribute ``magi_compile_config``, the
            ``MAGI_COMPILE_*`` environment and the defaults): a dict of fields, or (as in
            MagiCompiler) a callable given a copy of the config that returns the one to use.
        method_name: the method of a class or instance to compile (default ``forward``; for a
            callable class that is not an ``nn.Module`` and has no ``forward``, ``__call__``).
            Not accepted with a function or bound method.

    Returns:
        The class itself (its instances are compiled after ``__init__``), the same instance,
        a new bound method (its owner patched to use it), or a new function.
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

    if isinstance(obj, type):
        name = method_name or _default_method(obj)
        cfg = _resolve_config(getattr(obj, CONFIG_ATTRIBUTE, None), config_patch)
        if cfg.compile_mode == CompileMode.NONE:
            return obj
        fn = _method_of(obj, name)
        entry = _CompiledCallable(fn, cfg, dynamic_arg_dims, model_tag or obj.__name__, True)
        original_init = obj.__init__

        # Calls look __call__ up on the type: the class's forwards to the instance's compiled one.
        own = _instance_dunder_call(fn) if name == "__call__" else fn

        @functools.wraps(original_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            # A subclass that overrides the method compiles it only if it is decorated itself.
            if getattr(type(self), name) is own:
                _install(self, entry, name)

        obj.__init__ = __init__
        if own is not fn:
            obj.__call__ = own
        logger.debug("magi_compile: class %s, method %s", obj.__name__, name)
        return obj

    if isinstance(obj, nn.Module) or (callable(obj) and not _is_routine(obj)):
        name = method_name or _default_method(type(obj))
        cfg = _resolve_config(getattr(type(obj), CONFIG_ATTRIBUTE, None), config_patch)
        if cfg.compile_mode == CompileMode.NONE:
            return obj
        fn = _method_of(type(obj), name)
        tag = model_tag or type(obj).__name__
        _install(obj, _CompiledCallable(fn, cfg, dynamic_arg_dims, tag, True), name)
        if name == "__call__" and type(obj).__call__ is fn:
            # Calls look __call__ up on the type: this instance gets a subclass of its own
            # whose __call__ forwards to the compiled one.
            cls = type(obj)
            twin = type(cls.__name__, (cls,), {"__call__": _instance_dunder_call(fn)})
            twin.__qualname__ = cls.__qualname__
            twin.__module__ = cls.__module__
            obj.__class__ = twin
        return obj

    if inspect.ismethod(obj) or inspect.isfunction(obj):
        if method_name is not None:
            raise ValueError(
                "method_name applies to module classes and instances; to compile a function or "
                f"a bound method, pass it directly (got method_name={method_name!r} with "
                f"{getattr(obj, '__qualname__', obj)!s})"
            )
        owner = obj.__self__ if inspect.ismethod(obj) else None
        cfg = _resolve_config(
            getattr(type(owner), CONFIG_ATTRIBUTE, None) if owner else None, config_patch
        )
        if cfg.compile_mode == CompileMode.NONE:
            return obj
        if owner is not None:
            fn = obj.__func__
            entry = _CompiledCallable(fn, cfg, dynamic_arg_dims, model_tag, True)

            @functools.wraps(fn)
            def method(self: Any, *args: Any, **kwargs: Any) -> Any:
                return entry(self, *args, **kwargs)

            method._magi_compiled = entry  # type: ignore[attr-defined]
            if cfg.offload_config.model_cpu_offload and isinstance(owner, nn.Module):
                _offload.offload_module(owner)
            bound = types.MethodType(method, owner)
            object.__setattr__(owner, fn.__name__, bound)
            return bound
        entry = _CompiledCallable(obj, cfg, dynamic_arg_dims, model_tag, False)

        function = functools.wraps(obj)(_fast_dispatch.wrapper(entry, None, entry._direct))
        function._magi_compiled = entry  # type: ignore[attr-defined]
        return function

    raise TypeError(
        f"magi_compile cannot compile a {type(obj).__name__} object; pass an nn.Module class or "
        "instance, a bound method or a function"
    )
