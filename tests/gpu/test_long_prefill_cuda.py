"""A 100,000-token prefill at batch 1 completes on one GPU under magi_compile, for the two
models of benchmarks/long_prefill.py: the block with written-out attention (which eager cannot
run: its S x S scores alone are 298 GiB) against the same weights with SDPA's causal attention,
and Hugging Face's Llama at the Llama-3.2-1B shape against eager. The peaks are the ones the
benchmark's table reports, with room: 2.1 GiB and 4.4 GiB on an H100."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from magi_compiler import magi_compile

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOKENS = 100_000
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _peak_gib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, (torch.cuda.max_memory_allocated() - base) / 2**30


def _sdpa_block(block, x):
    """The block's computation with F.scaled_dot_product_attention (is_causal) in place of the
    written-out scores: what it computes, in memory that fits."""
    b, s, d = x.shape
    q, k, v = (
        block.qkv(block.norm1(x)).view(b, s, 3, block.heads, block.head_dim).permute(2, 0, 3, 1, 4)
    )
    att = F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=1 / math.sqrt(block.head_dim)
    )
    x = x + block.o(att.transpose(1, 2).reshape(b, s, d))
    h = block.norm2(x)
    return x + block.down(F.silu(block.gate(h)) * block.up(h))


def test_the_written_out_block_prefills_100k_tokens(assert_close_rel):
    from benchmarks import long_prefill

    block = long_prefill.build("block", "real", "cuda", torch.bfloat16)
    x = torch.randn(1, TOKENS, 2048, device="cuda", dtype=torch.bfloat16)
    compiled = magi_compile(copy.deepcopy(block))
    with torch.no_grad():
        compiled(x)  # capture and compile
        got, peak = _peak_gib(lambda: compiled(x))
        want = _sdpa_block(block, x)
    assert_close_rel(got.float(), want.float(), 2e-2)
    assert peak < 3.0, f"peak {peak:.2f} GiB"


def test_hugging_face_llama_prefills_100k_tokens(assert_close_rel):
    pytest.importorskip("transformers")
    from benchmarks import long_prefill

    model = long_prefill.build("llama", "real", "cuda", torch.bfloat16)
    call = long_prefill.make_call("llama", model, TOKENS, "cuda", torch.bfloat16)
    compiled = magi_compile(copy.deepcopy(model))
    with torch.no_grad():
        want, eager_peak = _peak_gib(lambda: call(model))
        call(compiled)  # capture and compile
        got, peak = _peak_gib(lambda: call(compiled))
    assert_close_rel(got.float(), want.float(), 5e-2)
    assert peak < eager_peak, f"magi {peak:.2f} GiB, eager {eager_peak:.2f} GiB"
