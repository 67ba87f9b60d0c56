"""range_attention (magi_compiler.attention): each mask type and mixes of overlapping slices
against the dense reference, lse, empty queries, GQA, head dims, softcap, sinks, dtypes,
gradients (gradcheck and the reference's autograd), the slice builders' exact output, every
argument check's error, the registered operators and their flags, and magi_compile (no
fallback, equal to eager, forward and backward cut at the operators)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from magi_compiler import _C, UserError, inspection, magi_compile
from magi_compiler.attention import (
    AttnMaskType,
    block_causal_slices,
    dense_mask,
    flash_path,
    portable,
    prefix_lm_slices,
    range_attention,
    sliding_window_slices,
    varlen_slices,
)
from magi_compiler.attention._reference import _reference_range_attention
from torch import nn

FULL, CAUSAL, INV, BI = 0, 1, 2, 3
RTOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, 2)


def qkv(tq=24, tk=28, hq=4, hk=2, d=16, dv=None, dtype=torch.float32, grad=False):
    q = torch.randn(tq, hq, d, dtype=dtype, requires_grad=grad)
    k = torch.randn(tk, hk, d, dtype=dtype, requires_grad=grad)
    v = torch.randn(tk, hk, dv or d, dtype=dtype, requires_grad=grad)
    return q, k, v


def check_against_reference(assert_close_rel, q, k, v, q_ranges, k_ranges, mask_types, **kw):
    out, lse = range_attention(q, k, v, q_ranges, k_ranges, mask_types, **kw)
    ref_out, ref_lse = _reference_range_attention(q, k, v, q_ranges, k_ranges, mask_types, **kw)
    assert out.dtype == q.dtype and out.shape == (q.shape[0], q.shape[1], v.shape[2])
    assert lse.dtype == portable.compute_dtype(q.dtype) and lse.shape == q.shape[:2]
    assert_close_rel(out, ref_out.to(q.dtype), RTOL[q.dtype])
    # lse is float32 (float64 for float64 inputs); -inf where a query sees nothing.
    assert_close_rel(lse, ref_lse.to(lse.dtype), 1e-5)
    return out, lse


# --- mask semantics -----------------------------------------------------------------------------


def test_dense_masks_are_magiattentions_pictures():
    """flex_flash_attn_func's docstring: each type for (5 q, 2 k), (2 q, 5 k), (5 q, 5 k)."""
    pictures = {
        (5, 2): {
            CAUSAL: "00 00 00 10 11",
            INV: "11 01 00 00 00",
            BI: "00 00 00 00 00",
        },
        (2, 5): {CAUSAL: "11110 11111", INV: "11111 01111", BI: "11110 01111"},
        (5, 5): {
            CAUSAL: "10000 11000 11100 11110 11111",
            INV: "11111 01111 00111 00011 00001",
            BI: "10000 01000 00100 00010 00001",
        },
    }
    for (sq, sk), by_type in pictures.items():
        for t, rows in by_type.items():
            mask = dense_mask(i32([0, sq]), i32([0, sk]), [t], sq, sk)
            drawn = " ".join("".join(str(int(b)) for b in row) for row in mask.tolist())
            assert drawn == rows, (sq, sk, AttnMaskType(t).name, drawn)
        assert dense_mask(i32([0, sq]), i32([0, sk]), [FULL], sq, sk).all()


@pytest.mark.parametrize("mask_type", [FULL, CAUSAL, INV, BI])
def test_each_mask_type_matches_the_dense_reference(mask_type, assert_close_rel):
    q, k, v = qkv()
    # Taller, wider and square slices, placed anywhere in q and k.
    q_ranges = i32([[0, 10], [10, 13], [13, 24]])
    k_ranges = i32([[2, 6], [6, 20], [17, 28]])
    check_against_reference(assert_close_rel, q, k, v, q_ranges, k_ranges, [mask_type] * 3)


def test_mixed_types_with_overlap_in_q_and_k(assert_close_rel):
    q, k, v = qkv(tq=30, tk=40)
    q_ranges = i32([[0, 12], [6, 20], [18, 30], [0, 30], [25, 26], [10, 10]])
    k_ranges = i32([[0, 20], [10, 32], [25, 40], [36, 40], [0, 40], [0, 5]])
    mask_types = torch.tensor([CAUSAL, BI, INV, FULL, CAUSAL, FULL], dtype=torch.int32)
    check_against_reference(assert_close_rel, q, k, v, q_ranges, k_ranges, mask_types)


def test_a_pair_two_slices_cover_counts_twice(assert_close_rel):
    """The same slice twice: out as once (weights double uniformly), lse + log 2 (as FFA's
    reduction of the two partial results gives)."""
    q, k, v = qkv()
    once = range_attention(q, k, v, i32([0, 24]), i32([0, 28]), [CAUSAL])
    twice = range_attention(q, k, v, i32([[0, 24], [0, 24]]), i32([[0, 28], [0, 28]]), [1, 1])
    assert_close_rel(twice[0], once[0], 1e-6)
    seen = once[1].isfinite()
    assert_close_rel(twice[1][seen], once[1][seen] + math.log(2.0), 1e-6)


def test_slices_sharing_queries_with_disjoint_keys_equal_their_union(assert_close_rel):
    q, k, v = qkv()
    split = range_attention(q, k, v, i32([[0, 24], [0, 24]]), i32([[0, 9], [9, 28]]), [0, 0])
    whole = range_attention(q, k, v, i32([0, 24]), i32([0, 28]), [FULL])
    assert_close_rel(split, whole, 1e-5)


def test_tiles_smaller_than_the_slices_give_the_same_result(monkeypatch, assert_close_rel):
    q, k, v = qkv(tq=40, tk=44)
    q_ranges, k_ranges = i32([[0, 40], [5, 33], [0, 17]]), i32([[0, 44], [3, 41], [20, 44]])
    whole = range_attention(q, k, v, q_ranges, k_ranges, [CAUSAL, BI, INV])
    monkeypatch.setattr(portable, "TILE_Q", 7)
    monkeypatch.setattr(portable, "TILE_K", 5)
    tiled = check_against_reference(
        assert_close_rel, q, k, v, q_ranges, k_ranges, [CAUSAL, BI, INV]
    )
    assert_close_rel(tiled, whole, 1e-5)


def test_queries_without_keys_get_zero_and_minus_infinity(assert_close_rel):
    q, k, v = qkv(tq=10, tk=6)
    # Queries 0..3 are covered by no slice, 4..6 by a CAUSAL slice taller than its keys (its
    # first rows see nothing), 7..9 by an empty key range.
    out, lse = check_against_reference(
        assert_close_rel,
        q,
        k,
        v,
        i32([[4, 7], [7, 10], [9, 9]]),
        i32([[0, 2], [3, 3], [0, 6]]),
        [CAUSAL, FULL, FULL],
    )
    blind = torch.tensor([1, 1, 1, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
    assert torch.equal(out[blind], torch.zeros_like(out[blind]))
    assert torch.equal(lse[blind], torch.full_like(lse[blind], float("-inf")))
    assert lse[~blind].isfinite().all()
    # No slice at all.
    out, lse = range_attention(q, k, v, i32([]), i32([]), [])
    assert not out.any() and (lse == float("-inf")).all()


@pytest.mark.parametrize(("hq", "hk"), [(4, 4), (8, 2), (6, 1)])
def test_grouped_query_heads(hq, hk, assert_close_rel):
    q, k, v = qkv(hq=hq, hk=hk, dv=12)
    check_against_reference(
        assert_close_rel, q, k, v, i32([[0, 12], [8, 24]]), i32([[0, 12], [4, 28]]), [1, 3]
    )


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_head_dims(head_dim, assert_close_rel):
    q, k, v = qkv(tq=12, tk=12, d=head_dim)
    slices = varlen_slices([0, 5, 12], causal=True)
    check_against_reference(assert_close_rel, q, k, v, *slices)


def test_softcap_sink_and_scale(assert_close_rel):
    q, k, v = qkv()
    q_ranges, k_ranges, types = i32([[0, 14], [10, 24]]), i32([[0, 20], [8, 28]]), [1, 0]
    for kw in (
        {"softcap": 1.5},
        {"softmax_scale": 0.9},
        {"sink": torch.randn(4)},  # gpt-oss: one logit per head
        {"sink": torch.randn(3, 4), "softcap": 4.0},  # MagiAttention's "sh": (tokens, heads)
    ):
        check_against_reference(assert_close_rel, q, k, v, q_ranges, k_ranges, types, **kw)
    # A query that sees no key still has the sink in its denominator: out 0, lse = the sinks'.
    sink = torch.randn(3, 4)
    out, lse = range_attention(q, k, v, i32([10, 24]), i32([0, 28]), [FULL], sink=sink)
    assert not out[:10].any()
    assert_close_rel(lse[:10], torch.logsumexp(sink, 0).expand(10, 4), 1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype, assert_close_rel):
    q, k, v = qkv(tq=40, tk=40, d=64, dtype=dtype)
    slices = varlen_slices([0, 15, 40], causal=True)
    check_against_reference(assert_close_rel, q, k, v, *slices, sink=torch.randn(4))


def test_mask_types_as_a_list_of_enum_members_and_deterministic_flag(assert_close_rel):
    q, k, v = qkv()
    q_ranges, k_ranges = i32([[0, 24]]), i32([[0, 28]])
    as_enum = range_attention(
        q, k, v, q_ranges, k_ranges, [AttnMaskType.BI_CAUSAL], deterministic=True
    )
    as_tensor = range_attention(q, k, v, q_ranges, k_ranges, torch.tensor([3], dtype=torch.int32))
    assert_close_rel(as_enum, as_tensor, 0.0)


# --- gradients ----------------------------------------------------------------------------------

GRAD_SLICES = (i32([[0, 4], [2, 7], [7, 8], [0, 8]]), i32([[0, 5], [1, 9], [8, 9], [3, 6]]))


@pytest.mark.parametrize(
    "kw", [{}, {"softcap": 1.5}, {"sink": "per head"}, {"sink": "sh", "softcap": 3.0}]
)
def test_gradcheck(kw):
    """Our backward operator against finite differences, through out and lse."""
    q, k, v = qkv(tq=8, tk=9, hq=2, hk=1, d=4, dv=3, dtype=torch.float64, grad=True)
    inputs = [q, k, v]
    if "sink" in kw:
        shape = (2,) if kw["sink"] == "per head" else (2, 2)
        inputs.append(torch.randn(shape, dtype=torch.float64, requires_grad=True))
    softcap = kw.get("softcap", 0.0)

    def f(q, k, v, sink=None):
        # Rows that see nothing (lse -inf) are left out of the lse the check differentiates.
        out, lse = range_attention(
            q, k, v, *GRAD_SLICES, [CAUSAL, BI, INV, FULL], softcap=softcap, sink=sink
        )
        return out, lse.masked_fill(lse.isinf(), 0.0)

    assert torch.autograd.gradcheck(f, tuple(inputs))


def test_gradients_match_the_dense_reference(assert_close_rel):
    q, k, v = qkv(tq=20, tk=22, hq=6, hk=2, d=8, grad=True)
    sink = torch.randn(2, 6, requires_grad=True)
    q_ranges = i32([[0, 8], [4, 20], [12, 20], [19, 20]])
    k_ranges = i32([[0, 10], [2, 22], [15, 16], [0, 22]])
    types = [CAUSAL, BI, FULL, INV]
    out_grad, lse_grad = torch.randn(20, 6, 8), torch.randn(20, 6)
    grads = []
    for fn in (range_attention, _reference_range_attention):
        out, lse = fn(q, k, v, q_ranges, k_ranges, types, softcap=2.0, sink=sink)
        loss = (out * out_grad).sum() + (lse * lse_grad).sum()
        grads.append(torch.autograd.grad(loss, (q, k, v, sink)))
    for ours, ref in zip(*grads, strict=True):
        assert_close_rel(ours, ref.to(ours.dtype), 1e-5)


# --- slice builders -----------------------------------------------------------------------------


def assert_slices(slices, q_ranges, k_ranges, mask_types):
    assert torch.equal(slices.q_ranges, i32(q_ranges))
    assert torch.equal(slices.k_ranges, i32(k_ranges))
    assert torch.equal(slices.mask_types, torch.tensor(mask_types, dtype=torch.int32))


def test_varlen_slices():
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)  # the empty document gets no slice
    assert_slices(varlen_slices(cu), [[0, 3], [3, 8]], [[0, 3], [3, 8]], [FULL, FULL])
    assert_slices(
        varlen_slices(cu, [0, 4, 6, 12], causal=True), [[0, 3], [3, 8]], [[0, 4], [6, 12]], [1, 1]
    )


def test_sliding_window_slices():
    assert_slices(
        sliding_window_slices([0, 6, 8], window=3),
        [[0, 3], [3, 6], [6, 8]],
        [[0, 3], [1, 6], [6, 8]],
        [CAUSAL, BI, CAUSAL],
    )
    # The mask it draws: causal, at most `window` keys, within each document.
    mask = dense_mask(*sliding_window_slices([0, 9, 16], window=4), 16, 16)
    pos = torch.arange(16)
    doc = (pos >= 9).int()
    q, k = pos[:, None], pos[None, :]
    assert torch.equal(mask, (k <= q) & (q - k < 4) & (doc[:, None] == doc[None, :]))


def test_block_causal_slices():
    assert_slices(
        block_causal_slices([0, 5, 7], block_size=2),
        [[0, 2], [2, 4], [4, 5], [5, 7]],
        [[0, 2], [0, 4], [0, 5], [5, 7]],
        [FULL] * 4,
    )


def test_prefix_lm_slices():
    assert_slices(
        prefix_lm_slices([0, 5, 7, 8], prefix_lens=[2, 3, 0]),
        [[0, 2], [2, 5], [5, 7], [7, 8]],
        [[0, 2], [0, 5], [5, 7], [7, 8]],
        [FULL, CAUSAL, FULL, CAUSAL],
    )
    mask = dense_mask(*prefix_lm_slices([0, 6], 2), 6, 6)
    q, k = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert torch.equal(mask, (k <= q) | (k < 2))


def _layout(slices, tokens_q, tokens_k):
    q, k, t = (x.tolist() for x in slices)
    return flash_path.varlen_layout(
        [(tuple(a), tuple(b), c) for a, b, c in zip(q, k, t, strict=True)], tokens_q, tokens_k
    )


def test_packed_documents_are_recognised_for_the_flash_varlen_kernels():
    """Slices that tile both sides with documents of one type, FULL or CAUSAL, in any order,
    give flash's cumulative offsets and longest documents; a dense mask is one document."""
    layout = _layout(varlen_slices([0, 3, 3, 8], [0, 4, 4, 12], causal=True), 8, 12)
    assert layout == flash_path.Varlen([0, 3, 8], [0, 4, 12], 5, 8, True)
    # Keys 4..6 belong to a document without queries: no slice reads them, flash would.
    assert _layout(varlen_slices([0, 3, 3, 8], [0, 4, 6, 12], causal=True), 8, 12) is None
    assert _layout(varlen_slices([0, 100, 160]), 160, 160) == flash_path.Varlen(
        [0, 100, 160], [0, 100, 160], 100, 100, False
    )
    shuffled = [((5, 9), (5, 9), FULL), ((0, 5), (0, 5), FULL)]
    assert flash_path.varlen_layout(shuffled, 9, 9) == flash_path.Varlen(
        [0, 5, 9], [0, 5, 9], 5, 5, False
    )
    assert flash_path.varlen_layout([((0, 7), (0, 7), CAUSAL)], 7, 7).causal


def _flash_mask(layout, n: int) -> torch.Tensor:
    """The mask flash draws for a layout of n queries and keys: documents, bottom-right causal,
    the window."""
    doc = torch.bucketize(torch.arange(n), torch.tensor(layout.cu_q[1:]), right=True)
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = doc[:, None] == doc[None, :]
    if layout.causal:
        mask &= k <= q
    if layout.window_left is not None:
        mask &= q - k <= layout.window_left
    return mask


def test_sliding_windows_are_recognised_for_the_flash_window():
    """sliding_window_slices' CAUSAL heads and BI_CAUSAL bands are causal documents under one
    window of w keys: flash's window_size_left is w - 1; documents shorter than the window have
    no band; a mask whose documents are all shorter is plain causal. Each layout's mask is the
    slices' mask."""
    for cu, window, want in (
        ([0, 9, 16], 4, flash_path.Varlen([0, 9, 16], [0, 9, 16], 9, 9, True, 3)),
        ([0, 3, 12, 13], 4, flash_path.Varlen([0, 3, 12, 13], [0, 3, 12, 13], 9, 9, True, 3)),
        ([0, 3, 7], 4, flash_path.Varlen([0, 3, 7], [0, 3, 7], 4, 4, True)),
        ([0, 20], 1, flash_path.Varlen([0, 20], [0, 20], 20, 20, True, 0)),
    ):
        slices = sliding_window_slices(cu, window)
        layout = _layout(slices, cu[-1], cu[-1])
        assert layout == want, (cu, window)
        assert torch.equal(_flash_mask(layout, cu[-1]), dense_mask(*slices, cu[-1], cu[-1]))


@pytest.mark.parametrize(
    "slices, why",
    [
        (
            [
                ((0, 4), (0, 4), CAUSAL),
                ((4, 9), (1, 9), BI),
                ((9, 12), (9, 12), CAUSAL),
                ((12, 16), (10, 16), BI),
            ],
            "two windows",
        ),  # fmt: skip
        (
            [((0, 4), (0, 4), CAUSAL), ((4, 9), (1, 9), BI), ((9, 16), (9, 16), CAUSAL)],
            "a document without a band longer than the window",
        ),  # fmt: skip
        ([((0, 4), (0, 4), CAUSAL), ((4, 16), (2, 16), BI)], "a band wider than its head"),
        ([((0, 4), (0, 4), FULL), ((4, 16), (1, 16), BI)], "a full head"),
    ],
)
def test_other_windows_stay_on_the_portable_path(slices, why):
    assert flash_path.varlen_layout(slices, 16, 16) is None, why


@pytest.mark.parametrize(
    "slices, tokens, why",
    [
        ([((0, 4), (0, 4), FULL), ((4, 8), (4, 8), CAUSAL)], (8, 8), "mixed types"),
        ([((0, 8), (0, 8), BI)], (8, 8), "a band"),
        ([((0, 8), (0, 8), INV)], (8, 8), "top-left causal"),
        ([((0, 4), (0, 4), FULL), ((5, 8), (4, 8), FULL)], (8, 8), "a gap in q"),
        ([((0, 4), (0, 4), FULL), ((4, 8), (3, 8), FULL)], (8, 8), "overlapping keys"),
        ([((0, 4), (0, 4), FULL), ((0, 4), (4, 8), FULL)], (4, 8), "queries in two slices"),
        ([((0, 4), (0, 4), FULL)], (8, 4), "queries no slice covers"),
        ([((0, 4), (0, 4), FULL), ((4, 4), (4, 8), FULL)], (4, 8), "an empty slice"),
        ([((0, 6), (0, 4), CAUSAL)], (6, 4), "causal with more queries than keys"),
        ([], (4, 4), "no slices"),
    ],
)
def test_other_slices_stay_on_the_portable_path(slices, tokens, why):
    assert flash_path.varlen_layout(slices, *tokens) is None, why


def test_the_flash_path_is_cuda_only():
    """Packed bf16 documents on the CPU stay on the portable path (the other conditions, dtype,
    head dim, softcap, sink, deterministic, are checked on CUDA tensors in
    tests/gpu/test_range_attention_cuda.py)."""
    q, k, v = qkv(8, 8, 4, 2, 16, dtype=torch.bfloat16)
    assert flash_path.plan(q, k, v, [((0, 8), (0, 8), CAUSAL)], None, 0.0, False) is None


def test_builders_put_their_tensors_on_the_device_asked():
    assert varlen_slices(torch.tensor([0, 4]), device="meta").q_ranges.device.type == "meta"
    assert block_causal_slices([0, 4], 2, device="meta").mask_types.device.type == "meta"
    assert prefix_lm_slices(torch.tensor([0, 4]), 1).k_ranges.device.type == "cpu"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: varlen_slices([0, 5, 3]), r"cu_seqlens_q must be non-negative and non-decreas"),
        (lambda: varlen_slices(torch.ones(2, 2)), r"cu_seqlens_q must be a 1-D integer tensor"),
        (
            lambda: varlen_slices([0, 4], [0, 2, 4]),
            r"cu_seqlens_q has 2 entries and cu_seqlens_k 3",
        ),
        (lambda: sliding_window_slices([0, 4], 0), r"window must be an int >= 1; got 0"),
        (lambda: block_causal_slices([0, 4], -2), r"block_size must be an int >= 1; got -2"),
        (lambda: prefix_lm_slices([0, 4, 8], [1]), r"prefix_lens has 1 entries for 2 documents"),
        (lambda: prefix_lm_slices([0, 4], -1), r"prefix_lens holds -1; prefix lengths must be"),
    ],
)
def test_builder_errors(call, message):
    with pytest.raises(UserError, match=message):
        call()


# --- argument checks ----------------------------------------------------------------------------


def _call(**changes):
    q, k, v = qkv(tq=8, tk=8)
    args = {
        "q": q,
        "k": k,
        "v": v,
        "q_ranges": i32([[0, 8]]),
        "k_ranges": i32([[0, 8]]),
        "mask_types": [CAUSAL],
    }
    args.update(changes)
    return lambda: range_attention(**args)


BAD_ARGUMENTS = [
    ({"q": torch.randn(8, 16)}, r"q must be a \(tokens, heads, head_dim\) tensor; got \(8, 16\)"),
    ({"q": torch.ones(8, 4, 16, dtype=torch.int32)}, r"q has dtype torch.int32; use float16"),
    ({"k": torch.randn(8, 2, 16).half()}, r"k has dtype torch.float16 but q has torch.float32"),
    ({"v": torch.randn(7, 2, 16)}, r"k \(8, 2, 16\) and v \(7, 2, 16\) must have the same tok"),
    ({"k": torch.randn(8, 2, 8)}, r"q's head_dim is 16 but k's is 8"),
    (
        {"k": torch.randn(8, 3, 16), "v": torch.randn(8, 3, 16)},
        r"k and v have 3 heads, which does not divide q's 4 heads",
    ),
    ({"q_ranges": i32([[0, 8]]).long()}, r"q_ranges has dtype torch.int64; use int32"),
    ({"k_ranges": torch.zeros(1, 3, dtype=torch.int32)}, r"k_ranges has shape \(1, 3\); it must"),
    ({"q_ranges": [[0, 8]]}, r"q_ranges must be an int32 tensor of shape \(n, 2\); got list"),
    ({"q_ranges": i32([[0, 8]]).to("meta")}, r"q_ranges is on meta but q is on cpu"),
    ({"mask_types": [1, 1]}, r"q_ranges has 1 slices, k_ranges 1 and mask_types 2; give one"),
    ({"mask_types": ["causal"]}, r"mask_types must be an int32 tensor or a list of ints"),
    ({"mask_types": [4]}, r"mask_types\[0\] is 4; use 0 FULL, 1 CAUSAL, 2 INV_CAUSAL or 3"),
    ({"q_ranges": i32([[5, 3]])}, r"q_ranges\[0\] is \[5, 3\): start > end"),
    ({"q_ranges": i32([[0, 9]])}, r"q_ranges\[0\] is \[0, 9\), outside the 8 tokens of q"),
    ({"k_ranges": i32([[-1, 4]])}, r"k_ranges\[0\] is \[-1, 4\), outside the 8 tokens of k"),
    ({"sink": torch.randn(3)}, r"sink has shape \(3,\); use \(heads_q,\) = \(4,\) or"),
    ({"sink": torch.ones(4, dtype=torch.int64)}, r"sink must be a floating-point tensor"),
    ({"softcap": -1.0}, r"softcap must be a finite float >= 0 \(0 turns it off\); got -1.0"),
]


@pytest.mark.parametrize(("changes", "message"), BAD_ARGUMENTS)
def test_argument_errors(changes, message):
    with pytest.raises(UserError, match="range_attention: " + message):
        _call(**changes)()


# --- the operators and magi_compile -------------------------------------------------------------


def test_operators_are_registered_boundaries_and_compute_sensitive():
    for name in ("magi::range_attention", "magi::range_attention_backward"):
        flags = _C.op_flags(name)
        assert flags == {"compute_sensitive": True, "subgraph_boundary": True}, (name, flags)


def test_opcheck_fake_implementations_and_autograd_registration():
    """torch.library.opcheck of both operators (schema, fake implementation against the real
    outputs, autograd registration, AOT dispatch), with q a transposed view: outputs are
    contiguous whatever the inputs' strides."""
    q = torch.randn(4, 10, 16).transpose(0, 1).requires_grad_()
    _, k, v = qkv(tq=10, tk=12, grad=True)
    sink = torch.randn(4, requires_grad=True)
    ranges = (i32([[0, 6], [4, 10]]), i32([[0, 12], [3, 9]]))
    types = torch.tensor([CAUSAL, BI], dtype=torch.int32)
    forward = (q, k, v, *ranges, types, sink, 0.25, 2.0, False)
    torch.library.opcheck(torch.ops.magi.range_attention.default, forward)
    # The backward operator has no backward of its own (no double backward).
    q, k, v, sink = (x.detach() for x in (q, k, v, sink))
    out, lse = torch.ops.magi.range_attention(q, k, v, *ranges, types, sink, 0.25, 2.0, False)
    dout, dlse = torch.randn(4, 10, 16).transpose(0, 1), torch.randn(10, 4)
    backward = (dout, dlse, q, k, v, out, lse, *ranges, types, sink, 0.25, 2.0, False)
    torch.library.opcheck(torch.ops.magi.range_attention_backward.default, backward)


class PackedAttention(nn.Module):
    def __init__(self, hidden=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        kv = kv_heads * self.head_dim
        self.qkv = nn.Linear(hidden, hidden + 2 * kv)
        self.o = nn.Linear(hidden, hidden)
        self.sink = nn.Parameter(torch.randn(heads))

    def forward(self, x, q_ranges, k_ranges, mask_types):
        t, kv = x.shape[0], self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([x.shape[1], kv, kv], dim=-1)
        out, lse = range_attention(
            q.view(t, self.heads, self.head_dim),
            k.view(t, self.kv_heads, self.head_dim),
            v.view(t, self.kv_heads, self.head_dim),
            q_ranges,
            k_ranges,
            mask_types,
            sink=self.sink,
            softcap=5.0,
        )
        return self.o(out.reshape(t, -1)) + 0.1 * lse.sum(-1, keepdim=True)


def test_under_magi_compile_no_fallback_and_equal_to_eager(counters, assert_close_rel):
    eager = PackedAttention()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"strict": True})
    for cu in ([0, 5, 12], [0, 3, 9, 20]):  # new token and slice counts: no re-capture
        x, grad = torch.randn(cu[-1], 32), torch.randn(cu[-1], 32)
        slices = prefix_lm_slices(cu, 2)
        outputs, grads = [], []
        for model in (eager, compiled):
            model.zero_grad()
            y = model(x, *slices)
            y.backward(grad)
            outputs.append(y)
            grads.append([p.grad for p in model.parameters()])
        assert_close_rel(outputs[1], outputs[0], 1e-5)
        assert_close_rel(grads[1], grads[0], 1e-5)
    assert counters().captures == 1
    forward, backward = inspection.last_compiled("forward"), inspection.last_compiled("backward")
    assert forward.boundary_ops == ("magi::range_attention",)
    assert backward.boundary_ops == ("magi::range_attention_backward",)
    assert forward.num_pieces == 2


def test_under_magi_compile_with_a_list_of_mask_types(counters, assert_close_rel):
    @magi_compile(config_patch={"strict": True})
    def attend(q, k, v, q_ranges, k_ranges):
        return range_attention(q, k, v, q_ranges, k_ranges, [CAUSAL, FULL])[0] * 2.0

    q, k, v = qkv()
    q_ranges, k_ranges = i32([[0, 10], [10, 24]]), i32([[0, 10], [0, 28]])
    with torch.no_grad():
        expected = range_attention(q, k, v, q_ranges, k_ranges, [CAUSAL, FULL])[0] * 2.0
        assert_close_rel(attend(q, k, v, q_ranges, k_ranges), expected, 1e-6)
    assert inspection.last_compiled().boundary_ops == ("magi::range_attention",)


# --- flash layers, checked on the CPU with a dense stand-in for flash's varlen kernels -----------


def _standin_mask(n_q, n_k, causal, left, right):
    """The pairs flash's varlen kernels see in one sequence: diagonal aligned to the bottom
    right, ``causal`` or a window of ``left``/``right`` keys (-1: no bound)."""
    i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    diagonal = i + n_k - n_q
    mask = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal or right >= 0:
        mask &= j <= diagonal + (0 if causal else right)
    if left >= 0:
        mask &= j >= diagonal - left
    return mask


def _standin_sequences(q, k, cu_q, cu_k, causal, left, right, scale):
    """Per sequence: its rows, keys and float64 scores (heads, rows, keys), masked."""
    hq, hk = q.shape[1], k.shape[1]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for a, b, c, e in zip(cq, cq[1:], ck, ck[1:], strict=False):
        qs = q[a:b].double().transpose(0, 1)
        ks = k[c:e].double().repeat_interleave(hq // hk, dim=1).transpose(0, 1)
        scores = (qs @ ks.transpose(1, 2) * scale).masked_fill(
            ~_standin_mask(b - a, e - c, causal, left, right), float("-inf")
        )
        yield (a, b, c, e), scores


def _standin_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, left, right, scale):
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float64)
    g = q.shape[1] // k.shape[1]
    for (a, b, c, e), scores in _standin_sequences(q, k, cu_q, cu_k, causal, left, right, scale):
        assert bool(torch.isfinite(scores).any(-1).all()), "a flash row without a key"
        assert b - a <= max_q and e - c <= max_k
        row_lse = scores.logsumexp(-1)
        vs = v[c:e].double().repeat_interleave(g, dim=1).transpose(0, 1)
        out[a:b] = (torch.exp(scores - row_lse[..., None]) @ vs).transpose(0, 1)
        lse[:, a:b] = row_lse
    return out.to(q.dtype), lse.float()


def _standin_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, left, right, sc):
    """FlashAttention's backward from the statistics it is handed (out and lse)."""
    hq, hk = q.shape[1], k.shape[1]
    g = hq // hk
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v))
    for (a, b, c, e), scores in _standin_sequences(q, k, cu_q, cu_k, causal, left, right, sc):
        p = torch.exp(scores - lse[:, a:b].double()[..., None])  # (hq, rows, keys)
        do = dout[a:b].double().transpose(0, 1)
        vs = v[c:e].double().repeat_interleave(g, dim=1).transpose(0, 1)
        ks = k[c:e].double().repeat_interleave(g, dim=1).transpose(0, 1)
        delta = (do * out[a:b].double().transpose(0, 1)).sum(-1, keepdim=True)
        ds = p * (do @ vs.transpose(1, 2) - delta)
        dq[a:b] = (ds @ ks * sc).transpose(0, 1)
        qs = q[a:b].double().transpose(0, 1)
        dk[c:e] = (ds.transpose(1, 2) @ qs * sc).transpose(0, 1).reshape(e - c, hk, g, -1).sum(2)
        dv[c:e] = (p.transpose(1, 2) @ do).transpose(0, 1).reshape(e - c, hk, g, -1).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _slices_of(built) -> list:
    q, k, t = (x.tolist() for x in built)
    return [(tuple(a), tuple(b), c) for a, b, c in zip(q, k, t, strict=True)]


LAYERED = {
    "block causal": (_slices_of(block_causal_slices([0, 9, 24, 30], 4)), 30, 30),
    "prefix lm": (_slices_of(prefix_lm_slices([0, 11, 30], [4, 7])), 30, 30),
    "all four types, overlapping": (
        [
            ((0, 10), (0, 12), FULL),
            ((4, 14), (2, 20), CAUSAL),
            ((8, 20), (10, 26), INV),
            ((6, 18), (8, 28), BI),
            ((2, 8), (0, 6), FULL),
        ],
        24,
        28,
    ),  # fmt: skip
    "more queries than keys, gaps, an empty slice": (
        [
            ((0, 9), (3, 7), CAUSAL),
            ((12, 20), (0, 5), INV),
            ((14, 22), (20, 25), BI),
            ((22, 24), (1, 1), FULL),
        ],
        24,
        28,
    ),  # fmt: skip
    "documents of mixed types": (
        [((0, 6), (0, 6), FULL), ((6, 15), (6, 15), CAUSAL), ((15, 24), (15, 28), CAUSAL)],
        24,
        28,
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(LAYERED))
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_flash_layers_compute_every_mask_type(name, heads, monkeypatch, assert_close_rel):
    """Slices that are not one varlen call run as layers of flash calls merged by log-sum-exp;
    with flash's kernels replaced by a dense stand-in of their semantics (bottom-right diagonal,
    windows, the backward from the handed out and lse), the forward and the backward equal the
    dense reference's, in float32; a query that no slice covers gets zeros and -inf."""
    monkeypatch.setattr(flash_path, "flash_forward", _standin_forward)
    monkeypatch.setattr(flash_path, "flash_backward", _standin_backward)
    slices, tq, tk = LAYERED[name]
    calls = flash_path.layers(slices, tq, tk)
    assert calls is not None and len(calls) <= flash_path.MAX_LAYERS, name
    q, k, v = qkv(tq, tk, *heads, 16)
    ranges = (i32([s[0] for s in slices]), i32([s[1] for s in slices]),
              torch.tensor([s[2] for s in slices], dtype=torch.int32))  # fmt: skip
    qr, kr, vr = (x.double().requires_grad_() for x in (q, k, v))
    ref_out, ref_lse = _reference_range_attention(qr, kr, vr, *ranges, softmax_scale=0.3)
    out, lse = flash_path.forward(q, k, v, calls, 0.3)
    assert_close_rel(out, ref_out.float(), 1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), name
    assert_close_rel(lse, ref_lse.float(), 1e-5)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(ref_out, (qr, kr, vr), dout.double())
    for got, want in zip(flash_path.backward(dout, q, k, v, out, lse, calls, 0.3), grads,
                         strict=True):  # fmt: skip
        assert_close_rel(got, want.float(), 1e-4)


def test_flash_layers_gather_only_what_they_must():
    """Packed documents are one call over the tensors as they are; block-causal masks one call
    whose keys are gathered per block; prefix-LM masks two calls (full prefixes, then the
    causal rest over gathered queries); slices needing more than MAX_LAYERS layers, none."""
    (docs,) = flash_path.layers(_slices_of(varlen_slices([0, 5, 12], causal=True)), 12, 12)
    assert docs.q_rows is None and docs.k_rows is None and docs.causal
    (blocks,) = flash_path.layers(LAYERED["block causal"][0], 30, 30)
    assert blocks.q_rows is None and not blocks.causal
    assert blocks.k_rows == ((0, 4), (0, 8), (0, 9), (9, 13), (9, 17), (9, 21), (9, 24),
                             (24, 28), (24, 30))  # fmt: skip
    assert blocks.cu_q == (0, 4, 8, 9, 13, 17, 21, 24, 28, 30) and blocks.max_k == 15
    full, causal = flash_path.layers(LAYERED["prefix lm"][0], 30, 30)
    assert (full.causal, full.q_rows, full.k_rows) == (
        False,
        ((0, 4), (11, 18)),
        ((0, 4), (11, 18)),
    )
    # Its keys, each whole document, tile the tokens: read as they are.
    assert (causal.causal, causal.q_rows, causal.k_rows) == (True, ((4, 11), (18, 30)), None)
    stacked = [((0, 8), (i, i + 8), FULL) for i in range(flash_path.MAX_LAYERS + 1)]
    assert flash_path.layers(stacked, 8, 30) is None
    assert len(flash_path.layers(stacked[:-1], 8, 30)) == flash_path.MAX_LAYERS
    assert flash_path.layers([((0, 4), (2, 2), FULL)], 4, 4) is None  # nothing to compute


def test_ranges_are_read_once_until_they_change(monkeypatch, assert_close_rel):
    """Calls with the same range tensors read them to the host (a synchronisation on CUDA) once;
    a range changed in place is read again, checked again and used; so are new tensors with the
    same values, inference tensors (no version counter) and any tensors while a CUDA graph is
    captured, every call."""
    reads = []
    original = torch.Tensor.tolist

    def counting(self):
        reads.append(tuple(self.shape))
        return original(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    q, k, v = qkv(16, 16, 2, 2, 8)
    q_ranges, k_ranges = i32([[0, 8], [8, 16]]), i32([[0, 8], [0, 16]])
    types = torch.tensor([FULL, CAUSAL], dtype=torch.int32)
    first, _ = range_attention(q, k, v, q_ranges, k_ranges, types)
    assert len(reads) == 3
    again, _ = range_attention(q, k, v, q_ranges, k_ranges, types)
    assert len(reads) == 3 and torch.equal(first, again)
    k_ranges[1, 0] = 8  # the second slice now sees keys 8..15 only
    changed, _ = range_attention(q, k, v, q_ranges, k_ranges, types)
    assert len(reads) == 6
    want, _ = _reference_range_attention(q, k, v, q_ranges, k_ranges, types)
    assert_close_rel(changed, want.float(), 1e-5)
    assert not torch.allclose(changed[8:], first[8:])
    k_ranges[1, 1] = 17
    reads.clear()
    with pytest.raises(UserError, match=r"k_ranges\[1\] is \[8, 17\), outside the 16 tokens"):
        range_attention(q, k, v, q_ranges, k_ranges, types)
    range_attention(q, k, v, q_ranges.clone(), k_ranges.clone().clamp_(max=16), types)
    assert len(reads) == 6
    with torch.inference_mode():
        inference = (q_ranges.clone(), k_ranges.clone().clamp_(max=16), types.clone())
        for _ in range(2):
            range_attention(q, k, v, *inference)
    assert len(reads) == 12
    # While a CUDA graph is captured the ranges are read (which fails the capture on CUDA):
    # a replay would not read them again.
    from magi_compiler.attention import op

    fixed = (q_ranges.clone(), k_ranges.clone().clamp_(max=16), types)
    range_attention(q, k, v, *fixed)
    monkeypatch.setattr(op, "_capturing", lambda x: True)
    range_attention(q, k, v, *fixed)
    assert len(reads) == 18


# --- one dense document on cuDNN: eligibility and the decision (the kernels: tests/gpu) --------


def test_cudnn_is_considered_for_one_dense_document_only(monkeypatch):
    """One FULL document, or one CAUSAL document with as many queries as keys, with as many
    key/value heads as query heads and a head dim up to 128; not packed documents, windows,
    grouped heads, bottom-right causal over more keys, head dim 256, or with cuDNN SDPA off."""
    from magi_compiler.attention import cudnn_path

    def dense(slices, tq, tk, hq=4, hk=4, d=64):
        q, k, v = qkv(tq, tk, hq, hk, d)
        return cudnn_path.dense_causal(q, k, v, flash_path.layers(slices, tq, tk))

    assert dense([((0, 16), (0, 20), FULL)], 16, 20) is False
    assert dense([((0, 16), (0, 16), CAUSAL)], 16, 16) is True
    assert dense([((0, 16), (0, 20), CAUSAL)], 16, 20) is None
    assert dense(_slices_of(varlen_slices([0, 8, 16])), 16, 16) is None
    assert dense(_slices_of(sliding_window_slices([0, 16], 4)), 16, 16) is None
    assert dense([((0, 16), (0, 16), FULL)], 16, 16, hk=2) is None
    assert dense([((0, 16), (0, 16), FULL)], 16, 16, d=256) is None
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: False)
    assert dense([((0, 16), (0, 16), FULL)], 16, 16) is None


def test_cudnn_is_chosen_once_per_shape_when_it_runs_agrees_and_is_faster(monkeypatch):
    """The first call of a shape and direction runs both kernels: cuDNN is taken when it ran,
    agreed with flash and was faster, and the verdict is kept (no kernel runs to decide again);
    a failure, a disagreement or a slower cuDNN keeps flash, with the reason listed; inside a
    CUDA-graph capture nothing is decided."""
    from magi_compiler.attention import cudnn_path

    cudnn_path.clear()
    ms = {"cudnn": 1.0, "flash": 2.0}
    runs = []

    def runner(name, value):
        def run():
            runs.append(name)
            if isinstance(value, Exception):
                raise value
            return (value,)

        run.kind = name
        return run

    monkeypatch.setattr(cudnn_path, "_median_ms", lambda fn: ms[fn.kind])
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    good, flash = torch.ones(4, 2), torch.ones(4, 2)

    def decide(q_tokens, cudnn_result, direction="forward"):
        q = torch.empty(q_tokens, 4, 64)
        return cudnn_path.use_cudnn(direction, q, q, True, runner("cudnn", cudnn_result),
                                    runner("flash", flash))  # fmt: skip

    assert decide(16, good) is True
    runs.clear()
    assert decide(16, good) is True and runs == []
    off = torch.full((4, 2), 1.5)
    assert decide(32, off) is False
    assert decide(48, RuntimeError("cuDNN Frontend error: no engine\nmore")) is False
    ms["cudnn"] = 3.0
    assert decide(64, good) is False
    capturing[0] = True
    runs.clear()
    assert decide(80, good) is False and runs == []
    log = cudnn_path.choices()
    assert [(e["q"][0], e["chosen"]) for e in log] == [
        (16, "cudnn"), (32, "flash"), (48, "flash"), (64, "flash")
    ]  # fmt: skip
    assert log[0]["ms"] == {"cudnn": 1.0, "flash": 2.0}
    assert log[1]["why"] == "result 0 differs from flash's by 0.5 (tolerance 0.02)"
    assert log[2]["why"] == "cuDNN failed: RuntimeError: cuDNN Frontend error: no engine"
    assert log[3]["ms"] == {"cudnn": 3.0, "flash": 2.0}
    cudnn_path.clear()
    assert cudnn_path.choices() == []


@pytest.mark.parametrize("mask", ["causal", "prefix_lm", "block_causal"])
def test_packed_training_example_matches_the_dense_mask_reference(mask, capsys):
    """examples/packed_training.py on the CPU: a training step of a Llama-style stack on packed
    documents, range_attention under magi_compile (cut at each call), loss and every gradient
    equal to the same stack's with SDPA over the dense boolean mask."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "packed_training.py"
    spec = importlib.util.spec_from_file_location("packed_training", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    argv = ["--device", "cpu", "--tokens", "128", "--hidden", "64", "--mask", mask]
    assert example.main(argv) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert f"mask {mask}, 2 layers under magi_compile (2 range_attention boundaries)" in out, out
    assert out.rstrip().endswith(": ok"), out
