"""What a failed capture says: our own error in Dynamo's wrapping, the reason to fall back to
eager, and dims marked dynamic that the traced code fixed (api.py)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

from magi_compiler.errors import DeviceError, InternalError, UnsupportedError, UserError

_OURS = (UserError, UnsupportedError, InternalError, DeviceError)


def causes(e: BaseException | None) -> Iterator[BaseException]:
    """``e`` and its chain of causes (Dynamo's ``inner_exception``, else ``__cause__``)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = getattr(e, "inner_exception", None) or e.__cause__


def magi_error(e: BaseException) -> BaseException | None:
    """The first UserError/UnsupportedError/InternalError/DeviceError in `e`'s chain of causes."""
    return next((c for c in causes(e) if isinstance(c, _OURS)), None)


def unsupported_reason(e: BaseException) -> str | None:
    """The reason to fall back to eager, when `e` says the code cannot be compiled."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    data_dependent = (
        GuardOnDataDependentSymNode,
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    for cause in causes(e):
        if isinstance(cause, UnsupportedError):
            return str(cause).strip()
        if isinstance(cause, torch._dynamo.exc.Unsupported):
            return "Dynamo cannot capture it as one graph: " + graph_break(cause)
        if isinstance(cause, data_dependent):
            # Raised while AOTAutograd traces (a custom autograd backward that reads tensor
            # values, say): the trace needs a value known only when the code runs.
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            return (
                "tracing needs a tensor's value, known only at run time "
                f"({type(cause).__name__}: {first}){_user_frame(cause)}"
            )
    return None


def _user_frame(e: BaseException) -> str:
    """' at file:line in function' for the innermost frame of `e`'s traceback outside torch
    and magi_compiler, or ''."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
    for frame in reversed(frames):
        path = frame.filename.replace("\\", "/")
        if "/torch/" not in path and "/magi_compiler/" not in path:
            return f" at {frame.filename}:{frame.lineno} in {frame.name}"
    return ""


_OUR_FILES = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.sep.join(("torch", "nn", "modules", "")),
)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller name the first frame
    outside magi_compiler and torch's module-call machinery: the user's call."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_OUR_FILES[0])
        or _OUR_FILES[1] in frame.f_code.co_filename
    ):
        frame, level = frame.f_back, level + 1
    return level


def recompile_limit_hit(e: BaseException) -> bool:
    """Whether Dynamo refused a capture for its limit of captures per code object."""
    return any(
        isinstance(c, torch._dynamo.exc.FailOnRecompileLimitHit)
        or (isinstance(c, torch._dynamo.exc.Unsupported) and "recompile limit" in str(c))
        for c in causes(e)
    )


def graph_break(e: BaseException) -> str:
    """What broke Dynamo's graph and where in the user's code: Dynamo's first line, its
    explanation, and the innermost user frame of the trace (file:line, function, source)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    explanation = next((ln for ln in lines if ln.startswith("Explanation:")), "")
    if explanation:
        text += f" ({explanation[len('Explanation:') :].strip()})"
    stack = getattr(e, "real_stack", None)
    if stack:
        frame = stack[-1]
        text += f" at {frame.filename}:{frame.lineno} in {frame.name}"
        if frame.line:
            text += f": `{frame.line.strip()}`"
    return text


SPECIALISED = re.compile(
    r"You marked L\['([A-Za-z_][A-Za-z0-9_]*)'\]\.size\(\)\[(\d+)\] as dynamic"
)


def constraint_violation(e: BaseException) -> ConstraintViolationError | None:
    """The ConstraintViolationError in `e`'s chain of causes, if any: dims marked dynamic that
    the traced code fixed."""
    return next((c for c in causes(e) if isinstance(c, ConstraintViolationError)), None)


def fixed_dim_error(
    tag: str,
    violation: ConstraintViolationError,
    frame: Any,
    names: list[str],
    values: list[Any],
    marked: list[list[int]],
) -> ValueError:
    """The error for dims named in dynamic_arg_dims that the traced code fixed: which, the
    static dims of other arguments they equal (the likeliest cause), and Dynamo's words.
    ``frame``: the entry's CallFrame (a wrapped forward's sources read as its parameters)."""
    from magi_compiler import _dynamic_dims

    text = str(violation)
    text = (frame.to_bound(text) if frame is not None else None) or text
    fixed = [(name, int(dim)) for name, dim in SPECIALISED.findall(text)]
    # Paths ("batch.x") and other sources are not parsed: Dynamo's words then name them.
    listed = ", ".join(f"dim {d} of {n!r}" for n, d in fixed) or "a dim"
    peers = _dynamic_dims.static_peers(names, values, marked, fixed)
    hint = (
        f"; its size equals {peers}, which {'is' if ',' not in peers else 'are'} static: "
        "if they always match, name those dims in dynamic_arg_dims too, else"
        if peers
        else ";"
    )
    first = str(violation).strip().splitlines()[0]
    return ValueError(
        f"{tag}: dynamic_arg_dims marks {listed} dynamic, but the code fixes its size (e.g. a "
        f"weight whose rows must match another tensor){hint} leave it out of dynamic_arg_dims "
        f"(Dynamo: {first})"
    )
