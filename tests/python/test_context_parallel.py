"""Context-parallel attention on the CPU: the planner exactly (assignments, balance, the plan's
slices covering each (q, k) pair once), and cp_attention, ring attention and Ulysses with gloo
on 2 and 4 processes against single-process range_attention, forward and gradients; with 2,
cp_attention inside a magi_compile'd module too."""

from __future__ import annotations

import os
import random
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from magi_compiler.attention import _cp_slices as geo
from magi_compiler.attention import range_attention
from magi_compiler.attention.context_parallel import (
    assign_chunks,
    contiguous_plan,
    cp_attention,
    dispatch,
    plan_context_parallel,
    ring_attention,
    ulysses_attention,
    undispatch,
    zigzag_plan,
)
from magi_compiler.attention.slices import mask_counts
from magi_compiler.errors import UserError

FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL = 0, 1, 2, 3


def varlen(total: int, shortest: int, longest: int, rng: random.Random, types=(CAUSAL,)):
    """Documents of random lengths packed to ``total`` tokens, each attending within itself."""
    q, types_out, pos = [], [], 0
    while pos < total:
        n = min(rng.randint(shortest, longest), total - pos)
        q.append((pos, pos + n))
        types_out.append(rng.choice(types))
        pos += n
    return q, list(q), types_out


def random_mix(total: int, rng: random.Random):
    """Documents of every mask type plus slices that overlap them in q and in k."""
    q, k, t = varlen(total, 1, max(2, total // 3), rng, types=(FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL))
    for _ in range(rng.randint(1, 3)):
        a = rng.randrange(total)
        c = rng.randrange(total)
        q.append((a, rng.randint(a, total)))
        k.append((c, rng.randint(c, total)))
        t.append(rng.randrange(4))
    return q, k, t


# --- the planner --------------------------------------------------------------------------------


def test_slice_pieces_cover_exactly_the_clipped_pairs():
    rng = random.Random(0)
    n = 16
    for _ in range(400):
        q0, k0 = rng.randrange(n), rng.randrange(n)
        s = geo.Piece(q0, rng.randint(q0, n), k0, rng.randint(k0, n), rng.randrange(4))
        a0, c0 = rng.randrange(n), rng.randrange(n)
        a1, c1 = rng.randint(a0, n), rng.randint(c0, n)
        want = mask_counts([s[:2]], [s[2:4]], [s.mask_type], n, n)
        want[:a0], want[a1:], want[:, :c0], want[:, c1:] = 0, 0, 0, 0
        got = torch.zeros(n, n, dtype=torch.int32)
        band = geo.clip(geo.band_of(*s), a0, a1, c0, c1)
        for p in geo.band_pieces(band) if band is not None else []:
            got += mask_counts([p[:2]], [p[2:4]], [p.mask_type], n, n)
        assert torch.equal(got, want), (s, (a0, a1, c0, c1))
        assert geo.band_area(band) == int(want.sum())


def test_causal_chunks_pair_up_largest_with_smallest():
    # areas 1..8: rounds (8, 7), (6, 5), (4, 3), (2, 1), each round's largest to the lighter rank
    rank_chunks, bound = assign_chunks(list(range(1, 9)), 2)
    assert rank_chunks == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert bound == 1
    plan = plan_context_parallel([(0, 8)], [(0, 8)], [CAUSAL], 8, 1, 2)
    assert [list(r.chunks) for r in plan.ranks] == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert plan.rank_areas == (18, 18) and plan.imbalance == 1.0


def test_equal_areas_keep_contiguous_blocks():
    plan = plan_context_parallel([(0, 16)], [(0, 16)], [FULL], 16, 2, 2)
    assert [list(r.chunks) for r in plan.ranks] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert plan.ranks[0].token_ranges == ((0, 8),)
    # the FULL pieces merge into one slice per buffer: local keys, then the other rank's
    assert [len(s) for s in plan.ranks[0].stages] == [1, 1, 1]


def test_ties_prefer_a_rank_holding_the_same_document():
    # equal areas and equal loads: each rank keeps to one document
    rank_chunks, _ = assign_chunks([5, 5, 5, 5], 2, docs=[0, 0, 1, 1])
    assert rank_chunks == [[0, 1], [2, 3]]


def test_balance_on_random_varlen_causal_masks():
    rng = random.Random(1)
    worst = 1.0
    for _ in range(6):
        q, k, t = varlen(16384, 128, 4096, rng)
        plan = plan_context_parallel(q, k, t, 16384, 256, 4)
        areas = plan.rank_areas
        assert max(areas) - min(areas) <= plan.balance_bound
        worst = max(worst, plan.imbalance)
    assert worst <= 1.05, worst


def test_permutation_round_trip_and_traffic_tables():
    rng = random.Random(2)
    q, k, t = random_mix(48, rng)
    plan = plan_context_parallel(q, k, t, 48, 3, 4, num_stages=3)
    assert torch.equal(plan.perm[plan.inv_perm], torch.arange(48))
    assert torch.equal(plan.inv_perm[plan.perm], torch.arange(48))
    for r in plan.ranks:
        local = plan.perm[r.rank * 12 : (r.rank + 1) * 12].tolist()
        assert local == [i for a, b in r.token_ranges for i in range(a, b)]
        for s in range(4):
            assert plan.recv_split_sizes[r.rank][s] == plan.send_split_sizes[s][r.rank]
            assert r.recv_ranges[s] == plan.ranks[s].send_ranges[r.rank]
        assert r.recv_ranges[r.rank] == ()


def _pairs_covered(plan) -> torch.Tensor:
    """How many times the plan's per-rank stage slices make each global (q, k) pair visible."""
    total, per_rank = plan.total_tokens, plan.tokens_per_rank
    got = torch.zeros(total, total, dtype=torch.int32)
    for r in plan.ranks:
        rows = plan.perm[r.rank * per_rank : (r.rank + 1) * per_rank]
        buffers = [rows]
        for stage in range(plan.num_stages):
            parts = []
            for ranges in r.recv_ranges:
                tokens = torch.tensor([i for a, b in ranges for i in range(a, b)], dtype=torch.long)
                n = tokens.numel()
                parts.append(
                    tokens[n * stage // plan.num_stages : n * (stage + 1) // plan.num_stages]
                )
            buffers.append(torch.cat(parts))
        for slices, cols in zip(r.stages, buffers, strict=True):
            local = mask_counts(*slices, per_rank, cols.numel())
            got.index_put_((rows[:, None].expand_as(local), cols[None].expand_as(local)), local,
                           accumulate=True)  # fmt: skip
    return got


@pytest.mark.parametrize("seed", range(4))
def test_plans_cover_every_pair_once(seed):
    rng = random.Random(seed)
    for _ in range(12):
        world, chunk, per = rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 3]), rng.randint(1, 3)
        total = world * chunk * per
        q, k, t = random_mix(total, rng)
        want = mask_counts(q, k, t, total, total)
        stages = rng.randint(1, 3)
        plans = [plan_context_parallel(q, k, t, total, chunk, world, num_stages=stages)]
        plans.append(contiguous_plan(q, k, t, total, world, num_stages=stages))
        if total % (2 * world) == 0:
            plans.append(zigzag_plan(q, k, t, total, world, num_stages=stages))
        for plan in plans:
            assert torch.equal(_pairs_covered(plan), want), plan.describe()
            assert sum(plan.rank_areas) == int(want.sum())


def test_layout_errors_say_what_to_pad():
    with pytest.raises(UserError, match="pad the packed sequence to a multiple of"):
        plan_context_parallel([(0, 10)], [(0, 10)], [CAUSAL], 10, 2, 2)
    with pytest.raises(UserError, match="mask type 7"):
        plan_context_parallel([(0, 8)], [(0, 8)], [7], 8, 2, 2)
    with pytest.raises(UserError, match="lie within the 8 tokens"):
        plan_context_parallel([(0, 9)], [(0, 8)], [FULL], 8, 2, 2)
    plan = plan_context_parallel([(0, 8)], [(0, 8)], [FULL], 8, 2, 2)
    with pytest.raises(UserError, match="plan is for 2 ranks but the process group has 1"):
        dispatch(torch.zeros(8, 1), plan)


def test_one_process_runs_a_one_rank_plan():
    rng = random.Random(3)
    q_ranges, k_ranges, types = random_mix(12, rng)
    plan = plan_context_parallel(q_ranges, k_ranges, types, 12, 3, 1)
    q, k, v = (torch.randn(12, 2, 4, dtype=torch.float64) for _ in range(3))
    out, lse = cp_attention(dispatch(q, plan), dispatch(k, plan), dispatch(v, plan), plan)
    ref_out, ref_lse = range_attention(q, k, v, *_slices(q_ranges, k_ranges, types))
    torch.testing.assert_close(undispatch(out, plan), ref_out)
    torch.testing.assert_close(undispatch(lse, plan), ref_lse)


# --- several processes --------------------------------------------------------------------------


def _slices(q, k, t):
    return (
        torch.tensor(q, dtype=torch.int32).reshape(-1, 2),
        torch.tensor(k, dtype=torch.int32).reshape(-1, 2),
        torch.tensor(t, dtype=torch.int32),
    )


def _masks(total: int):
    rng = random.Random(total)
    half = total // 2
    return {
        "full": ([(0, total)], [(0, total)], [FULL]),
        "causal": ([(0, total)], [(0, total)], [CAUSAL]),
        "inv_causal": ([(0, total)], [(0, total)], [INV_CAUSAL]),
        # a band of 5 keys per query, and a bottom-right causal block with more keys than rows
        "bi_causal": (
            [(0, total - 4), (half, total)],
            [(0, total), (0, total)],
            [BI_CAUSAL, CAUSAL],
        ),  # fmt: skip
        "varlen_mix": random_mix(total, rng),
        # most queries see nothing (out 0, lse -inf), and most ranks have nothing to compute
        "sparse": ([(1, total // 4)], [(total // 2, total - 1)], [FULL]),
    }


def _loss(out, lse, seed):
    g = torch.Generator().manual_seed(seed)
    w_out = torch.randn(out.shape, generator=g, dtype=out.dtype)
    w_lse = torch.randn(lse.shape, generator=g, dtype=lse.dtype)
    return (out * w_out).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * w_lse).sum()


def _check(name, got, want):
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=lambda m: f"{name}: {m}")


class _CompiledBlock(torch.nn.Module):
    """Projections around cp_attention, for magi_compile (at module level: its forward must
    close over nothing)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, plan) -> torch.Tensor:
        q, k, v = (y.contiguous() for y in self.qkv(x).unflatten(-1, (3, 4, 4)).unbind(1))
        out, _ = cp_attention(q, k, v, plan)
        return self.proj(out.flatten(1)) + x


def _check_compiled(rank: int, total: int):
    """cp_attention inside a magi_compile'd module: one capture for three masks (the plan is an
    input), the operator a boundary forward and backward, results equal to eager."""
    from magi_compiler import get_counters, inspection, magi_compile, reset_counters

    torch.manual_seed(0)
    eager = _CompiledBlock().double()
    model = _CompiledBlock().double()
    model.load_state_dict(eager.state_dict())
    magi_compile(model)
    reset_counters()
    for step, (ranges, types) in enumerate([
        ([(0, total // 3), (total // 3, total)], [CAUSAL, FULL]),
        ([(0, total)], [CAUSAL]),
        ([(0, total // 2), (total // 2, total)], [INV_CAUSAL, BI_CAUSAL]),
    ]):  # fmt: skip
        plan = plan_context_parallel(ranges, ranges, types, total, 2, dist.get_world_size())
        x = torch.randn(total, 16, generator=torch.Generator().manual_seed(step),
                        dtype=torch.float64)  # fmt: skip
        outs, grads = [], []
        for m in (model, eager):
            xi = x.clone().requires_grad_(True)
            y = undispatch(m(dispatch(xi, plan), plan), plan)
            y.square().sum().backward()
            outs.append(y)
            grads.append([xi.grad] + [p.grad for p in m.parameters()])
            m.zero_grad()
        _check(f"compiled step {step}: out", outs[0], outs[1])
        for n, (got, want) in enumerate(zip(*grads, strict=True)):
            _check(f"compiled step {step}: grad {n}", got, want)
    assert get_counters().captures == 1
    assert inspection.last_compiled("forward").boundary_ops == ("magi::cp_attention",)
    assert inspection.last_compiled("backward").boundary_ops == ("magi::cp_attention_backward",)


def _check_device_mesh(total: int):
    """A one-dimensional DeviceMesh does what its process group does."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    plan = plan_context_parallel([(0, total)], [(0, total)], [CAUSAL], total, 2, mesh.size())
    q, k, v = (torch.randn(total, 2, 4, generator=torch.Generator().manual_seed(n),
                           dtype=torch.float64) for n in range(3))  # fmt: skip
    by_mesh = cp_attention(*(dispatch(x, plan, mesh) for x in (q, k, v)), plan, mesh)
    by_group = cp_attention(*(dispatch(x, plan) for x in (q, k, v)), plan, mesh.get_group())
    for got, want in zip(by_mesh, by_group, strict=True):
        _check("device mesh", undispatch(got, plan, mesh), undispatch(want, plan))


def _worker(rank: int, world: int, store_path: str, total: int):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        heads, kv_heads, dim, v_dim = 2 * world, world, 8, 4
        for i, (name, (qr, kr, types)) in enumerate(_masks(total).items()):
            g = torch.Generator().manual_seed(i)
            q, k, v = (
                torch.randn(total, h, d, generator=g, dtype=torch.float64, requires_grad=True)
                for h, d in ((heads, dim), (kv_heads, dim), (kv_heads, v_dim))
            )
            sink = None
            if name == "varlen_mix":
                sink = torch.randn(heads, generator=g, dtype=torch.float64, requires_grad=True)
            leaves = (q, k, v) + ((sink,) if sink is not None else ())
            out, lse = range_attention(q, k, v, *_slices(qr, kr, types), sink=sink)
            want = (out, lse, *torch.autograd.grad(_loss(out, lse, i), leaves))

            cp_plan = plan_context_parallel(qr, kr, types, total, 2, world, num_stages=1 + i % 3)
            runs = {
                "cp": (cp_attention, cp_plan),
                "ring": (ring_attention, zigzag_plan(qr, kr, types, total, world)),
                "ulysses": (ulysses_attention, cp_plan),
            }
            for method, (attention, plan) in runs.items():
                local = [dispatch(x, plan) for x in (q, k, v)]
                out, lse = attention(*local, plan, sink=sink)
                out, lse = undispatch(out, plan), undispatch(lse, plan)
                grads = list(torch.autograd.grad(_loss(out, lse, i), leaves))
                if sink is not None:  # each rank holds its own queries' (or heads') share
                    dist.all_reduce(grads[-1])
                names = ("out", "lse", "dq", "dk", "dv", "dsink")[: len(want)]
                for what, got, ref in zip(names, (out, lse, *grads), want, strict=True):
                    _check(f"{world} ranks, {name}, {method}: {what}", got, ref)
        if world == 2:
            _check_device_mesh(total)
            _check_compiled(rank, total)
    finally:
        dist.destroy_process_group()


@pytest.mark.serial
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_matches_one_process(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "store"), 8 * world), nprocs=world)
