"""Partial attention results: keys and values packed for one collective, and the log-sum-exp
merge of results computed over disjoint sets of keys (used by cp_attention and the baselines).
"""

from __future__ import annotations

import torch

from magi_compiler.attention.portable import compute_dtype


def pack_kv(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """k and v side by side per token, so one collective carries both."""
    return torch.cat([k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1)], dim=1)


def unpack_kv(kv: torch.Tensor, k_like: torch.Tensor, v_like: torch.Tensor):
    split = k_like.shape[1] * k_like.shape[2]
    k = kv[:, :split].unflatten(1, k_like.shape[1:])
    v = kv[:, split:].unflatten(1, v_like.shape[1:])
    return k, v


def merge_partials(outs, lses, dtype: torch.dtype):
    """Partial attention results over disjoint keys merged by their log-sum-exps."""
    if len(outs) == 1:
        return outs[0].to(dtype), lses[0]
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    safe = lse.masked_fill(lse == float("-inf"), 0.0)
    out = sum(
        o.to(lse.dtype) * torch.exp(part - safe)[..., None]
        for o, part in zip(outs, lses, strict=True)
    )
    return out.to(dtype), lse


def empty_result(q, v):
    """out 0 and lse -inf: the result for queries that attend to nothing."""
    acc = compute_dtype(q.dtype)
    out = q.new_zeros((q.shape[0], q.shape[1], v.shape[2]))
    return out, torch.full(q.shape[:2], float("-inf"), dtype=acc, device=q.device)
