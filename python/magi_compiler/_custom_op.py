"""``magi_register_custom_op``: teach the compiler about a kernel it cannot see into.

The decorator registers a real ``torch.library`` custom operator (reachable as
``torch.ops.<namespace>.<name>``) from an annotated Python function, gives it a fake
implementation so Dynamo and AOTAutograd can trace it, optionally an autograd formula, and
records two flags in the C++ operator registry: ``is_subgraph_boundary`` (the compiled graph is
cut around its calls) and ``is_compute_sensitive`` (its outputs are worth saving rather than
recomputing). The flags are read when a graph is compiled, so registering an operator after a
model class was decorated still counts. Every mistake that can be caught at registration is
raised there, not deep inside a trace. See docs/custom_ops.md.
"""

from __future__ import annotations

import collections.abc
import functools
import hashlib
import inspect
import re
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

# torch's own tables of the Python types an operator schema can express. Private, but they are
# exactly what torch.library.custom_op accepts, so checking against them keeps us in step.
from torch._library.infer_schema import SUPPORTED_PARAM_TYPES, SUPPORTED_RETURN_TYPES

from magi_compiler import _C

__all__ = ["magi_register_custom_op"]

_PARAM_TYPES_HINT = (
    "torch.Tensor, Optional[torch.Tensor], list[torch.Tensor], list[Optional[torch.Tensor]], "
    "int, float, bool, str, torch.dtype, torch.device, Optional[int|float|bool|str] or "
    "list[int|float|bool]"
)
_RETURN_TYPES_HINT = (
    "torch.Tensor, tuple[torch.Tensor, ...] (a fixed number), list[torch.Tensor], int, float, "
    "bool or None"
)
# Names a string annotation may use without importing them (as torch.library allows).
_ANNOTATION_FALLBACKS = {
    "torch": torch,
    "Tensor": torch.Tensor,
    "Optional": typing.Optional,
    "Union": typing.Union,
    "List": typing.List,  # noqa: UP006
    "Sequence": collections.abc.Sequence,
    "dtype": torch.dtype,
    "device": torch.device,
}


def magi_register_custom_op(
    name: str | None = None,
    mutates_args: Sequence[str] = (),
    infer_output_meta_fn: Callable | Sequence[str] | None = None,
    setup_context_fn: Callable | None = None,
    backward_fn: Callable | None = None,
    is_compute_sensitive: bool = False,
    is_subgraph_boundary: bool = False,
) -> Callable:
    """Registers the decorated function as a custom operator the compiler understands.

    Args:
        name: ``"namespace::op_name"``. Default: ``"<source file stem>::<function name>"``, with
            characters outside ``[A-Za-z0-9_]`` replaced by ``_``.
        mutates_args: names of the tensor parameters the function writes in place.
        infer_output_meta_fn: how tracing learns the outputs' shapes, dtypes and devices:
            ``None``: the outputs are like the first N plain tensor parameters, N from the
            return annotation; a list of parameter names: output i is like that parameter;
            a callable with the function's signature: the fake implementation itself
            (return ``torch.empty(...)``/``empty_like`` tensors of the right metadata).
        setup_context_fn: ``setup_context_fn(ctx, inputs, output)``, saves what the backward
            needs (``ctx.save_for_backward(...)``). Requires ``backward_fn``.
        backward_fn: ``backward_fn(ctx, *grad_outputs)``, returns one gradient per parameter
            (``None`` for non-tensor or non-differentiable ones).
        is_compute_sensitive: the outputs are expensive to recompute (matmul- or
            attention-like); the recompute planner saves them.
        is_subgraph_boundary: cut the compiled graph at every call: the pieces before and after
            are compiled (and later CUDA-graphed) separately and the operator runs as is
            between them.

    Returns:
        The operator (a ``torch.library.CustomOpDef``), callable like the function.

    Raises:
        TypeError: a parameter or the return has an annotation an operator schema cannot
            express (the message names it and what to use instead), or an argument of this
            decorator has the wrong type.
        ValueError: ``infer_output_meta_fn`` names an unknown or non-tensor parameter, or the
            function has too few tensor parameters to shape its outputs; ``mutates_args`` names
            an unknown or non-tensor parameter; ``setup_context_fn`` is given without
            ``backward_fn``; the operator name is malformed or already registered.
    """
    if callable(name) and not isinstance(name, str):  # used bare: @magi_register_custom_op
        return magi_register_custom_op()(name)
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"magi_register_custom_op: name must be a string 'namespace::op_name', got "
            f"{type(name).__name__}"
        )
    if isinstance(mutates_args, str):
        raise TypeError(
            f"magi_register_custom_op: mutates_args must be a tuple of parameter names, got the "
            f"string {mutates_args!r}; write mutates_args=({mutates_args!r},)"
        )
    mutates_args = tuple(mutates_args)
    if setup_context_fn is not None and backward_fn is None:
        raise ValueError(
            "magi_register_custom_op: setup_context_fn is given without backward_fn; it only "
            "saves values for a backward, so pass backward_fn=... too (or drop setup_context_fn)"
        )
    for arg, value in (("setup_context_fn", setup_context_fn), ("backward_fn", backward_fn)):
        if value is not None and not callable(value):
            raise TypeError(
                f"magi_register_custom_op: {arg} must be a function, got {type(value).__name__}"
            )
    if not (
        infer_output_meta_fn is None
        or callable(infer_output_meta_fn)
        or (
            isinstance(infer_output_meta_fn, (list, tuple))
            and all(isinstance(n, str) for n in infer_output_meta_fn)
        )
    ):
        raise TypeError(
            "magi_register_custom_op: infer_output_meta_fn must be None, a list of parameter "
            f"names or a function, got {infer_output_meta_fn!r}"
        )

    def decorator(fn: Callable) -> Any:
        if not inspect.isfunction(fn):
            raise TypeError(
                f"magi_register_custom_op decorates a function, got {type(fn).__name__}"
            )
        qualname = _operator_name(name, fn)
        where = f"magi_register_custom_op({qualname!r})"
        sig = inspect.signature(fn)
        params = _parameter_types(fn, sig, where)
        return_annotation, returns = _return_types(fn, sig, where)
        tensor_params = [p for p, t in params.items() if _is_tensor(t)]
        for arg in mutates_args:
            if arg not in params:
                raise ValueError(
                    f"{where}: mutates_args names {arg!r}, which is not a parameter; parameters: "
                    f"{', '.join(params)}"
                )
            if not (_is_tensor(params[arg]) or _is_tensor_list(params[arg])):
                raise ValueError(
                    f"{where}: mutates_args names {arg!r}, which is not a tensor parameter; only "
                    "tensors can be written in place"
                )

        if callable(infer_output_meta_fn):
            fake, impl = infer_output_meta_fn, fn
        else:
            like = _output_templates(infer_output_meta_fn, params, tensor_params, returns, where)
            as_tuple = typing.get_origin(return_annotation) is tuple
            fake = _fake_like(sig, like, as_tuple)
            impl = _impl_checked_against(fn, sig, like, as_tuple, qualname)

        if _is_registered(qualname):
            raise ValueError(
                f"{where}: an operator of this name is already registered; register each "
                "operator once, or choose another name"
            )
        # The schema comes from the resolved annotations, so string annotations that torch could
        # not evaluate on its own (a bare "Tensor") work too.
        prototype = _prototype(sig, params, return_annotation)
        schema = torch.library.infer_schema(prototype, mutates_args=mutates_args)
        op = torch.library.custom_op(qualname, impl, mutates_args=mutates_args, schema=schema)
        op.register_fake(fake)
        if backward_fn is not None:
            op.register_autograd(backward_fn, setup_context=setup_context_fn)
        _C.set_op_flags(
            qualname,
            compute_sensitive=bool(is_compute_sensitive),
            subgraph_boundary=bool(is_subgraph_boundary),
        )
        _registered[qualname] = "|".join(
            [
                str(schema),
                f"boundary={bool(is_subgraph_boundary)}",
                f"compute_sensitive={bool(is_compute_sensitive)}",
                *(_source_hash(f) for f in (fn, fake, backward_fn, setup_context_fn)),
            ]
        )
        return op

    return decorator


# What each operator registered in this process is (schema, flags, a hash of the source of its
# functions): part of the compiled-module cache's key (_compile_cache.py), so that changing an
# operator's code or flags is a miss.
_registered: dict[str, str] = {}


def _source_hash(fn: Callable | None) -> str:
    if fn is None:
        return "-"
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        text = repr(getattr(fn, "__code__", fn))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def registry_fingerprint() -> str:
    """One hash over every operator registered so far."""
    text = "\n".join(f"{name}={what}" for name, what in sorted(_registered.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- names and annotations --------------------------------------------------------------------


def _sanitize(text: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return "_" + text if not text or text[0].isdigit() else text


def _operator_name(name: str | None, fn: Callable) -> str:
    if name is None:
        source = inspect.getsourcefile(fn) or fn.__code__.co_filename
        return f"{_sanitize(Path(source).stem)}::{_sanitize(fn.__name__)}"
    namespace, sep, op_name = name.partition("::")
    if not sep or not namespace or not op_name or "::" in op_name or "." in op_name:
        raise ValueError(
            f"magi_register_custom_op: name {name!r} is not of the form 'namespace::op_name' "
            "(e.g. 'athena::flash_attn')"
        )
    for part in (namespace, op_name):
        if not part.isidentifier():
            raise ValueError(
                f"magi_register_custom_op: {part!r} in name {name!r} is not a valid identifier"
            )
    return name


def _is_registered(qualname: str) -> bool:
    namespace, _, op_name = qualname.partition("::")
    try:
        getattr(getattr(torch.ops, namespace), op_name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _resolve(annotation: Any, fn: Callable) -> Any:
    """A string annotation (``from __future__ import annotations``) evaluated in the function's
    module, also inside generics (``list["torch.Tensor"]``)."""
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if isinstance(annotation, str):
        scope = {**_ANNOTATION_FALLBACKS, **fn.__globals__}
        return eval(annotation, scope)  # noqa: S307 - the user's own annotation
    origin = typing.get_origin(annotation)
    unresolved = (str, typing.ForwardRef)
    if origin is not None and any(isinstance(a, unresolved) for a in typing.get_args(annotation)):
        args = tuple(_resolve(a, fn) for a in typing.get_args(annotation))
        if origin is typing.Union:
            return typing.Union[args]  # noqa: UP007
        return typing.get_origin(annotation)[args]  # type: ignore[index]
    return annotation


def _describe(annotation: Any) -> str:
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        module = annotation.__module__
        return (
            annotation.__qualname__
            if module == "builtins"
            else f"{module}.{annotation.__qualname__}"
        )
    return repr(annotation)


def _prototype(sig: inspect.Signature, params: dict[str, Any], return_annotation: Any) -> Callable:
    """A stand-in with the function's signature and resolved annotations, for infer_schema."""

    def prototype() -> None:
        pass

    prototype.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(annotation=params[n]) for n, p in sig.parameters.items()],
        return_annotation=return_annotation,
    )
    return prototype


def _parameter_types(fn: Callable, sig: inspect.Signature, where: str) -> dict[str, Any]:
    types: dict[str, Any] = {}
    for pname, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"{where}: parameter {pname!r} is {p.kind.description}; an operator takes named "
                "parameters only (no *args, **kwargs or positional-only parameters)"
            )
        if p.annotation is inspect.Parameter.empty:
            raise TypeError(
                f"{where}: parameter {pname!r} has no type annotation; annotate it with one of "
                f"{_PARAM_TYPES_HINT}"
            )
        try:
            annotation = _resolve(p.annotation, fn)
        except Exception as e:
            raise TypeError(
                f"{where}: the annotation {p.annotation!r} of parameter {pname!r} cannot be "
                f"evaluated ({e}); use one of {_PARAM_TYPES_HINT}"
            ) from None
        if annotation not in SUPPORTED_PARAM_TYPES:
            instead = _PARAM_TYPES_HINT
            if typing.get_origin(annotation) is tuple:
                instead = "a list (list[torch.Tensor], list[int], ...) instead of a tuple"
            elif typing.get_origin(annotation) is dict or annotation is dict:
                instead = "one parameter per entry instead of a dict"
            raise TypeError(
                f"{where}: parameter {pname!r} is annotated {_describe(annotation)}, which an "
                f"operator schema cannot express; use {instead}"
            )
        types[pname] = annotation
    return types


def _return_types(fn: Callable, sig: inspect.Signature, where: str) -> tuple[Any, list[Any] | None]:
    """The resolved return annotation, and the types of the outputs: a list, or None when their
    number is only known at run time (``list[Tensor]``)."""
    annotation = sig.return_annotation
    if annotation is inspect.Signature.empty:
        raise TypeError(
            f"{where}: the function has no return annotation; add one: {_RETURN_TYPES_HINT}"
        )
    try:
        annotation = _resolve(annotation, fn)
    except Exception as e:
        raise TypeError(
            f"{where}: the return annotation {sig.return_annotation!r} cannot be evaluated ({e})"
        ) from None
    if annotation is None or annotation is type(None):
        return None, []
    items = typing.get_args(annotation) if typing.get_origin(annotation) is tuple else None
    if items is not None and Ellipsis not in items and items:
        bad = [t for t in items if t not in SUPPORTED_RETURN_TYPES or _is_tensor_list(t)]
        if not bad:
            return annotation, list(items)
    elif items is None and annotation in SUPPORTED_RETURN_TYPES:
        return annotation, None if _is_tensor_list(annotation) else [annotation]
    raise TypeError(
        f"{where}: the return annotation {_describe(annotation)} cannot be expressed by an "
        f"operator schema; use {_RETURN_TYPES_HINT}"
    )


def _is_tensor(t: Any) -> bool:
    return t is torch.Tensor or t == (torch.Tensor | None)


def _is_tensor_list(t: Any) -> bool:
    return typing.get_origin(t) in (list, collections.abc.Sequence) and any(
        _is_tensor(a) for a in typing.get_args(t)
    )


# --- output metadata --------------------------------------------------------------------------


def _output_templates(
    names: Sequence[str] | None,
    params: dict[str, Any],
    tensor_params: list[str],
    returns: list[Any] | None,
    where: str,
) -> list[str]:
    """The parameter each tensor output is shaped like."""
    if returns is None:
        raise ValueError(
            f"{where}: the function returns list[torch.Tensor], whose length is only known when "
            "it runs; pass infer_output_meta_fn as a function returning the fake outputs"
        )
    if any(t is not torch.Tensor for t in returns):
        raise ValueError(
            f"{where}: outputs other than tensors cannot be shaped like parameters; pass "
            "infer_output_meta_fn as a function returning the fake outputs"
        )
    if names is None:
        plain = [p for p in tensor_params if params[p] is torch.Tensor]
        if len(plain) < len(returns):
            raise ValueError(
                f"{where}: the function returns {len(returns)} tensor(s) but has only "
                f"{len(plain)} tensor parameter(s) ({', '.join(plain) or 'none'}) to shape them "
                "like; pass infer_output_meta_fn=[parameter names] or a function"
            )
        return plain[: len(returns)]
    names = list(names)
    for n in names:
        if n not in params:
            raise ValueError(
                f"{where}: infer_output_meta_fn names {n!r}, which is not a parameter; "
                f"parameters: {', '.join(params)}"
            )
        if n not in tensor_params:
            raise ValueError(
                f"{where}: infer_output_meta_fn names {n!r}, which is not a tensor parameter "
                f"(it is {_describe(params[n])})"
            )
    if len(names) != len(returns):
        raise ValueError(
            f"{where}: infer_output_meta_fn names {len(names)} parameter(s) but the return "
            f"annotation declares {len(returns)} output(s)"
        )
    return names


def _fake_like(sig: inspect.Signature, like: list[str], as_tuple: bool) -> Callable:
    """Outputs shaped like the parameters named in ``like`` (None when there are none)."""

    def fake(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        outputs = [torch.empty_like(bound.arguments[n]) for n in like]
        if not outputs:
            return None
        return tuple(outputs) if as_tuple else outputs[0]

    return fake


def _impl_checked_against(
    fn: Callable, sig: inspect.Signature, like: list[str], as_tuple: bool, qualname: str
) -> Callable:
    """``fn``, with its outputs checked against the metadata tracing was promised: a wrong
    shape, dtype or device is an error here rather than a wrong result later, and an output
    laid out differently from ``empty_like(template)`` (which the compiled graph assumes) is
    copied into that layout."""
    if not like:
        return fn

    def impl(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        outputs = list(result) if as_tuple else [result]
        bound = sig.bind(*args, **kwargs)
        for i, (out, n) in enumerate(zip(outputs, like, strict=True)):
            ref = bound.arguments[n]
            if out.shape != ref.shape or out.dtype != ref.dtype or out.device != ref.device:
                raise RuntimeError(
                    f"custom op {qualname}: output {i} is {out.dtype}{list(out.shape)} on "
                    f"{out.device}, but infer_output_meta_fn says it is like parameter {n!r}: "
                    f"{ref.dtype}{list(ref.shape)} on {ref.device}; fix the function or pass "
                    "infer_output_meta_fn as a function describing the real outputs"
                )
            if not _same_layout(out, ref):
                fixed = torch.empty_like(ref)
                fixed.copy_(out)
                outputs[i] = fixed
        return tuple(outputs) if as_tuple else outputs[0]

    impl.__wrapped__ = fn  # type: ignore[attr-defined]
    impl.__name__ = fn.__name__
    impl.__qualname__ = fn.__qualname__
    impl.__module__ = fn.__module__
    return impl


def _same_layout(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Does ``out`` have the strides ``torch.empty_like(ref)`` would have (ignoring dims of size
    one, whose stride means nothing)?"""
    if ref.is_contiguous():
        if out.is_contiguous():
            return True
        expected = _contiguous_strides(tuple(ref.shape))
    else:
        expected = _empty_like_strides(tuple(ref.shape), ref.stride())
    return all(s == e for s, e, n in zip(out.stride(), expected, out.shape, strict=True) if n > 1)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for n in reversed(shape):
        strides.append(running)
        running *= max(n, 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=256)
def _empty_like_strides(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    ref = torch.empty_strided(shape, stride, device="meta")
    return torch.empty_like(ref).stride()
