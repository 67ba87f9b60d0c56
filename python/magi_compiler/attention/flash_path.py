"""Range masks on PyTorch's flash kernels: the slices that are varlen attention, in layers.

Most masks in practice are documents packed one after another, each attending to itself fully
or causally: slice i pairs queries ``[cu_q[i], cu_q[i+1])`` with keys ``[cu_k[i], cu_k[i+1])``,
the ranges tile both sides without gaps, and every slice has the same type, FULL or CAUSAL (a
single slice over all tokens is the dense case). That is what FlashAttention's varlen kernels
compute (``aten::_flash_attention_forward``/``_backward`` with ``cum_seq_q``/``cum_seq_k``,
the kernels ``torch.nn.attention.varlen_attn`` calls), with CAUSAL aligned to the bottom right
as ours is. Causal documents under one sliding window (``sliding_window_slices``: a CAUSAL
slice over each document's first ``w`` tokens and a BI_CAUSAL band over the rest) are the same
kernels with ``window_size_left = w - 1``. Both run as one flash call.

Other slices run as *layers*, each one flash call over the keys and queries it gathers:

- every slice type is one of flash's masks over its own rectangle (flash aligns the diagonal of
  a sequence of ``Lq`` queries and ``Lk`` keys to the bottom right, as CAUSAL does): FULL;
  CAUSAL (``is_causal``); INV_CAUSAL, a left window of ``Lk - Lq`` keys; BI_CAUSAL, that window
  and causal. Queries that see no key are cut off first (the top of a CAUSAL slice with more
  queries than keys, the bottom of such an INV_CAUSAL slice, a BI_CAUSAL slice entirely);
- slices of one flash mask whose query ranges do not overlap form a layer, keys gathered in
  their order (a key range read by several slices is gathered once per slice);
- layers that share queries are merged by log-sum-exp, as the portable path merges tiles;
- the backward runs flash's backward per layer with the merged output and lse (the softmax
  over every layer, as ring attention does over its blocks) and adds the gradients up.

Block-causal masks are one layer (each block's keys gathered), prefix-LM masks two. Slices that
need more than ``MAX_LAYERS`` layers, softcap, sinks, the deterministic backward, float32 and
head dims flash does not take stay on the portable path.
"""

from __future__ import annotations

import functools
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


MAX_LAYERS = 16  # more layers than this (heavily overlapping slices): the portable path


class Layer(NamedTuple):
    """One flash varlen call: ``cu_q``/``cu_k`` offsets into the gathered queries and keys."""

    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]
    max_q: int
    max_k: int
    causal: bool
    window_left: int  #: -1: no bound (flash's convention)
    window_right: int  #: -1: no bound; 0 with ``causal``
    #: the query ranges gathered, in order; None when they tile all queries in order
    q_rows: tuple[tuple[int, int], ...] | None
    #: the key ranges gathered, in order; None when they tile all keys in order
    k_rows: tuple[tuple[int, int], ...] | None


def layers(slices, tokens_q: int, tokens_k: int) -> tuple[Layer, ...] | None:
    """The flash calls that compute ``slices`` (see the module's docstring), or None."""
    return _layers(tuple(slices), tokens_q, tokens_k)


@functools.lru_cache(maxsize=64)
def _layers(slices: tuple, tokens_q: int, tokens_k: int) -> tuple[Layer, ...] | None:
    whole = varlen_layout(slices, tokens_q, tokens_k)
    if whole is not None:
        wl = -1 if whole.window_left is None else whole.window_left
        return (
            Layer(tuple(whole.cu_q), tuple(whole.cu_k), whole.max_q, whole.max_k, whole.causal,
                  wl, 0 if whole.causal else -1, None, None),
        )  # fmt: skip
    groups: dict[tuple[bool, int, int], list] = {}
    for (q_start, q_end), (k_start, k_end), mask in slices:
        n_q, n_k = q_end - q_start, k_end - k_start
        if n_q <= 0 or n_k <= 0:
            continue
        if mask == AttnMaskType.FULL:
            key = (False, -1, -1)
        elif mask == AttnMaskType.CAUSAL:
            q_start, key = max(q_start, q_end - n_k), (True, -1, 0)
        elif mask == AttnMaskType.INV_CAUSAL:
            q_end = min(q_end, q_start + n_k)
            key = (False, n_k - (q_end - q_start), -1)
        else:
            if n_q > n_k:
                continue  # the band holds no pair
            key = (False, n_k - n_q, 0)
        groups.setdefault(key, []).append(((q_start, q_end), (k_start, k_end)))
    out: list[Layer] = []
    for (causal, left, right), items in groups.items():
        stacks: list[list] = []
        for item in sorted(items):
            stack = next((s for s in stacks if s[-1][0][1] <= item[0][0]), None)
            if stack is None:
                stacks.append([item])
            else:
                stack.append(item)
        for stack in stacks:
            out.append(_layer(stack, causal, left, right, tokens_q, tokens_k))
    return tuple(out) if 0 < len(out) <= MAX_LAYERS else None


def _layer(items, causal, left, right, tokens_q: int, tokens_k: int) -> Layer:
    q_ranges = tuple(q for q, _ in items)
    k_ranges = tuple(k for _, k in items)
    cu_q, cu_k = [0], [0]
    for (qa, qb), (ka, kb) in items:
        cu_q.append(cu_q[-1] + qb - qa)
        cu_k.append(cu_k[-1] + kb - ka)

    def tiles(ranges, tokens: int) -> bool:
        return (
            ranges[0][0] == 0
            and ranges[-1][1] == tokens
            and all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False))
        )

    return Layer(
        tuple(cu_q), tuple(cu_k),
        max(b - a for a, b in q_ranges), max(b - a for a, b in k_ranges), causal, left, right,
        None if tiles(q_ranges, tokens_q) else q_ranges,
        None if tiles(k_ranges, tokens_k) else k_ranges,
    )  # fmt: skip


def plan(q, k, v, slices, sink, softcap: float, deterministic: bool) -> tuple[Layer, ...] | None:
    """The flash calls for this call when flash can run it: CUDA, float16/bfloat16, head dims
    equal and a multiple of 8 up to 256, no softcap or sink, not deterministic, at most
    ``MAX_LAYERS`` layers."""
    if not (q.is_cuda and q.dtype in FLASH_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype):
        return None
    head_dim = q.shape[2]
    if head_dim % 8 or head_dim > MAX_HEAD_DIM or k.shape[2] != head_dim or v.shape[2] != head_dim:
        return None
    if sink is not None or softcap != 0.0 or deterministic:
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return None
    return layers(slices, q.shape[0], k.shape[0])


# Device copies of the offsets and gather indices of recent masks. A model's layers share one
# mask per step, so a few entries cover it; the indices of a long sequence are megabytes of
# device memory each, so few are kept.
@functools.lru_cache(maxsize=64)
def _on_device(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


@functools.lru_cache(maxsize=16)
def _rows(ranges: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """The indices of ``ranges``, in order (int64 on ``device``)."""
    return torch.cat([torch.arange(a, b) for a, b in ranges]).to(device)


def _pick(x: torch.Tensor, ranges, device: torch.device) -> torch.Tensor:
    return x if ranges is None else x.index_select(0, _rows(ranges, device))


def _call_args(layer: Layer, device: torch.device) -> tuple:
    return (
        _on_device(layer.cu_q, torch.int32, device), _on_device(layer.cu_k, torch.int32, device),
        layer.max_q, layer.max_k, layer.causal, layer.window_left, layer.window_right,
    )  # fmt: skip


def _window(causal: bool, left: int, right: int) -> dict[str, int]:
    if causal:
        return {} if left == -1 else {"window_size_left": left, "window_size_right": 0}
    if left == -1 and right == -1:
        return {}
    return {"window_size_left": left, "window_size_right": right}


def flash_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, left, right, scale):
    """Flash's varlen forward: ``(out, lse)``, lse (heads, tokens) float32."""
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale,
        **_window(causal, left, right),
    )  # fmt: skip
    return out, lse


def flash_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, left, right, scale):
    """Flash's varlen backward ``(dq, dk, dv)`` for the softmax statistics ``out``, ``lse``
    (heads, tokens)."""
    rng_state = torch.zeros(2, dtype=torch.uint64, device=q.device)  # no dropout
    unused = torch.empty(0, device=q.device)
    return torch.ops.aten._flash_attention_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, causal, rng_state, unused,
        scale=scale, **_window(causal, left, right),
    )  # fmt: skip


def forward(q, k, v, plan: tuple[Layer, ...], softmax_scale: float):
    """``(out, lse)`` in range_attention's layouts: out (tq, hq, d), lse (tq, hq) float32.
    Queries no slice covers get zeros and ``-inf``."""
    device = q.device
    first = plan[0]
    if len(plan) == 1 and first.q_rows is None:
        out, lse = flash_forward(
            q, _pick(k, first.k_rows, device), _pick(v, first.k_rows, device),
            *_call_args(first, device), softmax_scale,
        )  # fmt: skip
        return out, lse.t().contiguous()
    tq, hq = q.shape[:2]
    out = torch.zeros(tq, hq, v.shape[2], dtype=torch.float32, device=device)
    lse = torch.full((tq, hq), float("-inf"), dtype=torch.float32, device=device)
    for layer in plan:
        part, part_lse = flash_forward(
            _pick(q, layer.q_rows, device), _pick(k, layer.k_rows, device),
            _pick(v, layer.k_rows, device), *_call_args(layer, device), softmax_scale,
        )  # fmt: skip
        part_lse = part_lse.t()
        rows = None if layer.q_rows is None else _rows(layer.q_rows, device)
        old_out = out if rows is None else out.index_select(0, rows)
        old_lse = lse if rows is None else lse.index_select(0, rows)
        new_lse = torch.logaddexp(old_lse, part_lse)
        merged = old_out * torch.exp(old_lse - new_lse)[..., None]
        merged += part.float() * torch.exp(part_lse - new_lse)[..., None]
        if rows is None:
            out, lse = merged, new_lse
        else:
            out.index_copy_(0, rows, merged)
            lse.index_copy_(0, rows, new_lse)
    return out.to(q.dtype), lse


def backward(dout, q, k, v, out, lse, plan: tuple[Layer, ...], softmax_scale: float):
    """``(dq, dk, dv)`` of :func:`forward`'s output (no gradient through lse)."""
    device, dout = q.device, dout.contiguous()
    first = plan[0]
    if len(plan) == 1 and first.q_rows is None and first.k_rows is None:
        return flash_backward(
            dout, q, k, v, out, lse.t().contiguous(), *_call_args(first, device), softmax_scale
        )
    dq = torch.zeros(q.shape, dtype=torch.float32, device=device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=device)
    for layer in plan:
        pick_q = functools.partial(_pick, ranges=layer.q_rows, device=device)
        pick_k = functools.partial(_pick, ranges=layer.k_rows, device=device)
        parts = flash_backward(
            pick_q(dout), pick_q(q), pick_k(k), pick_k(v), pick_q(out),
            pick_q(lse).t().contiguous(), *_call_args(layer, device), softmax_scale,
        )  # fmt: skip
        for whole, part, ranges in zip((dq, dk, dv), parts, (layer.q_rows, layer.k_rows,
                                                             layer.k_rows), strict=True):  # fmt: skip
            if ranges is None:
                whole += part
            else:
                whole.index_add_(0, _rows(ranges, device), part.float())
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
