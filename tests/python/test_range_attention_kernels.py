"""range_attention's kernels on the CPU: which slices run on flash's varlen kernels and how
(one call, or layers merged by log-sum-exp, checked with a dense stand-in for flash's kernels),
the range tensors read once, the choice of cuDNN for one dense document, and the packed-training
example. The mask semantics, builders, checks and operators: test_range_attention.py; the
kernels themselves: tests/gpu/test_range_attention_cuda.py."""

from __future__ import annotations

import pytest
import torch
from magi_compiler import UserError
from magi_compiler.attention import (
    block_causal_slices,
    dense_mask,
    flash_path,
    prefix_lm_slices,
    range_attention,
    sliding_window_slices,
    varlen_slices,
)
from magi_compiler.attention._reference import _reference_range_attention
from test_range_attention import BI, CAUSAL, FULL, INV, i32, qkv

# --- packed documents and sliding windows: one flash call ---------------------------------------


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
