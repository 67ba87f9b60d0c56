"""Direct dispatch: calls that match a captured inference signature skip Dynamo and AOTAutograd.

Once an entry is captured, each call would still pass through Dynamo's guard evaluation and
AOTAutograd's runtime wrappers before it reaches the C++ runtime: tens of microseconds of
Python per call, most of a small-batch step's time under CUDA graphs. For inference graphs
(grad mode off) this module builds, per captured signature and module instance, a generated
function that gathers the graph's inputs straight from the call's arguments (parameters and
buffers through their modules' dicts) and calls the compiled graph with them.

A (signature, instance) pair gets a direct path only after one ordinary call through Dynamo
that passed Dynamo's guards for this instance, with grad mode and autocast off, and that
  - ran exactly one compiled inference graph, with exactly the inputs the generated function
    gathers (the same tensor objects and the same integers, checked one by one);
  - returned that graph's outputs unchanged (one tensor, or a tuple or list of them);
  - was captured without Python side effects (Dynamo recorded no attribute or container
    mutation to replay).
Direct calls check the compact guard signature (dtype, device, rank, static sizes, layout,
requires_grad of the arguments; grad mode, autocast, module.training) and then the guards of
the Dynamo cache entry the learning call ran (sizes the code branched on, the same tensor passed
twice, values of tuples and other arguments, parameters' dtypes and shapes, hooks; a few
microseconds, evaluated in C++ by Dynamo's guard manager; the C++ direct call reuses their
verdict while nothing they read moved, _guard_watch.py). A call that fails them is an ordinary
call. Parameters and buffers are read from their modules' dicts on every call (again only
when a dict's version tag moved); replacing a submodule they are read through
(``model.layers[0] = other``) is seen the same way (``_C.Routes``) and drops every direct path,
so the next call goes through Dynamo again. No global hook is installed: code that never calls
a compiled module is untouched. ``CompileConfig.fast_dispatch=False`` turns this off. See
docs/api.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from magi_compiler import _call_frame, _guard_watch
from magi_compiler._call_frame import CallFrame
from magi_compiler._logging import logger

# --- observing one ordinary call -----------------------------------------------------------
_observed = threading.local()


class Observation:
    """What the compiled graphs saw during one ordinary call: (run, inputs, outputs) each.
    Observations nest (a graph may run a custom op that calls another compiled entry)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable, list[Any], list[Any] | None]] = []
        self.outer: Observation | None = None

    def __enter__(self) -> Observation:
        self.outer = getattr(_observed, "current", None)
        _observed.current = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _observed.current = self.outer


def observe_inputs(run: Callable, args: list[Any]) -> tuple[Observation, int] | None:
    """Called by each compiled graph before it runs; returns where its outputs go."""
    obs = getattr(_observed, "current", None)
    if obs is None:
        return None
    obs.calls.append((run, list(args), None))
    return obs, len(obs.calls) - 1


def observe_outputs(slot: tuple[Observation, int], outputs: list[Any]) -> None:
    obs, i = slot
    run, args, _ = obs.calls[i]
    obs.calls[i] = (run, args, outputs)


def dynamo_guards(fn: Callable, frame_locals: dict[str, Any]) -> Any | None:
    """The guard manager of the Dynamo cache entry of ``fn`` a call with these locals runs
    (the first whose guards pass, Dynamo's own order: entries installed from the
    compiled-module cache, then captured ones), or None."""
    try:
        from torch._C._dynamo.eval_frame import _debug_get_precompile_entries
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = [
            *_debug_get_precompile_entries(fn.__code__),
            *_debug_get_cache_entry_list(fn.__code__),
        ]
        for entry in entries:
            manager = getattr(entry, "guard_manager", None)
            if manager is not None and manager.check(frame_locals):
                return manager
    except Exception:  # noqa: BLE001 - an internal API: without it, no direct path
        return None
    return None


# --- the generated gatherer ----------------------------------------------------------------
_LOCAL = re.compile(r"\bL\['([A-Za-z_][A-Za-z0-9_]*)'\]")
# A source reading a module's parameter or buffer dict: (dict expression, "['name']").
MODULE_STATE = re.compile(r"^(.*\._(?:parameters|buffers))(\['[^']*'\])$")


def _owned_entry(expr: str, owner_name: str | None) -> tuple[str, str] | None:
    """(dict expression, "['name']") when ``expr`` (a source with ``L[...]`` rewritten to
    names) reads a parameter or buffer dict of a module reached from ``owner_name``."""
    owned = MODULE_STATE.match(expr)
    if owned and owner_name and re.match(rf"{owner_name}\b", expr):
        return owned[1], owned[2]
    return None


class DirectPath:
    """One (signature, instance) pair's direct call: gather inputs, check the signature and
    Dynamo's guards, run, rebuild the result. ``native`` does the same in C++
    (``_C.DirectCall``, keyword arguments bound by the owner's ``_C.DirectEntry``), when every
    input's source is an argument, an item of a tuple argument, a size of one or a parameter
    or buffer of the module; else None. ``routes`` (``_C.Routes``) says whether the submodules
    the gatherer reads parameters through are still the ones it was built with."""

    def __init__(
        self,
        signature: Any,
        guards: Any,
        gather: Callable,
        run: Callable,
        rebuild: Callable,
        native: Any,
        routes: Any,
        through: list[int] = (),
    ):
        self.signature = signature
        self.guards = guards  # the Dynamo cache entry's guard manager
        self.gather = gather  # (*args, **kwargs) -> (guard values, graph inputs, frame locals)
        self.run = run
        self.rebuild = rebuild
        self.native = native
        self.routes = routes
        self.through = list(through)  # graph inputs rebuild takes after the outputs

    def result(self, inputs: list[Any]) -> Any:
        """Runs the graph on ``inputs`` and rebuilds the call's result."""
        through = [inputs[j] for j in self.through]  # before the run, which may consume them
        outputs = self.run(inputs)
        return self.rebuild([*outputs, *through] if through else outputs)


_SUBMODULE = re.compile(r"\._modules\['([^']*)'\]")


def module_routes(containers: list[str], namespace: dict[str, Any]) -> Any:
    """The ``_C.Routes`` of the parameter and buffer dicts named by ``containers`` (expressions
    such as ``self._modules['layers']._modules['0']._parameters``): each module on the way,
    the name read in its ``_modules`` and the submodule found there now."""
    from magi_compiler import _C

    steps: dict[tuple[int, str], tuple[Any, str, Any]] = {}
    for container in containers:
        for m in _SUBMODULE.finditer(container):
            parent = eval(container[: m.start()], namespace)  # noqa: S307 - our text
            table = getattr(parent, "__dict__", {}).get("_modules")
            if isinstance(table, dict) and (id(parent), m[1]) not in steps:
                steps[id(parent), m[1]] = (parent, m[1], table.get(m[1]))
    return _C.Routes(list(steps.values()))


def parameter_layout(fn: Callable, skip_first: bool) -> tuple[list[str], list[Any], int] | None:
    """How a call binds to ``fn``'s parameters (after the owner when ``skip_first``): names,
    defaults (``inspect.Parameter.empty`` where none) and the index of ``**kwargs`` (-1); None
    for a function with ``*args`` or keyword-only parameters (those calls are bound in Python)."""
    params = list(inspect.signature(fn).parameters.values())[1 if skip_first else 0 :]
    names, defaults, var_keyword = [], [], -1
    for i, p in enumerate(params):
        if p.kind in (p.VAR_POSITIONAL, p.KEYWORD_ONLY):
            return None
        if p.kind is p.VAR_KEYWORD:
            var_keyword = i
        names.append(p.name)
        defaults.append(p.default)
    return names, defaults, var_keyword


def _parameter_text(params: list[inspect.Parameter]) -> str | None:
    """A parameter list as source text (defaults set afterwards, _set_defaults), or None when
    it takes *args."""
    parts, positional_only, star = [], False, False
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return None
        if p.kind is p.VAR_KEYWORD:
            if positional_only:
                parts.append("/")
                positional_only = False
            parts.append(f"**{p.name}")
            continue
        if p.kind is p.POSITIONAL_ONLY:
            positional_only = True
        elif positional_only:
            parts.append("/")
            positional_only = False
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}=None")
    if positional_only:
        parts.append("/")
    return ", ".join(parts)


def _set_defaults(fn: Callable, params: list[inspect.Parameter]) -> None:
    """Gives ``fn`` (made from ``_parameter_text(params)``) the defaults of ``params``."""
    fn.__defaults__ = (
        tuple(
            p.default
            for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is not p.empty
        )
        or None
    )
    fn.__kwdefaults__ = {
        p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
    } or None


def build_gatherer(
    fn: Callable,
    guard_names: list[str],
    sources: list[str],
    owner_name: str | None,
    bound: dict[str, Any],
    frame: CallFrame,
) -> tuple[Callable | None, str]:
    """A function taking ``fn``'s arguments and returning ``(guard values, graph inputs,
    frame locals)``; the inputs are Dynamo's source expressions (rewritten to the bound
    parameters they read, ``frame``), with the parameter and buffer dicts of modules reached
    from ``owner_name`` looked up once now (from ``bound``, this call's arguments). The frame
    locals are what Dynamo's guards read. Returns (None, why) when the sources cannot be turned
    into code."""
    params = list(inspect.signature(fn).parameters.values())
    text = _parameter_text(params)
    if text is None:
        return None, "the function takes *args"
    namespace: dict[str, Any] = {"__magi_G": fn.__globals__}
    containers: dict[str, str] = {}  # container expression -> its name in the namespace
    items = []
    for source in sources:
        rewritten = frame.to_bound(source)
        if rewritten is None:
            return None, f"input source {source} reads the call's *args or **kwargs whole"
        expr = _LOCAL.sub(r"\1", rewritten).replace("G[", "__magi_G[")
        owned = _owned_entry(expr, owner_name)
        if owned:
            container, key = owned
            if container not in containers:
                try:
                    value = eval(container, {**namespace, **bound})  # noqa: S307 - our text
                except Exception as e:  # noqa: BLE001 - any failure: no direct path
                    return None, f"cannot evaluate {container}: {e}"
                if not isinstance(value, dict):
                    return None, f"{container} is not a dict"
                containers[container] = f"__magi_c{len(containers)}"
                namespace[containers[container]] = value
            expr = containers[container] + key
        items.append(expr)
    # The frame's locals as Dynamo's guards read them: the arguments (in the varargs form, the
    # call's positional arguments and keywords as Python binds them), and the closure's cells
    # (``__class__`` for a method that calls super()).
    own = _call_frame.own_parameters(fn)
    entries = [f"{name!r}: {name}" for name, _ in own]
    for i, (name, cell) in enumerate(
        zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False)
    ):
        namespace[f"__magi_cell{i}"] = cell
        entries.append(f"{name!r}: __magi_cell{i}.cell_contents")
    locals_ = f"{{{', '.join(entries)}}}"
    values = f"[{', '.join(guard_names)}], [{', '.join(items)}]"
    if frame.varargs:
        own_text = ", ".join(_call_frame.parameter_source(name, kind) for name, kind in own)
        code = (
            f"def __magi_values({text}):\n    return {values}\n"
            f"def __magi_frame({own_text}):\n    return {locals_}\n"
        )
    else:
        code = f"def __magi_gather({text}):\n    return {values}, {locals_}\n"
    try:
        exec(compile(code, f"<magi gather for {fn.__qualname__}>", "exec"), namespace)  # noqa: S102
    except SyntaxError as e:
        return None, f"generated gatherer does not compile: {e}"
    # Taken out of the namespace, which is their globals: a function and the dict holding it
    # would be a reference cycle, and the parameter dicts in the namespace (a module's weights)
    # would outlive the module until a second garbage collection.
    if frame.varargs:
        values_of, frame_of = namespace.pop("__magi_values"), namespace.pop("__magi_frame")
        _set_defaults(values_of, params)

        def gather(*args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], dict[str, Any]]:
            guard_values, inputs = values_of(*args, **kwargs)
            return guard_values, inputs, frame_of(*args, **kwargs)

    else:
        gather = namespace.pop("__magi_gather")
        _set_defaults(gather, params)
    gather.magi_routes = module_routes(list(containers), {**namespace, **bound})
    return gather, ""


_ARG = re.compile(r"^L\['([A-Za-z_][A-Za-z0-9_]*)'\]$")
_ARG_SIZE = re.compile(r"^L\['([A-Za-z_][A-Za-z0-9_]*)'\]\.size\(\)\[(\d+)\]$")
_ARG_ITEM = re.compile(r"^L\['([A-Za-z_][A-Za-z0-9_]*)'\]\[(\d+)\]$")


def build_native(
    fn: Callable,
    sources: list[str],
    owner_name: str | None,
    bound: dict[str, Any],
    signature: Any,
    guards: Any,
    run: Callable,
    rebuild: Callable,
    frame: CallFrame,
    memoize: bool = False,
    through: list[int] = (),
) -> tuple[Any, str]:
    """The C++ form of a direct path (``_C.DirectCall``), or (None, why not). Each graph input
    must come from an argument (``L['x']``), a size of one (``L['x'].size()[0]``), or a
    parameter or buffer dict of a module reached from ``owner_name`` (read on every call),
    once rewritten to the bound parameters (``frame``). ``memoize``: Dynamo's guards are
    evaluated once per argument layout and process state (``fast_dispatch_guards="arguments"``).
    ``through``: the graph inputs ``rebuild`` takes after the outputs (:func:`rebuild_for`)."""
    from magi_compiler import _C

    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL) for p in parameters):
        return None, "the function has keyword-only parameters or *args"
    names = [p.name for p in parameters]
    index = {name: i for i, name in enumerate(names)}
    namespace = {"__magi_G": fn.__globals__, **bound}
    slots: list[tuple] = []
    containers: list[str] = []  # per fixed slot, the expression of its dict
    for original in sources:
        source = frame.to_bound(original)
        if source is None:
            return None, f"input source {original} reads the call's *args or **kwargs whole"
        if (m := _ARG.match(source)) and m[1] in index:
            slots.append(("arg", index[m[1]]))
            continue
        if (m := _ARG_SIZE.match(source)) and m[1] in index:
            slots.append(("size", index[m[1]], int(m[2])))
            continue
        if (m := _ARG_ITEM.match(source)) and m[1] in index:
            slots.append(("item", index[m[1]], int(m[2])))
            continue
        owned = _owned_entry(_LOCAL.sub(r"\1", source).replace("G[", "__magi_G["), owner_name)
        if owned is None:
            return None, f"input source {source} is not an argument, a size or a parameter"
        container, key = owned
        try:
            table = eval(container, namespace)  # noqa: S307 - our text, as in build_gatherer
        except Exception as e:  # noqa: BLE001 - any failure: no native path
            return None, f"cannot evaluate {container}: {e}"
        name = key[2:-2]
        if not isinstance(table, dict) or not isinstance(table.get(name), torch.Tensor):
            return None, f"{container}{key} is not a tensor in a dict"
        slots.append(("fixed", table, name))
        containers.append(container)
    result = {_first: "tensor", tuple: "tuple", list: "list"}.get(rebuild, "call")
    builder = rebuild if result == "call" else None
    target = run.magi_native_target
    if target is None:
        return None, "the graph's run is wrapped (dumps are on)"
    cells = [
        (name, cell)
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False)
    ]
    planner = None
    if not memoize:
        fixed = [(slot[1], slot[2]) for slot in slots if slot[0] == "fixed"]
        planner = _guard_watch.planner(
            guards.root,
            fn.__globals__,
            names,
            dict(cells),
            lambda: [table.get(name) for table, name in fixed],
            containers,
            frame,
            lambda why: logger.debug(
                "%s: Dynamo's guards are evaluated on every direct call: %s",
                fn.__qualname__,
                why,
            ),
        )
    native = _C.DirectCall(
        signature,
        guards.root.check,
        names,
        cells,
        target,
        slots,
        result,
        owner_name is not None,
        memoize,
        planner,
        module_routes(containers, namespace),
        builder,
        frame.native_spec(),
        list(through),
    )
    return native, ""


def same_inputs(gathered: list[Any], seen: list[Any]) -> str:
    """ "" when ``gathered`` holds exactly what the graph received, else the first difference."""
    if len(gathered) != len(seen):
        return f"{len(gathered)} inputs gathered, the graph received {len(seen)}"
    for i, (a, b) in enumerate(zip(gathered, seen, strict=True)):
        if isinstance(b, torch.Tensor) or isinstance(a, torch.Tensor):
            if a is not b:
                return f"input {i} is not the tensor the graph received"
        elif type(a) is not type(b) or a != b:
            return f"input {i} is {a!r}, the graph received {b!r}"
    return ""


def rebuild_for(
    result: Any, outputs: list[Any], inputs: list[Any] = ()
) -> tuple[Callable | None, list[int]]:
    """How to turn the graph's output list into ``result``, when it is those outputs as they
    are: one tensor, or a tuple or list of them in order; or a structure made fresh by each
    call (:func:`_template`), whose tensors may also be graph inputs returned as they came in
    (a layer handing its attention bias on). With the indices of those inputs: the function
    is then given the outputs followed by those inputs, in that order."""
    if isinstance(result, torch.Tensor):
        if len(outputs) == 1 and outputs[0] is result:
            return _first, []
        return _template_for(result, outputs, inputs)
    if isinstance(result, (tuple, list)) and type(result) in (tuple, list):
        if len(result) == len(outputs) and all(
            r is o for r, o in zip(result, outputs, strict=True)
        ):
            return (tuple if type(result) is tuple else list), []
    if isinstance(result, dict) and dataclasses.is_dataclass(result):
        # A dataclass that is also a dict (Hugging Face's ModelOutput): rebuilt from its
        # fields when the ones set are the outputs in order and the others are None.
        names = [f.name for f in dataclasses.fields(result)]
        values = [getattr(result, n) for n in names]
        present = [n for n, v in zip(names, values, strict=True) if v is not None]
        if len(present) == len(outputs) and all(
            getattr(result, n) is o for n, o in zip(present, outputs, strict=True)
        ):
            kind = type(result)
            return (lambda outs: kind(**dict(zip(present, outs, strict=True)))), []
    return _template_for(result, outputs, inputs)


def _template_for(
    result: Any, outputs: list[Any], inputs: list[Any]
) -> tuple[Callable | None, list[int]]:
    """:func:`_template` of ``result``; a tensor that is no output but a graph input takes the
    next place after the outputs (the inputs so used are the second item)."""
    by_id = {id(o): i for i, o in enumerate(outputs)}
    input_at = {id(x): j for j, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
    through: list[int] = []

    def place(tensor: torch.Tensor) -> int | None:
        if id(tensor) in by_id:
            return by_id[id(tensor)]
        j = input_at.get(id(tensor))
        if j is None:
            return None
        if j not in through:
            through.append(j)
        return len(outputs) + through.index(j)

    build = _template(result, place)
    return (build, through) if build is not None else (None, [])


# Modules whose classes a direct call may rebuild attribute by attribute: transformers' caches
# (a DynamicCache of DynamicLayers holding the graph's key and value outputs), made fresh by
# each call of a model called with use_cache=True.
_REBUILT_MODULES = ("transformers.cache_utils",)
# Values a rebuilt result keeps as they were: not numbers, which may be sizes that change per
# call (a dynamic batch), and are refused.
_CONSTANT = (bool, str, torch.dtype, torch.device, type(None))


def _template(value: Any, place: Callable[[torch.Tensor], int | None]) -> Callable | None:
    """A function of the graph's outputs that builds a new ``value`` of the same structure:
    tensors are taken from the list by position (``place``), flags, strings, dtypes, devices
    and None are kept, and lists, tuples, ModelOutputs and transformers' cache objects are
    built anew. None when ``value`` holds anything else (a tensor with no place, an object the
    call did not make)."""
    if isinstance(value, torch.Tensor):
        i = place(value)
        return None if i is None else (lambda outs: outs[i])
    if isinstance(value, _CONSTANT):
        return lambda outs: value
    kind = type(value)
    if kind in (list, tuple):
        parts = [_template(v, place) for v in value]
        if any(p is None for p in parts):
            return None
        return lambda outs: kind([p(outs) for p in parts])
    if isinstance(value, dict) and dataclasses.is_dataclass(value):
        fields = {
            f.name: _template(getattr(value, f.name), place) for f in dataclasses.fields(value)
        }
        if any(f is None for f in fields.values()):
            return None
        return lambda outs: kind(**{n: f(outs) for n, f in fields.items()})
    if kind.__module__ in _REBUILT_MODULES and type(getattr(value, "__dict__", None)) is dict:
        attributes = {k: _template(v, place) for k, v in vars(value).items()}
        if any(a is None for a in attributes.values()):
            return None

        def build(outs: list[Any]) -> Any:
            obj = kind.__new__(kind)
            obj.__dict__.update({k: a(outs) for k, a in attributes.items()})
            return obj

        return build
    return None


def _first(outputs: list[Any]) -> Any:
    return outputs[0]


def log_refusal(tag: str, why: str) -> None:
    logger.debug("%s: no direct dispatch for this signature: %s", tag, why)


class OwnerPaths:
    """The direct paths of one module instance (or of a plain function), valid while the
    registration epoch stays as it was. Held by the owner's entry in a WeakKeyDictionary, so
    a freed module takes its paths (and the parameter dicts they reach) with it."""

    def __init__(self) -> None:
        from magi_compiler import _C

        self.epoch = _C.registration_epoch()
        self.paths: list[DirectPath] = []
        self.refused: set[int] = set()  # ids of signatures that cannot get one

    def valid(self) -> bool:
        from magi_compiler import _C

        return self.epoch == _C.registration_epoch()


class PathTable:
    """OwnerPaths per owner: weakly keyed for module instances, one slot for plain functions
    (and owners that take no weak reference, which get no direct path)."""

    def __init__(self) -> None:
        self._by_owner: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._unowned: OwnerPaths | None = None
        # The owner last looked up and its paths: a call of the same module again finds them
        # without the dictionary's lookup. The weak reference's callback drops the pair when
        # the owner dies, so it keeps nothing of a freed module alive.
        self._last: tuple[weakref.ref, OwnerPaths] | None = None
        # Per owner, the C++ side of its paths (_C.DirectEntry): the natives of its current
        # OwnerPaths, which the compiled method's wrapper tries before any Python runs.
        self._entries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._unowned_entry: Any = None

    def get(self, owner: Any) -> OwnerPaths | None:
        if owner is None:
            return self._unowned
        last = self._last
        if last is not None and last[0]() is owner:
            return last[1]
        try:
            paths = self._by_owner.get(owner)
            if paths is not None:
                self._last = (weakref.ref(owner, self._forget), paths)
            return paths
        except TypeError:  # not weakly referenceable (or not hashable)
            return None

    def _forget(self, _ref: weakref.ref) -> None:
        self._last = None

    def fresh(self, owner: Any) -> OwnerPaths | None:
        """A new, empty OwnerPaths for ``owner`` (None when it cannot have one)."""
        self._last = None
        paths = OwnerPaths()
        if owner is None:
            self._unowned = paths
        else:
            try:
                self._by_owner[owner] = paths
            except TypeError:
                return None
        entry = self.native_entry(owner, create=False)
        if entry is not None:
            entry.reset()
        return paths

    def native_entry(self, owner: Any, create: bool = True) -> Any:
        """The _C.DirectEntry of ``owner`` (None for an owner without weak references, or
        when it has none yet and ``create`` is False)."""
        from magi_compiler import _C

        if owner is None:
            if self._unowned_entry is None and create:
                self._unowned_entry = _C.DirectEntry(None)
            return self._unowned_entry
        try:
            entry = self._entries.get(owner)
            if entry is None and create:
                entry = self._entries[owner] = _C.DirectEntry(weakref.ref(owner))
            return entry
        except TypeError:
            return None

    def learned(self, owner: Any, path: DirectPath) -> None:
        """Makes ``path``'s native form, when it has one, callable from ``owner``'s entry."""
        if path.native is not None:
            entry = self.native_entry(owner)
            if entry is not None:
                entry.add(path.native)

    def forget_all(self) -> None:
        """Drops every owner's paths (the compiled function fell back to eager)."""
        self._last = None
        self._by_owner = weakref.WeakKeyDictionary()
        self._unowned = None
        for entry in [self._unowned_entry, *self._entries.values()]:
            if entry is not None:
                entry.reset()


def wrapper(entry: Any, owner: Any, table: PathTable) -> Callable:
    """The callable that replaces a compiled method (``owner`` given) or function: calls try
    the owner's direct calls in C++ first (_C.DirectEntry), then go through ``entry`` (the
    _CompiledCallable). While Dynamo traces (a nested compiled module),
    the call goes straight to ``entry``, which Dynamo can inline."""
    native = table.native_entry(owner)
    is_compiling = torch.compiler.is_compiling
    layout = parameter_layout(entry.fn, skip_first=owner is not None)
    if native is not None and layout is not None:
        native.set_parameters(*layout[:2], inspect.Parameter.empty, layout[2])
    if native is None:  # an owner without weak references: no direct paths at all

        def plain(*args: Any, **kwargs: Any) -> Any:
            return entry(owner, *args, **kwargs)

        return _unpicklable(plain)
    if owner is None:

        def function(*args: Any, **kwargs: Any) -> Any:
            if not is_compiling():
                result = native(*args, **kwargs)
                if result is not None:
                    return result
                return entry.call(args, kwargs, natives_tried=True)
            return entry(*args, **kwargs)

        return _unpicklable(function)

    def method(*args: Any, **kwargs: Any) -> Any:
        if not is_compiling():
            result = native(*args, **kwargs)
            if result is not None:
                return result
            return entry.call((owner, *args), kwargs, natives_tried=True)
        return entry(owner, *args, **kwargs)

    return _unpicklable(method)


def _unpicklable(fn: Callable) -> Callable:
    """Marks a wrapper that sits in a module's ``__dict__`` as nothing to serialise: Dynamo's
    guard serialiser (compiled-module cache) writes a module's callable attributes, following a
    nested function's closure into our runtime objects; a function whose qualified name does
    not resolve is skipped instead."""
    fn.__qualname__ = f"magi_compiled_{fn.__name__}"
    return fn


def direct_path(
    fn: Callable,
    is_method: bool,
    signature: inspect.Signature,
    param_names: list[str],
    sig: Any,
    call: tuple[tuple, dict],
    seen: Observation,
    result: Any,
    memoize: bool,
    tag: str,
) -> tuple[DirectPath | None, str]:
    """(DirectPath, "") for the call of ``fn`` just observed (``seen``, which returned
    ``result``; ``sig`` its GuardSignature), or (None, why not). ``memoize``: Dynamo's guards
    evaluated once per argument layout (fast_dispatch_guards='arguments')."""
    args, kwargs = call
    if len(seen.calls) != 1:
        return None, f"the call ran {len(seen.calls)} compiled graphs, not one"
    run, graph_inputs, outputs = seen.calls[0]
    if getattr(run, "magi_kind", None) != "inference" or run.magi_sources is None:
        return None, "the graph is not an inference graph with known input sources"
    if not run.magi_side_effect_free:
        return None, "the captured code has Python side effects Dynamo replays"
    rebuild, through = rebuild_for(result, outputs or [], graph_inputs)
    if rebuild is None:
        return None, "the result is not the graph's outputs (or inputs) as they are"
    call_frame, why = CallFrame.of(fn, is_method)
    if call_frame is None:
        return None, why
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    owner_name = next(iter(signature.parameters)) if is_method else None
    arguments = dict(bound.arguments)
    gather, why = build_gatherer(
        fn, param_names, run.magi_sources, owner_name, arguments, call_frame
    )
    if gather is None:
        return None, why
    try:
        _, gathered, frame = gather(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure: no direct path
        return None, f"the gatherer failed: {e}"
    why = same_inputs(gathered, graph_inputs)
    if why:
        return None, why
    guards = dynamo_guards(fn, frame)
    if guards is None:
        return None, "no Dynamo cache entry whose guards pass for this call"
    native, why = build_native(
        fn, run.magi_sources, owner_name, arguments, sig, guards, run, rebuild, call_frame,
        memoize=memoize, through=through,
    )  # fmt: skip
    if native is None:
        logger.debug("%s: direct calls stay in Python: %s", tag, why)
    return DirectPath(sig, guards, gather, run, rebuild, native, gather.magi_routes, through), ""
