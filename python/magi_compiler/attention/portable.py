"""The portable implementation of range-mask attention: plain PyTorch, on any device.

Each slice is cut into tiles of at most ``TILE_Q`` queries by ``TILE_K`` keys, and only the
tiles that hold a visible pair are computed; a tile's scores exist only while it is processed,
in float32 (float64 for float64 inputs), so memory stays at one tile's scores whatever the
sequence length. The forward gives each tile's partial ``(out, lse)`` for its queries and
merges it into the running result by log-sum-exp, exactly as MagiAttention's FFA kernel
reduces the partial results of slices that share queries; the sink logits join the
denominator at the end. The backward recomputes each tile's probabilities from the final
``lse`` (FlashAttention's backward), so it needs no saved scores.

This is the reference path a CUDA kernel will replace behind the same operator; it is exact
but not fast (one Python iteration per tile).
"""

from __future__ import annotations

import torch

from magi_compiler.attention.slices import diagonal_bounds

TILE_Q = 512
TILE_K = 2048


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Scores, softmax statistics and accumulators: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def forward(q, k, v, slices, sink, softmax_scale: float, softcap: float):
    """``(out, lse)``: out (tq, hq, dv) in q's dtype, lse (tq, hq) in the compute dtype.

    ``slices`` is a list of ``((q_start, q_end), (k_start, k_end), mask_type)`` of Python ints,
    already validated."""
    acc = compute_dtype(q.dtype)
    tq, hq, _ = q.shape
    hk = k.shape[1]
    out = torch.zeros(tq, hq, v.shape[2], dtype=acc, device=q.device)
    lse = torch.full((tq, hq), float("-inf"), dtype=acc, device=q.device)
    for a, b, c, e, mask in _tiles(slices, q.device):
        qt = _grouped(q[a:b], hk).to(acc)  # (rows, hk, g, d)
        scores = _scores(qt, k[c:e].to(acc), softmax_scale, softcap, mask)[0]
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)
        p = torch.exp(scores - row_max)  # (hk, g, rows, cols)
        row_sum = p.sum(dim=-1)
        tile_out = torch.einsum("hgqk,khd->qhgd", p, v[c:e].to(acc))
        tile_out = tile_out / _rows_last(row_sum).clamp_min(torch.finfo(acc).tiny)[..., None]
        tile_lse = _rows_last(row_max.squeeze(-1) + torch.log(row_sum))
        _merge(out, lse, a, b, tile_out.reshape(b - a, hq, -1), tile_lse.reshape(b - a, hq))
    if sink is not None:
        sink_lse = torch.logsumexp(sink.to(acc), dim=0)  # (hq,)
        merged = torch.logaddexp(lse, sink_lse.expand_as(lse))
        out *= torch.exp(lse - merged)[..., None]
        lse = merged
    return out.to(q.dtype), lse


def backward(dout, dlse, q, k, v, out, lse, slices, sink, softmax_scale: float, softcap: float):
    """``(dq, dk, dv, dsink)`` of ``forward``'s ``(out, lse)``; dsink is None without a sink."""
    acc = compute_dtype(q.dtype)
    hk = k.shape[1]
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    lse = lse.to(acc)
    # delta_i = dout_i . out_i - dlse_i: the row term of softmax's backward, with lse's own
    # gradient folded in (d lse / d s_ij = p_ij).
    delta = (dout.to(acc) * out.to(acc)).sum(dim=-1)
    if dlse is not None:
        delta = delta - dlse.to(acc)
    # Queries that see nothing have lse = -inf and no visible pair: any finite value keeps
    # exp(-inf - lse) = 0 there.
    lse_safe = lse.masked_fill(lse == float("-inf"), 0.0)
    for a, b, c, e, mask in _tiles(slices, q.device):
        qt = _grouped(q[a:b], hk).to(acc)
        dot = _grouped(dout[a:b], hk).to(acc)
        kt, vt = k[c:e].to(acc), v[c:e].to(acc)
        scores, tanh = _scores(qt, kt, softmax_scale, softcap, mask)
        p = torch.exp(scores - _rows_first(_grouped(lse_safe[a:b], hk))[..., None])
        dv[c:e] += torch.einsum("hgqk,qhgd->khd", p, dot)
        dp = torch.einsum("qhgd,khd->hgqk", dot, vt)
        ds = p * (dp - _rows_first(_grouped(delta[a:b], hk))[..., None])
        if tanh is not None:
            ds = ds * (1.0 - tanh * tanh)
        ds = ds * softmax_scale
        dq[a:b] += torch.einsum("hgqk,khd->qhgd", ds, kt).reshape(b - a, q.shape[1], -1)
        dk[c:e] += torch.einsum("hgqk,qhgd->khd", ds, qt)
    dsink = None
    if sink is not None:
        p_sink = torch.exp(sink.to(acc)[:, None, :] - lse[None])  # (s, tq, hq)
        dsink = -(p_sink * delta[None]).sum(dim=1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink


# --- tiles --------------------------------------------------------------------------------------


def _tiles(slices, device):
    """``(q_start, q_end, k_start, k_end, mask)`` per tile holding a visible pair; mask is a
    (rows, cols) bool tensor, or None when every pair of the tile is visible."""
    for q_range, k_range, mask_type in slices:
        d_lo, d_hi = diagonal_bounds(q_range, k_range, mask_type)
        for a in range(q_range[0], q_range[1], TILE_Q):
            b = min(a + TILE_Q, q_range[1])
            # Keys some row of [a, b) sees: k_start <= key < k_end, a + d_lo <= key <= b-1 + d_hi.
            lo, hi = max(k_range[0], a + d_lo), min(k_range[1], b + d_hi)
            for c in range(lo, hi, TILE_K):
                e = min(c + TILE_K, hi)
                if c - (b - 1) >= d_lo and (e - 1) - a <= d_hi:
                    yield a, b, c, e, None
                    continue
                rows = torch.arange(a, b, device=device)[:, None]
                cols = torch.arange(c, e, device=device)[None, :]
                yield a, b, c, e, (cols - rows >= d_lo) & (cols - rows <= d_hi)


def _scores(qt, kt, softmax_scale: float, softcap: float, mask):
    """The tile's scores (hk, g, rows, cols), masked to -inf, and tanh(s / softcap) (or None)."""
    scores = torch.einsum("qhgd,khd->hgqk", qt, kt) * softmax_scale
    tanh = None
    if softcap > 0.0:
        tanh = torch.tanh(scores / softcap)
        scores = tanh * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores, tanh


def _merge(out, lse, a: int, b: int, tile_out, tile_lse) -> None:
    """Folds a tile's normalised partial result for queries [a, b) into ``out``/``lse``."""
    old = lse[a:b]
    new = torch.logaddexp(old, tile_lse)
    new_safe = new.masked_fill(new == float("-inf"), 0.0)
    out[a:b] = out[a:b] * torch.exp(old - new_safe)[..., None] + (
        tile_out * torch.exp(tile_lse - new_safe)[..., None]
    )
    lse[a:b] = new


def _grouped(x, hk: int):
    """(rows, hq, ...) -> (rows, hk, g, ...): the query heads that share a key head together."""
    return x.reshape(x.shape[0], hk, x.shape[1] // hk, *x.shape[2:])


def _rows_first(x):
    """(rows, hk, g) -> (hk, g, rows)."""
    return x.permute(1, 2, 0)


def _rows_last(x):
    """(hk, g, rows) -> (rows, hk, g)."""
    return x.permute(2, 0, 1)
