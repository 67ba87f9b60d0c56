"""How the frame Dynamo traces relates to the parameters a call binds to.

Dynamo traces the compiled function's own code object: its guards and the sources of its
graph's inputs name that frame's locals (``L['x']``). Calls are bound to the function's
signature as ``inspect.signature`` reports it, which follows ``__wrapped__``. The two are the
same for an undecorated function. For a forward wrapped by a decorator that takes
``(self, *args, **kwargs)`` (Hugging Face's ``can_return_tuple`` and ``check_model_inputs``)
the signature is the inner forward's (``input_ids``, ``attention_mask``, ...) while the frame
holds ``self``, the tuple ``args`` and the dict ``kwargs``, and a source reads
``L['kwargs']['input_ids']`` or ``L['args'][0]``.

A :class:`CallFrame` says which of the two a function is, and for the second (the varargs
form) rewrites the frame's sources into the bound parameters they name:
``L['kwargs']['input_ids']`` and, when ``input_ids`` is the first parameter after ``self``,
``L['args'][0]`` both become ``L['input_ids']``. That holds on every call whose frame passes
the guards of the cache entry the sources came from: those guards read the item, so it exists,
and Python binds it to that parameter (a call that passes it twice raises before any frame
runs). What the rewrite loses is the call's form, positional or keyword: the direct call
builds the frame for the guards from the call as Python does (the positional arguments after
the owner as ``args``, a copy of the keywords as ``kwargs``) and keys reused verdicts by the
form as well (direct_call.cpp).

Other layouts (named parameters besides the owner before ``*args``, keyword-only parameters,
or parameters that differ from the signature's) get no direct path.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

_CO_VARARGS, _CO_VARKEYWORDS = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS
_P = inspect.Parameter
# A frame local, optionally followed by one item read from it (a keyword or a position).
_LOCAL_ITEM = re.compile(
    r"L\['([A-Za-z_][A-Za-z0-9_]*)'\](?:\[(?:'([A-Za-z_][A-Za-z0-9_]*)'|(\d+))\])?"
)


def own_parameters(fn: Callable) -> list[tuple[str, Any]]:
    """(name, kind) of each parameter of ``fn``'s code object: the frame's first locals."""
    code = fn.__code__
    names = code.co_varnames
    n, kwonly = code.co_argcount, code.co_kwonlyargcount
    params = [
        (names[i], _P.POSITIONAL_ONLY if i < code.co_posonlyargcount else _P.POSITIONAL_OR_KEYWORD)
        for i in range(n)
    ]
    params += [(names[n + i], _P.KEYWORD_ONLY) for i in range(kwonly)]
    rest = n + kwonly
    if code.co_flags & _CO_VARARGS:
        params.append((names[rest], _P.VAR_POSITIONAL))
        rest += 1
    if code.co_flags & _CO_VARKEYWORDS:
        params.append((names[rest], _P.VAR_KEYWORD))
    return params


def parameter_source(name: str, kind: Any) -> str:
    """How a parameter of this kind is written in a parameter list (no default)."""
    if kind is _P.VAR_POSITIONAL:
        return f"*{name}"
    if kind is _P.VAR_KEYWORD:
        return f"**{name}"
    return name


def _same_defaults(fn: Callable, bound: list[inspect.Parameter]) -> bool:
    """Whether ``fn``'s own defaults are the objects the signature reports."""
    positional = [
        p.default
        for p in bound
        if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD) and p.default is not _P.empty
    ]
    own = fn.__defaults__ or ()
    if len(own) != len(positional) or any(a is not b for a, b in zip(own, positional, strict=True)):
        return False
    kw = fn.__kwdefaults__ or {}
    return all(kw.get(p.name, _P.empty) is p.default for p in bound if p.kind is _P.KEYWORD_ONLY)


class CallFrame:
    """The frame of one compiled function against its bound parameters (see the module's
    docstring). ``names``: the bound parameters, the owner first for a method. In the varargs
    form, ``owner`` is the frame's name for the owner (None when a method's owner arrives as
    ``args[0]``, or for a function), ``args`` and ``kwargs`` the names of ``*args`` and
    ``**kwargs`` (``kwargs`` None when the frame takes none)."""

    def __init__(
        self,
        names: list[str],
        var_keyword: str | None,
        method: bool,
        varargs: tuple[str | None, str, str | None] | None = None,
    ):
        self.names = names
        self.var_keyword = var_keyword  # the bound **kwargs parameter, if any
        self.method = method
        self.varargs = varargs is not None
        self.owner, self.args, self.kwargs = varargs or (None, "", None)
        self.positional = [n for n in names if n != var_keyword]
        # The index in ``positional`` of the parameter args[0] binds to: the owner's for a
        # method whose frame does not name it.
        self.lead = 1 if self.owner is not None else 0

    @classmethod
    def of(cls, fn: Callable, method: bool) -> tuple[CallFrame | None, str]:
        """The CallFrame of ``fn`` (a method when ``method``), or (None, why there is none)."""
        code = getattr(fn, "__code__", None)
        if code is None:
            return None, f"{fn!r} has no code object"
        try:
            bound = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError) as e:
            return None, f"no signature: {e}"
        own = own_parameters(fn)
        var_keyword = next((p.name for p in bound if p.kind is _P.VAR_KEYWORD), None)
        names = [p.name for p in bound]
        if own == [(p.name, p.kind) for p in bound]:
            if not _same_defaults(fn, bound):
                return None, "the function's defaults differ from its signature's"
            return cls(names, var_keyword, method), ""
        kinds = [kind for _, kind in own]
        lead = 1 if kinds[:1] in ([_P.POSITIONAL_OR_KEYWORD], [_P.POSITIONAL_ONLY]) else 0
        shape = kinds[lead:]
        if shape not in ([_P.VAR_POSITIONAL], [_P.VAR_POSITIONAL, _P.VAR_KEYWORD]) or (
            lead and not method
        ):
            return None, (
                "the traced frame's parameters ("
                + ", ".join(name for name, _ in own)
                + ") are neither the signature's nor (self, *args, **kwargs)"
            )
        if any(p.kind in (_P.VAR_POSITIONAL, _P.KEYWORD_ONLY) for p in bound):
            return None, "the wrapped signature has *args or keyword-only parameters"
        if method and not bound:
            return None, "the wrapped signature has no owner parameter"
        if fn.__defaults__:
            return None, "the traced frame's owner parameter has a default"
        varargs = (
            own[0][0] if lead else None,
            own[lead][0],
            own[lead + 1][0] if len(shape) == 2 else None,
        )
        return cls(names, var_keyword, method, varargs), ""

    # --- sources ----------------------------------------------------------------------------
    def to_bound(self, text: str) -> str | None:
        """``text`` (a source, or a guard's code) with each reference to the frame's locals
        rewritten to the bound parameter it reads; None when one reads the call's form itself
        (``L['args']`` or ``L['kwargs']`` as a whole)."""
        if not self.varargs:
            return text
        failed = False

        def rewrite(m: re.Match) -> str:
            nonlocal failed
            local, key, index = m[1], m[2], m[3]
            if local == self.owner:
                return f"L['{self.names[0]}']" + m[0][len(f"L['{local}']") :]
            if local not in (self.args, self.kwargs):
                return m[0]  # a closure cell
            name = self._parameter(local, key if index is None else int(index))
            if name is None:
                failed = True
                return m[0]
            if name == self.var_keyword:  # a keyword no parameter names: held there
                return f"L['{name}']['{key}']"
            return f"L['{name}']"

        out = _LOCAL_ITEM.sub(rewrite, text)
        return None if failed else out

    def _parameter(self, local: str, item: str | int | None) -> str | None:
        """The bound parameter that ``local[item]`` of the frame is (``local`` its ``*args`` or
        ``**kwargs``): a named one, or for a keyword no parameter names, the bound ``**kwargs``
        (it holds that keyword)."""
        if local == self.args and isinstance(item, int):
            j = item + self.lead
            return self.positional[j] if j < len(self.positional) else None
        if local == self.kwargs and isinstance(item, str):
            if item in self.positional[1 if self.method else 0 :]:
                return item
            if item not in self.names and self.var_keyword is not None:
                return self.var_keyword
        return None

    def bound_index(self, local: str, item: str | int) -> int | None:
        """The index in ``names`` of the named parameter that the frame's ``local[item]`` is
        (``local`` its ``*args`` or ``**kwargs``), or None."""
        name = self._parameter(local, item)
        return None if name is None or name == self.var_keyword else self.names.index(name)

    def owner_of(self, frame: dict[str, Any]) -> Any:
        """The owner in the frame's locals ``frame`` (a method's)."""
        if self.owner is not None:
            return frame[self.owner]
        if self.varargs:
            return frame[self.args][0]
        return frame[self.names[0]]

    def native_spec(self) -> tuple[str | None, str, str | None] | None:
        """How ``_C.DirectCall`` builds the frame from the call: None for the bound
        parameters themselves, else (owner's name or None, ``*args``'s, ``**kwargs``'s or
        None)."""
        return (self.owner, self.args, self.kwargs) if self.varargs else None
