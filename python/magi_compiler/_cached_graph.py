"""The ATen graph of a compiled-module cache entry, as it is stored: pickled with torch's
``GraphPickler``, each node's meta cut down to what lowering reads (fx_import.cpp), and each
value described by a record (dtype, device, sizes and strides, sympy expressions where
symbolic) rather than by a fake tensor, which took most of a warm start's load to rebuild."""

from __future__ import annotations

from typing import Any

import torch

from magi_compiler._logging import logger

# What lowering reads from a node's meta (fx_import.cpp): the rest (module stacks, source
# function stacks, ...) costs pickling time and bytes and is left out.
_KEPT_META = ("val", "stack_trace")


class TensorRecord:
    """What lowering reads of a node's fake tensor (fx_import.cpp), in the fake tensor's
    terms: dtype, device, requires_grad, shape, stride(), storage_offset(). Sizes are ints
    or sympy expressions (a symbolic size's ``node.expr``). A graph from the cache carries
    these instead of fake tensors, which took most of a warm start's loading time to rebuild."""

    __slots__ = ("dtype", "device", "requires_grad", "shape", "_stride", "_offset")
    magi_record = "tensor"

    def __init__(self, dtype, device, requires_grad, shape, stride, offset) -> None:
        self.dtype, self.device, self.requires_grad = dtype, device, requires_grad
        self.shape, self._stride, self._offset = shape, stride, offset

    def stride(self) -> tuple:
        if self._stride is None:
            raise RuntimeError("this layout has no strides")
        return self._stride

    def storage_offset(self) -> Any:
        return self._offset

    def __reduce__(self) -> tuple:
        fields = (self.dtype, self.device, self.requires_grad, self.shape, self._stride)
        return TensorRecord, (*fields, self._offset)


class SymRecord:
    """A node's symbolic number: its kind ("int", "float", "bool") and, for an int, its sympy
    expression (lowering reads no more)."""

    __slots__ = ("kind", "expr")
    magi_record = "sym"

    def __init__(self, kind: str, expr: Any = None) -> None:
        self.kind, self.expr = kind, expr

    def __reduce__(self) -> tuple:
        return SymRecord, (self.kind, self.expr)


class _NotRecorded(Exception):
    """A meta value the records do not describe: the graph keeps its fake tensors."""


def _size(x: Any) -> Any:
    if type(x) is int:
        return x
    if isinstance(x, torch.SymInt):
        static = x.node.maybe_as_int()
        return static if static is not None else x.node.expr
    raise _NotRecorded(type(x).__name__)


def _record(val: Any) -> Any:
    """``val`` (a node's meta["val"]) as records."""
    if val is None or type(val) in (int, float, bool):
        return val
    if isinstance(val, torch.Tensor):
        try:
            stride = tuple(_size(x) for x in val.stride())
            offset = _size(val.storage_offset())
        except RuntimeError:  # layouts without strides (sparse, nested)
            stride, offset = None, 0
        shape = tuple(_size(x) for x in val.shape)
        return TensorRecord(val.dtype, val.device, val.requires_grad, shape, stride, offset)
    if isinstance(val, torch.SymInt):
        return SymRecord("int", _size(val))
    if isinstance(val, torch.SymFloat):
        return SymRecord("float")
    if isinstance(val, torch.SymBool):
        return SymRecord("bool")
    if type(val) in (tuple, list):
        return type(val)(_record(v) for v in val)
    raise _NotRecorded(type(val).__name__)


def pickle_graph(gm: torch.fx.GraphModule) -> bytes:
    from torch.fx._graph_pickler import GraphPickler, Options

    saved = [(node, node.meta) for node in gm.graph.nodes]
    try:
        try:
            records = [_record(meta.get("val")) for _, meta in saved]
        except _NotRecorded as e:
            logger.debug("compiled-module cache: a graph keeps its fake tensors (%s)", e)
            records = None
        for i, (node, meta) in enumerate(saved):
            node.meta = {k: meta[k] for k in _KEPT_META if k in meta}
            if records is not None and "val" in meta:
                node.meta["val"] = records[i]
        return GraphPickler.dumps(gm, Options(ops_filter=None))
    finally:
        for node, meta in saved:
            node.meta = meta


def unpickle_graph(data: bytes) -> torch.fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # Not recompiled: lowering reads the graph, never the module's Python code (generating and
    # compiling it took a tenth of a warm start's time on a 16-layer model).
    return GraphPickler.loads(data, FakeTensorMode(shape_env=ShapeEnv()))
