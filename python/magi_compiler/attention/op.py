"""``range_attention``: the public function, its argument checks, and the registered operators.

Two operators carry the work, so that a kernel can replace the portable path without changing
any caller: ``magi::range_attention`` (forward: out and lse) and
``magi::range_attention_backward`` (dq, dk, dv, dsink). On CUDA, in float16 and bfloat16,
slices run on PyTorch's flash varlen kernels, in one call or in layers merged by log-sum-exp
(``flash_path.py``), and one dense document on cuDNN's kernels where they are faster
(``cudnn_path.py``); softcap, sinks, the deterministic backward and the rest run on the
portable path. Both are graph boundaries and compute-sensitive, like the FlashAttention recipe in docs/custom_ops.md: under ``magi_compile``
the graphs are cut at them and their outputs are saved rather than recomputed.

Checks on shapes, dtypes and devices run in ``range_attention`` (so they also fire while a
graph is traced); checks on the values of the ranges and mask types need the data and run when
the operator runs.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence

import torch

from magi_compiler._custom_op import magi_register_custom_op
from magi_compiler.attention import cudnn_path, flash_path, portable
from magi_compiler.attention.slices import AttnMaskType
from magi_compiler.errors import UserError

__all__ = ["range_attention"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def range_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_ranges: torch.Tensor,
    k_ranges: torch.Tensor,
    mask_types: torch.Tensor | Sequence[int],
    *,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    sink: torch.Tensor | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over packed tokens with a mask given as slices; see docs/attention.md.

    Args:
        q: (tokens_q, heads_q, head_dim) float16, bfloat16, float32 or float64.
        k: (tokens_k, heads_k, head_dim), v: (tokens_k, heads_k, head_dim_v), q's dtype and
            device; heads_k divides heads_q (grouped-query attention).
        q_ranges, k_ranges: int32 (n, 2) on q's device; row i is slice i's [start, end).
        mask_types: int32 (n,) tensor or a list of ints / ``AttnMaskType``: 0 FULL, 1 CAUSAL
            (bottom-right aligned), 2 INV_CAUSAL (top-left aligned), 3 BI_CAUSAL (both).
        softmax_scale: scale of q.k; default ``head_dim ** -0.5``.
        softcap: if > 0, scores become ``softcap * tanh(score / softcap)`` (after the scale).
        sink: per-head sink logits, (heads_q,) or (sink_tokens, heads_q): they join every
            query's softmax denominator and contribute no value.
        deterministic: ask the kernel for a backward without atomics (the portable path
            always is deterministic).

    Returns:
        ``(out, lse)``: out (tokens_q, heads_q, head_dim_v) in q's dtype; lse (tokens_q,
        heads_q), the natural-log log-sum-exp of each query's scores and sinks, float32
        (float64 for float64 inputs). A query no slice covers (and no sink) gets out 0 and
        lse -inf. Slices that share a (query, key) pair count it once per slice.
    """
    if not isinstance(mask_types, torch.Tensor):
        mask_types = _mask_types_tensor(mask_types, q)
    _check_metadata(q, k, v, q_ranges, k_ranges, mask_types, sink, softcap)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    return _range_attention(
        q,
        k,
        v,
        q_ranges,
        k_ranges,
        mask_types,
        sink,
        float(softmax_scale),
        float(softcap),
        bool(deterministic),
    )


# --- the operators ------------------------------------------------------------------------------


# The outputs are contiguous whatever the inputs' strides: the metadata says so, and both the
# portable path and a kernel write fresh contiguous tensors.


def _forward_meta(
    q, k, v, q_ranges, k_ranges, mask_types, sink, softmax_scale, softcap, deterministic
):
    tokens, heads = q.shape[0], q.shape[1]
    out = q.new_empty((tokens, heads, v.shape[2]))
    return out, q.new_empty((tokens, heads), dtype=portable.compute_dtype(q.dtype))


def _backward_meta(
    dout,
    dlse,
    q,
    k,
    v,
    out,
    lse,
    q_ranges,
    k_ranges,
    mask_types,
    sink,
    softmax_scale,
    softcap,
    deterministic,
):
    dsink = q.new_empty((0,), dtype=torch.float32) if sink is None else sink.new_empty(sink.shape)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


@magi_register_custom_op(
    name="magi::range_attention_backward",
    infer_output_meta_fn=_backward_meta,
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def _range_attention_backward(
    dout: torch.Tensor,
    dlse: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_ranges: torch.Tensor,
    k_ranges: torch.Tensor,
    mask_types: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    softcap: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    slices = _checked_slices(q_ranges, k_ranges, mask_types, q.shape[0], k.shape[0])
    calls = flash_path.plan(q, k, v, slices, sink, softcap, deterministic)
    # Autograd hands an unused lse a gradient of zeros; flash's backward takes none.
    if calls is not None and (dlse is None or not bool(dlse.any())):
        dense = cudnn_path.dense_causal(q, k, v, calls)
        args = (dout, q, k, v, out, lse)
        flash = functools.partial(flash_path.backward, *args, calls, softmax_scale)
        if dense is not None and cudnn_path.use_cudnn(
            "backward", q, k, dense, functools.partial(cudnn_path.backward, *args, dense,
                                                       softmax_scale), flash,
        ):  # fmt: skip
            dq, dk, dv = cudnn_path.backward(*args, dense, softmax_scale)
        else:
            dq, dk, dv = flash()
        return dq, dk, dv, q.new_empty((0,), dtype=torch.float32)
    sink2d = None if sink is None else sink.reshape(-1, q.shape[1])
    dq, dk, dv, dsink = portable.backward(
        dout, dlse, q, k, v, out, lse, slices, sink2d, softmax_scale, softcap
    )
    if sink is None:
        return dq, dk, dv, q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, dsink.reshape(sink.shape).to(sink.dtype)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, q_ranges, k_ranges, mask_types, sink, softmax_scale, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_ranges, k_ranges, mask_types, sink)
    ctx.softmax_scale, ctx.softcap, ctx.deterministic = softmax_scale, softcap, deterministic
    ctx.has_sink = sink is not None


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, q_ranges, k_ranges, mask_types, sink = ctx.saved_tensors
    dq, dk, dv, dsink = _range_attention_backward(
        dout,
        dlse,
        q,
        k,
        v,
        out,
        lse,
        q_ranges,
        k_ranges,
        mask_types,
        sink if ctx.has_sink else None,
        ctx.softmax_scale,
        ctx.softcap,
        ctx.deterministic,
    )
    return dq, dk, dv, None, None, None, (dsink if ctx.has_sink else None), None, None, None


@magi_register_custom_op(
    name="magi::range_attention",
    infer_output_meta_fn=_forward_meta,
    setup_context_fn=_setup_context,
    backward_fn=_backward,
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def _range_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_ranges: torch.Tensor,
    k_ranges: torch.Tensor,
    mask_types: torch.Tensor,
    sink: torch.Tensor | None,
    softmax_scale: float,
    softcap: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    slices = _checked_slices(q_ranges, k_ranges, mask_types, q.shape[0], k.shape[0])
    calls = flash_path.plan(q, k, v, slices, sink, softcap, deterministic)
    if calls is not None:
        dense = cudnn_path.dense_causal(q, k, v, calls)
        flash = functools.partial(flash_path.forward, q, k, v, calls, softmax_scale)
        if dense is not None and cudnn_path.use_cudnn(
            "forward", q, k, dense,
            functools.partial(cudnn_path.forward, q, k, v, dense, softmax_scale), flash,
        ):  # fmt: skip
            return cudnn_path.forward(q, k, v, dense, softmax_scale)
        return flash()
    sink2d = None if sink is None else sink.reshape(-1, q.shape[1])
    return portable.forward(q, k, v, slices, sink2d, softmax_scale, softcap)


# --- checks -------------------------------------------------------------------------------------


def _fail(message: str) -> None:
    raise UserError(f"range_attention: {message}")


def _mask_types_tensor(mask_types, q) -> torch.Tensor:
    try:
        values = [int(t) for t in mask_types]
    except (TypeError, ValueError):
        _fail(
            f"mask_types must be an int32 tensor or a list of ints (0 FULL, 1 CAUSAL, "
            f"2 INV_CAUSAL, 3 BI_CAUSAL); got {mask_types!r}"
        )
    device = q.device if isinstance(q, torch.Tensor) else None
    return torch.tensor(values, dtype=torch.int32, device=device)


def _check_metadata(q, k, v, q_ranges, k_ranges, mask_types, sink, softcap) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            seen = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            _fail(
                f"{name} must be a (tokens, heads, head_dim) tensor; got {seen}; pack the batch "
                "into the token dim (x.flatten(0, 1)) and describe documents with ranges"
            )
    if q.dtype not in _DTYPES:
        _fail(f"q has dtype {q.dtype}; use float16, bfloat16, float32 or float64")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            _fail(f"{name} has dtype {x.dtype} but q has {q.dtype}; cast them to one dtype")
        if x.device != q.device:
            _fail(f"{name} is on {x.device} but q is on {q.device}; move them to one device")
    if k.shape[0] != v.shape[0] or k.shape[1] != v.shape[1]:
        _fail(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same tokens and heads")
    if k.shape[2] != q.shape[2]:
        _fail(f"q's head_dim is {q.shape[2]} but k's is {k.shape[2]}; they must be equal")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        _fail(
            f"k and v have {k.shape[1]} heads, which does not divide q's {q.shape[1]} heads; "
            "for grouped-query attention use a number of key/value heads that divides it"
        )
    for name, x in (("q_ranges", q_ranges), ("k_ranges", k_ranges)):
        _check_index_tensor(name, x, (2,), q.device)
    _check_index_tensor("mask_types", mask_types, (), q.device)
    n = q_ranges.shape[0]
    if k_ranges.shape[0] != n or mask_types.shape[0] != n:
        _fail(
            f"q_ranges has {n} slices, k_ranges {k_ranges.shape[0]} and mask_types "
            f"{mask_types.shape[0]}; give one q range, k range and mask type per slice"
        )
    if sink is not None:
        if not isinstance(sink, torch.Tensor) or not sink.is_floating_point():
            _fail(f"sink must be a floating-point tensor; got {sink!r}")
        if sink.dim() not in (1, 2) or sink.shape[-1] != q.shape[1]:
            _fail(
                f"sink has shape {tuple(sink.shape)}; use (heads_q,) = ({q.shape[1]},) or "
                f"(sink_tokens, heads_q) = (s, {q.shape[1]})"
            )
        if sink.device != q.device:
            _fail(f"sink is on {sink.device} but q is on {q.device}; move it to q's device")
    if not (isinstance(softcap, (int, float)) and softcap >= 0.0 and math.isfinite(softcap)):
        _fail(f"softcap must be a finite float >= 0 (0 turns it off); got {softcap!r}")


def _check_index_tensor(name: str, x, trailing: tuple[int, ...], device) -> None:
    shape = "(n, 2)" if trailing else "(n,)"
    if not isinstance(x, torch.Tensor):
        _fail(f"{name} must be an int32 tensor of shape {shape}; got {type(x).__name__}")
    if x.dtype != torch.int32:
        _fail(f"{name} has dtype {x.dtype}; use int32 ({name}.to(torch.int32))")
    if x.dim() != 1 + len(trailing) or tuple(x.shape[1:]) != trailing:
        _fail(f"{name} has shape {tuple(x.shape)}; it must be {shape}")
    if x.device != device:
        _fail(f"{name} is on {x.device} but q is on {device}; move it to q's device")


# The checked slices of recent calls, by the identity and version of their three tensors: the
# ranges are read to the host (a device synchronisation on CUDA) once, not once per layer and
# step. Entries hold weak references; a tensor changed in place has a new version, a new tensor
# a new identity. Inference tensors have no version counter and are read every call, and so
# are all tensors while a CUDA graph is captured: a replay would run the mask the capture saw,
# whatever the ranges then hold, so the read fails the capture instead. A write that bypasses
# the version counter (through ``.data`` or a NumPy/DLPack alias) is not seen.
_SLICES_SEEN: dict[tuple, tuple] = {}
_SLICES_KEPT = 64


def _checked_slices(q_ranges, k_ranges, mask_types, tokens_q: int, tokens_k: int):
    """The slices as a tuple of Python ints, after checking every range and mask type."""
    tensors = (q_ranges, k_ranges, mask_types)
    key = (*map(id, tensors), tokens_q, tokens_k)
    cacheable = not any(x.is_inference() for x in tensors) and not _capturing(q_ranges)
    if cacheable:
        versions = tuple(x._version for x in tensors)
        seen = _SLICES_SEEN.get(key)
        if (
            seen
            and seen[1] == versions
            and all(r() is x for r, x in zip(seen[0], tensors, strict=True))
        ):
            return seen[2]
    slices = _read_slices(q_ranges, k_ranges, mask_types, tokens_q, tokens_k)
    if cacheable:
        if len(_SLICES_SEEN) >= _SLICES_KEPT:
            del _SLICES_SEEN[next(iter(_SLICES_SEEN))]
        _SLICES_SEEN[key] = (tuple(weakref.ref(x) for x in tensors), versions, slices)
    return slices


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _read_slices(q_ranges, k_ranges, mask_types, tokens_q: int, tokens_k: int):
    q_list, k_list, t_list = q_ranges.tolist(), k_ranges.tolist(), mask_types.tolist()
    for name, ranges, tokens in (("q_ranges", q_list, tokens_q), ("k_ranges", k_list, tokens_k)):
        for i, (start, end) in enumerate(ranges):
            if start > end:
                _fail(
                    f"{name}[{i}] is [{start}, {end}): start > end; ranges are [start, end) "
                    "with start <= end"
                )
            if start < 0 or end > tokens:
                side = "q" if name == "q_ranges" else "k"
                _fail(
                    f"{name}[{i}] is [{start}, {end}), outside the {tokens} tokens of {side}; "
                    f"ranges must lie in [0, {tokens}]"
                )
    valid = [int(t) for t in AttnMaskType]
    for i, t in enumerate(t_list):
        if t not in valid:
            _fail(f"mask_types[{i}] is {t}; use 0 FULL, 1 CAUSAL, 2 INV_CAUSAL or 3 BI_CAUSAL")
    return tuple((tuple(a), tuple(b), t) for a, b, t in zip(q_list, k_list, t_list, strict=True))
