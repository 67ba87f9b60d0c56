"""Context parallelism: one packed sequence's attention spread over the ranks of a process group.

The sequence is cut into chunks, and the planner (:func:`plan_context_parallel`) deals them to
ranks so that every rank's masked attention area is about the same. :func:`dispatch` keeps a
rank's chunks of a token-major tensor, :func:`undispatch` puts the pieces back together, and
:func:`cp_attention` runs ``range_attention`` on a rank's queries against exactly the keys and
values they attend to: its own, then the remote ones, which arrive by all-to-all-v in stages so
that stage ``t + 1``'s communication is in flight while stage ``t`` computes. Partial results
are merged by their log-sum-exps. The backward fetches the keys and values again in the same
stages, computes each stage's gradients against the merged output (FlashAttention's backward
needs only the final ``out`` and ``lse``), and sends the key/value gradients back to their
owners by the reverse all-to-all-v, overlapped the same way; the owners sum them.

The same code runs with gloo on CPU tensors and NCCL on CUDA tensors: it uses only
``all_to_all_single``, ``all_gather_into_tensor`` and ``batch_isend_irecv``. Ring attention and
Ulysses, the baselines, live in ``_cp_baselines`` and take the same plans. See docs/attention.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from magi_compiler.attention import _cp_comm as comm
from magi_compiler.attention._cp_baselines import ring_attention, ulysses_attention
from magi_compiler.attention._cp_partials import empty_result, merge_partials, pack_kv, unpack_kv
from magi_compiler.attention._cp_plan import (
    ContextParallelPlan,
    RankPlan,
    StageSlices,
    assign_chunks,
    contiguous_plan,
    plan_context_parallel,
    zigzag_plan,
)
from magi_compiler.attention.op import range_attention
from magi_compiler.errors import UserError

__all__ = [
    "ContextParallelPlan",
    "RankPlan",
    "StageSlices",
    "assign_chunks",
    "plan_context_parallel",
    "zigzag_plan",
    "contiguous_plan",
    "dispatch",
    "undispatch",
    "cp_attention",
    "ring_attention",
    "ulysses_attention",
]


def dispatch(x: torch.Tensor, plan: ContextParallelPlan, group=None) -> torch.Tensor:
    """This rank's rows of a token-major tensor ``(total_tokens, ...)``, in plan order.

    ``x`` is taken to be the same on every rank. Differentiable: the backward all-gathers the
    ranks' gradients, so every rank gets the gradient of the whole ``x``."""
    rank, size = _rank_in(plan, group)
    if x.dim() < 1 or x.shape[0] != plan.total_tokens:
        raise UserError(
            f"dispatch: the tensor has shape {tuple(x.shape)} but the plan is for "
            f"{plan.total_tokens} tokens along dim 0"
        )
    t = _tensors(plan, rank, x.device)
    return comm.DispatchRows.apply(x, t.local_tokens, t.inv_perm, size, group)


def undispatch(x_local: torch.Tensor, plan: ContextParallelPlan, group=None) -> torch.Tensor:
    """The whole token-major tensor from every rank's dispatched rows (an all-gather).

    Differentiable: the backward keeps this rank's rows of the incoming gradient, which must
    therefore be the same on every rank (every rank computing the same loss on the result)."""
    rank, size = _rank_in(plan, group)
    if x_local.dim() < 1 or x_local.shape[0] != plan.tokens_per_rank:
        raise UserError(
            f"undispatch: the tensor has shape {tuple(x_local.shape)} but each rank of the plan "
            f"holds {plan.tokens_per_rank} tokens along dim 0"
        )
    t = _tensors(plan, rank, x_local.device)
    return comm.UndispatchRows.apply(x_local, t.local_tokens, t.inv_perm, size, group)


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: ContextParallelPlan,
    group=None,
    *,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    sink: torch.Tensor | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``range_attention`` of the plan's slices, for this rank's dispatched q, k and v.

    Args:
        q, k, v: this rank's rows (``dispatch`` of the packed ``(tokens, heads, head_dim)``
            tensors): ``(plan.tokens_per_rank, heads, head_dim)``; GQA as in range_attention.
        plan: from :func:`plan_context_parallel` (or ``zigzag_plan``/``contiguous_plan``), the
            same on every rank; its world size must be the group's.
        group: the process group (default: the whole world).
        softmax_scale, softcap, sink, deterministic: as in ``range_attention``. ``sink``'s
            gradient on each rank is that rank's queries' share; like any parameter's
            gradient under context parallelism it is summed over the group by whatever reduces
            gradients (data parallelism over data x context ranks, FSDP).

    Returns:
        ``(out, lse)`` for this rank's queries, in plan order (``undispatch`` them for the
        whole sequence).
    """
    rank, size = _rank_in(plan, group)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3 or x.shape[0] != plan.tokens_per_rank:
            raise UserError(
                f"cp_attention: {name} has shape {tuple(x.shape)}; expected this rank's "
                f"(tokens, heads, head_dim) rows with {plan.tokens_per_rank} tokens "
                "(dispatch the packed tensor first)"
            )
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    t = _tensors(plan, rank, q.device)
    opts = (float(softmax_scale), float(softcap), bool(deterministic))
    return _ContextParallelAttention.apply(q, k, v, sink, t, group, opts)


# --- per-rank tensors ---------------------------------------------------------------------------


@dataclass
class _RankTensors:
    """One rank's part of a plan as tensors on one device (cached in the plan)."""

    rank: int
    world_size: int
    local_tokens: torch.Tensor  # global token of each local row
    inv_perm: torch.Tensor
    stages: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per buffer: slices
    send_index: list[torch.Tensor]  # per remote stage: local rows to send
    send_sizes: list[list[int]]
    recv_sizes: list[list[int]]

    @property
    def num_remote_stages(self) -> int:
        return len(self.send_index)


def _rank_in(plan: ContextParallelPlan, group) -> tuple[int, int]:
    rank, size = comm.group_rank_and_size(group)
    if size != plan.world_size:
        raise UserError(
            f"context parallelism: the plan is for {plan.world_size} ranks but the process "
            f"group has {size}; plan with world_size={size}"
        )
    return rank, size


def _tensors(plan: ContextParallelPlan, rank: int, device: torch.device) -> _RankTensors:
    key = ("cp", rank, str(device))
    cached = plan._device_cache.get(key)
    if cached is None:
        r: RankPlan = plan.ranks[rank]
        tl = plan.tokens_per_rank

        def to(x):
            return x.to(device, non_blocking=True)

        cached = _RankTensors(
            rank=rank,
            world_size=plan.world_size,
            local_tokens=to(plan.perm[rank * tl : (rank + 1) * tl]),
            inv_perm=to(plan.inv_perm),
            stages=[(to(s.q_ranges), to(s.k_ranges), to(s.mask_types)) for s in r.stages],
            send_index=[to(i) for i in r.send_index],
            send_sizes=[list(s) for s in r.send_split_sizes],
            recv_sizes=[list(s) for s in r.recv_split_sizes],
        )
        plan._device_cache[key] = cached
    return cached


# --- the staged computation ---------------------------------------------------------------------


class _Gathers:
    """The remote stages' key/value buffers, stage ``t + 1`` requested while ``t`` is used."""

    def __init__(self, kv: torch.Tensor, t: _RankTensors, group):
        self.kv, self.t, self.group = kv, t, group
        self.pending = self._launch(0)

    def _launch(self, i: int):
        if i >= self.t.num_remote_stages:
            return None
        if self.t.world_size == 1:
            return self.kv.new_empty((0, self.kv.shape[1])), None
        send = self.kv.index_select(0, self.t.send_index[i])
        return comm.all_to_all_rows(
            send, self.t.send_sizes[i], self.t.recv_sizes[i], self.group, async_op=True
        )

    def next(self, i: int) -> torch.Tensor:
        """Remote stage ``i``'s buffer (stages counted from 0); starts fetching stage i + 1."""
        buf, work = self.pending
        if work is not None:
            work.wait()
        self.pending = self._launch(i + 1)
        return buf


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, t: _RankTensors, group, opts):
        scale, softcap, det = opts
        gathers = _Gathers(pack_kv(k, v), t, group)
        outs, lses = [], []

        def attend(kk, vv, slices, with_sink):
            part_out, part_lse = range_attention(
                q, kk, vv, *slices, softmax_scale=scale, softcap=softcap,
                sink=sink if with_sink else None, deterministic=det,
            )  # fmt: skip
            outs.append(part_out)
            lses.append(part_lse)

        if len(t.stages[0][2]) or sink is not None:
            attend(k, v, t.stages[0], True)
        for i in range(t.num_remote_stages):
            buf = gathers.next(i)
            if len(t.stages[i + 1][2]):
                attend(*unpack_kv(buf, k, v), t.stages[i + 1], False)
        out, lse = merge_partials(outs, lses, q.dtype) if outs else empty_result(q, v)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.t, ctx.group, ctx.opts = t, group, opts
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sink = ctx.saved_tensors
        t, group = ctx.t, ctx.group
        scale, softcap, det = ctx.opts
        acc = lse.dtype
        kv = pack_kv(k, v)
        gathers = _Gathers(kv, t, group)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dkv = torch.zeros(kv.shape, dtype=acc, device=q.device)
        dsink = None

        def grads(kk, vv, slices, with_sink):
            return torch.ops.magi.range_attention_backward(
                dout, dlse, q, kk, vv, out, lse, *slices,
                sink if with_sink else None, scale, softcap, det,
            )  # fmt: skip

        if len(t.stages[0][2]) or sink is not None:
            dq_i, dk_i, dv_i, ds = grads(k, v, t.stages[0], True)
            dsink = ds.to(sink.dtype) if sink is not None else None
            dq += dq_i
            dkv += pack_kv(dk_i, dv_i)
        returns = []
        for i in range(t.num_remote_stages):
            buf = gathers.next(i)
            if len(t.stages[i + 1][2]):
                dq_i, dk_i, dv_i, _ = grads(*unpack_kv(buf, k, v), t.stages[i + 1], False)
                dq += dq_i
                dbuf = pack_kv(dk_i, dv_i)
            else:
                dbuf = buf.new_zeros(buf.shape)
            if t.world_size > 1:
                returns.append(
                    comm.all_to_all_rows(
                        dbuf, t.recv_sizes[i], t.send_sizes[i], group, async_op=True
                    )
                )
        for i, (back, work) in enumerate(returns):
            work.wait()
            # one index_add per destination: no index repeats within it, so the sums are
            # deterministic even where index_add uses atomics
            start = 0
            for n in t.send_sizes[i]:
                if n:
                    index = t.send_index[i][start : start + n]
                    dkv.index_add_(0, index, back[start : start + n].to(acc))
                start += n
        dk, dv = unpack_kv(dkv, k, v)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink, None, None, None
