"""The context-parallel solver: how much attention work each chunk holds, and which rank gets it.

A chunk's work is its masked attention area, the number of (q, k) pairs its queries attend to,
counted exactly from the slices (:mod:`._cp_slices`). :func:`assign_chunks` deals the chunks to
ranks, the same number each, so the ranks' areas balance, with a bound proven in its docstring;
document locality breaks ties. Plain Python over integers, deterministic.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from magi_compiler.attention import _cp_slices as geo


def chunk_bands(slices: Sequence[geo.Piece], num_chunks: int, chunk_size: int):
    """Per chunk, the bands of the slices clipped to its query rows (empty ones dropped)."""
    per_chunk: list[list[geo.Band]] = [[] for _ in range(num_chunks)]
    for s in slices:
        band = geo.band_of(*s)
        for c in range(s.q0 // chunk_size, min(num_chunks, -(-s.q1 // chunk_size))):
            b = geo.clip(band, c * chunk_size, (c + 1) * chunk_size, s.k0, s.k1)
            if b is not None:
                per_chunk[c].append(b)
    return per_chunk


def chunk_documents(slices: Sequence[geo.Piece], num_chunks: int, chunk_size: int) -> list[int]:
    """A document id per chunk for the locality tie-break: documents are the connected runs of
    overlapping q ranges; a chunk belongs to the first one its tokens meet (-1: none)."""
    doc = [-1] * num_chunks
    runs: list[list[int]] = []
    for q0, q1 in sorted((s.q0, s.q1) for s in slices if s.q0 < s.q1):
        if runs and q0 < runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], q1)
        else:
            runs.append([q0, q1])
    for d, (q0, q1) in enumerate(runs):
        for c in range(q0 // chunk_size, -(-q1 // chunk_size)):
            if doc[c] == -1:
                doc[c] = d
    return doc


def assign_chunks(
    areas: Sequence[int], world_size: int, docs: Sequence[int] | None = None
) -> tuple[list[list[int]], int]:
    """Deals ``len(areas)`` chunks to ``world_size`` ranks, the same number each, balancing the
    sum of areas. Returns the chunks per rank (ascending) and the bound ``R`` proven below.

    1. Greedy by rounds: sort the chunks by area, largest first; take them ``world_size`` at a
       time and give the i-th largest of a round to the i-th least loaded rank. Ties between
       equally loaded ranks go to the rank already holding a neighbouring chunk of the same
       document, then one holding any chunk of that document, then the lowest rank; equal
       areas are ordered so that, with all areas equal, rank r gets the r-th contiguous block.
    2. Local improvement: while a swap of a chunk of the most loaded rank with a chunk of
       another rank lowers the larger of the two loads (area difference d with
       0 < d < load gap), apply the one that evens the pair best.

    Bound: pairing sorted loads with reverse-sorted items keeps the spread of the loads at
    most max(previous spread, spread of the round's items); the rounds start from zero loads,
    so after step 1 ``max - min <= R``, the largest area range within one round (at most the
    largest minus the smallest chunk area). Step 2's swaps keep both loads inside the old
    [min, max], so the bound holds at the end: ``max <= mean + (W-1)/W * R``.
    """
    n, w = len(areas), world_size
    per_rank = n // w
    docs = list(docs) if docs is not None else [-1] * n
    order = sorted(range(n), key=lambda c: (-areas[c], c % per_rank, c // per_rank))
    loads = [0] * w
    owner = [-1] * n
    held: list[list[int]] = [[] for _ in range(w)]
    held_docs: list[set[int]] = [set() for _ in range(w)]
    bound = 0

    def affinity(r: int, c: int) -> tuple[int, int]:
        near = any(
            0 <= m < n and owner[m] == r and docs[m] == docs[c] and docs[c] != -1
            for m in (c - 1, c + 1)
        )
        return (int(near), int(docs[c] != -1 and docs[c] in held_docs[r]))

    for start in range(0, n, w):
        round_chunks = order[start : start + w]
        bound = max(bound, areas[round_chunks[0]] - areas[round_chunks[-1]])
        free = set(range(w))
        for c in round_chunks:
            low = min(loads[r] for r in free)
            r = max((r for r in free if loads[r] == low), key=lambda r: (affinity(r, c), -r))
            free.discard(r)
            owner[c] = r
            held[r].append(c)
            held_docs[r].add(docs[c])
            loads[r] += areas[c]

    for _ in range(4 * n):
        top = max(range(w), key=lambda r: (loads[r], -r))
        best = None
        for other in sorted(range(w), key=lambda r: (loads[r], r)):
            gap = loads[top] - loads[other]
            if gap <= 1:
                break
            theirs = sorted((areas[y], y) for y in held[other])
            for x in held[top]:
                # the best partner y has area near areas[x] - gap / 2, strictly inside
                # (areas[x] - gap, areas[x])
                i = bisect.bisect_left(theirs, (areas[x] - gap / 2, -1))
                for a_y, y in theirs[max(0, i - 1) : i + 1]:
                    d = areas[x] - a_y
                    if 0 < d < gap:
                        key = (abs(gap - 2 * d), x, y)
                        if best is None or key < best[0]:
                            best = (key, other, x, y, d)
            if best is not None:
                break
        if best is None:
            break
        _, other, x, y, d = best
        held[top][held[top].index(x)] = y
        held[other][held[other].index(y)] = x
        loads[top] -= d
        loads[other] += d
    return [sorted(h) for h in held], bound
