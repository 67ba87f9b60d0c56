"""What Python state a Dynamo guard tree reads, so a direct call can reuse its verdict.

In the default ``fast_dispatch_guards="dynamo"`` mode a C++ direct call (``_C.DirectCall``)
evaluates the guards of the Dynamo cache entry its learning call ran. Their verdict is a
function of three things: the call's arguments, process state, and the Python objects the tree
reaches from the frame's locals and the function's globals. The first two are the fingerprint
``fast_dispatch_guards="arguments"`` already keys verdicts by. This module walks the tree once
after it passed and lists how to tell, cheaply and from C++, that the third did not change
either:

- a dict read at a key (``_parameters['weight']``, a global, a module's attribute): the dict's
  version tag, and when it moved, the object now at that key against the one the walk saw;
- a dict whose keys or size a guard reads (``DICT_CONTAINS``, the ordered keys of
  ``_modules``): the version tag alone;
- a function's ``__code__`` or ``__kwdefaults__``, an object's type, a closure cell's
  contents: the object the walk saw, by identity;
- what a class holds (``type(x).__dict__['name']``, ``type(x).__mro__``, an attribute found
  in a base): the type's version tag, which CPython moves whenever the class or a base changes;
- a tensor the tree guards that is neither an argument nor a gathered parameter or buffer: its
  layout (the direct call checks gathered ones on every call already);
- an attribute a guard says an object lacks (``hasattr(x, '_dynamo_dynamic_indices')``):
  looked up on every call;
- an attribute a property or a ``__getattribute__`` computes, whose immutable value the guards
  compare (a Hugging Face config's ``output_attentions``): read and compared on every call.

While all of them hold and the fingerprint is one the guards passed, the guards would pass
again, so the direct call skips them. Anything the tree reads another way (a list's items, an
attribute of an arbitrary object, a Python lambda guard below the root) makes the tree
unwatchable; the direct call then evaluates the guards on every call, as before. ``plan``
returns the lists, or a reason when the tree cannot be watched. For a frame in the varargs form
(_call_frame.py) the guards on the call's ``args`` and ``kwargs`` are the call's form, which the
fingerprint holds, and their items the bound arguments.
"""

from __future__ import annotations

import ast
import inspect
import re
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from magi_compiler._call_frame import CallFrame

# Kinds of identity pins, as _C.DirectCall reads them.
PIN_CODE, PIN_TYPE, PIN_CELL, PIN_TYPE_UNCHANGED, PIN_KWDEFAULTS = 0, 1, 2, 3, 4
# How the direct call holds each watched dict (_Plan.result).
HELD_DICT, THROUGH_HOLDER, AT_KEY = 0, 1, 2

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE
# Attribute lookups that read the instance __dict__ after the type's data descriptors:
# object's, and SimpleNamespace's (its own slot, the same generic lookup).
_GENERIC_GETATTRIBUTE = (object.__getattribute__, types.SimpleNamespace.__getattribute__)
# How a type exposes the real instance __dict__: a getset descriptor (classes defined in
# Python), a member descriptor (SimpleNamespace's C struct field).
_INSTANCE_DICT = (types.GetSetDescriptorType, types.MemberDescriptorType)
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device)
_SAVED_HOOKS = "torch._functorch.aot_autograd.utils.top_saved_tensors_hooks ids == None"
_HASATTR = re.compile(
    r"^(?:hasattr\(.*, '([A-Za-z_][A-Za-z0-9_]*)'\) == False"
    r"|not hasattr\(.*, '([A-Za-z_][A-Za-z0-9_]*)'\))$"
)
_DICT_KEY = re.compile(r"^DictGetItemGuardAccessor\((.*)\)$")
_GETATTR = re.compile(r"^GetAttrGuardAccessor\(([A-Za-z_][A-Za-z0-9_]*)\)$")
_GENERIC_GETATTR = re.compile(r"^GenericGetAttrGuardAccessor\(([A-Za-z_][A-Za-z0-9_]*)\)$")
_FRAME = re.compile(r"^FrameLocalsGuardAccessor\(key='([A-Za-z_][A-Za-z0-9_]*)'")
_TUPLE = re.compile(r"^TupleGetItemGuardAccessor\((\d+)\)$")
# An epilogue guard over the arguments' sizes, strides and identities only (the shape
# environment's relations, aliasing between arguments): the fingerprint decides it.
_ARG_TERM = re.compile(
    r"L\['([A-Za-z_][A-Za-z0-9_]*)'\](?:\.size\(\)\[\d+\]|\.stride\(\)\[\d+\]"
    r"|\.storage_offset\(\))?"
)
_ARITHMETIC = re.compile(r"^(?:[\s\d()<>=!+\-*/%]|\band\b|\bor\b|\bnot\b|\bis\b)*$")
# G['a'].b['c'] ... as an epilogue guard names objects it compares by identity.
_CHAIN_STEPS = r"(?:\['[^']*'\]|\.[A-Za-z_][A-Za-z0-9_]*)*"
_GLOBAL_CHAIN = re.compile(r"G(?:\['[^']*'\]|\.[A-Za-z_][A-Za-z0-9_]*)+")
_CHAIN_STEP = re.compile(r"\['([^']*)'\]|\.([A-Za-z_][A-Za-z0-9_]*)")
# Dynamo's read of a number attribute it made symbolic (a dropout's p, changed between models
# that share a forward's code object): ``___as_tensor(<chain>).item() == 0.1``.
_AS_TENSOR_ITEM = re.compile(r"___as_tensor\((?P<chain>[^()]*)\)\.item\(\)")
_NUMBER = re.compile(r"(?<![\w.])(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_BOUND_SELF = re.compile(
    r"^(?P<a>\S+) is object\.__getattribute__\((?P<b>\S+), '(?P<name>[A-Za-z_][A-Za-z0-9_]*)'\)"
    r"\.__self__$"
)


_NO_KEY = object()  # watch() with no key of its own: registers the dict's holder only
_ABSENT = object()


class Unwatchable(Exception):
    """The tree reads Python state in a way the plan cannot follow."""


def _text(guard: Any) -> str:
    parts = guard.verbose_code_parts()
    return parts[0].split("  #")[0].strip() if parts else ""


def _instance_attribute(obj: Any, name: str) -> bool:
    """Whether ``getattr(obj, name)`` is ``vars(obj)[name]``: an instance of an ordinary
    class (a config object, a dataclass, a SimpleNamespace) whose real ``__dict__`` holds the
    name, with no ``__getattribute__`` of its own and no data descriptor (property, slot) of that name on
    its type, which would take precedence over the instance dict."""
    cls = type(obj)
    if cls.__getattribute__ not in _GENERIC_GETATTRIBUTE:
        return False
    if type(inspect.getattr_static(cls, "__dict__", None)) not in _INSTANCE_DICT:
        return False  # a __dict__ of the class's own making, not the instance dict
    try:
        if not isinstance(vars(obj), dict) or name not in vars(obj):
            return False
    except TypeError:  # no __dict__
        return False
    found = inspect.getattr_static(cls, name, None)
    return found is None or not (
        hasattr(type(found), "__set__") or hasattr(type(found), "__delete__")
    )


def _plain_class_attribute(cls: type) -> bool:
    """Whether ``x.__class__`` is ``type(x)`` for instances of ``cls`` (object's descriptor,
    not a property of the class's own)."""
    return (
        cls.__getattribute__ in _GENERIC_GETATTRIBUTE
        and inspect.getattr_static(cls, "__class__", None) is vars(object)["__class__"]
    )


def _class_assignable(value: Any) -> bool:
    """Whether ``value.__class__ = ...`` can change its type: CPython allows it for instances
    of classes defined in Python (heap types) and of module types only, not of ``dict``,
    ``OrderedDict``, functions or ``object()``."""
    return bool(type(value).__flags__ & _HEAPTYPE) or isinstance(value, types.ModuleType)


def _immutable(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v) for v in value)
    return type(value) in _IMMUTABLE or isinstance(value, type)


class _Plan:
    def __init__(self, arg_index: dict[str, int], gathered: set[int]):
        self.arg_index = arg_index
        self.gathered = gathered  # ids of the tensors the direct call gathers and checks
        # id -> (dict, keys or None for the whole dict, the object whose __dict__ it is)
        self.dicts: dict[int, tuple[dict, set[Any] | None, Any]] = {}
        # ids of the dicts found at a key of a dict watched before them: the direct call
        # reaches them through that key, so it does not hold them (see result())
        self.reached: set[int] = set()
        self.pins: list[tuple[int, Any, Any]] = []
        self.tensors: dict[int, torch.Tensor] = {}
        self.absent: list[tuple[Any, int, str]] = []  # (object or None, argument index, name)
        # (object, name, value, generic): attributes a property computes, read on every call
        self.reread: list[tuple[Any, str, Any, bool]] = []
        # Dynamo's NO_TENSOR_ALIASING guard: these arguments must not be any of these tensors
        # (arguments among themselves: the fingerprint's aliasing)
        self.distinct_args: set[int] = set()
        self.distinct_tensors: dict[int, torch.Tensor] = {}
        self.saved_hooks = False

    def watch(self, d: Any, key: Any = None, whole: bool = False, holder: Any = None) -> None:
        """Watches ``d`` at ``key``, or ``whole``. ``holder``: the object ``d`` is the
        ``__dict__`` of, through which the direct call reaches it (an instance dict may hold
        the module itself, as its compiled ``forward`` does: held directly, the module could
        never be freed)."""
        if not isinstance(d, dict):
            raise Unwatchable(f"a read of a {type(d).__name__} by key")
        if type(d).__getitem__ is not dict.__getitem__ and type(d) is not OrderedDict:
            raise Unwatchable(f"a {type(d).__name__} with its own __getitem__")
        held, keys, known = self.dicts.get(id(d), (d, set(), None))
        if whole or keys is None:
            keys = None
        elif key is not _NO_KEY:
            keys.add(key)
        self.dicts[id(d)] = (held, keys, holder if holder is not None else known)

    def reach(self, parent: dict, key: Any) -> None:
        """Notes that the value at ``parent[key]`` (watched at that key) is a dict, which
        the direct call then compares without holding it."""
        value = parent[key]
        if isinstance(value, dict) and id(value) not in self.dicts:
            self.reached.add(id(value))

    def result(self) -> tuple:
        """The dicts in the order they were met (a dict reached at a key after the dict
        holding it), each as (dict or its holder, keys or None, how it is held): HELD_DICT (a
        root, such as the globals), THROUGH_HOLDER (an instance's or Python module's
        ``__dict__``, reached through the object, held weakly) or AT_KEY (a value at a key of
        an earlier dict, compared by identity and version, not held: holding a module's
        ``_modules`` could hold, through a hook's bound method, the module itself)."""
        dicts = []
        for d, keys, holder in self.dicts.values():
            if holder is not None:
                how = THROUGH_HOLDER
            else:
                how = AT_KEY if id(d) in self.reached else HELD_DICT
            dicts.append(
                (d if holder is None else holder, None if keys is None else list(keys), how)
            )
        distinct = (sorted(self.distinct_args), list(self.distinct_tensors.values()))
        return (
            dicts,
            self.pins,
            list(self.tensors.values()),
            self.absent,
            self.saved_hooks,
            distinct,
            self.reread,
        )


def _leaves(plan: _Plan, manager: Any, value: Any, arg: int | None) -> None:
    """Checks that the leaf guards of ``manager`` decide the same while ``value`` (an argument
    when ``arg`` is its index) and what is watched stay as they are."""
    for guard in manager.get_leaf_guards():
        kind = type(guard).__name__
        if kind in ("ID_MATCH", "NONE_MATCH", "NOT_NONE"):
            continue  # the value's identity, which the path to it pins
        if kind == "TYPE_MATCH":
            if arg is None and _class_assignable(value):
                plan.pins.append((PIN_TYPE, value, type(value)))
            continue  # an argument's type is in the fingerprint; a dict's cannot change
        if kind in ("EQUALS_MATCH", "TRUE_MATCH", "FALSE_MATCH"):
            if arg is None and not _immutable(value):
                raise Unwatchable(f"{kind} on a {type(value).__name__}")
            continue  # scalar arguments' values are in the signature
        if kind == "TENSOR_MATCH":
            if arg is None and id(value) not in plan.gathered:
                if value.layout != torch.strided or value.is_nested:
                    raise Unwatchable(f"a {value.layout} tensor at {manager.get_source()}")
                plan.tensors[id(value)] = value
            continue  # arguments and gathered tensors are checked on every call
        if kind == "NO_TENSOR_ALIASING":
            if arg is not None:
                plan.distinct_args.add(arg)
            elif isinstance(value, torch.Tensor):
                plan.distinct_tensors[id(value)] = value
            else:
                raise Unwatchable(f"NO_TENSOR_ALIASING on a {type(value).__name__}")
            continue
        if kind == "DYNAMIC_INDICES" and arg is not None:
            # True when the argument has no _dynamo_dynamic_indices (mark_dynamic's mark); a
            # marked argument makes the call check the guards.
            plan.absent.append((None, arg, "_dynamo_dynamic_indices"))
            continue
        if kind == "NO_HASATTR":
            m = _HASATTR.match(_text(guard))
            if m is None:
                raise Unwatchable(f"NO_HASATTR {_text(guard)!r}")
            plan.absent.append(
                (None if arg is not None else value, -1 if arg is None else arg, m[1] or m[2])
            )
            continue
        if kind in ("DICT_CONTAINS", "DICT_VERSION", "DICT_LENGTH", "LENGTH_CHECK"):
            if isinstance(value, tuple) and kind == "LENGTH_CHECK":
                continue
            if arg is not None and kind != "DICT_VERSION" and type(value) is dict and not value:
                continue  # an empty **kwargs: the fingerprint holds that it is empty
            if arg is not None:
                raise Unwatchable(f"{kind} on an argument")
            plan.watch(value, whole=True)
            continue
        raise Unwatchable(f"a {kind} guard on {manager.get_source()}")


def _children(plan: _Plan, manager: Any, value: Any) -> None:
    """Walks the managers below ``manager``, whose guarded object is ``value``."""
    if type(manager).__name__ == "DictGuardManager":
        plan.watch(value, whole=True)  # keys by position
        keys = list(value.keys())
        for index, (key_manager, value_manager) in manager.get_key_value_managers().items():
            if key_manager is not None:
                _walk(plan, key_manager, keys[index])
            if value_manager is not None:
                plan.reach(value, keys[index])
                _walk(plan, value_manager, value[keys[index]])
    for accessor, child in zip(manager.get_accessors(), manager.get_child_managers(), strict=True):
        how = accessor.repr()
        if _empty(child):
            continue  # nothing is checked of the object it reaches
        if m := _DICT_KEY.match(how):
            try:
                key = ast.literal_eval(m[1])
            except (ValueError, SyntaxError) as e:
                raise Unwatchable(f"a dict key written {m[1]}") from e
            plan.watch(value, key)
            plan.reach(value, key)
            _walk(plan, child, value[key])
        elif (
            (m := _GETATTR.match(how)) and m[1] == "cell_contents" and type(value) is types.CellType
        ):
            plan.pins.append((PIN_CELL, value, value.cell_contents))
            _walk(plan, child, value.cell_contents)
        elif m := _GETATTR.match(how):
            name = m[1]
            # A module subclass may compute attributes (properties, __getattribute__).
            if type(value) is types.ModuleType and name in vars(value):
                pass
            elif name == "__class__" and _plain_class_attribute(type(value)):
                _type_of(plan, child, value)
                continue
            elif type(value) is types.MethodType and name in ("__func__", "__self__"):
                # A bound method's function and object cannot be reassigned; the path to the
                # method (_generic_attribute) pins both.
                _walk(plan, child, getattr(value, name))
                continue
            elif _instance_attribute(value, name):
                # Looked up through the type first: the type is pinned, and so is its content
                # (a property or __getattribute__ added later would take over the lookup).
                plan.pins.append((PIN_TYPE_UNCHANGED, value, type(value)))
            else:
                _reread(plan, child, value, name, generic=False)
                continue
            plan.watch(vars(value), name, holder=value)
            plan.reach(vars(value), name)
            _walk(plan, child, vars(value)[name])
        elif how == "ClosureGuardAccessor":
            # A function's __closure__ cannot be reassigned: its cells are the function's,
            # which the path to it pins.
            if not isinstance(value, types.FunctionType) or value.__closure__ is None:
                raise Unwatchable(f"__closure__ of a {type(value).__name__}")
            _walk(plan, child, value.__closure__)
        elif how == "TypeGuardAccessor":
            _type_of(plan, child, value)
        elif how == "FuncKwDefaultsGuardAccessor":
            # Reassignable (f.__kwdefaults__ = {...}): pinned, and the dict watched itself.
            if not isinstance(value, types.FunctionType) or value.__kwdefaults__ is None:
                raise Unwatchable(f"__kwdefaults__ of a {type(value).__name__}")
            plan.pins.append((PIN_KWDEFAULTS, value, value.__kwdefaults__))
            _walk(plan, child, value.__kwdefaults__)
        elif m := _GENERIC_GETATTR.match(how):
            _generic_attribute(plan, child, value, m[1])
        elif how == "GetGenericDictGuardAccessor":
            plan.watch(vars(value), _NO_KEY, holder=value)
            _walk(plan, child, vars(value))
        elif how == "CodeGuardAccessor":
            if not isinstance(value, types.FunctionType):
                raise Unwatchable(f"__code__ of a {type(value).__name__}")
            plan.pins.append((PIN_CODE, value, value.__code__))
            _walk(plan, child, value.__code__)
        elif (m := _TUPLE.match(how)) and type(value) is tuple:
            _walk(plan, child, value[int(m[1])])
        else:
            raise Unwatchable(f"{how} on {manager.get_source()}")


def _type_of(plan: _Plan, manager: Any, value: Any) -> None:
    """Walks the guards on ``type(value)``: the type is pinned with its version tag, which
    CPython changes whenever the class or a base is modified, so its ``__mro__`` and the objects
    its own and its bases' ``__dict__`` hold (``type(x).__dict__['name']``, ``type(x).__mro__[1]``)
    stay the ones seen while the pin holds."""
    plan.pins.append((PIN_TYPE_UNCHANGED, value, type(value)))
    _fixed_class(plan, manager, type(value))


def _fixed_class(plan: _Plan, manager: Any, cls: type) -> None:
    """Walks the guards on ``cls``, the pinned type of _type_of or one of its bases. An
    attribute read from it goes through its metaclass too, which is pinned as well."""
    _leaves(plan, manager, cls, None)
    for accessor, child in zip(manager.get_accessors(), manager.get_child_managers(), strict=True):
        how = accessor.repr()
        if how == "TypeDictGuardAccessor":
            if type(child).__name__ == "DictGuardManager":
                raise Unwatchable(f"the keys of {child.get_source()} by position")
            for kind in map(lambda g: type(g).__name__, child.get_leaf_guards()):
                if kind not in ("TYPE_MATCH", "DICT_CONTAINS", "DICT_LENGTH"):
                    raise Unwatchable(f"a {kind} guard on {child.get_source()}")
            for item, grandchild in zip(
                child.get_accessors(), child.get_child_managers(), strict=True
            ):
                _walk(plan, grandchild, vars(cls)[_dict_key(item.repr(), child)])
        elif how == "TypeMROGuardAccessor":
            mro = cls.__mro__
            _leaves(plan, child, mro, None)
            for item, grandchild in zip(
                child.get_accessors(), child.get_child_managers(), strict=True
            ):
                m = _TUPLE.match(item.repr())
                if m is None:
                    raise Unwatchable(f"{item.repr()} on {child.get_source()}")
                _fixed_class(plan, grandchild, mro[int(m[1])])
        elif (m := _GETATTR.match(how)) and any(m[1] in vars(c) for c in cls.__mro__):
            # Defined by cls or a base: a base's change moves cls's version tag too.
            found = next(vars(c)[m[1]] for c in cls.__mro__ if m[1] in vars(c))
            if getattr(cls, m[1]) is not found:
                raise Unwatchable(f"{cls.__name__}.{m[1]} is not the object its class holds")
            if _class_assignable(cls):
                plan.pins.append((PIN_TYPE_UNCHANGED, cls, type(cls)))  # the metaclass
            _walk(plan, child, found)
        else:
            raise Unwatchable(f"{how} on {manager.get_source()}")


def _reread(plan: _Plan, manager: Any, value: Any, name: str, generic: bool) -> None:
    """An attribute computed when read (a property, a class's own ``__getattribute__``), which
    the guards only compare to an immutable value: read again on every call and compared, as
    Dynamo's guard reads it. ``generic``: read as ``object.__getattribute__``."""
    try:
        current = object.__getattribute__(value, name) if generic else getattr(value, name)
    except Exception as e:  # noqa: BLE001 - the guards passed on it just now; anything else
        raise Unwatchable(f"attribute {name} of a {type(value).__name__}: {e!r}") from e
    if manager.get_accessors() or type(manager).__name__ == "DictGuardManager":
        raise Unwatchable(f"guards below the computed attribute {manager.get_source()}")
    if not _immutable(current) or isinstance(current, type):
        raise Unwatchable(f"the computed attribute {manager.get_source()} is a {type(current)}")
    for guard in manager.get_leaf_guards():
        kind = type(guard).__name__
        if kind == "ID_MATCH" and (current is None or isinstance(current, bool)):
            continue  # a singleton: equal and of the same type is the same object
        if kind not in ("EQUALS_MATCH", "TRUE_MATCH", "FALSE_MATCH", "NONE_MATCH", "TYPE_MATCH"):
            raise Unwatchable(f"a {kind} guard on the computed attribute {manager.get_source()}")
    plan.reread.append((value, name, current, generic))


def _dict_key(how: str, manager: Any) -> Any:
    """The key a DictGetItemGuardAccessor reads."""
    m = _DICT_KEY.match(how)
    if m is None:
        raise Unwatchable(f"{how} on {manager.get_source()}")
    try:
        return ast.literal_eval(m[1])
    except (ValueError, SyntaxError) as e:
        raise Unwatchable(f"a key written {m[1]}") from e


def _generic_attribute(plan: _Plan, manager: Any, value: Any, name: str) -> None:
    """Walks the guards on ``object.__getattribute__(value, name)`` (a read that bypasses the
    class's own ``__getattribute__``, as Hugging Face's configs are read): with the type pinned
    unchanged, it is the instance dict's entry, or else the class's plain attribute (while the
    instance dict does not gain the name)."""
    cls = type(value)
    if name == "__dict__":
        if type(inspect.getattr_static(cls, "__dict__", None)) not in _INSTANCE_DICT:
            raise Unwatchable(f"the __dict__ of a {cls.__name__}")
        plan.pins.append((PIN_TYPE_UNCHANGED, value, cls))
        plan.watch(vars(value), _NO_KEY, holder=value)
        _walk(plan, manager, vars(value))
        return
    found = inspect.getattr_static(cls, name, _ABSENT)
    if hasattr(type(found), "__set__") or hasattr(type(found), "__delete__"):
        _reread(plan, manager, value, name, generic=True)  # a property
        return
    try:
        own = vars(value)
    except TypeError as e:
        raise Unwatchable(f"a {cls.__name__} without __dict__") from e
    if name not in own and isinstance(found, types.FunctionType):
        # A method, read as a bound method of ``value`` (a new object per read): while the
        # class is pinned and the instance dict does not gain the name, its function and
        # its __self__ stay what the guards saw.
        plan.pins.append((PIN_TYPE_UNCHANGED, value, cls))
        plan.watch(own, name, holder=value)
        _walk(plan, manager, found.__get__(value, cls))
        return
    if name not in own and (found is _ABSENT or hasattr(type(found), "__get__")):
        raise Unwatchable(f"{cls.__name__}.{name} is neither an instance nor a class attribute")
    plan.pins.append((PIN_TYPE_UNCHANGED, value, cls))
    plan.watch(own, name, holder=value)  # present or absent, as now
    if name in own:
        plan.reach(own, name)
    _walk(plan, manager, own[name] if name in own else found)


def _empty(manager: Any) -> bool:
    return (
        not manager.get_leaf_guards()
        and not manager.get_accessors()
        and type(manager).__name__ != "DictGuardManager"
    )


def _walk(plan: _Plan, manager: Any, value: Any) -> None:
    _leaves(plan, manager, value, None)
    _children(plan, manager, value)


def _argument(plan: _Plan, manager: Any, index: int, value: Any) -> None:
    _leaves(plan, manager, value, index)
    if manager.get_accessors():
        raise Unwatchable(f"guards below the argument {manager.get_source()}")


def _call_form(plan: _Plan, manager: Any, value: Any, local: str, frame: CallFrame) -> None:
    """Walks the guards on the call's ``*args`` tuple or ``**kwargs`` dict (``local``) in the
    varargs form (_call_frame.py): their length, type and keys are the call's form, which the
    fingerprint holds; their items are the bound arguments."""
    for guard in manager.get_leaf_guards():
        kind = type(guard).__name__
        if kind not in ("TYPE_MATCH", "LENGTH_CHECK", "DICT_LENGTH", "DICT_CONTAINS"):
            raise Unwatchable(f"a {kind} guard on the call's {local}")
    if type(manager).__name__ == "DictGuardManager":
        keys = list(value.keys())
        for index, (key_manager, value_manager) in manager.get_key_value_managers().items():
            if key_manager is not None:
                if key_manager.get_accessors():
                    raise Unwatchable(f"guards below a key of the call's {local}")
                _leaves(plan, key_manager, keys[index], None)  # a string: in the form
            if value_manager is not None:
                _call_item(plan, value_manager, local, keys[index], value[keys[index]], frame)
    for accessor, child in zip(manager.get_accessors(), manager.get_child_managers(), strict=True):
        how = accessor.repr()
        if m := _DICT_KEY.match(how):
            try:
                key = ast.literal_eval(m[1])
            except (ValueError, SyntaxError) as e:
                raise Unwatchable(f"a key written {m[1]}") from e
        elif m := _TUPLE.match(how):
            key = int(m[1])
        else:
            raise Unwatchable(f"{how} on the call's {local}")
        _call_item(plan, child, local, key, value[key], frame)


def _call_item(
    plan: _Plan, manager: Any, local: str, key: Any, value: Any, frame: CallFrame
) -> None:
    index = frame.bound_index(local, key)
    if index is None:
        raise Unwatchable(f"{local}[{key!r}] is no named parameter")
    if frame.method and index == 0:
        _walk(plan, manager, value)  # the owner, as args[0]
    else:
        _argument(plan, manager, index, value)


def _parts(guard: Any) -> list[str]:
    """Every code part of ``guard`` (Dynamo joins all shape and aliasing checks into one
    lambda guard with a part each), comments dropped."""
    return [part.split("  #")[0].strip() for part in guard.verbose_code_parts()]


def _epilogue(
    plan: _Plan, guard: Any, globals_: dict, frame: CallFrame, owner: tuple[str, Any] | None
) -> None:
    for text in _parts(guard):
        bound = frame.to_bound(text)
        if bound is None:
            raise Unwatchable(f"epilogue guard {text!r} reads the call's form")
        _epilogue_part(plan, bound, globals_, owner)


def _epilogue_part(plan: _Plan, text: str, globals_: dict, owner: tuple[str, Any] | None) -> None:
    """``owner``: a method's (name, module), whose attribute chains an identity guard may
    compare (Hugging Face's ``L['self'].config is L['self']._modules['model'].config``)."""
    rest = text
    for m in _ARG_TERM.finditer(text):
        if owner is not None and m[1] == owner[0]:
            continue  # a chain from the owner: below
        if m[1] not in plan.arg_index:
            raise Unwatchable(f"epilogue guard {text!r}")
        rest = rest.replace(m[0], " ")
    if "G[" not in text and _ARITHMETIC.match(rest):
        return  # the fingerprint (sizes, strides, offsets, aliasing) decides it
    chain_of = _GLOBAL_CHAIN
    if owner is not None:
        chain_of = re.compile(
            rf"{_GLOBAL_CHAIN.pattern}|L\['{re.escape(owner[0])}'\]{_CHAIN_STEPS}"
        )
    bound = _BOUND_SELF.match(text)
    if bound is not None and bound["a"] == bound["b"] and chain_of.fullmatch(bound["a"]):
        # X is object.__getattribute__(X, 'm').__self__ (transformers reads a config's method
        # to call it): true while m is a plain function of X's class, which is pinned, and
        # X's own __dict__ does not hold m, which is watched.
        value = _resolve_chain(plan, bound["a"], globals_, owner, text)
        cls, name = type(value), bound["name"]
        own = getattr(value, "__dict__", None)
        plain = isinstance(inspect.getattr_static(cls, name, None), types.FunctionType)
        if type(own) is not dict or name in own or not plain:
            raise Unwatchable(f"epilogue guard {text!r}")
        plan.pins.append((PIN_TYPE_UNCHANGED, value, cls))
        plan.watch(own, name, holder=value)
        return
    if _number_guard(plan, text, chain_of, globals_, owner):
        return
    chains = [m[0] for m in chain_of.finditer(text)]
    leftover = chain_of.sub(" ", text)
    if not chains or not re.fullmatch(r"\s*is\s*(?:not\s*)?", leftover):
        raise Unwatchable(f"epilogue guard {text!r}")
    for chain in chains:
        _resolve_chain(plan, chain, globals_, owner, text)


def _number_guard(
    plan: _Plan, text: str, chain_of: re.Pattern, globals_: dict, owner: tuple[str, Any] | None
) -> bool:
    """Whether ``text`` compares numbers read through chains (``G['a'].b``, the owner's
    attributes) with constants; if so, every step of each chain is watched, which keeps the
    verdict while no step is written, the numbers being immutable."""
    plain = _AS_TENSOR_ITEM.sub(lambda m: m["chain"], text)
    chains = [m[0] for m in chain_of.finditer(plain)]
    leftover = _NUMBER.sub(" ", chain_of.sub(" ", plain))
    if not chains or not _ARITHMETIC.match(leftover) or not re.search(r"[<>=]", leftover):
        return False
    probe = _Plan(plan.arg_index, set())  # nothing watched until every chain is a number
    values = [_resolve_chain(probe, chain, globals_, owner, text) for chain in chains]
    if not all(type(v) in (int, float, bool) for v in values):
        return False
    for chain in chains:
        _resolve_chain(plan, chain, globals_, owner, text)
    return True


def _resolve_chain(
    plan: _Plan, chain: str, globals_: dict, owner: tuple[str, Any] | None, text: str
) -> Any:
    """The object ``chain`` (``G['a'].b`` or the owner's ``L['self'].c['d']``) names, each
    step's dict watched at its key."""
    value: Any = globals_ if chain.startswith("G") else owner[1]
    steps = chain[1:] if chain.startswith("G") else chain[len(f"L['{owner[0]}']") :]
    for step in _CHAIN_STEP.finditer(steps):
        if step[1] is not None:
            plan.watch(value, step[1])
            plan.reach(value, step[1])
            value = value[step[1]]
            continue
        name = step[2]
        if type(value) is not types.ModuleType or name not in vars(value):
            if not _instance_attribute(value, name):
                raise Unwatchable(f"epilogue guard {text!r}")
            # As for an attribute the tree reads (_children): the type is pinned too.
            plan.pins.append((PIN_TYPE_UNCHANGED, value, type(value)))
        plan.watch(vars(value), name, holder=value)
        plan.reach(vars(value), name)
        value = vars(value)[name]
    return value


def plan(
    root: Any,
    frame: dict[str, Any],
    globals_: dict,
    arg_names: list[str],
    cells: dict[str, Any],
    gathered: list[Any],
    call_frame: CallFrame,
) -> tuple | str:
    """What the guard tree ``root`` reads, for the direct call to watch (see the module's
    docstring), or why it cannot be watched. ``frame``: the locals the guards just passed on;
    ``arg_names``: the function's bound parameters, the first the module for a method (the
    same object on every call of the direct call's owner: walked, not fingerprinted);
    ``cells``: the closure's cells by name; ``gathered``: the tensors the direct call gathers
    from parameter and buffer dicts (it compares their layouts on every call itself);
    ``call_frame``: how the frame's locals relate to the bound parameters (the varargs form's
    ``*args`` and ``**kwargs`` hold them)."""
    method = call_frame.method
    first = 1 if method else 0
    p = _Plan(
        {name: i for i, name in enumerate(arg_names) if i >= first},
        {id(t) for t in gathered if isinstance(t, torch.Tensor)},
    )
    try:
        for guard in root.get_leaf_guards():
            kind = type(guard).__name__
            if kind in ("GLOBAL_STATE", "TORCH_FUNCTION_MODE_STACK"):
                continue  # the fingerprint's process state
            if kind == "DEFAULT_DEVICE":
                import torch.utils._device as device_module

                p.watch(vars(device_module), "CURRENT_DEVICE")
                continue
            if kind == "LAMBDA_GUARD" and _text(guard) == _SAVED_HOOKS:
                p.saved_hooks = True
                continue
            raise Unwatchable(f"the root guard {kind} {_text(guard)!r}")
        owner = (arg_names[0], call_frame.owner_of(frame)) if method else None
        for guard in root.get_epilogue_lambda_guards():
            _epilogue(p, guard, globals_, call_frame, owner)
        varargs = call_frame.varargs
        for accessor, child in zip(root.get_accessors(), root.get_child_managers(), strict=True):
            how = accessor.repr()
            m = _FRAME.match(how)
            if how == "GlobalsGuardAccessor":
                _walk(p, child, globals_)
            elif m and varargs and m[1] in (call_frame.args, call_frame.kwargs):
                _call_form(p, child, frame[m[1]], m[1], call_frame)
            elif m and varargs and m[1] == call_frame.owner:
                _walk(p, child, frame[m[1]])
            elif m and not varargs and m[1] in p.arg_index:
                _argument(p, child, p.arg_index[m[1]], frame[m[1]])
            elif m and not varargs and method and m[1] == arg_names[0]:
                _walk(p, child, frame[m[1]])
            elif m and m[1] in cells:
                p.pins.append((PIN_CELL, cells[m[1]], frame[m[1]]))
                _walk(p, child, frame[m[1]])
            else:
                raise Unwatchable(f"{how} at the root")
    except Unwatchable as e:
        return str(e)
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        return f"the tree's objects moved while it was walked: {e!r}"
    return p.result()


def planner(
    root: Any,
    globals_: dict,
    arg_names: list[str],
    cells: dict[str, Any],
    gathered: Callable[[], list[Any]],
    containers: list[str],
    call_frame: CallFrame,
    log: Callable[[str], None],
) -> Callable:
    """The callable a direct call runs after each guard check that passed, to learn what to
    watch: ``(frame) -> plan | None``; ``log`` gets the reason when there is none.
    ``containers``: per gathered parameter or buffer, the expression of the dict the direct
    call reads it from (``self._modules['fc']._parameters``); the plan ends with those dicts
    as the frame reaches them now, so that a call can tell when a submodule was replaced by a
    write that no registration hook saw (``model._modules['fc'] = other``)."""
    codes = [compile(c, "<magi container>", "eval") for c in containers]

    def make(frame: dict[str, Any]) -> tuple | None:
        try:
            result = plan(root, frame, globals_, arg_names, cells, gathered(), call_frame)
        except Exception as e:  # noqa: BLE001 - an unforeseen tree: evaluate it every call
            result = f"the walk failed: {e!r}"
        if isinstance(result, str):
            log(result)
            return None
        scope = {"__magi_G": globals_, **frame}
        try:
            if call_frame.method:  # the containers are read from the bound owner's name
                scope[arg_names[0]] = call_frame.owner_of(frame)
            now = [eval(code, scope) for code in codes]  # noqa: S307 - our expressions
        except Exception as e:  # noqa: BLE001 - the path no longer reaches them
            log(f"a parameter dict is no longer reachable: {e!r}")
            return None
        return (*result, now)

    return make
