"""One dense document on cuDNN's fused attention, where it runs, agrees and is faster than flash.

A range mask that is a single document, one FULL slice over every query and key or one CAUSAL
slice with as many queries as keys, is plain attention, and PyTorch's cuDNN kernels
(``aten::_scaled_dot_product_cudnn_attention`` and its backward) ran ahead of the flash kernels
of ``flash_path.py`` on an H100 (the attention table of benchmarks/RESULTS.md); since that need
not hold for every shape and GPU, each shape is measured. They are considered when the call
has as many key/value heads as query heads (PyTorch's cuDNN call takes no grouped heads), one
head dim of at most 128, and ``torch.backends.cuda.cudnn_sdp_enabled()``.

Whether cuDNN runs is decided once per (direction, shape, dtype, causal, device) in a process,
on the first call that is not being captured into a CUDA graph: both kernels run, cuDNN's
results are compared with flash's (out and lse forward, dq, dk and dv backward, within
half-precision rounding), and both are timed (median of ``TIMED_RUNS`` CUDA-event timings).
cuDNN is kept only when it ran, agreed and was faster; every decision and its reason is logged
at INFO and listed by :func:`choices`. The kernels take (batch, heads, tokens, head_dim)
tensors, contiguous (PyTorch's cuDNN call may misread other strides), so the packed tensors
are copied into that layout and back.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from typing import Any

import torch

from magi_compiler._logging import logger

TIMED_RUNS = 5
MAX_HEAD_DIM = 128

_lock = threading.Lock()
_verdicts: dict[tuple, str] = {}
_log: list[dict[str, Any]] = []


def dense_causal(q, k, v, calls) -> bool | None:
    """For flash calls (``flash_path.plan``) that are one dense document cuDNN can run: whether
    it is causal; otherwise None."""
    if len(calls) != 1:
        return None
    call = calls[0]
    if call.q_rows is not None or call.k_rows is not None or len(call.cu_q) != 2:
        return None
    if call.window_left != -1 or (call.causal and q.shape[0] != k.shape[0]):
        return None
    if q.shape[1] != k.shape[1] or q.shape[2] > MAX_HEAD_DIM or v.shape[2] != q.shape[2]:
        return None
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return None
    return call.causal


def _bhsd(x: torch.Tensor) -> torch.Tensor:
    """(tokens, heads, dim) -> (1, heads, tokens, dim), contiguous."""
    return x.transpose(0, 1).unsqueeze(0).contiguous()


def _thd(x: torch.Tensor) -> torch.Tensor:
    return x[0].transpose(0, 1).contiguous()


def forward(q, k, v, causal: bool, softmax_scale: float):
    """``(out, lse)`` in range_attention's layouts: out (tq, hq, d), lse (tq, hq) float32."""
    out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        _bhsd(q), _bhsd(k), _bhsd(v), None, True, 0.0, causal, False, scale=softmax_scale
    )
    return _thd(out), lse.reshape(q.shape[1], q.shape[0]).t().contiguous().float()


def backward(dout, q, k, v, out, lse, causal: bool, softmax_scale: float):
    """``(dq, dk, dv)`` of :func:`forward`'s output (no gradient through lse)."""
    no_dropout = torch.zeros((), dtype=torch.int64, device=q.device)
    # No bias and no cumulative offsets: undefined tensors (an empty one would mean varlen).
    grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        _bhsd(dout), _bhsd(q), _bhsd(k), _bhsd(v), _bhsd(out),
        lse.t().unsqueeze(0).contiguous(), no_dropout, no_dropout, None, None, None,
        q.shape[0], k.shape[0], 0.0, causal, scale=softmax_scale,
    )  # fmt: skip
    return tuple(_thd(g) for g in grads)


def _disagreement(ours, theirs) -> str:
    """Why cuDNN's results are not flash's, or "": half-precision results (out, gradients)
    within 5% of their largest magnitude (at least 1), float32 ones (lse) within 0.02."""
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        if a.shape != b.shape:
            return f"result {i} has shape {tuple(a.shape)}, flash's {tuple(b.shape)}"
        scale = 1.0 if b.dtype == torch.float32 else max(1.0, float(b.float().abs().max()))
        tolerance = 2e-2 if b.dtype == torch.float32 else 5e-2 * scale
        err = float((a.float() - b.float()).abs().max())
        if not err <= tolerance:  # also catches NaN
            return f"result {i} differs from flash's by {err:.3g} (tolerance {tolerance:.3g})"
    return ""


def _median_ms(fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(TIMED_RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def use_cudnn(direction: str, q, k, causal: bool, run_cudnn, run_flash) -> bool:
    """Whether ``direction`` ("forward" or "backward") of this shape runs on cuDNN; decided on
    its first call outside CUDA-graph capture by running and timing both (module docstring)."""
    key = (direction, tuple(q.shape), tuple(k.shape), q.dtype, causal, q.device)
    with _lock:
        verdict = _verdicts.get(key)
    if verdict is not None:
        return verdict == "cudnn"
    if torch.cuda.is_current_stream_capturing():
        return False  # no probe inside a capture; the next call outside one decides
    entry: dict[str, Any] = {"direction": direction, "q": tuple(q.shape), "k": tuple(k.shape),
                             "dtype": str(q.dtype).removeprefix("torch."), "causal": causal}  # fmt: skip
    flash = run_flash()
    try:
        why = _disagreement(flash, run_cudnn())
    except Exception as e:  # noqa: BLE001 - any failure of the cuDNN call is a verdict
        why = f"cuDNN failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if why:
        entry.update(chosen="flash", why=why)
    else:
        entry["ms"] = {"cudnn": _median_ms(run_cudnn), "flash": _median_ms(run_flash)}
        entry["chosen"] = min(entry["ms"], key=entry["ms"].get)
    with _lock:
        _verdicts[key] = entry["chosen"]
        _log.append(entry)
    logger.info("range_attention %s of one dense document: %s", direction, entry)
    return entry["chosen"] == "cudnn"


def choices() -> list[dict[str, Any]]:
    """The decisions made in this process, in order: direction, shapes, dtype, causal, the
    kernel chosen, and the timings (ms) or why cuDNN was not taken."""
    with _lock:
        return [dict(e) for e in _log]


def clear() -> None:
    """Forgets the decisions (the next call of each shape decides again)."""
    with _lock:
        _verdicts.clear()
        _log.clear()
