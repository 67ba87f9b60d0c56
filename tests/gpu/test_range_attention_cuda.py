"""range_attention on CUDA tensors: each mask type, overlapping mixes, GQA, head dims, softcap
and sinks against the dense float64 reference (the portable path), packed documents on the
flash varlen kernels forward and backward (in one call or in layers), the backward against the reference's autograd, and a
packed-attention module under magi_compile. The checks mirror tests/python/test_range_attention.py."""

from __future__ import annotations

import copy

import pytest
import torch
from magi_compiler import inspection, magi_compile
from magi_compiler.attention import (
    block_causal_slices,
    cudnn_path,
    portable,
    prefix_lm_slices,
    range_attention,
    sliding_window_slices,
    varlen_slices,
)
from magi_compiler.attention._reference import _reference_range_attention
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = "cuda"
RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
FULL, CAUSAL, INV, BI = 0, 1, 2, 3


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def i32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=DEVICE).reshape(-1, 2)


def qkv(tq, tk, hq, hk, d, dtype, grad=False):
    shapes = ((tq, hq, d), (tk, hk, d), (tk, hk, d))
    return [torch.randn(s, dtype=dtype, device=DEVICE, requires_grad=grad) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("mask_type", [FULL, CAUSAL, INV, BI])
def test_each_mask_type_against_the_reference(mask_type, head_dim, dtype, assert_close_rel):
    q, k, v = qkv(300, 340, 8, 2, head_dim, dtype)
    q_ranges = i32([[0, 100], [90, 200], [200, 300], [0, 300]])
    k_ranges = i32([[0, 150], [120, 220], [220, 340], [330, 340]])
    types = [mask_type, BI, mask_type, FULL]
    kw = {"softcap": 8.0, "sink": torch.randn(8, device=DEVICE)} if mask_type == BI else {}
    out, lse = range_attention(q, k, v, q_ranges, k_ranges, types, **kw)
    ref_out, ref_lse = _reference_range_attention(q, k, v, q_ranges, k_ranges, types, **kw)
    assert out.device.type == "cuda" and lse.dtype == torch.float32
    assert_close_rel(out, ref_out.to(dtype), RTOL[dtype])
    assert_close_rel(lse, ref_lse.float(), 1e-5)


def test_backward_against_the_reference(assert_close_rel):
    q, k, v = qkv(200, 220, 8, 2, 64, torch.float32, grad=True)
    sink = torch.randn(8, device=DEVICE, requires_grad=True)
    slices = varlen_slices([0, 70, 200], [0, 90, 220], causal=True, device=DEVICE)
    out_grad = torch.randn(200, 8, 64, device=DEVICE)
    grads = []
    for fn in (range_attention, _reference_range_attention):
        out, lse = fn(q, k, v, *slices, sink=sink, softcap=10.0)
        loss = (out * out_grad).sum() + lse.sum()
        grads.append(torch.autograd.grad(loss, (q, k, v, sink)))
    for ours, ref in zip(*grads, strict=True):
        assert_close_rel(ours, ref.to(ours.dtype), 1e-5)


class PackedAttention(nn.Module):
    def __init__(self, hidden=256, heads=8, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.qkv = nn.Linear(hidden, hidden + 2 * kv_heads * self.head_dim)
        self.o = nn.Linear(hidden, hidden)

    def forward(self, x, q_ranges, k_ranges, mask_types):
        t, kv = x.shape[0], self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([x.shape[1], kv, kv], dim=-1)
        out, _ = range_attention(
            q.view(t, self.heads, self.head_dim),
            k.view(t, self.kv_heads, self.head_dim),
            v.view(t, self.kv_heads, self.head_dim),
            q_ranges,
            k_ranges,
            mask_types,
        )
        return self.o(out.reshape(t, -1))


def test_under_magi_compile_trains_like_eager(counters, assert_close_rel):
    eager = PackedAttention().to(DEVICE)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"strict": True})
    for cu in ([0, 100, 256], [0, 40, 200, 384]):
        x = torch.randn(cu[-1], 256, device=DEVICE)
        grad = torch.randn_like(x)
        slices = prefix_lm_slices(cu, 16, device=DEVICE)
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
    assert inspection.last_compiled("forward").boundary_ops == ("magi::range_attention",)


@pytest.fixture
def portable_calls(monkeypatch):
    """How many times the portable forward and backward ran."""
    calls = {"forward": 0, "backward": 0}
    for name in calls:
        original = getattr(portable, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(portable, name, spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_documents_run_on_flash_forward_and_backward(
    causal, head_dim, dtype, portable_calls, assert_close_rel
):
    """Documents of 300, 220 and 480 tokens (keys: 320, 220, 500), GQA 8/2: out, lse and
    the gradients of q, k and v match the float64 reference within half-precision rounding,
    and the portable path never runs."""
    cu_q, cu_k = [0, 300, 520, 1000], [0, 320, 540, 1040]
    q, k, v = qkv(1000, 1040, 8, 2, head_dim, dtype, grad=True)
    slices = varlen_slices(cu_q, cu_k, causal=causal, device=DEVICE)
    out_grad = torch.randn(1000, 8, head_dim, device=DEVICE, dtype=dtype)
    results = []
    for fn in (range_attention, _reference_range_attention):
        out, lse = fn(q, k, v, *slices)
        grads = torch.autograd.grad((out * out_grad).sum(), (q, k, v))
        results.append((out, lse, *grads))
    assert portable_calls == {"forward": 0, "backward": 0}
    ours, ref = results
    assert_close_rel(ours[0], ref[0].to(dtype), RTOL[dtype])
    assert_close_rel(ours[1], ref[1].float(), 1e-3)
    for got, want in zip(ours[2:], ref[2:], strict=True):
        assert_close_rel(got, want.to(dtype), 2 * RTOL[dtype])


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_one_dense_document_decides_between_cudnn_and_flash(
    causal, head_dim, portable_calls, assert_close_rel
):
    """One document of 2,048 tokens, 8 heads, bf16: the first forward and the first backward
    each run cuDNN and flash and keep the faster (cuDNN must have run and agreed: the decision
    lists both timings); out, lse and the gradients equal the float64 reference's."""
    cudnn_path.clear()
    q, k, v = qkv(2048, 2048, 8, 8, head_dim, torch.bfloat16, grad=True)
    slices = varlen_slices([0, 2048], causal=causal, device=DEVICE)
    out_grad = torch.randn(2048, 8, head_dim, device=DEVICE, dtype=torch.bfloat16)
    results = []
    for fn in (range_attention, _reference_range_attention):
        out, lse = fn(q, k, v, *slices)
        results.append((out, lse, *torch.autograd.grad((out * out_grad).sum(), (q, k, v))))
    assert portable_calls == {"forward": 0, "backward": 0}
    log = cudnn_path.choices()
    assert [e["direction"] for e in log] == ["forward", "backward"], log
    assert all(set(e.get("ms", {})) == {"cudnn", "flash"} for e in log), log
    ours, ref = results
    assert_close_rel(ours[0], ref[0].to(torch.bfloat16), RTOL[torch.bfloat16])
    assert_close_rel(ours[1], ref[1].float(), 1e-3)
    for got, want in zip(ours[2:], ref[2:], strict=True):
        assert_close_rel(got, want.to(torch.bfloat16), 2 * RTOL[torch.bfloat16])


def _mixed_slices():
    """Every mask type, overlapping in queries and keys, a CAUSAL slice with more queries
    than keys, queries no slice covers (1000..1023)."""
    q = [[0, 400], [300, 700], [500, 900], [100, 350], [700, 1000]]
    k = [[0, 500], [200, 650], [600, 1024], [0, 200], [800, 900]]
    return i32(q), i32(k), torch.tensor([FULL, CAUSAL, INV, BI, CAUSAL], device=DEVICE)


LAYERED = {
    "sliding window": lambda: sliding_window_slices([0, 600, 1024], 128, device=DEVICE),
    "block causal": lambda: block_causal_slices([0, 600, 1024], 128, device=DEVICE),
    "prefix lm": lambda: prefix_lm_slices([0, 600, 1024], [150, 100], device=DEVICE),
    "all four types": _mixed_slices,
}


@pytest.mark.parametrize("mask", list(LAYERED))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_range_masks_run_on_flash_forward_and_backward(
    mask, head_dim, portable_calls, assert_close_rel
):
    """Sliding windows (one flash call with its window), block-causal masks (keys gathered per
    block), prefix-LM masks (two calls merged) and a mix of every type (one call per flash mask
    and layer of non-overlapping queries) over 1,024 tokens, GQA 8/2, in bf16: out, lse and the
    gradients equal the float64 reference's, and the portable path never runs."""
    q, k, v = qkv(1024, 1024, 8, 2, head_dim, torch.bfloat16, grad=True)
    slices = LAYERED[mask]()
    out_grad = torch.randn(1024, 8, head_dim, device=DEVICE, dtype=torch.bfloat16)
    results = []
    for fn in (range_attention, _reference_range_attention):
        out, lse = fn(q, k, v, *slices)
        results.append((out, lse, *torch.autograd.grad((out * out_grad).sum(), (q, k, v))))
    assert portable_calls == {"forward": 0, "backward": 0}
    ours, ref = results
    assert_close_rel(ours[0], ref[0].to(torch.bfloat16), RTOL[torch.bfloat16])
    assert torch.equal(torch.isinf(ours[1]), torch.isinf(ref[1]))
    assert_close_rel(ours[1], ref[1].float(), 1e-3)
    for got, want in zip(ours[2:], ref[2:], strict=True):
        assert_close_rel(got, want.to(torch.bfloat16), 2 * RTOL[torch.bfloat16])


@pytest.mark.parametrize(
    "kwargs, dtype, why",
    [
        ({"softcap": 10.0}, torch.bfloat16, "softcap"),
        ({"sink": "sink"}, torch.bfloat16, "sink"),
        ({"deterministic": True}, torch.bfloat16, "deterministic"),
        ({}, torch.float32, "float32"),
    ],
)
def test_what_flash_cannot_take_stays_portable(
    kwargs, dtype, why, portable_calls, assert_close_rel
):
    q, k, v = qkv(256, 256, 4, 2, 64, dtype)
    if kwargs.get("sink") == "sink":
        kwargs = {"sink": torch.randn(4, device=DEVICE)}
    slices = varlen_slices([0, 100, 256], causal=True, device=DEVICE)
    out, _ = range_attention(q, k, v, *slices, **kwargs)
    reference_kwargs = {n: a for n, a in kwargs.items() if n != "deterministic"}  # one way only
    ref, _ = _reference_range_attention(q, k, v, *slices, **reference_kwargs)
    assert portable_calls["forward"] == 1, why
    assert_close_rel(out, ref.to(dtype), RTOL[dtype])


def test_a_gradient_through_lse_takes_the_portable_backward(portable_calls, assert_close_rel):
    """Flash's backward takes no gradient of the log-sum-exp: a loss that reads lse gets the
    portable backward, and the reference's gradients."""
    q, k, v = qkv(256, 256, 4, 2, 64, torch.bfloat16, grad=True)
    slices = varlen_slices([0, 100, 256], causal=True, device=DEVICE)
    grads = []
    for fn in (range_attention, _reference_range_attention):
        out, lse = fn(q, k, v, *slices)
        grads.append(torch.autograd.grad(out.float().sum() + lse.sum(), (q, k, v)))
    assert portable_calls == {"forward": 0, "backward": 1}
    for got, want in zip(*grads, strict=True):
        assert_close_rel(got, want.to(got.dtype), 2e-2)
