"""Which dims of which arguments are dynamic: from ``dynamic_arg_dims`` or, when absent, from
the annotations of the compiled function.

Inference works from resolved annotations (``typing.get_type_hints``), so it also works under
``from __future__ import annotations``, where annotations are strings; if a string cannot be
resolved (a name imported only under ``TYPE_CHECKING``), its text is matched instead.
Parameters annotated ``Tensor``, ``Tensor | None`` or ``Optional[Tensor]`` get the config's
``dynamic_dim_default`` (dim 0 unless changed). When no parameter is annotated as a tensor, that
dim of every tensor argument is dynamic.

Also the calls ``aot=True`` makes to capture ``compile_sizes`` along those dims.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import threading
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Tensor, and the legacy typed names (FloatTensor, LongTensor, ...) Hugging Face annotates with.
_TENSOR_NAME = (
    r"(?:torch\.)?(?:Tensor|(?:Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool)Tensor)"
)
_TENSOR_TEXT = re.compile(
    rf"^\s*(?:Optional\[\s*{_TENSOR_NAME}\s*\]|{_TENSOR_NAME}(?:\s*\|\s*None)?"
    rf"|None\s*\|\s*{_TENSOR_NAME})\s*$"
)


def _is_tensor_annotation(annotation: Any) -> bool:
    if annotation is torch.Tensor or isinstance(annotation, type(torch.FloatTensor)):
        return True
    if isinstance(annotation, str):
        return bool(_TENSOR_TEXT.match(annotation))
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and _is_tensor_annotation(args[0])
    return False


def infer_from_annotations(
    fn: Callable, skip_first: bool, dim: int = 0
) -> dict[str, list[int]] | None:
    """``{param: [dim]}`` for tensor-annotated parameters; None when none is annotated so."""
    params = list(inspect.signature(fn).parameters.values())
    if skip_first:
        params = params[1:]
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable string annotations: fall back to their text
        hints = {}
    dims = {}
    for p in params:
        annotation = hints.get(p.name, p.annotation)
        if annotation is inspect.Parameter.empty:
            continue
        if _is_tensor_annotation(annotation):
            dims[p.name] = [dim]
    return dims or None


def normalise(spec: Any, where: str) -> list[int]:
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple)):
        raise TypeError(f"{where}: expected an int or a list of ints, got {spec!r}")
    if isinstance(spec, int):
        return [spec]
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in spec):
        raise TypeError(f"{where}: expected an int or a list of ints, got {spec!r}")
    return list(spec)


def resolve_path(arguments: dict[str, Any], path: str) -> Any:
    """Value at ``"batch.x"``: attribute (or key) ``x`` of argument ``batch``; None if absent."""
    head, *rest = path.split(".")
    value = arguments.get(head)
    for part in rest:
        if value is None:
            return None
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return value


def unmark_dynamic(t: torch.Tensor, dim: int) -> None:
    """Undoes torch._dynamo.mark_dynamic(t, dim) or maybe_mark_dynamic(t, dim) (the marks live
    on the tensor object)."""
    getattr(t, "_dynamo_dynamic_indices", set()).discard(dim)
    getattr(t, "_dynamo_weak_dynamic_indices", set()).discard(dim)
    ranges = getattr(t, "_dynamo_dynamic_range", None)
    if ranges:
        for r in [r for r in ranges if getattr(r, "dim", None) == dim]:
            ranges.discard(r)


def calls_of_sizes(
    signature: inspect.Signature,
    param_names: list[str],
    args: tuple,
    kwargs: dict,
    values: list[Any],
    dims: list[list[int]],
    sizes: list[int],
) -> list[tuple[tuple, dict]]:
    """The calls that capture ``sizes`` (``aot=True``): this call's arguments with each tensor
    that has dynamic dims replaced by one of that size along them (zeros; ones for integer and
    bool tensors, so token ids and masks stay valid). Empty when no input has a dynamic dim."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    sized = [
        (name, value, value_dims)
        for name, value, value_dims in zip(param_names, values, dims, strict=False)
        if isinstance(value, torch.Tensor) and value_dims
    ]
    if not sized:
        return []
    calls = []
    for size in sorted(set(sizes)):
        arguments = dict(bound.arguments)
        for name, value, value_dims in sized:
            shape = list(value.shape)
            for dim in value_dims:
                shape[dim] = size
            fill = torch.ones if not value.is_floating_point() else torch.zeros
            arguments[name] = fill(shape, dtype=value.dtype, device=value.device)
        call = inspect.BoundArguments(signature, arguments)
        calls.append((call.args, call.kwargs))
    return calls


def shapes(values: list[Any]) -> list[tuple[Any, ...] | None]:
    """(dtype, shape) of each tensor value, None for the others."""
    return [(v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else None for v in values]


def changed_dims(
    earlier: list[list[tuple[Any, ...] | None]],
    now: list[tuple[Any, ...] | None],
    dims: list[list[int]],
) -> list[tuple[int, int, int, int]]:
    """(value index, dim, size before, size now) of the static dims whose size differs from
    the closest earlier capture with the same tensors (dtypes and ranks), sizes 0 and 1 now
    excepted (PyTorch specialises them). Empty when no earlier capture has the same tensors."""
    best: list[tuple[int, int, int, int]] | None = None
    for shapes_before in earlier:
        if len(shapes_before) != len(now):
            continue
        changed = []
        for index, (before, current) in enumerate(zip(shapes_before, now, strict=True)):
            if (before is None) != (current is None):
                break
            if current is None:
                continue
            if before[0] != current[0] or len(before[1]) != len(current[1]):
                break
            for dim, (a, b) in enumerate(zip(before[1], current[1], strict=True)):
                if a != b and b > 1 and dim not in dims[index]:
                    changed.append((index, dim, a, b))
        else:
            if changed and (best is None or len(changed) < len(best)):
                best = changed
    return best or []


def grow(
    earlier: list[list[tuple[Any, ...] | None]],
    values: list[Any],
    dims: list[list[int]],
    names: list[str],
    grown: dict[str, set[int]],
) -> list[list[int]]:
    """Dims of this call's tensors whose size differs from an earlier capture of the same
    dtypes and ranks become dynamic, for this capture and (recorded in ``grown``) every later
    call: an attention mask that grows by a token per generated token would otherwise capture
    once per token."""
    from magi_compiler._logging import logger

    for index, dim, before, now in changed_dims(earlier, shapes(values), dims):
        grown.setdefault(names[index], set()).add(dim)
        dims[index] = sorted(set(dims[index]) | {dim})
        logger.info(
            "dim %d of %r changed size since an earlier capture (%d, now %d): dynamic from now "
            "on (dynamic_arg_dims names dynamic dims up front)",
            dim, names[index], before, now,
        )  # fmt: skip
    return dims


def static_peers(
    names: list[str], values: list[Any], marked: list[list[int]], fixed: list[tuple[str, int]]
) -> str:
    """The static dims of other tensor arguments whose size at this call equals a named dim
    the code fixed (``dim 1 of 'position_ids' (6)``): the likeliest reason, when the code
    relates the two, is that the other one was left static. Sizes 0 and 1 are too common to
    tell anything."""
    index = {name: i for i, name in enumerate(names)}
    found: list[str] = []
    for name, dim in fixed:
        i = index.get(name)
        if i is None or not isinstance(values[i], torch.Tensor) or dim >= values[i].dim():
            continue
        size = values[i].shape[dim]
        if size < 2:
            continue
        for j, other in enumerate(values):
            if not isinstance(other, torch.Tensor):
                continue
            for d, n in enumerate(other.shape):
                if n == size and d not in marked[j] and (j, d) != (i, dim):
                    found.append(f"dim {d} of {names[j]!r} ({n})")
    return ", ".join(dict.fromkeys(found[:3]))


_ints_lock = threading.Lock()
_ints_depth = 0  # calls into Dynamo in progress, all threads
_ints_saved: tuple[Any, ...] = ()
# Where Dynamo reads its rule for which integers stay constants (same function object in each).
_INT_RULE_MODULES = ("torch._dynamo.utils", "torch._dynamo.variables.builder")
_INT_RULE = "is_int_specialization_case"


def _argument_integer(source: Any) -> bool:
    """Whether Dynamo's ``source`` is an argument of the call or an item of one (``n``,
    ``kwargs['n']``, ``sizes[1]``), not an attribute of an object reached from one."""
    from torch._dynamo import source as sources

    while isinstance(source, (sources.GetItemSource, sources.DictGetItemSource)):
        source = source.base
    return isinstance(source, sources.LocalSource) and source.is_input


def _specialising(rule: Callable) -> Callable:
    def is_int_specialization_case(value: Any, source: Any) -> bool:
        return _argument_integer(source) or rule(value, source)

    return is_int_specialization_case


def _swap_int_rule() -> tuple[Any, ...]:
    """Makes integer arguments constants in Dynamo's rule (or, where this torch has no such
    rule, every integer); returns what to put back."""
    import importlib

    modules = [importlib.import_module(name) for name in _INT_RULE_MODULES]
    rules = [getattr(m, _INT_RULE, None) for m in modules]
    if callable(rules[0]) and all(r is rules[0] for r in rules):
        wrapped = _specialising(rules[0])
        for m in modules:
            setattr(m, _INT_RULE, wrapped)
        return ("rule", modules, rules[0])
    saved = torch._dynamo.config.specialize_int
    torch._dynamo.config.specialize_int = True
    return ("config", saved)


def _restore_int_rule(saved: tuple[Any, ...]) -> None:
    if saved[0] == "rule":
        for m in saved[1]:
            setattr(m, _INT_RULE, saved[2])
    else:
        torch._dynamo.config.specialize_int = saved[1]


@contextlib.contextmanager
def integers_specialised() -> Iterator[None]:
    """Integer arguments (and items of list, tuple and dict arguments) stay specialised, each
    value its own capture as the signature has it, while integers Dynamo reads from objects
    (a cache's length counter) follow its automatic dynamic as under torch.compile: constant
    first, symbolic once the value changes. The rule is process-wide: it is in place while any
    call into Dynamo is in progress and put back when the last one, on any thread, returns."""
    global _ints_depth, _ints_saved
    with _ints_lock:
        if _ints_depth == 0:
            _ints_saved = _swap_int_rule()
        _ints_depth += 1
    try:
        yield
    finally:
        with _ints_lock:
            _ints_depth -= 1
            if _ints_depth == 0:
                _restore_int_rule(_ints_saved)
