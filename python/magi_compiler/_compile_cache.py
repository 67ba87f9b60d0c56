"""The compiled-module cache on disk: a warm process runs a compiled entry without Dynamo's
trace, AOTAutograd or NVRTC (docs/cache.md).

What a warm start needs comes from two places, and an entry file holds both:

- **Dynamo's half** (``torch._dynamo.package.CompilePackage``): per captured graph, the
  rewritten bytecode of the function and its guards, serialised, plus checksums of every
  source range the trace inlined. Installed before the first call, the guards decide per call
  whether a captured graph applies, exactly as they did in the process that captured it;
  Dynamo refuses the whole entry if a traced source range changed.
- **Ours**: per captured graph, the ATen inference graph AOTAutograd produced (with its
  tensor metadata), where each input came from, and whether the capture had side effects.
  Loading lowers it again (import, passes, executable) and takes the kernels from the kernel
  cache, so nothing is traced or compiled by NVRTC.

The file name is a key over everything outside the guards that could change the result
(:func:`key_parts`): the function, its source, the config fields that change codegen, the
custom-op registry, torch/CUDA/GPU/Python versions, our build and the distributed layout. A
change is a different file: a miss, logged at INFO with the parts that differ from the
function's other entries; never a wrong hit.

Inference graphs are cached when AOTAutograd's runtime wrapper adds nothing (no input mutation
outside the graph, no output aliasing an input, no tensor subclass); a training capture is
cached as AOTAutograd's bundled entry of its forward and backward, wrapper included
(_cache_training.py). An entry with any other graph is not written, and the log says why. Files are
written whole to a temporary name and renamed into place under a lock, so concurrent
processes neither corrupt an entry nor write it twice; a file whose checksum fails is a miss
with a warning and is replaced.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import inspect
import itertools
import json
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from magi_compiler import _counters
from magi_compiler._cached_graph import pickle_graph, unpickle_graph
from magi_compiler._logging import logger

FORMAT = 3  # bump when the entry layout changes: old entries become misses
_MAGIC = b"MAGI-MODULE-CACHE\n"
_ENTRY_SUFFIX = ".entry"
_META_SUFFIX = ".json"

# Config fields that do not change what is compiled.
_KEY_EXEMPT_FIELDS = {"cache_root_dir", "aot", "disable_cache"}

# What the cache did in this process, per model tag, for the dump's index page: (when, what,
# detail), "what" one of hit, miss, captured, written, not written.
_events: dict[str, collections.deque[tuple[float, str, str]]] = {}
_events_lock = threading.Lock()


def _event(model_tag: str, what: str, detail: str) -> None:
    with _events_lock:
        _events.setdefault(model_tag, collections.deque(maxlen=32)).append(
            (time.time(), what, detail)
        )


def events(model_tag: str) -> list[tuple[float, str, str]]:
    """The cache's hits, misses and writes for ``model_tag`` in this process, oldest first."""
    with _events_lock:
        return list(_events.get(model_tag, ()))


# --- the key -------------------------------------------------------------------------------
def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _source_of(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):  # no source on disk (a REPL, a generated function)
        return f"<no source: {getattr(fn, '__code__', fn)!r}>"


@functools.cache
def _build_hash() -> str:
    """Our extension's bytes: a rebuilt `_C` (other passes, other kernels) is another key."""
    from magi_compiler import _C

    with open(_C.__file__, "rb") as f:
        return _sha(f.read())[:16]


def _device_part() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device"
    names = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        names.append(f"{torch.cuda.get_device_name(i)} sm_{major}{minor}")
    return "; ".join(names)


def _distributed_part() -> str:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return "single process"
    return f"rank {dist.get_rank()} of {dist.get_world_size()} ({dist.get_backend()})"


def _config_part(config: Any) -> str:
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in _KEY_EXEMPT_FIELDS}
    return _sha(json.dumps(fields, sort_keys=True, default=str))[:16]


def key_parts(fn: Callable, config: Any) -> dict[str, str]:
    """Everything outside Dynamo's guards that a cached entry depends on, by name."""
    from magi_compiler import _custom_op

    return {
        "format": str(FORMAT),
        "function": f"{fn.__module__}.{fn.__qualname__}",
        "source": _sha(_source_of(fn))[:16],
        "config": _config_part(config),
        "custom ops": _custom_op.registry_fingerprint(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "device": _device_part(),
        "python": sys.version.split()[0],
        "build": _build_hash(),
        "distributed": _distributed_part(),
    }


# --- files ---------------------------------------------------------------------------------
def modules_dir(config: Any) -> str:
    return os.path.join(os.path.expanduser(config.cache_root_dir), "modules")


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _seal(payload: bytes) -> bytes:
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def _unseal(data: bytes) -> bytes | None:
    """The payload, or None when the file is not a whole entry (truncated, overwritten)."""
    head = len(_MAGIC)
    if not data.startswith(_MAGIC) or len(data) < head + 32:
        return None
    digest, payload = data[head : head + 32], data[head + 32 :]
    return payload if hashlib.sha256(payload).digest() == digest else None


def _read_meta(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# --- what our backend records per captured graph --------------------------------------------
@dataclasses.dataclass
class GraphArtifact:
    """One captured Dynamo graph, as our backend compiled it: enough to rebuild its runner."""

    graph: bytes | None  # the ATen inference graph, pickled with its tensor metadata (GraphPickler)
    sources: list[str] | None  # where each input came from (direct calls need them)
    side_effect_free: bool
    num_inputs: int
    # The capturing call's value of each symbolic size: passes that decide by size (chunk_rows)
    # decide in a warm process as they did in the cold one.
    size_hints: dict[str, int] = dataclasses.field(default_factory=dict)
    gm: Any = dataclasses.field(default=None, repr=False, compare=False)  # until pickled

    def materialize(self) -> None:
        """Pickles the graph (on the writer thread: it costs a tenth of a second or more)."""
        if self.graph is None:
            self.graph, self.gm = pickle_graph(self.gm), None


@dataclasses.dataclass
class TrainingArtifact:
    """A training capture's forward and backward: AOTAutograd's bundled entry, pickled
    (_cache_training.py)."""

    entry: bytes | None
    pending: Any = dataclasses.field(default=None, repr=False, compare=False)  # until pickled

    def materialize(self) -> None:
        if self.entry is None:
            self.pending.pre_save()  # AOTAutograd's: our graphs pickle themselves
            self.entry, self.pending = pickle.dumps(self.pending), None


def trivial_wrapper_reason(metadata: Any, gm: torch.fx.GraphModule, num_inputs: int) -> str:
    """Why AOTAutograd's runtime wrapper around this inference graph does more than call it
    (so calling the lowered graph alone would differ), or "" when it does not."""
    if metadata is None:
        return "AOTAutograd's metadata is not available"
    if getattr(metadata, "num_mutated_inp_runtime_indices", 0):
        return "the graph mutates an input outside the graph"
    if getattr(metadata, "num_intermediate_bases", 0):
        return "an output is a view of an intermediate"
    for info in getattr(metadata, "output_info", []):
        if getattr(info.output_type, "name", "non_alias") != "non_alias":
            return "an output aliases an input"
    if getattr(metadata, "is_rng_op_functionalized", False):
        return "the graph draws random numbers through functionalised RNG"
    from torch._functorch._aot_autograd.schemas import SubclassCreationMeta

    if any(isinstance(m, SubclassCreationMeta) for m in getattr(metadata, "subclass_inp_meta", [])):
        return "an input is a tensor subclass"
    placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if placeholders != num_inputs:
        return f"AOTAutograd changed the inputs ({num_inputs} captured, {placeholders} lowered)"
    return ""


class _LoadedGraph:
    """A cached graph as ``CompilePackage.install`` wants a backend: rebuilt on install."""

    def __init__(self, artifact: GraphArtifact | TrainingArtifact, config: Any):
        self.artifact = artifact
        self.config = config

    def after_deserialization(self) -> Callable:
        from magi_compiler import _backend

        if isinstance(self.artifact, TrainingArtifact):
            from magi_compiler import _cache_training

            training = _cache_training.load(self.artifact.entry, self.config)
            training.magi_cache_artifact = self.artifact  # type: ignore[attr-defined]
            return training

        run = _backend.lower_cached_graph(
            unpickle_graph(self.artifact.graph), self.artifact, self.config
        )

        def compiled(*args: Any) -> list[Any]:
            return run(list(args))

        compiled.magi_cache_artifact = self.artifact  # type: ignore[attr-defined]
        return compiled


# --- Dynamo's side ---------------------------------------------------------------------------
def serializable_guards(entries: list[Any]) -> list[bool]:
    """Dynamo's guard filter while caching. Guards whose kind Dynamo cannot write to disk are
    dropped where what they check is covered otherwise: on globals (imported modules, builtins,
    global functions: the same objects in every process that imports the same sources), and on
    functions and code objects (the closure of a decorator's wrapper, a method: their code lies
    in the source ranges Dynamo checksums). Any other such guard is kept; the entry is
    then not written (``disable_for``) rather than the guard lost."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    keep = []
    for e in entries:
        kinds = (e.guard_type, *(e.derived_guard_types or ()))
        value = getattr(e, "value", None)
        droppable = e.is_global or inspect.isfunction(value) or inspect.iscode(value)
        keep.append(not (droppable and any(k in unsupported for k in kinds)))
    return keep


def is_unwritable_guards_failure(error: BaseException) -> bool:
    """Whether a capture failed because Dynamo could not serialise its guards: an object the
    guard state refers to that pickle cannot write (it raises from inside the serialiser), or
    a guard kind it cannot write (Dynamo drops the package, "Detected a package bypass", then
    trips over its own assertion)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb, last = error.__traceback__, None
        while tb is not None:
            name = tb.tb_frame.f_code.co_name
            if name in ("serialize_guards", "pickle_guards_state"):
                return True
            last, tb = name, tb.tb_next
        if isinstance(error, AssertionError) and last == "_compile_inner":
            return True
        error = error.__cause__ or error.__context__
    return False


def _advance_unique_ids(dynamo_entry: Any) -> None:
    """Dynamo names the globals it installs with a per-process counter; the entry installs
    names from the capturing process, which a later capture here must not reuse."""
    from torch._dynamo import bytecode_transformation as bt

    highest = 0
    for code in dynamo_entry.codes:
        for name in itertools.chain(code.backend_ids, code.import_sources):
            for part in str(name).split("_"):
                if part.isdigit():
                    highest = max(highest, int(part))
    current = next(bt._unique_id_counter)
    bt._unique_id_counter = itertools.count(max(current, highest + 1))


# --- one compiled entry's cache ---------------------------------------------------------------
class EntryCache:
    """The disk cache of one ``magi_compile``d function: loads its entry before the first
    capture and writes it after each new one."""

    def __init__(self, fn: Callable, config: Any, model_tag: str):
        self.fn = fn
        self.config = config
        self.model_tag = model_tag
        self.parts = key_parts(fn, config)
        self.key = _sha(json.dumps(self.parts, sort_keys=True))[:32]
        function_id = _sha(self.parts["function"])[:16]
        self.directory = os.path.join(modules_dir(config), function_id)
        self.path = os.path.join(self.directory, self.key + _ENTRY_SUFFIX)
        self.artifacts: dict[
            str, GraphArtifact | TrainingArtifact
        ] = {}  # backend id -> artifact, loaded or new
        self.package: Any = None
        self.loaded_graphs = 0
        self._written_ids: frozenset[str] = frozenset()
        self._refused: str | None = None  # why this entry is not written (logged once)
        self._failure: str | None = None  # the last write's error (warned about once)

    # -- load ------------------------------------------------------------------------------
    def package_for_compile(self) -> Any:
        """The ``CompilePackage`` Dynamo records into: the cached entry installed, when there
        is one that loads, else a fresh one."""
        from torch._dynamo.package import CompilePackage

        start = time.perf_counter()
        loaded = self._read()
        if loaded is not None:
            dynamo_entry, artifacts = loaded
            try:
                package = CompilePackage(self.fn, dynamo_entry)
                _advance_unique_ids(dynamo_entry)
                package.install({bid: _LoadedGraph(a, self.config) for bid, a in artifacts.items()})
            except Exception as e:  # noqa: BLE001 - any failure to load is a miss
                self._miss(f"the entry did not load: {e}")
            else:
                self.package, self.artifacts = package, dict(artifacts)
                self._written_ids = frozenset(artifacts)
                self.loaded_graphs = len(artifacts)
                _counters.bump("disk_cache_hits")
                self._touch()
                ms = (time.perf_counter() - start) * 1e3
                logger.info(
                    "%s: loaded %d compiled graph(s) from %s in %.0f ms",
                    self.model_tag, len(artifacts), self.path, ms,
                )  # fmt: skip
                _event(
                    self.model_tag,
                    "hit",
                    f"{len(artifacts)} graph(s) from {self.path}, {ms:.0f} ms",
                )
                return package
        try:
            self.package = CompilePackage(self.fn)
        except Exception as e:  # noqa: BLE001 - a function Dynamo cannot package: no cache
            logger.info("%s: no compiled-module cache for this function: %s", self.model_tag, e)
            return None
        return self.package

    def _read(self) -> tuple[Any, dict[str, GraphArtifact | TrainingArtifact]] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self._miss(f"no entry: {self._why_new()}")
            return None
        except OSError as e:
            self._miss(f"cannot read {self.path} ({e}); compiling", warn=True)
            return None
        payload = _unseal(data)
        try:
            if payload is None:
                raise ValueError("the file is truncated or corrupt")
            stored = pickle.loads(payload)
            if stored.get("parts") != self.parts:
                raise ValueError("its key parts differ from this process's")
            return pickle.loads(stored["dynamo"]), stored["graphs"]
        except Exception as e:  # noqa: BLE001 - a broken file is a miss, replaced later
            self._miss(
                f"entry {self.path} is unusable ({e}); compiling, and it will be replaced",
                warn=True,
            )
            return None

    def _miss(self, why: str, warn: bool = False) -> None:
        _counters.bump("disk_cache_misses")
        (logger.warning if warn else logger.info)(
            "%s: compiled-module cache miss: %s", self.model_tag, why
        )
        _event(self.model_tag, "miss", why)

    def _why_new(self) -> str:
        """Which key parts differ from the closest of the function's other entries."""
        try:
            names = [n for n in os.listdir(self.directory) if n.endswith(_META_SUFFIX)]
        except FileNotFoundError:
            return "first compile of this function with this cache"
        closest: list[str] | None = None
        for name in sorted(names):
            other = _read_meta(os.path.join(self.directory, name)).get("parts", {})
            changed = [k for k in self.parts if other.get(k) != self.parts[k]]
            if changed and (closest is None or len(changed) < len(closest)):
                closest = changed
        if closest is None:
            return "first compile with this key"
        return (
            f"key differs from the closest cached entry of this function in: {', '.join(closest)}"
        )

    def _touch(self) -> None:
        meta_path = self.path[: -len(_ENTRY_SUFFIX)] + _META_SUFFIX
        with contextlib.suppress(OSError), _locked(self.directory):
            meta = _read_meta(meta_path)
            meta["hits"] = int(meta.get("hits", 0)) + 1
            meta["last_used"] = time.time()
            _write_atomically(meta_path, json.dumps(meta, indent=1).encode())

    def explain_capture(self, args: tuple, kwargs: dict) -> None:
        """Logs why a call was captured although graphs were loaded from the cache: the
        guards each loaded graph failed on this call's frame."""
        if not self.loaded_graphs:
            return
        try:
            from torch._C._dynamo.eval_frame import _debug_get_precompile_entries

            bound = inspect.signature(self.fn, follow_wrapped=False).bind(*args, **kwargs)
            bound.apply_defaults()
            frame = dict(bound.arguments)
            closure = self.fn.__closure__ or ()
            frame.update(
                zip(self.fn.__code__.co_freevars, (c.cell_contents for c in closure), strict=True)
            )
            failed = []
            for entry in _debug_get_precompile_entries(self.fn.__code__):
                verdict = entry.guard_manager.check_verbose(frame)
                if not verdict.result:
                    failed.append("; ".join(verdict.verbose_code_parts))
        except Exception as e:  # noqa: BLE001 - only an explanation
            failed = [f"(could not evaluate the loaded guards: {e})"]
        why = " | ".join(failed) or "none"
        logger.info(
            "%s: captured although %d graph(s) were loaded from the cache: failed guards: %s",
            self.model_tag, self.loaded_graphs, why,
        )  # fmt: skip
        _event(self.model_tag, "captured", f"the loaded graphs' guards failed: {why}")

    # -- write -----------------------------------------------------------------------------
    def after_capture(self) -> None:
        """Writes the entry when this process captured graphs it does not hold yet: what
        Dynamo recorded is taken now, the graphs are pickled and the file written on the
        writer thread, off the call's path. A cache that cannot be written never fails the
        call: it warns and compiles on."""
        if self.package is None:
            return
        try:
            job = self._prepare()
        except Exception as e:  # noqa: BLE001 - the model's call must not fail on the cache
            return self._failed(e)
        if job is not None:
            _submit(self._write, *job)

    def _prepare(self) -> tuple[bytes, dict[str, Any]] | None:
        """Dynamo's half of the entry, pickled, and the graphs to write; None when nothing is
        new or the entry cannot be written (logged)."""
        for bid, fn in self.package.cached_backends.items():
            artifact = getattr(fn, "magi_cache_artifact", None)
            if artifact is not None:
                self.artifacts.setdefault(bid, artifact)
        try:
            entry = self.package.cache_entry()
        except Exception as e:  # noqa: BLE001 - Dynamo could not package this function
            return self._refuse(f"Dynamo cannot package it ({e})")
        bypassed = [c for c in entry.codes if c.bypassed]
        if bypassed:
            return self._refuse(
                "Dynamo could not write its guards (a guard on a local object that cannot be "
                "serialised, or a graph break)"
            )
        # Dynamo files the function under ``fn.__module__``, which functools.wraps copies from
        # the wrapped function (Hugging Face's forward decorators); its globals, which the
        # guards read and the compiled bytecode runs with, are the wrapper's own module's.
        entry.codes[0].python_module = self.fn.__globals__.get("__name__", self.fn.__module__)
        ids = entry.backend_ids
        missing = {bid for bid in ids if bid not in self.artifacts}
        if missing:
            reasons = {
                getattr(self.package.cached_backends.get(bid), "magi_cache_refusal", None)
                for bid in missing
            }
            return self._refuse(
                "; ".join(sorted(r for r in reasons if r)) or "a graph was not ours"
            )
        if frozenset(ids) == self._written_ids:
            return None
        self._written_ids = frozenset(ids)
        # Pickled now: later captures add to the package while the writer works.
        return pickle.dumps(entry), {bid: self.artifacts[bid] for bid in ids}

    def _write(self, dynamo: bytes, graphs: dict[str, Any]) -> None:
        """On the writer thread."""
        try:
            start = time.perf_counter()
            for artifact in graphs.values():
                artifact.materialize()
            payload = pickle.dumps({"parts": self.parts, "dynamo": dynamo, "graphs": graphs})
            meta = {
                "function": self.parts["function"],
                "model_tag": self.model_tag,
                "parts": self.parts,
                "graphs": len(graphs),
                "created": time.time(),
                "hits": 0,
            }
            with _locked(self.directory):
                _write_atomically(self.path, _seal(payload))
                meta_path = self.path[: -len(_ENTRY_SUFFIX)] + _META_SUFFIX
                meta["hits"] = int(_read_meta(meta_path).get("hits", 0))
                meta["bytes"] = len(payload)
                _write_atomically(meta_path, json.dumps(meta, indent=1).encode())
        except Exception as e:  # noqa: BLE001 - a graph that does not pickle, a full disk
            self._written_ids = frozenset()
            return self._failed(e)
        _counters.bump("disk_cache_writes")
        ms = (time.perf_counter() - start) * 1e3
        logger.info(
            "%s: wrote %d compiled graph(s) to %s (%.1f KiB, %.0f ms on the writer thread)",
            self.model_tag, len(graphs), self.path, len(payload) / 1024, ms,
        )  # fmt: skip
        _event(
            self.model_tag,
            "written",
            f"{len(graphs)} graph(s) to {self.path}, {len(payload) / 1024:.1f} KiB, {ms:.0f} ms",
        )
        _refresh_dump(self.model_tag)

    def _failed(self, error: Exception) -> None:
        """A write failed. Each later capture tries again (a full disk may have room by then);
        the same error again is logged at INFO, so a cache directory that cannot be written
        warns once, not at every capture."""
        why = f"{type(error).__name__}: {error}"
        again = why == self._failure
        self._failure = why
        (logger.info if again else logger.warning)(
            "%s: the compiled-module cache entry could not be written%s: %s",
            self.model_tag, " again" if again else "", why,
        )  # fmt: skip
        _event(self.model_tag, "not written", why)
        _refresh_dump(self.model_tag)

    def _refuse(self, why: str) -> None:
        if self._refused != why:
            self._refused = why
            logger.info("%s: not written to the compiled-module cache: %s", self.model_tag, why)
            _event(self.model_tag, "not written", why)
            _refresh_dump(self.model_tag)


def _refresh_dump(model_tag: str) -> None:
    from magi_compiler import _dump

    _dump.refresh_page(model_tag)


# --- the writer thread -------------------------------------------------------------------------
_pending: list[concurrent.futures.Future] = []
_pending_lock = threading.Lock()


@functools.cache
def _writer() -> concurrent.futures.ThreadPoolExecutor:
    """One thread writes every entry, in order. Python waits for it at exit, so an entry
    whose call returned is on disk when the process ends (unless it ends by ``os._exit``)."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="magi-cache-writer")


def _submit(job: Callable, *args: Any) -> None:
    with _pending_lock:
        _pending.append(_writer().submit(job, *args))


def wait_for_writes() -> None:
    """Returns once every entry handed to the writer so far is written (or has failed). On
    the writer thread itself (a log handler reading the counters), returns at once."""
    if threading.current_thread().name.startswith("magi-cache-writer"):
        return
    with _pending_lock:
        pending, _pending[:] = list(_pending), []
    concurrent.futures.wait(pending)


def _after_fork_in_child() -> None:
    # The writer thread does not exist in a forked child: a new one starts on demand, and
    # the parent's pending writes are the parent's.
    _writer.cache_clear()
    _pending.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_entries: dict[tuple[Any, str], EntryCache] = {}
_entries_lock = threading.Lock()


def entry_cache(fn: Callable, config: Any, model_tag: str) -> EntryCache:
    """The one EntryCache of ``fn`` under ``config`` in this process: entries compiled one by
    one share Dynamo's cache of the function, so they share its package too."""
    with _entries_lock:
        key = (fn, repr(config))
        if key not in _entries:
            _entries[key] = EntryCache(fn, config, model_tag)
        return _entries[key]


# --- the command line's view ----------------------------------------------------------------
@dataclasses.dataclass
class EntryInfo:
    path: str
    function: str
    model_tag: str
    graphs: int
    bytes: int
    hits: int
    created: float
    last_used: float
    parts: dict[str, str]


def list_entries(root: str) -> list[EntryInfo]:
    base = os.path.join(os.path.expanduser(root), "modules")
    out = []
    for directory, _, files in os.walk(base):
        for name in sorted(files):
            if not name.endswith(_ENTRY_SUFFIX):
                continue
            path = os.path.join(directory, name)
            meta = _read_meta(path[: -len(_ENTRY_SUFFIX)] + _META_SUFFIX)
            stat = os.stat(path)
            out.append(
                EntryInfo(
                    path=path,
                    function=meta.get("function", "?"),
                    model_tag=meta.get("model_tag", "?"),
                    graphs=int(meta.get("graphs", 0)),
                    bytes=stat.st_size,
                    hits=int(meta.get("hits", 0)),
                    created=float(meta.get("created", stat.st_mtime)),
                    last_used=float(meta.get("last_used", meta.get("created", stat.st_mtime))),
                    parts=meta.get("parts", {}),
                )
            )
    return out


def remove_entry(entry: EntryInfo) -> None:
    directory = os.path.dirname(entry.path)
    with _locked(directory):
        for path in (entry.path, entry.path[: -len(_ENTRY_SUFFIX)] + _META_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
