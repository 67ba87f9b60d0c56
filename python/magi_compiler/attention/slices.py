"""How a range-mask (AttnSlice) attention mask is described, and builders for common masks.

A mask is a list of slices ``(q_range, k_range, mask_type)``: the queries ``[q_start, q_end)``
attend the keys ``[k_start, k_end)`` with one of four shapes, numbered as MagiAttention numbers
them (``magi_attention.common.enum.AttnMaskType``). With ``d = key - query`` in global token
indices, a (query, key) pair inside the slice's rectangle is visible when

* FULL: always;
* CAUSAL: ``d <= k_end - q_end`` (bottom-right aligned: the last query sees the last key);
* INV_CAUSAL: ``d >= k_start - q_start`` (top-left aligned: the first query sees the first key);
* BI_CAUSAL: both (a band).

These are the bounds of ``magi_attention.common.rectangle.AttnRectangle`` and the pictures of
``flex_flash_attn_func``'s docstring. The builders return int32 tensors ready for
``range_attention``; see docs/attention.md.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import torch

from magi_compiler.errors import UserError

__all__ = [
    "AttnMaskType",
    "Slices",
    "dense_mask",
    "varlen_slices",
    "sliding_window_slices",
    "block_causal_slices",
    "prefix_lm_slices",
]


class AttnMaskType(enum.IntEnum):
    """The shape of one slice's mask, numbered as MagiAttention's ``attn_type_map``."""

    FULL = 0
    CAUSAL = 1
    INV_CAUSAL = 2
    BI_CAUSAL = 3


class Slices(NamedTuple):
    """``(q_ranges, k_ranges, mask_types)``: int32 tensors of shapes (n, 2), (n, 2), (n,)."""

    q_ranges: torch.Tensor
    k_ranges: torch.Tensor
    mask_types: torch.Tensor


_NO_BOUND = 1 << 62


def diagonal_bounds(q_range: tuple[int, int], k_range: tuple[int, int], mask_type: int):
    """``(d_lo, d_hi)``: the slice's visible pairs have ``d_lo <= key - query <= d_hi``."""
    (q_start, q_end), (k_start, k_end) = q_range, k_range
    causal = mask_type in (AttnMaskType.CAUSAL, AttnMaskType.BI_CAUSAL)
    inv_causal = mask_type in (AttnMaskType.INV_CAUSAL, AttnMaskType.BI_CAUSAL)
    d_hi = k_end - q_end if causal else _NO_BOUND
    d_lo = k_start - q_start if inv_causal else -_NO_BOUND
    return d_lo, d_hi


def mask_counts(q_ranges, k_ranges, mask_types, num_q: int, num_k: int) -> torch.Tensor:
    """(num_q, num_k) int32: how many slices make each (query, key) pair visible."""
    device = q_ranges.device if isinstance(q_ranges, torch.Tensor) else None
    counts = torch.zeros(num_q, num_k, dtype=torch.int32, device=device)
    for (qs, qe), (ks, ke), t in zip(
        _pairs(q_ranges), _pairs(k_ranges), _ints(mask_types), strict=True
    ):
        d_lo, d_hi = diagonal_bounds((qs, qe), (ks, ke), t)
        rows = torch.arange(qs, qe, device=device)[:, None]
        cols = torch.arange(ks, ke, device=device)[None, :]
        counts[qs:qe, ks:ke] += ((cols - rows >= d_lo) & (cols - rows <= d_hi)).int()
    return counts


def dense_mask(q_ranges, k_ranges, mask_types, num_q: int, num_k: int) -> torch.Tensor:
    """(num_q, num_k) bool: the pairs some slice makes visible (for pictures and for SDPA)."""
    return mask_counts(q_ranges, k_ranges, mask_types, num_q, num_k) > 0


# --- builders -----------------------------------------------------------------------------------


def varlen_slices(cu_seqlens_q, cu_seqlens_k=None, *, causal: bool = False, device=None) -> Slices:
    """One slice per packed document: document i's queries ``[cu_q[i], cu_q[i+1])`` attend its
    keys ``[cu_k[i], cu_k[i+1])``, FULL or CAUSAL (bottom-right aligned, as flash-attn's varlen
    causal). ``cu_seqlens_k`` defaults to ``cu_seqlens_q``. Documents without queries or keys
    get no slice."""
    bounds_q = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q")
    bounds_k = bounds_q if cu_seqlens_k is None else _cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    if len(bounds_k) != len(bounds_q):
        raise UserError(
            f"varlen_slices: cu_seqlens_q has {len(bounds_q)} entries and cu_seqlens_k "
            f"{len(bounds_k)}; give both one entry more than the number of documents"
        )
    mask_type = AttnMaskType.CAUSAL if causal else AttnMaskType.FULL
    slices = [
        ((qs, qe), (ks, ke), mask_type)
        for (qs, qe), (ks, ke) in zip(_documents(bounds_q), _documents(bounds_k), strict=True)
        if qe > qs and ke > ks
    ]
    return _to_tensors(slices, _device(device, cu_seqlens_q))


def sliding_window_slices(cu_seqlens, window: int, *, device=None) -> Slices:
    """Causal attention within each document, each query seeing at most ``window`` keys: the
    query at position i sees keys ``i - window + 1 .. i`` of its document (as Hugging Face's
    ``sliding_window``). Two slices per document longer than the window: CAUSAL over its first
    ``window`` tokens, BI_CAUSAL (the band) for the rest."""
    _positive(window, "window", "sliding_window_slices")
    slices = []
    for start, end in _documents(_cu_seqlens(cu_seqlens, "cu_seqlens")):
        head = min(end, start + window)
        if head > start:
            slices.append(((start, head), (start, head), AttnMaskType.CAUSAL))
        if end > head:
            slices.append(((head, end), (start + 1, end), AttnMaskType.BI_CAUSAL))
    return _to_tensors(slices, _device(device, cu_seqlens))


def block_causal_slices(cu_seqlens, block_size: int, *, device=None) -> Slices:
    """Block-causal (chunked) attention within each document: the tokens of block b (positions
    ``[b * block_size, (b + 1) * block_size)`` from the document's start) attend every key of
    blocks 0..b of their document, fully. One FULL slice per block."""
    _positive(block_size, "block_size", "block_causal_slices")
    slices = []
    for start, end in _documents(_cu_seqlens(cu_seqlens, "cu_seqlens")):
        for q_start in range(start, end, block_size):
            q_end = min(end, q_start + block_size)
            slices.append(((q_start, q_end), (start, q_end), AttnMaskType.FULL))
    return _to_tensors(slices, _device(device, cu_seqlens))


def prefix_lm_slices(cu_seqlens, prefix_lens: int | Sequence[int], *, device=None) -> Slices:
    """Prefix-LM attention within each document: its first ``prefix_len`` tokens attend each
    other fully, the rest attend the whole prefix and themselves causally. ``prefix_lens`` is
    one length for every document or one per document; a prefix longer than its document
    makes the whole document FULL. Up to two slices per document."""
    documents = _documents(_cu_seqlens(cu_seqlens, "cu_seqlens"))
    if isinstance(prefix_lens, int):
        prefix_lens = [prefix_lens] * len(documents)
    prefix_lens = [int(p) for p in prefix_lens]
    if len(prefix_lens) != len(documents):
        raise UserError(
            f"prefix_lm_slices: prefix_lens has {len(prefix_lens)} entries for "
            f"{len(documents)} documents; give one per document or a single int"
        )
    slices = []
    for (start, end), prefix in zip(documents, prefix_lens, strict=True):
        if prefix < 0:
            raise UserError(
                f"prefix_lm_slices: prefix_lens holds {prefix}; prefix lengths must be >= 0"
            )
        split = min(end, start + prefix)
        if split > start:
            slices.append(((start, split), (start, split), AttnMaskType.FULL))
        if end > split:
            slices.append(((split, end), (start, end), AttnMaskType.CAUSAL))
    return _to_tensors(slices, _device(device, cu_seqlens))


# --- helpers ------------------------------------------------------------------------------------


def _pairs(ranges) -> list[tuple[int, int]]:
    rows = ranges.tolist() if isinstance(ranges, torch.Tensor) else ranges
    return [(int(a), int(b)) for a, b in rows]


def _ints(values) -> list[int]:
    return [int(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]


def _cu_seqlens(cu_seqlens, name: str) -> list[int]:
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
            raise UserError(
                f"{name} must be a 1-D integer tensor of cumulative lengths (0, l0, l0+l1, ...); "
                f"got a {cu_seqlens.dtype} tensor of shape {tuple(cu_seqlens.shape)}"
            )
        cu_seqlens = cu_seqlens.tolist()
    bounds = [int(b) for b in cu_seqlens]
    if not bounds or bounds[0] < 0 or any(b < a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise UserError(
            f"{name} must be non-negative and non-decreasing (0, l0, l0+l1, ...); got {bounds}"
        )
    return bounds


def _documents(bounds: list[int]) -> list[tuple[int, int]]:
    return list(zip(bounds, bounds[1:], strict=False))


def _positive(value: int, name: str, where: str) -> None:
    if not isinstance(value, int) or value < 1:
        raise UserError(f"{where}: {name} must be an int >= 1; got {value!r}")


def _device(device, like) -> torch.device:
    if device is not None:
        return torch.device(device)
    return like.device if isinstance(like, torch.Tensor) else torch.device("cpu")


def _to_tensors(slices, device: torch.device) -> Slices:
    q = [list(s[0]) for s in slices]
    k = [list(s[1]) for s in slices]
    t = [int(s[2]) for s in slices]
    return Slices(
        torch.tensor(q, dtype=torch.int32, device=device).reshape(-1, 2),
        torch.tensor(k, dtype=torch.int32, device=device).reshape(-1, 2),
        torch.tensor(t, dtype=torch.int32, device=device),
    )
