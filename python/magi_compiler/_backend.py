"""Dynamo backend: Dynamo graph → AOTAutograd (functionalised ATen graphs, forward and
backward) → C++ import → pass pipeline → C++ executor.

This module is glue only: it never looks inside a graph. Everything after AOTAutograd happens
in ``magi_compiler._C``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import inspect
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from magi_compiler import (
    _C,
    _compile_cache,
    _counters,
    _dump,
    _fast_dispatch,
    _offload,
    _recompute,
    inspection,
)
from magi_compiler._decompositions import decomposition_table
from magi_compiler._logging import logger
from magi_compiler.config import CompileConfig


def lower_graph(
    gm: torch.fx.GraphModule,
    kind: str,
    config: CompileConfig,
    from_cache: bool = False,
    saved_from: int | None = None,
    size_hints: dict[str, int] | None = None,
) -> Callable:
    """Imports an ATen-level FX graph, runs the pipeline and returns a boxed callable.
    ``from_cache``: the graph comes from the compiled-module cache, not from AOTAutograd.
    ``saved_from``: a training forward's first saved-for-backward output, when known (else
    read from AOTAutograd's metadata). ``size_hints``: the compiling call's value of each
    symbolic size (else read from the graph's shape environment)."""
    start = time.perf_counter()
    if not from_cache:
        _record_for_cache(gm, kind)
    lowering = _dump.lowering(kind, gm, config)  # timeline, summary and (if enabled) dumps
    graph = _C.import_fx_graph(gm)
    lowering.imported(graph)
    # Custom-op boundaries are read from the C++ op registry now, at compile time, so operators
    # registered after the model was decorated count too.
    records = graph.run_pipeline(
        list(config.pass_config.disabled_passes),
        list(config.splitting_ops),
        after_pass=lowering.after_pass,
        chunk_rows=config.chunk_rows if kind == "inference" else 0,
        size_hints=(_recompute.size_hints(gm.graph) if size_hints is None else size_hints)
        if kind == "inference"
        else {},
    )
    lowering.passes_done(records)
    executable = _C.Executable(
        graph,
        attention_backend=config.attention_backend,
        private_outputs_from=_saved_outputs_start(kind) if saved_from is None else saved_from,
        offload=_offload.engine_settings(config, kind),
        # Training graphs keep the caching allocator: their backward frees saved inputs as it
        # reads them, which the arena's peak estimate does not model (ExecutorOptions).
        memory_arena=kind == "inference",
        disabled_passes=list(config.pass_config.disabled_passes),
    )
    # All CUDA kernels at once on a thread pool, rather than one by one in the first call.
    executable.precompile_kernels()
    lowering.built(executable)
    _counters.bump("cache_loaded_graphs" if from_cache else "compiles")
    logger.debug(
        "compiled %s graph: %d nodes, %d operator calls, %d piece calls of %d pieces, %.1f ms",
        kind,
        graph.num_nodes,
        executable.num_operator_calls,
        executable.num_piece_calls,
        executable.num_pieces,
        (time.perf_counter() - start) * 1e3,
    )

    runner = _cuda_graph_runner(gm, kind, config, executable)
    call = lowering.first_call_hook(runner.run if runner is not None else executable.run)

    first = True

    def run(args: list[Any]) -> list[Any]:
        # Boxed calling convention: the list is ours to empty. The C++ side takes the inputs and
        # clears it before running, so each input (a backward's saved tensors) is freed after
        # its last use rather than when the call returns.
        nonlocal first
        slot = _fast_dispatch.observe_inputs(run, args)
        if first:
            first = False
            with _without_custom_op_check(executable):
                outputs = call(args, steal_inputs=True)
        else:
            outputs = call(args, steal_inputs=True)
        if slot is not None:
            _fast_dispatch.observe_outputs(slot, outputs)
        return outputs

    run._boxed_call = True  # type: ignore[attr-defined]
    run.magi_graph = graph  # type: ignore[attr-defined]  # for inspection and tests
    run.magi_executable = executable  # type: ignore[attr-defined]
    run.magi_cuda_graphs = runner  # type: ignore[attr-defined]
    # What a C++ direct call may run in place of `run`: the runner or executable itself, unless
    # something wraps it (dumps count the first calls to write their reports).
    plain = call == (runner.run if runner is not None else executable.run)
    run.magi_native_target = (runner or executable) if plain else None  # type: ignore[attr-defined]
    run.magi_kind = kind  # type: ignore[attr-defined]
    # Where Dynamo found each input (source expressions) and whether the capture had Python
    # side effects: what a direct call needs (_fast_dispatch.py). Inference graphs only.
    capture = getattr(_capturing, "info", None) if kind == "inference" else None
    run.magi_sources = capture["sources"] if capture else None  # type: ignore[attr-defined]
    run.magi_side_effect_free = bool(capture and capture["side_effect_free"])  # type: ignore[attr-defined]
    inspection.record(kind, run, config.splitting_ops)
    return run


def _saved_outputs_start(kind: str) -> int:
    """For a training forward, the index of its first saved-for-backward output (what
    AOTAutograd's metadata says comes after the returned values); -1 otherwise or unknown."""
    if kind != "forward":
        return -1
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    return int(getattr(metadata, "num_forward", -1))


_warned_cpu_cudagraphs = False


def _cuda_graph_runner(gm: torch.fx.GraphModule, kind: str, config: CompileConfig, executable):
    """A CUDA graph runner for FULL mode (None otherwise; PIECEWISE is set up on the
    executable itself). CUDA graphs apply to inference graphs on CUDA tensors only."""
    global _warned_cpu_cudagraphs
    mode = config.cudagraph_mode.name
    if mode == "NONE" or kind != "inference":
        return None
    from magi_compiler._cached_graph import TensorRecord  # a cached graph's fake tensors

    devices = {
        n.meta["val"].device.type
        for n in gm.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), (torch.Tensor, TensorRecord))
    }
    if devices != {"cuda"} or not _C.CudaGraphRunner.available():
        if not _warned_cpu_cudagraphs:
            _warned_cpu_cudagraphs = True
            logger.warning(
                "cudagraph_mode=%s needs CUDA inputs and a CUDA build; running without CUDA "
                "graphs (inputs on %s)",
                mode,
                ", ".join(sorted(devices)) or "no device",
            )
        return None
    # Pieces called in row chunks (chunk_rows) run inside their caller's graph, not on their own.
    split = executable.num_pieces > executable.num_chunked_pieces
    if mode == "FULL" and config.offload_config.model_cpu_offload:
        # One graph for the whole call cannot wait for copies started by the previous call,
        # nor notice weights changed in place: offloaded models use PIECEWISE graphs.
        _offload.warn_once(
            "full-graphs",
            "cudagraph_mode=FULL with model_cpu_offload: capturing the pieces only (PIECEWISE), "
            "the weight copies run between them%s",
            "" if split else "; this graph has no pieces, so no CUDA graphs",
        )
        mode = "PIECEWISE"
        if not split:
            return None
    ladder = bucket_ladder(config)
    # Offloaded weights reach the graphs as views of the engine's streaming buffers, new
    # tensors on every call: keyed by identity, each call would capture again.
    offloaded = config.offload_config.model_cpu_offload
    keyed = [] if offloaded else keyed_inputs(getattr(_capturing, "info", None))
    if len(keyed) != executable.num_inputs:
        keyed = []  # the sources do not line up with the graph's inputs: key none
    if mode == "PIECEWISE" and split:
        executable.enable_piece_cuda_graphs(config.max_cuda_graphs, ladder, keyed)
        paddings = executable.piece_paddings
    else:
        paddings = [executable.padding]
    if ladder:
        for i, padding in enumerate(paddings):
            if padding.startswith("not padded") and "no tensor input has a dynamic" not in padding:
                where = f"piece {i}" if len(paddings) > 1 else "this graph"
                logger.info(
                    "CUDA graphs: batch sizes of %s are captured exactly, not padded into "
                    "buckets (%s)",
                    where,
                    padding[len("not padded: ") :],
                )
    if mode == "PIECEWISE" and split:
        return None
    return _C.CudaGraphRunner(executable, config.max_cuda_graphs, ladder, keyed)


def keyed_inputs(capture: dict[str, Any] | None) -> list[bool]:
    """Per graph input, whether Dynamo found it in a module's parameters or buffers: CUDA
    graphs key those by identity (``runtime/cuda_graph.h``), so a layer compiled once and
    called for each layer instance gets a graph per instance that reads its weights in place."""
    if capture is None:
        return []
    return [bool(_fast_dispatch.MODULE_STATE.match(source)) for source in capture["sources"]]


def bucket_ladder(config: CompileConfig) -> list[int]:
    """Batch sizes CUDA graphs are captured for: compile_sizes, else the default ladder; none
    when padding is off."""
    if not config.cudagraph_padding:
        return []
    return sorted(set(config.compile_sizes)) or list(_C.default_bucket_ladder())


_capturing = threading.local()  # .info: _capture_info of the Dynamo graph being compiled
_static_dims = threading.local()  # .seen: see recording_static_dims


@contextlib.contextmanager
def recording_static_dims():
    """Collects, while active, the static dims of every tensor input of the Dynamo graphs
    captured on this thread, by source (``{"L['w']": {0, 1}}``; a dim static in any graph
    counts): which dims marked maybe-dynamic the traced code fixed."""
    outer = getattr(_static_dims, "seen", None)
    _static_dims.seen = seen = {}
    try:
        yield seen
    finally:
        _static_dims.seen = outer


def _record_static_dims(gm: torch.fx.GraphModule) -> None:
    seen = getattr(_static_dims, "seen", None)
    if seen is None:
        return
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        name = getattr(getattr(node.meta.get("grapharg"), "source", None), "name", None)
        if callable(name):  # a method before torch 2.10, a property since
            name = name()
        value = node.meta.get("example_value")
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            continue
        static = {
            i
            for i, size in enumerate(value.shape)
            if not isinstance(size, torch.SymInt) or size.node.maybe_as_int() is not None
        }
        seen.setdefault(name, set()).update(static)


def _capture_info(gm: torch.fx.GraphModule) -> dict[str, Any] | None:
    """The source expression of each input of Dynamo's graph (``L['x']``,
    ``L['self']._modules['fc']._parameters['weight']``, ``L['x'].size()[0]``) and whether the
    traced code had Python side effects; None when Dynamo does not say."""
    sources = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        arg = node.meta.get("grapharg")
        name = getattr(getattr(arg, "source", None), "name", None)
        if callable(name):  # a method before torch 2.10, a property since
            name = name()
        if not isinstance(name, str):
            return None
        sources.append(name)
    try:
        from torch._dynamo.source import TempLocalSource
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        effects = tx.output.side_effects
        own_keywords = _own_keywords(tx.f_code)
        # Objects created during the trace count as "modified" too; what a direct call would
        # skip are mutations of objects that existed before it (they have a source; a
        # TempLocalSource only names an object the trace built, such as a ModelOutput). The
        # frame's own **kwargs dict is made for the call and dies with the frame: a write to
        # it (a decorator's kwargs.pop or kwargs[k] = v) is seen by nothing after it.
        side_effect_free = not (
            effects.tensor_hooks
            or effects.save_for_backward
            or any(
                effects.is_modified(v)
                and getattr(v, "source", None) is not None
                and not isinstance(v.source, TempLocalSource)
                and _source_name(v.source) != own_keywords
                and not _restored(effects, v)
                for v in effects.id_to_variable.values()
            )
        )
    except Exception:  # noqa: BLE001 - an internal API: without it, assume side effects
        side_effect_free = False
    return {"sources": sources, "side_effect_free": side_effect_free}


# --- the compiled-module cache (_compile_cache.py) ----------------------------------------------
_cache_record = threading.local()  # .graphs: [(kind, artifact or None, why not)] of one capture


def _record_for_cache(gm: torch.fx.GraphModule, kind: str) -> None:
    """While a capture is recorded for the disk cache: keeps what a warm process needs to
    rebuild this graph, or why it cannot."""
    graphs = getattr(_cache_record, "graphs", None)
    if graphs is None:
        return
    if kind != "inference":  # recorded whole by _on_training_entry, if AOTAutograd bundles it
        graphs.append((kind, None, "AOTAutograd made no cache entry of the training graphs"))
        return
    context = torch._guards.TracingContext.try_get()
    why = _compile_cache.trivial_wrapper_reason(
        getattr(context, "fw_metadata", None), gm, _cache_record.num_inputs
    )
    capture = getattr(_capturing, "info", None)
    if not why and capture is None:
        why = "Dynamo did not say where the graph's inputs come from"
    if why:
        graphs.append((kind, None, why))
        return
    # Pickled when the entry is written, on the cache's writer thread.
    artifact = _compile_cache.GraphArtifact(
        None,
        capture["sources"],
        capture["side_effect_free"],
        _cache_record.num_inputs,
        size_hints=_recompute.size_hints(gm.graph),
        gm=gm,
    )
    graphs.append((kind, artifact, ""))


def _on_training_entry(entry: Any) -> None:
    """AOTAutograd's bundle of a training capture's forward and backward (_cache_training.py)
    replaces the graphs' own records."""
    graphs = getattr(_cache_record, "graphs", None)
    if graphs is None:
        return
    graphs[:] = [g for g in graphs if g[0] not in ("forward", "backward")]
    graphs.append(("training", _compile_cache.TrainingArtifact(None, pending=entry), ""))


def captured_since_last_asked() -> bool:
    """Whether this thread captured a graph since the last time it asked."""
    captured = getattr(_cache_record, "captured", False)
    _cache_record.captured = False
    return captured


def _attach_cache_record(compiled: Callable, graphs: list[tuple[str, Any, str]]) -> Callable:
    """The backend's result, carrying its cache artifact (or why it has none) for
    ``EntryCache.after_capture``."""
    if not hasattr(compiled, "__dict__"):
        inner = compiled

        def compiled(*args: Any) -> Any:
            return inner(*args)

    if len(graphs) == 1 and graphs[0][1] is not None:
        compiled.magi_cache_artifact = graphs[0][1]  # type: ignore[attr-defined]
    else:
        why = "; ".join(sorted({w for _, _, w in graphs if w})) or "no graph was lowered"
        compiled.magi_cache_refusal = why  # type: ignore[attr-defined]
    return compiled


def lower_cached_graph(gm: torch.fx.GraphModule, artifact: Any, config: CompileConfig) -> Callable:
    """The runner of a graph loaded from the compiled-module cache."""
    _capturing.info = {"sources": artifact.sources, "side_effect_free": artifact.side_effect_free}
    try:
        return lower_graph(gm, "inference", config, from_cache=True, size_hints=artifact.size_hints)
    finally:
        _capturing.info = None


def _source_name(source: Any) -> Any:
    name = getattr(source, "name", None)
    return name() if callable(name) else name  # a method before torch 2.10, a property since


def _own_keywords(code: types.CodeType) -> str | None:
    """The source of ``code``'s ``**kwargs`` parameter as a local of the traced frame."""
    if not code.co_flags & inspect.CO_VARKEYWORDS:
        return None
    index = code.co_argcount + code.co_kwonlyargcount
    index += 1 if code.co_flags & inspect.CO_VARARGS else 0
    return f"L['{code.co_varnames[index]}']"


_PLAIN = (bool, int, float, str, type(None))
_MISSING = object()


def _restored(effects: Any, variable: Any) -> bool:
    """Whether every attribute the trace wrote on this pre-existing object ends with the plain
    value (None, a bool, a number, a string) it had before: a set-then-reset pair, such as
    transformers' output collector (set on entry, reset in a ``finally``), changes nothing a
    direct call would have to replay."""
    obj = getattr(variable, "value", None)
    writes = effects.store_attr_mutations.get(variable)
    if obj is None or not writes or variable.is_underlying_vt_modified(effects):
        return False
    for name, value in writes.items():
        if not value.is_python_constant():
            return False
        after, before = value.as_python_constant(), getattr(obj, name, _MISSING)
        if not isinstance(after, _PLAIN) or type(after) is not type(before) or after != before:
            return False
    return True


_gc_lock = threading.Lock()
_gc_depth = 0  # captures in progress that paused the collector, all threads


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector around a capture: Dynamo, AOTAutograd and our
    passes allocate enough to set off full collections of the whole heap (torch, transformers
    and the model included), a few tenths of a second each; what they leave is collected as
    usual afterwards. Only a collector that was on is paused, and it is turned back on when
    the last capture in progress (on any thread) ends."""
    global _gc_depth
    with _gc_lock:
        if _gc_depth == 0 and not gc.isenabled():
            paused = False
        else:
            paused = True
            _gc_depth += 1
            gc.disable()
    try:
        yield
    finally:
        if paused:
            with _gc_lock:
                _gc_depth -= 1
                if _gc_depth == 0:
                    gc.enable()


_MINIFIER_MODULE = "torch._dynamo.repro.after_dynamo"


class _BackendWithoutMinifier:
    """What Dynamo's ``wrap_backend_debug`` returns, the same attributes and call, for a
    process with no minifier configured: the minifier is imported only if one is configured
    by the time a graph reaches the backend."""

    def __init__(self, backend: Callable, compiler_name: str | None) -> None:
        functools.wraps(backend)(self)
        self._torchdynamo_orig_backend = backend
        self._compiler_name = compiler_name
        self.__name__ = getattr(backend, "compiler_name", getattr(backend, "__name__", "magi"))
        if hasattr(backend, "get_compiler_config"):
            self.get_compiler_config = backend.get_compiler_config

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any):
        if torch._dynamo.config.repro_after is not None:
            from torch._dynamo.repro import after_dynamo

            wrapped = after_dynamo.wrap_backend_debug(self._torchdynamo_orig_backend, None)
            return wrapped(gm, example_inputs, **kwargs)
        return self._torchdynamo_orig_backend(gm, example_inputs, **kwargs)


@contextlib.contextmanager
def without_minifier_import() -> Iterator[None]:
    """Around ``torch._dynamo.optimize``/``torch.compile``: Dynamo wraps every backend for its
    minifier, and the minifier's module imports AOTAutograd, Inductor's code cache and
    networkx, a third of a second with bytecode caches and a second without. A call served
    from the compiled-module cache needs none of them; a capture imports AOTAutograd itself.
    While no minifier is configured and that module is not loaded, Dynamo's import of it finds
    ``_BackendWithoutMinifier`` instead, for the duration of the call only."""
    if _MINIFIER_MODULE in sys.modules or torch._dynamo.config.repro_after is not None:
        yield
        return
    stand_in = types.ModuleType(_MINIFIER_MODULE)
    stand_in.wrap_backend_debug = _BackendWithoutMinifier

    def anything_else(name: str) -> Any:
        # A torch that reads more from the module gets the real one, loaded now. Dunders are
        # what the import system probes (``__path__``): they are not there, as on any module.
        if name.startswith("__"):
            raise AttributeError(name)
        if sys.modules.get(_MINIFIER_MODULE) is stand_in:
            del sys.modules[_MINIFIER_MODULE]
        return getattr(importlib.import_module(_MINIFIER_MODULE), name)

    stand_in.__getattr__ = anything_else
    sys.modules[_MINIFIER_MODULE] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(_MINIFIER_MODULE) is stand_in:
            del sys.modules[_MINIFIER_MODULE]


def _attention_pass_on(config: CompileConfig) -> bool:
    """recognize_attention is not disabled (``pass_config.disabled_passes`` or
    ``MAGI_DISABLE_PASSES``, as for the C++ pipeline)."""
    env = os.environ.get("MAGI_DISABLE_PASSES", "").split(",")
    disabled = {n.strip() for n in env} | set(config.pass_config.disabled_passes)
    return "recognize_attention" not in disabled


def make_backend(config: CompileConfig, on_lowered: Callable[[str, Any], None] | None = None):
    """A Dynamo backend compiling every captured graph with magi's pipeline. AOTAutograd is
    imported at the first capture: a process whose graphs all come from the compiled-module
    cache never needs it (importing it costs most of a second)."""

    def compiler(kind: str, bundled: bool = False):
        """``bundled``: a training graph AOTAutograd bundles for the compiled-module cache."""
        if bundled:
            from magi_compiler import _cache_training

        def compile_fn(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
            if config.backend == "eager":
                fn = gm.forward
            else:
                fn = lower_graph(gm, kind, config)
            if on_lowered is not None:
                on_lowered(kind, fn)
            if bundled:
                return _cache_training.LoweredGraph(gm, kind, fn, _saved_outputs_start(kind))
            return fn

        if bundled:
            return _cache_training.serializable_compiler(compile_fn)
        return compile_fn

    def partition(joint_module: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any):
        # The C++ recompute planner decides what the backward recomputes (_recompute.py).
        return _recompute.partition(joint_module, joint_inputs, config=config, **kwargs)

    @functools.cache
    def aot(bundled: bool) -> Callable:
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(
            fw_compiler=compiler("forward", bundled=bundled),
            partition_fn=partition,
            bw_compiler=compiler("backward", bundled=bundled),
            # Bundled too: AOTAutograd may still choose inference (no output needs grad).
            inference_compiler=compiler("inference", bundled=bundled),
            decompositions=decomposition_table(),
            keep_inference_input_mutations=True,
        )

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        _counters.bump("captures")
        _cache_record.captured = True
        logger.debug("captured a Dynamo graph with %d nodes", len(gm.graph.nodes))
        _capturing.info = _capture_info(gm)
        _record_static_dims(gm)
        caching = config.backend != "eager" and not config.disable_cache
        if caching:
            _cache_record.graphs, _cache_record.num_inputs = [], len(example_inputs)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(_dump.compile_scope(gm, config))  # INFO line; dumps if on
                # AOTAutograd's rule for a training graph; only those need its bundle (and the
                # import of the module that makes one, about a second).
                training = torch.is_grad_enabled() and any(
                    getattr(t, "requires_grad", False) for t in example_inputs
                )
                if training and config.backend != "eager" and _attention_pass_on(config):
                    from magi_compiler import _attention_fx

                    _attention_fx.rewrite_attention(gm)  # the inference pass runs in C++
                bundled = caching and training
                if bundled:
                    from magi_compiler import _cache_training

                    stack.enter_context(_cache_training.recording(_on_training_entry))
                compiled = aot(bundled)(gm, example_inputs)
            if caching:
                compiled = _attach_cache_record(compiled, _cache_record.graphs)
            return compiled
        finally:
            _capturing.info = None
            _cache_record.graphs = None

    return backend


def _without_custom_op_check(executable: Any) -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd runs a compiled graph's first call under a dispatch mode that checks custom
    operators for outputs aliasing their inputs. Every ATen call our executor makes then goes
    through Python, which slows that call and gives each intermediate a Python object: the extra
    reference keeps generated kernels from writing over inputs that die at them, so the first
    call peaks higher than the later ones. A graph without custom operators has nothing for the
    mode to check: its first call runs without it. Any other mode (the caller's own) stays."""
    if executable is None or executable.calls_custom_ops:
        return contextlib.nullcontext()
    if torch._C._len_torch_dispatch_stack() != 1:
        return contextlib.nullcontext()
    mode = torch._C._get_dispatch_stack_at(0)
    if type(mode).__name__ != "_AnalyzeCustomOpInputOutputMode":
        return contextlib.nullcontext()
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()
