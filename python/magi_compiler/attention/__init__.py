"""Range-mask (AttnSlice) attention: masks given as slices of (q range, k range, mask type).

``range_attention`` runs attention over packed ``(tokens, heads, head_dim)`` tensors with a
mask described by slices, as MagiAttention describes masks; the builders return the slices of
common masks. See docs/attention.md.
"""

from magi_compiler.attention.op import range_attention
from magi_compiler.attention.slices import (
    AttnMaskType,
    Slices,
    block_causal_slices,
    dense_mask,
    prefix_lm_slices,
    sliding_window_slices,
    varlen_slices,
)

__all__ = [
    "range_attention",
    "AttnMaskType",
    "Slices",
    "dense_mask",
    "varlen_slices",
    "sliding_window_slices",
    "block_causal_slices",
    "prefix_lm_slices",
]
