"""Packed documents on PyTorch's flash kernels: the slices that are plain varlen attention.

Most masks in practice are documents packed one after another, each attending to itself fully
or causally: slice i pairs queries ``[cu_q[i], cu_q[i+1])`` with keys ``[cu_k[i], cu_k[i+1])``,
the ranges tile both sides without gaps, and every slice has the same type, FULL or CAUSAL (a
single slice over all tokens is the dense case). That is what FlashAttention's varlen kernels
compute (``aten::_flash_attention_forward``/``_backward`` with ``cum_seq_q``/``cum_seq_k``,
the kernels ``torch.nn.attention.varlen_attn`` calls), with CAUSAL aligned to the bottom right
as ours is. Causal documents under one sliding window (``sliding_window_slices``: a CAUSAL
slice over each document's first ``w`` tokens and a BI_CAUSAL band over the rest) are the same
kernels with ``window_size_left = w - 1``. :func:`plan` recognises such slices;
:func:`forward` and :func:`backward` run them.
Everything else (other mask types, overlaps, gaps, mixed types, softcap, sinks, the
deterministic backward, float32, head dims flash does not take) stays on the portable path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from magi_compiler.attention.slices import AttnMaskType

FLASH_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


class Varlen(NamedTuple):
    """Documents as flash's varlen kernels take them."""

    cu_q: list[int]  #: query offsets, from 0 to the query tokens
    cu_k: list[int]  #: key offsets, from 0 to the key tokens
    max_q: int
    max_k: int
    causal: bool
    #: a sliding window: the query at position i sees keys i - window_left .. i (causal only)
    window_left: int | None = None


def varlen_layout(slices, tokens_q: int, tokens_k: int) -> Varlen | None:
    """The documents ``slices`` describe (:func:`documents`), or the sliding-window documents
    (:func:`windowed_documents`), or None."""
    return documents(slices, tokens_q, tokens_k) or windowed_documents(slices, tokens_q, tokens_k)


def documents(slices, tokens_q: int, tokens_k: int) -> Varlen | None:
    """The documents ``slices`` describe, or None when they are not packed documents of one
    type: ``slices`` (``((q_start, q_end), (k_start, k_end), type)`` of Python ints, in any
    order) must tile ``[0, tokens_q)`` and ``[0, tokens_k)`` in the same order, without gaps,
    overlaps or empty ranges, all FULL or all CAUSAL; a CAUSAL slice must have no more queries
    than keys (flash aligns its diagonal to the bottom right, as CAUSAL does, but leaves the
    queries above it undefined)."""
    if not slices or tokens_q == 0 or tokens_k == 0:
        return None
    types = {t for _, _, t in slices}
    if types not in ({AttnMaskType.FULL}, {AttnMaskType.CAUSAL}):
        return None
    causal = types == {AttnMaskType.CAUSAL}
    cu_q, cu_k = [0], [0]
    for (q_start, q_end), (k_start, k_end), _ in sorted(slices):
        if q_start != cu_q[-1] or k_start != cu_k[-1] or q_end <= q_start or k_end <= k_start:
            return None
        if causal and q_end - q_start > k_end - k_start:
            return None
        cu_q.append(q_end)
        cu_k.append(k_end)
    if cu_q[-1] != tokens_q or cu_k[-1] != tokens_k:
        return None
    max_q = max(b - a for a, b in zip(cu_q, cu_q[1:], strict=False))
    max_k = max(b - a for a, b in zip(cu_k, cu_k[1:], strict=False))
    return Varlen(cu_q, cu_k, max_q, max_k, causal)


def windowed_documents(slices, tokens_q: int, tokens_k: int) -> Varlen | None:
    """Causal documents under one sliding window of ``w`` keys, as ``sliding_window_slices``
    builds them, or None: per document ``[s, e)`` (they tile the tokens, q and k alike), a CAUSAL
    slice over ``[s, s + w)`` (the whole document when shorter) and, when the document is longer,
    a BI_CAUSAL band with queries ``[s + w, e)`` and keys ``[s + 1, e)``. ``w`` is read from the
    bands and must be the same in all; documents without a band are at most ``w`` long."""
    if not slices or tokens_q != tokens_k:
        return None
    ordered = sorted(slices)
    cu, heads, window, i = [0], [], None, 0
    while i < len(ordered):
        (q_start, q_end), k_range, mask = ordered[i]
        if mask != AttnMaskType.CAUSAL or k_range != (q_start, q_end) or q_start != cu[-1]:
            return None
        if q_end <= q_start:
            return None
        end, i = q_end, i + 1
        if i < len(ordered) and ordered[i][2] == AttnMaskType.BI_CAUSAL:
            (b_start, b_end), (bk_start, bk_end), _ = ordered[i]
            width = q_end - q_start
            if b_start != q_end or bk_end != b_end or bk_start != q_start + 1 or b_end <= b_start:
                return None
            if window not in (None, width):
                return None
            window, end, i = width, b_end, i + 1
        else:
            heads.append(q_end - q_start)
        cu.append(end)
    if window is None or cu[-1] != tokens_q or any(n > window for n in heads):
        return None
    longest = max(b - a for a, b in zip(cu, cu[1:], strict=False))
    return Varlen(cu, cu, longest, longest, True, window - 1)


def plan(q, k, v, slices, sink, softcap: float, deterministic: bool) -> Varlen | None:
    """The varlen layout when flash can run this call: CUDA, float16/bfloat16, head dims equal
    and a multiple of 8 up to 256, no softcap or sink, not deterministic, packed documents."""
    if not (q.is_cuda and q.dtype in FLASH_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype):
        return None
    head_dim = q.shape[2]
    if head_dim % 8 or head_dim > MAX_HEAD_DIM or k.shape[2] != head_dim or v.shape[2] != head_dim:
        return None
    if sink is not None or softcap != 0.0 or deterministic:
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return None
    return varlen_layout(slices, q.shape[0], k.shape[0])


def _offsets(layout: Varlen, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.tensor(layout.cu_q, dtype=torch.int32, device=device),
        torch.tensor(layout.cu_k, dtype=torch.int32, device=device),
    )


def _window(layout: Varlen) -> dict[str, int]:
    if layout.window_left is None:
        return {}
    return {"window_size_left": layout.window_left, "window_size_right": 0}


def forward(q, k, v, layout: Varlen, softmax_scale: float):
    """``(out, lse)`` in range_attention's layouts: out (tq, hq, d), lse (tq, hq) float32."""
    cu_q, cu_k = _offsets(layout, q.device)
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, layout.max_q, layout.max_k, 0.0, layout.causal, False,
        scale=softmax_scale, **_window(layout),
    )  # fmt: skip
    return out, lse.t().contiguous()  # flash's lse is (hq, tq)


def backward(dout, q, k, v, out, lse, layout: Varlen, softmax_scale: float):
    """``(dq, dk, dv)`` of :func:`forward`'s output (no gradient through lse)."""
    cu_q, cu_k = _offsets(layout, q.device)
    rng_state = torch.zeros(2, dtype=torch.uint64, device=q.device)  # no dropout
    unused = torch.empty(0, device=q.device)
    return torch.ops.aten._flash_attention_backward(
        dout.contiguous(), q, k, v, out, lse.t().contiguous(), cu_q, cu_k, layout.max_q,
        layout.max_k, 0.0, layout.causal, rng_state, unused, scale=softmax_scale,
        **_window(layout),
    )  # fmt: skip
