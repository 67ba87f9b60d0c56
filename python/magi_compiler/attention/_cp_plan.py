"""The context-parallel planner: which rank owns which chunks, and what each rank computes.

``plan_context_parallel`` cuts the packed sequence into chunks of ``chunk_size`` tokens,
measures each chunk's masked attention area (the (q, k) pairs its queries attend to), deals
the chunks to ranks so the areas balance (``_cp_solver.assign_chunks``), and then, for every rank,
works out exactly which key/value tokens it needs from which other rank and the slices it runs
against each buffer. Everything is plain Python over integers, deterministic, and the same on
every rank, so each rank computes the whole plan for itself and no rank waits on another to
learn it.

Buffers. A rank attends its local queries to a list of key/value buffers, its *stages*. Stage 0
is its own local keys and values (no communication); stages ``1..S`` are received by one
all-to-all-v each, rank ``s``'s part of stage ``t`` being the ``t``-th of ``S`` near-equal
pieces (by token count) of the needed tokens ``s`` owns, in global order. Each original slice is
clipped to each local query chunk and then cut where the key buffer stops being contiguous in
global token order (owner and stage boundaries); the keys every row of a chunk attends to are
handled as whole runs (one FULL slice per owner and stage), and only the two diagonal edges,
each narrower than a chunk, are cut token-exactly by :mod:`._cp_slices`. The cut slices cover
the same (q, k) pairs as the original ones, each (q, k) pair in exactly one stage, so merging
the stages' partial outputs by their log-sum-exps gives the single-device result.
"""

from __future__ import annotations

import bisect
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from magi_compiler.attention import _cp_slices as geo
from magi_compiler.attention._cp_solver import assign_chunks, chunk_bands, chunk_documents
from magi_compiler.errors import UserError

Ranges = tuple[tuple[int, int], ...]

# Plans by key, so that the registered operators (which take no Python objects) can find them.
_plans: weakref.WeakValueDictionary[int, ContextParallelPlan] = weakref.WeakValueDictionary()
_plan_ids = itertools.count()


def plan_by_key(key: int) -> ContextParallelPlan:
    """The live plan of ``key`` (``ContextParallelPlan.key``)."""
    plan = _plans.get(key)
    if plan is None:
        raise UserError(
            f"context parallelism: no plan {key} is alive in this process; keep the plan "
            "object referenced for as long as code that uses it runs"
        )
    return plan


@dataclass(frozen=True, eq=False)
class StageSlices:
    """The slices one rank runs against one key/value buffer: q in the rank's local token order,
    k in the buffer's order; int32 tensors on the CPU (``cp_attention`` moves them)."""

    q_ranges: torch.Tensor
    k_ranges: torch.Tensor
    mask_types: torch.Tensor

    def __len__(self) -> int:
        return int(self.mask_types.numel())

    def __iter__(self):
        """``q_ranges, k_ranges, mask_types``, as ``range_attention`` takes them."""
        return iter((self.q_ranges, self.k_ranges, self.mask_types))


@dataclass(frozen=True, eq=False)
class RankPlan:
    """What one rank owns, needs, sends and computes."""

    rank: int
    chunks: tuple[int, ...]  # global chunk ids, ascending: the rank's local token order
    token_ranges: Ranges  # the same as global token ranges, merged
    area: int  # masked attention area of its queries
    local_slices: tuple[geo.Piece, ...]  # the slices clipped to its queries: q local, k global
    needed_k_ranges: Ranges  # global key/value tokens its queries attend to, merged
    recv_ranges: tuple[Ranges, ...]  # per source rank: the needed tokens it owns (empty: self)
    send_ranges: tuple[Ranges, ...]  # per destination rank: what that rank needs from this one
    send_split_sizes: tuple[tuple[int, ...], ...]  # per remote stage, per destination rank
    recv_split_sizes: tuple[tuple[int, ...], ...]  # per remote stage, per source rank
    send_index: tuple[torch.Tensor, ...]  # per remote stage: local rows to send, int64
    stages: tuple[StageSlices, ...]  # stage 0: local keys; then one per remote stage


@dataclass(frozen=True, eq=False)
class ContextParallelPlan:
    """A packed sequence's split over ``world_size`` ranks. ``perm[p]`` is the global token at
    position ``p`` of the concatenation of the ranks' local tokens (rank ``r`` holds positions
    ``[r * tokens_per_rank, (r + 1) * tokens_per_rank)``); ``inv_perm`` is its inverse."""

    total_tokens: int
    chunk_size: int
    world_size: int
    num_stages: int  # remote stages per cp_attention call
    slices: tuple[geo.Piece, ...]
    chunk_areas: tuple[int, ...]
    rank_areas: tuple[int, ...]
    imbalance: float  # max rank area / mean rank area (1.0 for an empty mask)
    balance_bound: int  # proven: max - min rank area <= this (see assign_chunks)
    perm: torch.Tensor
    inv_perm: torch.Tensor
    ranks: tuple[RankPlan, ...]
    key: int = field(default_factory=lambda: next(_plan_ids))
    # ``key`` as an int64 CPU tensor: what the registered operators take, so a compiled graph
    # gets the plan as an input and a new plan (a new mask) does not recompile it
    handle: torch.Tensor = field(init=False, repr=False)
    # a field, not a property: a compiled graph guards on it as a plain value
    tokens_per_rank: int = field(init=False)
    _device_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "handle", torch.tensor([self.key], dtype=torch.int64))
        object.__setattr__(self, "tokens_per_rank", self.total_tokens // self.world_size)
        _plans[self.key] = self

    @property
    def send_split_sizes(self) -> tuple[tuple[int, ...], ...]:
        """Per rank, per destination: key/value tokens sent over all stages (all-to-all-v)."""
        return tuple(tuple(map(sum, zip(*r.send_split_sizes, strict=True))) for r in self.ranks)

    @property
    def recv_split_sizes(self) -> tuple[tuple[int, ...], ...]:
        """Per rank, per source: key/value tokens received over all stages."""
        return tuple(tuple(map(sum, zip(*r.recv_split_sizes, strict=True))) for r in self.ranks)

    def describe(self) -> str:
        """A few readable lines: chunks, areas, balance and traffic per rank."""
        lines = [
            f"context-parallel plan: {self.total_tokens} tokens, {len(self.chunk_areas)} chunks "
            f"of {self.chunk_size}, {self.world_size} ranks, {self.num_stages} remote stages; "
            f"area imbalance {self.imbalance:.4f} (max/mean), max-min <= {self.balance_bound}"
        ]
        for r in self.ranks:
            lines.append(
                f"  rank {r.rank}: chunks {list(r.chunks)}, area {r.area}, receives "
                f"{sum(map(sum, r.recv_split_sizes))} k/v tokens, "
                f"slices per stage {[len(s) for s in r.stages]}"
            )
        return "\n".join(lines)


def normalize_slices(q_ranges, k_ranges, mask_types, total_tokens: int) -> tuple[geo.Piece, ...]:
    """The slices as Python tuples, checked against the sequence length."""
    qs = torch.as_tensor(q_ranges).reshape(-1, 2).tolist()
    ks = torch.as_tensor(k_ranges).reshape(-1, 2).tolist()
    ts = torch.as_tensor(mask_types).reshape(-1).tolist()
    if not len(qs) == len(ks) == len(ts):
        raise UserError(
            f"context parallelism: {len(qs)} q ranges, {len(ks)} k ranges and {len(ts)} mask "
            "types were given; pass one of each per slice"
        )
    out = []
    for n, ((q0, q1), (k0, k1), t) in enumerate(zip(qs, ks, ts, strict=True)):
        if not (0 <= q0 <= q1 <= total_tokens and 0 <= k0 <= k1 <= total_tokens):
            raise UserError(
                f"context parallelism: slice {n} has q range [{q0}, {q1}) and k range "
                f"[{k0}, {k1}); ranges must be ordered and lie within the {total_tokens} tokens"
            )
        if t not in geo.MASK_TYPE_NAMES:
            raise UserError(
                f"context parallelism: slice {n} has mask type {t}; use 0 FULL, 1 CAUSAL, "
                "2 INV_CAUSAL or 3 BI_CAUSAL"
            )
        out.append(geo.Piece(q0, q1, k0, k1, t))
    return tuple(out)


def _merge(ranges) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _intersect(xs, ys) -> list[list[int]]:
    """Intersection of two sorted lists of disjoint intervals."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append([a, b])
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


class _Source:
    """One owner's tokens as they appear in a rank's buffers: the global intervals ``runs``
    (ascending) laid end to end, and ``segments`` ``(p0, p1, stage, offset)`` saying that
    positions ``[p0, p1)`` of that list sit in buffer ``stage`` from row ``offset``."""

    def __init__(self, runs, segments):
        self.starts = [a for a, _ in runs]
        self.ends = [b for _, b in runs]
        self.prefix = [0]
        for a, b in runs:
            self.prefix.append(self.prefix[-1] + b - a)
        self.segments = segments

    def count_below(self, g: int) -> int:
        i = bisect.bisect_right(self.starts, g) - 1
        return 0 if i < 0 else self.prefix[i] + min(g, self.ends[i]) - self.starts[i]

    def place(self, p0: int, p1: int):
        """The buffer pieces ``(stage, row, p_start, p_end)`` of list positions [p0, p1)."""
        for s0, s1, stage, offset in self.segments:
            a, b = max(p0, s0), min(p1, s1)
            if a < b:
                yield stage, offset + a - s0, a, b


def emit_stage_pieces(
    bands, chunks, owner, chunk_size: int, sources: Sequence[_Source], num_buffers: int
) -> list[list[geo.Piece]]:
    """The slices of one rank per buffer. ``bands[c]`` are chunk ``c``'s clipped bands,
    ``chunks`` the rank's chunks in local order, ``sources[s]`` how owner ``s``'s tokens are laid
    out in the buffers (every key a band uses must be in them)."""
    pieces: list[list[geo.Piece]] = [[] for _ in range(num_buffers)]
    for slot, c in enumerate(chunks):
        dq = slot * chunk_size - c * chunk_size
        for b in bands[c]:
            center0, center1 = geo.row_lo(b, b.q1 - 1), geo.row_hi(b, b.q0)
            if center0 < center1:
                # every row attends to all of [center0, center1): one FULL run per buffer piece
                for src in sources:
                    p0, p1 = src.count_below(center0), src.count_below(center1)
                    for stage, row, a, e in src.place(p0, p1):
                        pieces[stage].append(geo.Piece(b.q0 + dq, b.q1 + dq, row, row + e - a, 0))
                edges = ((b.k0, center0), (center1, b.k1))
            else:
                edges = ((b.k0, b.k1),)
            for e0, e1 in edges:
                g = e0
                while g < e1:
                    end = min(e1, (g // chunk_size + 1) * chunk_size)
                    src = sources[owner[g // chunk_size]]
                    p0 = src.count_below(g)
                    for stage, row, a, e in src.place(p0, p0 + end - g):
                        g0 = g + a - p0
                        part = geo.clip(b, b.q0, b.q1, g0, g0 + e - a)
                        if part is not None:
                            dk = row - g0
                            pieces[stage].extend(p.shifted(dq, dk) for p in geo.band_pieces(part))
                    g = end
    return [_merge_full(p) for p in pieces]


def _merge_full(pieces: list[geo.Piece]) -> list[geo.Piece]:
    """Joins FULL slices that touch along k (same rows), then along q (same keys)."""
    for along_k in (True, False):
        key = (lambda p: (p.q0, p.q1, p.k0)) if along_k else (lambda p: (p.k0, p.k1, p.q0))
        out: list[geo.Piece] = []
        for p in sorted(pieces, key=lambda p: (p.mask_type != 0, key(p), p)):
            last = out[-1] if out else None
            if last is not None and last.mask_type == p.mask_type == 0:
                if along_k and (last.q0, last.q1, last.k1) == (p.q0, p.q1, p.k0):
                    out[-1] = last._replace(k1=p.k1)
                    continue
                if not along_k and (last.k0, last.k1, last.q1) == (p.k0, p.k1, p.q0):
                    out[-1] = last._replace(q1=p.q1)
                    continue
            out.append(p)
        pieces = out
    return sorted(pieces, key=lambda p: (p.q0, p.k0, p.q1, p.k1, p.mask_type))


def stage_slices(pieces: Sequence[geo.Piece]) -> StageSlices:
    rows = [[p.q0, p.q1, p.k0, p.k1, p.mask_type] for p in pieces]
    t = torch.tensor(rows, dtype=torch.int32).reshape(-1, 5)
    return StageSlices(t[:, 0:2].contiguous(), t[:, 2:4].contiguous(), t[:, 4].contiguous())


def _stage_bounds(n: int, stages: int) -> list[int]:
    return [n * t // stages for t in range(stages + 1)]


def build_plan(
    slices: tuple[geo.Piece, ...],
    total_tokens: int,
    chunk_size: int,
    rank_chunks: Sequence[Sequence[int]],
    num_stages: int,
    *,
    bands=None,
    chunk_areas=None,
    balance_bound: int = 0,
) -> ContextParallelPlan:
    """The plan for a given assignment of chunks to ranks (each list is sorted here)."""
    w = len(rank_chunks)
    num_chunks = total_tokens // chunk_size
    rank_chunks = [sorted(c) for c in rank_chunks]
    if bands is None:
        bands = chunk_bands(slices, num_chunks, chunk_size)
    if chunk_areas is None:
        chunk_areas = [sum(geo.band_area(b) for b in bs) for bs in bands]
    owner = [0] * num_chunks
    for r, cs in enumerate(rank_chunks):
        for c in cs:
            owner[c] = r
    owned = [_merge((c * chunk_size, (c + 1) * chunk_size) for c in cs) for cs in rank_chunks]
    perm = torch.cat(
        [torch.arange(c * chunk_size, (c + 1) * chunk_size) for cs in rank_chunks for c in cs]
    )
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(total_tokens)
    per_rank = total_tokens // w

    needed = [_merge((b.k0, b.k1) for c in cs for b in bands[c]) for cs in rank_chunks]
    # recv[r][s]: global intervals rank r receives from s
    recv = [[[] if s == r else _intersect(needed[r], owned[s]) for s in range(w)] for r in range(w)]
    bounds = [[_stage_bounds(sum(b - a for a, b in recv[r][s]), num_stages) for s in range(w)]
              for r in range(w)]  # fmt: skip
    recv_sizes = [
        [[bounds[r][s][t + 1] - bounds[r][s][t] for s in range(w)] for t in range(num_stages)]
        for r in range(w)
    ]

    ranks = []
    for r in range(w):
        sources = []
        for s in range(w):
            if s == r:
                sources.append(_Source(owned[r], [(0, per_rank, 0, 0)]))
                continue
            segs = []
            for t in range(num_stages):
                p0, p1 = bounds[r][s][t], bounds[r][s][t + 1]
                segs.append((p0, p1, t + 1, sum(recv_sizes[r][t][:s])))
            sources.append(_Source(recv[r][s], segs))
        stage_pieces = emit_stage_pieces(
            bands, rank_chunks[r], owner, chunk_size, sources, num_stages + 1
        )
        local = []
        for slot, c in enumerate(rank_chunks[r]):
            dq = (slot - c) * chunk_size
            local.extend(p.shifted(dq, 0) for b in bands[c] for p in geo.band_pieces(b))
        send_index = []
        for t in range(num_stages):
            parts = []
            for d in range(w):
                if d == r:
                    continue
                src = _Source(recv[d][r], [])
                p0, p1 = bounds[d][r][t], bounds[d][r][t + 1]
                for a, b in zip(src.starts, src.ends, strict=True):
                    pa, pb = src.count_below(a), src.count_below(b)
                    lo, hi = max(pa, p0), min(pb, p1)
                    if lo < hi:
                        parts.append(torch.arange(a + lo - pa, a + hi - pa))
            tokens = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
            send_index.append(inv_perm[tokens] - r * per_rank)
        ranks.append(
            RankPlan(
                rank=r,
                chunks=tuple(rank_chunks[r]),
                token_ranges=tuple(map(tuple, owned[r])),
                area=sum(chunk_areas[c] for c in rank_chunks[r]),
                local_slices=tuple(local),
                needed_k_ranges=tuple(map(tuple, needed[r])),
                recv_ranges=tuple(tuple(map(tuple, recv[r][s])) for s in range(w)),
                send_ranges=tuple(tuple(map(tuple, recv[d][r])) for d in range(w)),
                send_split_sizes=tuple(
                    tuple(recv_sizes[d][t][r] for d in range(w)) for t in range(num_stages)
                ),
                recv_split_sizes=tuple(tuple(x) for x in recv_sizes[r]),
                send_index=tuple(send_index),
                stages=tuple(stage_slices(p) for p in stage_pieces),
            )
        )
    rank_areas = tuple(r.area for r in ranks)
    mean = sum(rank_areas) / w
    return ContextParallelPlan(
        total_tokens=total_tokens,
        chunk_size=chunk_size,
        world_size=w,
        num_stages=num_stages,
        slices=slices,
        chunk_areas=tuple(chunk_areas),
        rank_areas=rank_areas,
        imbalance=max(rank_areas) / mean if mean > 0 else 1.0,
        balance_bound=balance_bound,
        perm=perm,
        inv_perm=inv_perm,
        ranks=tuple(ranks),
    )


def check_layout(total_tokens: int, chunk_size: int, world_size: int, num_stages: int) -> int:
    if world_size < 1 or chunk_size < 1 or num_stages < 1:
        raise UserError(
            f"context parallelism: world_size {world_size}, chunk_size {chunk_size} and "
            f"num_stages {num_stages} must all be at least 1"
        )
    if total_tokens % chunk_size or (total_tokens // chunk_size) % world_size:
        raise UserError(
            f"context parallelism: {total_tokens} tokens do not split into chunks of "
            f"{chunk_size} dealt evenly to {world_size} ranks; pad the packed sequence to a "
            f"multiple of chunk_size * world_size = {chunk_size * world_size} tokens (padding "
            "tokens in no slice cost nothing) or pick another chunk_size"
        )
    return total_tokens // chunk_size


def plan_context_parallel(
    q_ranges,
    k_ranges,
    mask_types,
    total_tokens: int,
    chunk_size: int,
    world_size: int,
    *,
    num_stages: int = 2,
) -> ContextParallelPlan:
    """Plans context-parallel attention over a packed self-attention sequence.

    ``q_ranges``/``k_ranges`` (int ``(n, 2)``) and ``mask_types`` (``(n,)``: 0 FULL, 1 CAUSAL,
    2 INV_CAUSAL, 3 BI_CAUSAL) are the slices of ``range_attention`` over the whole sequence;
    queries and keys index the same ``total_tokens`` tokens, which must split into chunks of
    ``chunk_size`` dealt evenly to ``world_size`` ranks. ``num_stages``: how many pieces the
    received keys/values come in (communication of one overlaps computation of the previous).
    Deterministic: every rank computes the same plan.
    """
    num_chunks = check_layout(total_tokens, chunk_size, world_size, num_stages)
    slices = normalize_slices(q_ranges, k_ranges, mask_types, total_tokens)
    bands = chunk_bands(slices, num_chunks, chunk_size)
    areas = [sum(geo.band_area(b) for b in bs) for bs in bands]
    docs = chunk_documents(slices, num_chunks, chunk_size)
    rank_chunks, bound = assign_chunks(areas, world_size, docs)
    return build_plan(
        slices, total_tokens, chunk_size, rank_chunks, num_stages,
        bands=bands, chunk_areas=areas, balance_bound=bound,
    )  # fmt: skip


def zigzag_plan(
    q_ranges, k_ranges, mask_types, total_tokens: int, world_size: int, *, num_stages: int = 1
) -> ContextParallelPlan:
    """Ring attention's causal load balance: ``2 * world_size`` chunks, rank ``r`` holding
    chunks ``r`` and ``2 * world_size - 1 - r`` whatever the mask."""
    chunk_size = max(1, total_tokens // (2 * world_size))
    check_layout(total_tokens, chunk_size, world_size, num_stages)
    if chunk_size * 2 * world_size != total_tokens:
        raise UserError(
            f"zigzag plan: {total_tokens} tokens are not a multiple of 2 * world_size = "
            f"{2 * world_size}; pad the packed sequence"
        )
    slices = normalize_slices(q_ranges, k_ranges, mask_types, total_tokens)
    rank_chunks = [[r, 2 * world_size - 1 - r] for r in range(world_size)]
    return build_plan(slices, total_tokens, chunk_size, rank_chunks, num_stages)


def contiguous_plan(
    q_ranges, k_ranges, mask_types, total_tokens: int, world_size: int, *, num_stages: int = 1
) -> ContextParallelPlan:
    """Rank ``r`` holds the ``r``-th contiguous block of tokens (no balancing)."""
    chunk_size = max(1, total_tokens // world_size)
    check_layout(total_tokens, chunk_size, world_size, num_stages)
    slices = normalize_slices(q_ranges, k_ranges, mask_types, total_tokens)
    return build_plan(slices, total_tokens, chunk_size, [[r] for r in range(world_size)],
                      num_stages)  # fmt: skip


__all__ = [
    "ContextParallelPlan",
    "RankPlan",
    "StageSlices",
    "assign_chunks",
    "plan_by_key",
    "plan_context_parallel",
    "zigzag_plan",
    "contiguous_plan",
]
