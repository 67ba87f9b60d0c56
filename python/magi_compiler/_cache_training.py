"""Training entries of the compiled-module cache (docs/cache.md): a captured graph that
AOTAutograd splits into a forward and a backward is cached as AOTAutograd's own bundled entry,
the record torch's precompile writes: both ATen graphs, the runtime metadata (which inputs are
mutated, which outputs alias, what the forward saves for the backward) and the wrappers around
them. Loading it rebuilds AOTAutograd's runtime wrapper (the ``autograd.Function``) around our
two lowered graphs without tracing or partitioning anything.

Each graph is lowered into a :class:`LoweredGraph`, the ``OutputCode`` AOTAutograd bundles: it
runs our executable and, written to disk, holds the ATen graph (GraphPickler), which a warm
process lowers again. This module imports ``torch._inductor.output_code`` (about a second), so
only processes that compile or load a training graph with the cache on import it.

While our backend compiles with the cache on, :func:`recording` stands in for AOTAutograd's
own cache: it never loads from torch's cache directory, asks AOTAutograd for a bundle only for
training compiles, and hands the bundle to the compiled-module cache rather than writing it to
torch's directory.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from torch._inductor.output_code import OutputCode

from magi_compiler import _backend, _cached_graph

_loading = threading.local()  # .config: the config of the training entry being loaded


class LoweredGraph(OutputCode):
    """One lowered training graph (forward or backward) as AOTAutograd bundles it."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, run: Callable, saved_from: int):
        super().__init__()
        self.kind = kind
        self.saved_from = saved_from  # the forward's first saved-for-backward output
        self._gm: torch.fx.GraphModule | None = gm
        self._graph: bytes | None = None  # the pickled ATen graph, once written
        self._run: Callable | None = run
        self._boxed_call = True

    def __call__(self, inputs: list[Any]) -> Any:
        return self._run(inputs)

    def prepare_for_serialization(self) -> None:
        # Called on a shallow copy (AOTAutograd's pre_save): the running one keeps its run.
        self._graph = _cached_graph.pickle_graph(self._gm)
        self._gm = self._run = None

    def post_compile(self, example_inputs: Any, constants: Any, graph_kwargs: Any) -> None:
        if self._run is None:  # loaded from disk
            gm = _cached_graph.unpickle_graph(self._graph)
            self._run = _backend.lower_graph(
                gm, self.kind, _loading.config, from_cache=True, saved_from=self.saved_from
            )


def serializable_compiler(compile_fn: Callable) -> Any:
    """``compile_fn`` as the compiler AOTAutograd bundles the output of."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    return SerializableAOTDispatchCompiler(LoweredGraph, compile_fn)


@contextlib.contextmanager
def recording(on_entry: Callable[[Any], None]) -> Iterator[None]:
    """While active, a training compile by AOTAutograd calls ``on_entry(entry)`` with its
    bundled entry (pickled later, by the cache's writer thread)."""
    from torch._functorch import aot_autograd
    from torch._functorch._aot_autograd import autograd_cache
    from torch._functorch._aot_autograd.schemas import AOTAutogradCacheInfo

    cache = autograd_cache.AOTAutogradCache

    def try_load(mod: Any, args: Any, aot_config: Any, *rest: Any, **kwargs: Any) -> None:
        training = torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args
        )
        if training:  # AOTAutograd bundles what it compiles when it has a cache_info
            aot_config.cache_info = AOTAutogradCacheInfo(
                "magi-compiled-module-cache", time.time_ns(), forward_symints=[]
            )
        return None

    def save(key: str, entry: Any, remote: bool) -> None:
        if getattr(entry, "compiled_bw", None) is not None:  # an inference graph: ours records it
            on_entry(entry)

    with contextlib.ExitStack() as stack:
        stack.enter_context(
            torch._functorch.config.patch(
                bundled_autograd_cache=True,
                # The backward is lowered with the forward, so one bundle holds both.
                force_non_lazy_backward_lowering=True,
            )
        )
        stack.enter_context(
            mock.patch.object(aot_autograd, "should_use_local_autograd_cache", lambda: True)
        )
        stack.enter_context(
            mock.patch.object(aot_autograd, "should_use_remote_autograd_cache", lambda: False)
        )
        stack.enter_context(mock.patch.object(cache, "try_load", staticmethod(try_load)))
        stack.enter_context(mock.patch.object(cache, "save", staticmethod(save)))
        yield


def load(data: bytes, config: Any) -> Callable:
    """The callable a cached training entry stands for: AOTAutograd's runtime wrapper around
    our lowered forward and backward, rebuilt from ``data``."""
    from torch._functorch._aot_autograd.aot_autograd_result import deserialize_bundled_cache_entry

    entry = pickle.loads(data)
    _loading.config = config
    try:
        return deserialize_bundled_cache_entry(entry)
    finally:
        _loading.config = None
