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
import torch.distributed.distributed_c10d as _c10d

from magi_compiler._custom_op import magi_register_custom_op
from magi_compiler.attention import _cp_comm as comm
from magi_compiler.attention._cp_baselines import ring_attention, ulysses_attention
from magi_compiler.attention._cp_partials import empty_result, merge_partials, pack_kv, unpack_kv
from magi_compiler.attention._cp_plan import (
    ContextParallelPlan,
    RankPlan,
    StageSlices,
    assign_chunks,
    contiguous_plan,
    plan_by_key,
    plan_context_parallel,
    zigzag_plan,
)
from magi_compiler.attention.op import range_attention
from magi_compiler.attention.portable import compute_dtype
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
    group = comm.as_process_group(group)
    rank, size = comm.rank_in_plan(plan, group)
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
    group = comm.as_process_group(group)
    rank, size = comm.rank_in_plan(plan, group)
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
        group: the process group or a one-dimensional DeviceMesh (default: the whole world).
        softmax_scale, softcap, sink, deterministic: as in ``range_attention``. ``sink``'s
            gradient on each rank is that rank's queries' share; like any parameter's
            gradient under context parallelism it is summed over the group by whatever reduces
            gradients (data parallelism over data x context ranks, FSDP).

    Returns:
        ``(out, lse)`` for this rank's queries, in plan order (``undispatch`` them for the
        whole sequence).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3 or x.shape[0] != plan.tokens_per_rank:
            raise UserError(
                f"cp_attention: {name} has shape {tuple(x.shape)}; expected this rank's "
                f"(tokens, heads, head_dim) rows with {plan.tokens_per_rank} tokens "
                "(dispatch the packed tensor first)"
            )
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    group = comm.as_process_group(group)
    group_name = group.group_name if group is not None else ""
    return _cp_attention(
        q, k, v, sink, plan.handle, group_name,
        float(softmax_scale), float(softcap), bool(deterministic),
    )  # fmt: skip


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


def _forward(q, k, v, sink, t: _RankTensors, group, scale: float, softcap: float, det: bool):
    """This rank's (out, lse): local keys while the first remote stage is fetched, then each
    received stage while the next one is fetched, merged by log-sum-exp."""
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
    return merge_partials(outs, lses, q.dtype) if outs else empty_result(q, v)


def _backward(dout, dlse, q, k, v, out, lse, sink, t: _RankTensors, group, scale, softcap, det):
    """(dq, dk, dv, dsink): keys and values fetched again stage by stage, each stage's
    gradients computed against the merged out and lse, dk/dv sent back to their owners by the
    reverse all-to-all-v while the next stage computes, and summed there."""
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
            back = comm.all_to_all_rows(
                dbuf, t.recv_sizes[i], t.send_sizes[i], group, async_op=True
            )
            returns.append(back)
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
    dk, dv = (x.contiguous().to(y.dtype) for x, y in zip(unpack_kv(dkv, k, v), (k, v), strict=True))
    return dq.to(q.dtype), dk, dv, dsink


# --- the registered operators -------------------------------------------------------------------
# cp_attention runs as two boundary operators, so a magi_compile'd model keeps it whole (its
# collectives and staging stay out of the compiled pieces) and the recompute planner saves its
# outputs. Operators take no Python objects: the plan travels as its handle (a CPU tensor
# holding its registry key, so a new plan is a new input, not a recompilation) and the process
# group as its name ("" for the default group).


def _resolve(plan_handle: torch.Tensor, group_name: str):
    plan = plan_by_key(int(plan_handle.reshape(-1)[0]))
    group = _c10d._resolve_process_group(group_name) if group_name else None
    return plan, group


def _forward_meta(q, k, v, sink, plan_handle, group_name, softmax_scale, softcap, deterministic):
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    return out, q.new_empty(q.shape[:2], dtype=compute_dtype(q.dtype))


def _backward_meta(dout, dlse, q, k, v, out, lse, sink, *rest):
    dsink = torch.empty_like(sink) if sink is not None else q.new_empty((0,))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


@magi_register_custom_op(
    name="magi::cp_attention_backward",
    infer_output_meta_fn=_backward_meta,
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def _cp_attention_backward(
    dout: torch.Tensor,
    dlse: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sink: torch.Tensor | None,
    plan_handle: torch.Tensor,
    group_name: str,
    softmax_scale: float,
    softcap: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    plan, group = _resolve(plan_handle, group_name)
    rank, _ = comm.rank_in_plan(plan, group)
    t = _tensors(plan, rank, q.device)
    dq, dk, dv, dsink = _backward(
        dout, dlse, q, k, v, out, lse, sink, t, group, softmax_scale, softcap, deterministic
    )
    return dq, dk, dv, dsink if dsink is not None else q.new_empty((0,))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, sink, plan_handle, *options = inputs
    ctx.save_for_backward(q, k, v, *output, sink, plan_handle)
    ctx.options, ctx.has_sink = options, sink is not None


def _backward_fn(ctx, dout, dlse):
    q, k, v, out, lse, sink, plan_handle = ctx.saved_tensors
    sink = sink if ctx.has_sink else None
    dq, dk, dv, dsink = _cp_attention_backward(
        dout, dlse, q, k, v, out, lse, sink, plan_handle, *ctx.options
    )
    return dq, dk, dv, (dsink if ctx.has_sink else None), None, None, None, None, None


@magi_register_custom_op(
    name="magi::cp_attention",
    infer_output_meta_fn=_forward_meta,
    setup_context_fn=_setup_context,
    backward_fn=_backward_fn,
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def _cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sink: torch.Tensor | None,
    plan_handle: torch.Tensor,
    group_name: str,
    softmax_scale: float,
    softcap: float,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    plan, group = _resolve(plan_handle, group_name)
    rank, _ = comm.rank_in_plan(plan, group)
    t = _tensors(plan, rank, q.device)
    return _forward(q, k, v, sink, t, group, softmax_scale, softcap, deterministic)
