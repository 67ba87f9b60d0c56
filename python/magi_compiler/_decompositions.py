"""The decomposition table handed to AOTAutograd.

AOTAutograd always applies PyTorch's CompositeImplicitAutograd decompositions (``F.linear`` →
``aten.t`` + ``aten.addmm``, ``F.scaled_dot_product_attention`` → the backend's SDPA op, ...);
this table adds ours on top. The executor can run any ATen op, so the table exists to give
later passes (fusion) a small, stable op set, not for correctness. An entry is added only with
the pass that benefits from it, and only where it keeps eager's numbers (up to the order of a
float32 sum):

- ``slice_backward`` with step 1 over a dim of constant size (the gradient of ``x[..., a:b]``,
  as in rotary embeddings' ``rotate_half``) becomes ``constant_pad_nd`` with zeros: the same
  values, and an op the fusion pass generates for the last dim, so the backward of a rotary
  embedding is one kernel instead of a zero fill, a copy and an add per slice.
- ``sum`` over one middle dim of constant size 2 to 8 (the gradient of grouped-query
  attention's ``expand`` of K and V over the query heads of a group) becomes a sum of that
  dim's ``select`` views, in float32 for half-precision inputs and rounded once, as ATen's sum
  is (added in order: float32 results of 5 or more elements may differ from ATen's in the last
  bits). The views cost nothing, and the adds fuse with the transpose and copy that follow; a
  reduction over a middle dim has no generated form (only the last dim's and the leading
  dims'). With fusion off (``MAGI_DISABLE_PASSES=fuse_groups``) the adds run as ATen calls.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def _slice_backward(grad_output, input_sizes, dim, start, end, step):
    rank = len(input_sizes)
    dim = dim % rank if rank else dim
    size = input_sizes[dim] if rank else None
    if step != 1 or not isinstance(size, int) or not all(isinstance(b, int) for b in (start, end)):
        return NotImplemented  # symbolic bounds or strides: ATen's own op
    # ATen's slice bounds: negative counts from the end, then clamped to [0, size].
    start = min(max(start + size if start < 0 else start, 0), size)
    end = min(max(end + size if end < 0 else end, start), size)
    pad = [0, 0] * (rank - 1 - dim) + [start, size - end]
    return aten.constant_pad_nd.default(grad_output, pad, 0.0)


MAX_UNROLLED_SUM = 8


def _sum_dim(x, dim, keepdim=False, *, dtype=None):
    rank = x.dim()
    if dtype is not None or dim is None or len(dim) != 1 or rank < 3 or not x.is_floating_point():
        return NotImplemented
    if not -rank <= dim[0] < rank:
        return NotImplemented  # ATen raises the error
    d = dim[0] % rank
    size = x.shape[d]
    if d in (0, rank - 1) or not isinstance(size, int) or not 2 <= size <= MAX_UNROLLED_SUM:
        return NotImplemented  # a row or column reduction, or too long to unroll
    acc = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    total = aten.select.int(x, d, 0).to(acc)
    for i in range(1, size):
        total = total + aten.select.int(x, d, i).to(acc)
    total = total.to(x.dtype)
    return total.unsqueeze(d) if keepdim else total


def decomposition_table() -> dict[Any, Any]:
    return {
        aten.slice_backward.default: _slice_backward,
        aten.sum.dim_IntList: _sum_dim,
    }
