"""The baselines context-parallel attention is measured against, on the same masks and plans.

* Ring attention: every rank's keys and values travel once around the ring of ranks; at step
  ``t`` a rank attends its queries to the keys of rank ``rank - t``, with the plan's slices cut
  to that rank's tokens, while the next block is already on its way. With ``zigzag_plan``
  (rank ``r`` holding chunks ``r`` and ``2W - 1 - r``) a causal mask is load-balanced; any mask
  is correct with any plan. The backward sends the keys and values around again, with their
  gradients travelling one step behind, and returns each block's gradient to its owner.
* Ulysses: an all-to-all turns "my tokens, all heads" into "all tokens, my heads", a rank runs
  ``range_attention`` on the whole sequence for its heads, and a second all-to-all turns the
  output back. Needs the head counts (q and k/v) divisible by the world size. Its backward is
  autograd through differentiable all-to-alls.
"""

from __future__ import annotations

import torch

from magi_compiler.attention import _cp_comm as comm
from magi_compiler.attention import _cp_plan as planning
from magi_compiler.attention._cp_partials import empty_result, merge_partials, pack_kv, unpack_kv
from magi_compiler.attention._cp_solver import chunk_bands
from magi_compiler.attention.op import range_attention
from magi_compiler.errors import UserError


def _ring_stages(plan, rank: int, device):
    """Per ring step t: the slices of this rank's queries against rank ``rank - t``'s keys."""
    key = ("ring", rank, str(device))
    if key not in plan._device_cache:
        w, cs, per_rank = plan.world_size, plan.chunk_size, plan.tokens_per_rank
        num_chunks = plan.total_tokens // cs
        owner = [0] * num_chunks
        for r in plan.ranks:
            for c in r.chunks:
                owner[c] = r.rank
        sources = [
            planning._Source(r.token_ranges, [(0, per_rank, (rank - r.rank) % w, 0)])
            for r in plan.ranks
        ]
        bands = chunk_bands(plan.slices, num_chunks, cs)
        pieces = planning.emit_stage_pieces(bands, plan.ranks[rank].chunks, owner, cs, sources, w)
        stages = []
        for p in pieces:
            s = planning.stage_slices(p)
            stages.append((s.q_ranges.to(device), s.k_ranges.to(device), s.mask_types.to(device)))
        plan._device_cache[key] = stages
    return plan._device_cache[key]


def ring_attention(
    q, k, v, plan, group=None, *, softmax_scale=None, softcap: float = 0.0, sink=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring attention over this rank's dispatched q, k, v (same contract as cp_attention)."""
    group = comm.as_process_group(group)
    rank, size = comm.rank_in_plan(plan, group)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    stages = _ring_stages(plan, rank, q.device)
    opts = (float(softmax_scale), float(softcap), rank, size)
    return _RingAttention.apply(q, k, v, sink, stages, group, opts)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, stages, group, opts):
        scale, softcap, rank, size = opts
        cur = pack_kv(k, v)
        outs, lses = [], []
        for step in range(size):
            if step < size - 1:
                nxt = torch.empty_like(cur)
                reqs = comm.ring_exchange(cur, nxt, rank, size, group, tag=0)
            if len(stages[step][2]) or (step == 0 and sink is not None):
                kk, vv = unpack_kv(cur, k, v)
                part_out, part_lse = range_attention(
                    q, kk, vv, *stages[step], softmax_scale=scale, softcap=softcap,
                    sink=sink if step == 0 else None,
                )  # fmt: skip
                outs.append(part_out)
                lses.append(part_lse)
            if step < size - 1:
                for r in reqs:
                    r.wait()
                cur = nxt
        out, lse = merge_partials(outs, lses, q.dtype) if outs else empty_result(q, v)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.stages, ctx.group, ctx.opts = stages, group, opts
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sink = ctx.saved_tensors
        scale, softcap, rank, size = ctx.opts
        stages, group = ctx.stages, ctx.group
        acc = lse.dtype
        cur = pack_kv(k, v)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dsink = None
        travelling = None  # (buffer, requests): the gradient of the block now held, in flight
        for step in range(size):
            if step < size - 1:
                nxt = torch.empty_like(cur)
                reqs = comm.ring_exchange(cur, nxt, rank, size, group, tag=0)
            contribution = torch.zeros(cur.shape, dtype=acc, device=q.device)
            if len(stages[step][2]) or (step == 0 and sink is not None):
                kk, vv = unpack_kv(cur, k, v)
                dq_i, dk_i, dv_i, ds = torch.ops.magi.range_attention_backward(
                    dout, dlse, q, kk, vv, out, lse, *stages[step],
                    sink if step == 0 else None, scale, softcap, False,
                )  # fmt: skip
                dq += dq_i
                contribution += pack_kv(dk_i, dv_i)
                if step == 0 and sink is not None:
                    dsink = ds.to(sink.dtype)
            if travelling is not None:
                for r in travelling[1]:
                    r.wait()
                contribution += travelling[0]
            if size > 1:
                arrived = torch.empty_like(contribution)
                travelling = (
                    arrived,
                    comm.ring_exchange(contribution, arrived, rank, size, group, 1),
                )
            else:
                travelling = (contribution, [])
            if step < size - 1:
                for r in reqs:
                    r.wait()
                cur = nxt
        for r in travelling[1]:
            r.wait()
        dk, dv = unpack_kv(travelling[0], k, v)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink, None, None, None


def ulysses_attention(
    q, k, v, plan, group=None, *, softmax_scale=None, softcap: float = 0.0, sink=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ulysses (all-to-all over heads) for this rank's dispatched q, k, v; any plan's token
    split works, since each rank sees the whole sequence for its heads."""
    group = comm.as_process_group(group)
    rank, size = comm.rank_in_plan(plan, group)
    for name, x in (("q", q), ("k", k)):
        if x.shape[1] % size:
            raise UserError(
                f"ulysses_attention: {name} has {x.shape[1]} heads, not divisible by the "
                f"{size} ranks; Ulysses splits heads across ranks"
            )
    device = q.device
    key = ("ulysses", str(device))
    if key not in plan._device_cache:
        tensors = planning.stage_slices(plan.slices)
        plan._device_cache[key] = (
            plan.perm.to(device),
            plan.inv_perm.to(device),
            tuple(x.to(device) for x in (tensors.q_ranges, tensors.k_ranges, tensors.mask_types)),
        )
    perm, inv_perm, slices = plan._device_cache[key]

    def to_sequence(x):  # (tokens/W, heads, d) -> (tokens, heads/W, d), global order
        tl, h = x.shape[0], x.shape[1]
        blocks = x.reshape(tl, size, h // size, *x.shape[2:]).transpose(0, 1)
        blocks = blocks.reshape(size * tl, h // size, *x.shape[2:])
        if size > 1:
            blocks = comm.AllToAllRows.apply(blocks, [tl] * size, [tl] * size, group)
        return blocks.index_select(0, inv_perm)

    def to_heads(y):  # (tokens, heads/W, ...) global order -> (tokens/W, heads, ...)
        tl = y.shape[0] // size
        blocks = y.index_select(0, perm)
        if size > 1:
            blocks = comm.AllToAllRows.apply(blocks, [tl] * size, [tl] * size, group)
        blocks = blocks.reshape(size, tl, *y.shape[1:]).transpose(0, 1)
        return blocks.reshape(tl, size * y.shape[1], *y.shape[2:])

    heads = q.shape[1] // size
    my_sink = None if sink is None else sink[..., rank * heads : (rank + 1) * heads]
    out, lse = range_attention(
        to_sequence(q), to_sequence(k), to_sequence(v), *slices,
        softmax_scale=softmax_scale, softcap=softcap, sink=my_sink,
    )  # fmt: skip
    return to_heads(out), to_heads(lse)
