"""Slice geometry for context parallelism: clipping AttnSlices to rectangles, exactly.

An AttnSlice ``(q_range, k_range, mask_type)`` allows, for each query row ``i`` of its q range,
the keys ``j`` of its k range that its mask type admits. Every one of the four types (FULL,
CAUSAL bottom-right aligned, INV_CAUSAL top-left aligned, BI_CAUSAL their intersection) is
one *band*: the pairs of a rectangle whose diagonal offset ``j - i`` lies between two bounds,
either of which may be absent. A band clipped to a smaller rectangle is a band again, but
generally not one of the four types in the clipped rectangle's own alignment (a causal
diagonal passes through the old bottom-right corner, not the new one). :func:`band_pieces`
turns any band back into at most three slices of the four types that cover exactly its pairs,
so the context-parallel planner can cut slices at chunk, owner and stage boundaries without
changing which (q, k) pairs attend, and so without changing the result.
"""

from __future__ import annotations

from typing import NamedTuple

FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL = 0, 1, 2, 3
MASK_TYPE_NAMES = {FULL: "FULL", CAUSAL: "CAUSAL", INV_CAUSAL: "INV_CAUSAL", BI_CAUSAL: "BI_CAUSAL"}


class Band(NamedTuple):
    """The pairs ``(i, j)`` with ``q0 <= i < q1``, ``k0 <= j < k1`` and
    ``dlo <= j - i <= dhi``; ``None`` is an absent bound."""

    q0: int
    q1: int
    k0: int
    k1: int
    dlo: int | None
    dhi: int | None


class Piece(NamedTuple):
    """One slice of the four types: q rows ``[q0, q1)``, keys ``[k0, k1)``, ``mask_type``."""

    q0: int
    q1: int
    k0: int
    k1: int
    mask_type: int

    def shifted(self, dq: int, dk: int) -> Piece:
        """The same slice with its rows moved by ``dq`` and its keys by ``dk`` (the mask types
        are defined relative to the slice's corners, so a shift keeps them)."""
        return Piece(self.q0 + dq, self.q1 + dq, self.k0 + dk, self.k1 + dk, self.mask_type)


def band_of(q0: int, q1: int, k0: int, k1: int, mask_type: int) -> Band:
    """The band of one AttnSlice."""
    dlo = k0 - q0 if mask_type in (INV_CAUSAL, BI_CAUSAL) else None
    dhi = k1 - q1 if mask_type in (CAUSAL, BI_CAUSAL) else None
    return Band(q0, q1, k0, k1, dlo, dhi)


def row_lo(b: Band, i: int) -> int:
    """First key row ``i`` of the band attends to (meaningful for non-empty rows)."""
    return b.k0 if b.dlo is None else max(b.k0, i + b.dlo)


def row_hi(b: Band, i: int) -> int:
    """One past the last key row ``i`` attends to."""
    return b.k1 if b.dhi is None else min(b.k1, i + b.dhi + 1)


def clip(b: Band, q0: int, q1: int, k0: int, k1: int) -> Band | None:
    """The band's pairs inside the rectangle ``[q0, q1) x [k0, k1)``, trimmed to its non-empty
    rows and their key extent; ``None`` when no pair is left."""
    return trim(Band(max(b.q0, q0), min(b.q1, q1), max(b.k0, k0), min(b.k1, k1), b.dlo, b.dhi))


def trim(b: Band) -> Band | None:
    """The same pairs with the rectangle shrunk to the non-empty rows and the keys they use.

    Row ``i`` is non-empty iff ``k0 < k1``, ``i >= k0 - dhi`` and ``i < k1 - dlo`` (and
    ``dlo <= dhi``); the widths ``hi(i) - lo(i)`` rise, stay and fall along the rows, so the
    non-empty rows are one interval, and consecutive rows' key intervals touch, so the keys
    they use are one interval too: ``[lo(first row), hi(last row))``.
    """
    if b.k0 >= b.k1 or b.q0 >= b.q1:
        return None
    if b.dlo is not None and b.dhi is not None and b.dlo > b.dhi:
        return None
    q0 = b.q0 if b.dhi is None else max(b.q0, b.k0 - b.dhi)
    q1 = b.q1 if b.dlo is None else min(b.q1, b.k1 - b.dlo)
    if q0 >= q1:
        return None
    kept = Band(q0, q1, b.k0, b.k1, b.dlo, b.dhi)
    return kept._replace(k0=row_lo(kept, q0), k1=row_hi(kept, q1 - 1))


def band_pieces(b: Band) -> list[Piece]:
    """At most three slices of the four types whose pairs are exactly the (trimmed) band's.

    The rows split where the lower bound starts to bind (``i = k0 - dlo``) and where the upper
    bound stops binding (``i = k1 - dhi - 1``). In each part, each side of a row's key interval
    is either the rectangle's edge or the diagonal: edge/edge is FULL, edge/diagonal CAUSAL
    with its keys ending where the last row's do, diagonal/edge INV_CAUSAL with its keys
    starting where the first row's do, diagonal/diagonal BI_CAUSAL.
    """
    cuts = {b.q0, b.q1}
    if b.dlo is not None:
        cuts.add(b.k0 - b.dlo)
    if b.dhi is not None:
        cuts.add(b.k1 - b.dhi - 1)
    rows = sorted(c for c in cuts if b.q0 <= c <= b.q1)
    pieces = []
    for r0, r1 in zip(rows, rows[1:], strict=False):
        if r0 >= r1:
            continue
        lo_diag = b.dlo is not None and r0 + b.dlo >= b.k0
        hi_diag = b.dhi is not None and r0 + b.dhi + 1 < b.k1
        k0 = r0 + b.dlo if lo_diag else b.k0
        k1 = r1 + b.dhi if hi_diag else b.k1
        kind = (FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL)[int(hi_diag) + 2 * int(lo_diag)]
        pieces.append(Piece(r0, r1, k0, k1, kind))
    return pieces


def piece_area(p: Piece) -> int:
    """Number of (q, k) pairs of one slice."""
    lq, lk = p.q1 - p.q0, p.k1 - p.k0
    if lq <= 0 or lk <= 0:
        return 0
    if p.mask_type == FULL:
        return lq * lk
    if p.mask_type == BI_CAUSAL:
        return lq * (lk - lq + 1) if lk >= lq else 0
    # CAUSAL and INV_CAUSAL: rows of width lk - lq + 1 ... lk, the narrow ones dropping out
    # when the slice is taller than wide.
    if lk >= lq:
        return lq * (lk - lq) + lq * (lq + 1) // 2
    return lk * (lk + 1) // 2


def band_area(b: Band | None) -> int:
    """Number of (q, k) pairs of a band."""
    if b is None:
        return 0
    b = trim(b)
    return 0 if b is None else sum(piece_area(p) for p in band_pieces(b))
