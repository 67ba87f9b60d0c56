"""Collectives for context parallelism, written once for gloo (CPU tensors) and NCCL (CUDA).

Only ``torch.distributed`` calls that both backends implement are used: ``all_gather_into_tensor``,
``all_to_all_single`` with split sizes (all-to-all-v) and ``batch_isend_irecv``. The autograd
functions here are the differentiable halves of the public API: dispatching a replicated token
tensor keeps this rank's rows and its backward all-gathers the gradient; undispatching
all-gathers and its backward keeps this rank's rows again (the gradient reaching an
undispatched tensor must be the same on every rank, as when every rank computes the same loss).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from magi_compiler.errors import UserError


def as_process_group(group):
    """``group`` itself, or the process group of a one-dimensional ``DeviceMesh``."""
    if group is not None and hasattr(group, "get_group") and hasattr(group, "ndim"):
        if group.ndim != 1:
            raise UserError(
                f"context parallelism: a {group.ndim}-dimensional device mesh was given; pass "
                "the context-parallel dimension's mesh (mesh['cp']) or its process group"
            )
        return group.get_group()
    return group


def group_rank_and_size(group) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size; ``(0, 1)`` without an
    initialised process group (a single process runs the whole plan itself)."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise UserError(
                "context parallelism: a process group was given but torch.distributed is not "
                "initialised; call torch.distributed.init_process_group first"
            )
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def rank_in_plan(plan, group) -> tuple[int, int]:
    """This rank and the group size, checked against the plan's world size."""
    rank, size = group_rank_and_size(as_process_group(group))
    if size != plan.world_size:
        raise UserError(
            f"context parallelism: the plan is for {plan.world_size} ranks but the process "
            f"group has {size}; plan with world_size={size}"
        )
    return rank, size


def all_gather_rows(x: torch.Tensor, world_size: int, group) -> torch.Tensor:
    """The ranks' ``x`` stacked along dim 0, rank order."""
    if world_size == 1:
        return x
    x = x.contiguous()
    out = x.new_empty((world_size * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(out, x, group=group)
    return out


def all_to_all_rows(
    x: torch.Tensor, send_sizes, recv_sizes, group, *, async_op: bool = False
) -> tuple[torch.Tensor, object]:
    """All-to-all-v along dim 0: rows ``[sum(send_sizes[:d]), ...)`` go to rank ``d``; the
    result holds what each source sent, in source order. Returns ``(result, work)``; ``work``
    is None unless ``async_op`` (then wait on it before reading the result)."""
    x = x.contiguous()
    out = x.new_empty((sum(recv_sizes), *x.shape[1:]))
    work = dist.all_to_all_single(
        out, x, list(recv_sizes), list(send_sizes), group=group, async_op=async_op
    )
    return out, work


def ring_exchange(send: torch.Tensor, recv: torch.Tensor, rank: int, size: int, group, tag: int):
    """Starts sending ``send`` to the next rank and receiving ``recv`` from the previous one;
    returns the requests to wait on."""
    nxt = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size
    prv = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size
    ops = [
        dist.P2POp(dist.isend, send.contiguous(), nxt, group, tag),
        dist.P2POp(dist.irecv, recv, prv, group, tag),
    ]
    return dist.batch_isend_irecv(ops)


class DispatchRows(torch.autograd.Function):
    """``x[index]`` of a replicated tensor; backward: the ranks' gradients all-gathered and put
    back in global order (every rank gets the whole gradient)."""

    @staticmethod
    def forward(ctx, x, index, inv_perm, world_size, group):
        ctx.inv_perm, ctx.world_size, ctx.group = inv_perm, world_size, group
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        full = all_gather_rows(grad, ctx.world_size, ctx.group)
        return full.index_select(0, ctx.inv_perm), None, None, None, None


class UndispatchRows(torch.autograd.Function):
    """The ranks' local rows all-gathered and put back in global order; backward: this rank's
    rows of the (replicated) gradient."""

    @staticmethod
    def forward(ctx, x, index, inv_perm, world_size, group):
        ctx.index = index
        return all_gather_rows(x, world_size, group).index_select(0, inv_perm)

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(0, ctx.index), None, None, None, None


class AllToAllRows(torch.autograd.Function):
    """Differentiable all-to-all-v along dim 0; backward is the reverse all-to-all-v."""

    @staticmethod
    def forward(ctx, x, send_sizes, recv_sizes, group):
        ctx.send_sizes, ctx.recv_sizes, ctx.group = send_sizes, recv_sizes, group
        return all_to_all_rows(x, send_sizes, recv_sizes, group)[0]

    @staticmethod
    def backward(ctx, grad):
        back = all_to_all_rows(grad, ctx.recv_sizes, ctx.send_sizes, ctx.group)[0]
        return back, None, None, None
