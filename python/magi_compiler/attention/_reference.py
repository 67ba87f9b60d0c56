"""A dense reference for range-mask attention, to check the portable path and kernels against.

It builds the whole (tokens_q, tokens_k) matrix of how many slices make each pair visible and
adds ``log(count)`` to the scores (``-inf`` where no slice does): softmax over the multiset
union of the slices, the semantics ``range_attention`` implements (see docs/attention.md). It
materialises tokens_q x tokens_k scores per head, so it is for small tests only; it is
differentiable by autograd, rows without a visible key included (their gradients are zero).
"""

from __future__ import annotations

import torch

from magi_compiler.attention.slices import mask_counts


def _reference_range_attention(
    q,
    k,
    v,
    q_ranges,
    k_ranges,
    mask_types,
    *,
    softmax_scale=None,
    softcap: float = 0.0,
    sink=None,
    dtype: torch.dtype = torch.float64,
):
    """``(out, lse)`` computed densely in ``dtype``; out in ``dtype`` too (cast it yourself)."""
    tq, hq, d = q.shape
    tk, hk = k.shape[0], k.shape[1]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    counts = mask_counts(q_ranges, k_ranges, mask_types, tq, tk).to(q.device)
    bias = torch.where(counts > 0, counts.to(dtype).log(), float("-inf"))
    qh = q.to(dtype).transpose(0, 1)  # (hq, tq, d)
    kh = k.to(dtype).repeat_interleave(hq // hk, dim=1).transpose(0, 1)
    vh = v.to(dtype).repeat_interleave(hq // hk, dim=1).transpose(0, 1)
    scores = qh @ kh.transpose(1, 2) * scale
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores + bias
    if sink is not None:
        sinks = sink.to(dtype).reshape(-1, hq).transpose(0, 1)  # (hq, s)
        scores = torch.cat([scores, sinks[:, None, :].expand(hq, tq, -1)], dim=-1)
    empty = torch.isinf(scores).all(dim=-1, keepdim=True)
    # Rows without a visible key: softmax over zeros (finite gradients), then zeroed.
    scores = scores.masked_fill(empty, 0.0)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    p = torch.exp(scores - lse).masked_fill(empty, 0.0)
    out = p[..., :tk] @ vh
    lse = lse.masked_fill(empty, float("-inf")).squeeze(-1)
    return out.transpose(0, 1), lse.transpose(0, 1)
