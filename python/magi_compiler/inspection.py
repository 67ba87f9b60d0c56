"""What the compiler made of the graphs it compiled: for tests, debugging and curious users.

Every graph lowered to the C++ executor (a forward, backward or inference graph of a captured
module) leaves a :class:`CompiledGraphInfo` here: how many pieces it was split into at custom-op
boundaries, which boundary operators run between them, and how many pieces are distinct.
Records hold no tensors; the last 64 are kept::

    from magi_compiler import inspection

    y = block(x)                                  # first call: captures and compiles
    info = inspection.last_compiled()
    info.num_pieces, info.num_unique_pieces, info.boundary_ops
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CompiledGraphInfo",
    "last_compiled",
    "compiled_graphs",
    "last_recompute_plan",
    "recompute_plans",
    "offload_reports",
    "clear",
]


@dataclass(frozen=True)
class CompiledGraphInfo:
    kind: str  #: "forward", "backward" or "inference"
    num_pieces: int  #: piece calls per run (calls in row chunks, chunk_rows, included); 0: none
    num_unique_pieces: int  #: distinct pieces (identical ones are compiled once)
    piece_sequence: tuple[int, ...]  #: for each piece call, in order, the distinct piece it runs
    boundary_ops: tuple[str, ...]  #: boundary operator calls between the pieces, in order
    num_operator_calls: int  #: dispatcher calls per run, inside pieces included
    _run: Callable[[], Any] = field(repr=False, compare=False)

    @property
    def graph(self) -> Any:
        """The compiled ``_C.Graph`` (pieces under ``.pieces``), or None once it was freed."""
        run = self._run()
        return None if run is None else run.magi_graph

    @property
    def executable(self) -> Any:
        """The ``_C.Executable``, or None once it was freed."""
        run = self._run()
        return None if run is None else run.magi_executable


_lock = threading.Lock()
_records: collections.deque[CompiledGraphInfo] = collections.deque(maxlen=64)
_plans: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)


def record(kind: str, run: Callable, splitting_ops: Sequence[str]) -> CompiledGraphInfo:
    """Called by the backend for each lowered graph (``run`` carries magi_graph and
    magi_executable)."""
    graph, exe = run.magi_graph, run.magi_executable  # type: ignore[attr-defined]
    info = CompiledGraphInfo(
        kind=kind,
        num_pieces=exe.num_piece_calls,
        num_unique_pieces=exe.num_pieces,
        piece_sequence=tuple(exe.piece_call_sequence),
        boundary_ops=tuple(graph.boundary_op_names(list(splitting_ops))),
        num_operator_calls=exe.num_operator_calls,
        _run=weakref.ref(run),
    )
    with _lock:
        _records.append(info)
    return info


def last_compiled(kind: str | None = None) -> CompiledGraphInfo | None:
    """The most recently compiled graph (of ``kind``, when given), or None."""
    with _lock:
        for info in reversed(_records):
            if kind is None or info.kind == kind:
                return info
    return None


def compiled_graphs() -> list[CompiledGraphInfo]:
    """Every kept record, oldest first."""
    with _lock:
        return list(_records)


def record_recompute_plan(plan: dict[str, Any]) -> None:
    """Called by the partitioner (_recompute.py) for each training graph it plans."""
    with _lock:
        _plans.append(plan)


def last_recompute_plan() -> dict[str, Any] | None:
    """The recompute plan of the most recent training compile, or None. Keys: ``policy``,
    ``recomputed`` and ``saved`` (FX node names), ``saved_bytes``, ``no_recompute_bytes``,
    ``recomputed_bytes``, ``predicted_peak_bytes``, ``predicted_forward_peak_bytes``,
    ``no_recompute_peak_bytes``, ``lowest_peak_bytes`` (about how low a peak budget can go),
    ``recompute_seconds``, ``budget_met``, ``note`` and ``report`` (the text table)."""
    with _lock:
        return _plans[-1] if _plans else None


def recompute_plans() -> list[dict[str, Any]]:
    """Every kept recompute plan, oldest first."""
    with _lock:
        return list(_plans)


def attention_choices() -> list[dict[str, Any]]:
    """The attention kernels ``attention_backend="auto"`` chose in this process, one per shape,
    oldest first. Keys: ``shape`` (sizes, strides, dtype, device, causal), ``traced`` (the
    backend the capture recorded), ``chosen``, ``ms`` (median time per backend timed) and
    ``rejected`` (backends left out, with the reason)."""
    from magi_compiler import _C

    return _C.attention_choices()


def attention_patterns() -> list[dict[str, Any]]:
    """Every decision of the ``recognize_attention`` pass in this process, oldest first: one
    per softmax fed by a matmul. Keys: ``where`` (the softmax's FX name and source line),
    ``rewritten`` and ``detail`` (the call it became, with its mask, causality and scale, or why
    the chain was left as written). The C++ pass decides for inference graphs; training
    captures are rewritten before AOTAutograd (``_attention_fx``), their entries marked
    ``graph: "training"`` and listed after the inference ones. The ``recognize_causal_masks``
    pass records its decisions here too, marked ``pass: "recognize_causal_masks"``: ``where`` is
    the attention call, ``rewritten`` whether its mask, built from token positions, became
    ``is_causal`` (or was dropped as keeping everything)."""
    from magi_compiler import _C, _attention_fx

    return _C.attention_patterns() + list(_attention_fx.patterns)


def offload_reports() -> list[dict[str, Any]]:
    """The weight offload report of every kept inference graph that ran with offloaded
    weights, oldest first (model_cpu_offload, docs/offload.md). Keys: ``policy``, ``source``
    (what the plan's step times came from: ``calibration call``, ``cost model``,
    ``measured``), ``plan_version``, ``weights``, ``groups``, ``total_bytes``,
    ``resident_bytes``, ``streamed_bytes``, ``buffer_bytes``, ``link_gbps``,
    ``predicted_compute_ms``, ``predicted_copy_ms``, ``predicted_call_ms``,
    ``predicted_overlap``, ``ratio_to_hide``, ``hidden``, ``measured_call_ms``,
    ``measured_compute_ms``, ``measured_overlap`` (-1 until a timed call ran the current
    plan) and ``calls``."""
    out = []
    for info in compiled_graphs():
        exe = info.executable
        report = exe.offload_report() if exe is not None else None
        if report is not None:
            out.append(report)
    return out


def clear() -> None:
    """Forgets every record and plan, the attention patterns, and the attention choices (the
    next call of each shape probes again)."""
    from magi_compiler import _C

    with _lock:
        _records.clear()
        _plans.clear()
    _C.clear_attention_choices()
    _C.clear_attention_patterns()
    from magi_compiler import _attention_fx

    _attention_fx.patterns.clear()
