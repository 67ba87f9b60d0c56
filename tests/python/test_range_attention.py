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
