"""Decoding with a static KV cache on CUDA under FULL CUDA graphs (magi_compiler.kv_cache,
docs/decode.md): for 64 steps the greedy tokens equal eager's (float32, TF32 off), with the
example decoder (examples/decoder.py) and a tiny Hugging Face Llama with its own StaticCache
(HFStaticCacheLM). After warm-up every call is one direct call and one CUDA graph replay, and
nothing synchronises with the host (torch.cuda.set_sync_debug_mode("error") around the
generation; generate's two timing synchronisations are let through). Context buckets get one
graph each. bf16 decoding replays the same way."""

from __future__ import annotations

import copy

import pytest
import torch
from blocks import init_weights_
from decoder import LlamaDecoder
from magi_compiler import get_counters, kv_cache, magi_compile
from magi_compiler.kv_cache import HFStaticCacheLM, generate

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPT, NEW, MAX_LEN = 8, 64, 80
FULL = {"cudagraph_mode": "FULL"}


@pytest.fixture(autouse=True)
def _fresh(counters):
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def example_decoder(dtype=torch.float32) -> LlamaDecoder:
    model = LlamaDecoder(max_len=MAX_LEN, device="cuda")
    init_weights_(model, std=0.3, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.embed.weight.copy_(torch.randn(model.embed.weight.shape, generator=gen))
    return model.to(dtype).eval()


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    from benchmarks.zoo_models import FAMILIES

    config = transformers.LlamaConfig(
        **FAMILIES["llama"].configs["tiny"],
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(config).eval()
    return lambda: HFStaticCacheLM(model, transformers.StaticCache(config, max_cache_len=MAX_LEN))


def prompt_tokens() -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    return torch.randint(0, 256, (1, PROMPT), generator=gen).cuda()


class Recorder:
    """Calls ``model``; after each call records (direct calls, captures, CUDA graph replays)."""

    def __init__(self, model, lowered) -> None:
        self.model, self.lowered, self.after = model, lowered, []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        c = get_counters()
        replays = sum(r.magi_cuda_graphs.num_replays for r in self.lowered if r.magi_cuda_graphs)
        self.after.append((c.direct_calls, c.captures, replays))
        return out


def warm_up(compiled, **kwargs) -> None:
    """Two short generations: captures, CUDA graph warm-ups and captures, direct paths."""
    for _ in range(2):
        generate(compiled, prompt_tokens(), 4, **kwargs)
        compiled.reset()


def without_host_sync(monkeypatch, fn):
    """``fn()`` with any synchronising CUDA call an error, except generate's own two."""
    synchronize = kv_cache._synchronize

    def timing_sync(device):
        torch.cuda.set_sync_debug_mode(0)
        synchronize(device)
        torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(kv_cache, "_synchronize", timing_sync)
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        monkeypatch.undo()


@pytest.mark.parametrize("which", ["example", "hugging_face"])
def test_greedy_decode_replays_one_cuda_graph_per_token(which, lowered, monkeypatch):
    if which == "example":
        eager = example_decoder()
        compiled = magi_compile(copy.deepcopy(eager), config_patch=FULL)
    else:
        new_lm = tiny_llama()
        eager, compiled = new_lm(), magi_compile(new_lm(), config_patch=FULL)
    want = generate(eager, prompt_tokens(), NEW)
    warm_up(compiled)
    calls, prompt = Recorder(compiled, lowered), prompt_tokens()  # its copy to the GPU syncs
    got = without_host_sync(monkeypatch, lambda: generate(calls, prompt, NEW))
    assert torch.equal(got.tokens, want.tokens), (got.tokens, want.tokens)
    assert len(set(want.tokens[0].tolist())) > NEW // 4
    assert get_counters().captures == 2  # prefill and decode
    for before, after in zip(calls.after, calls.after[1:], strict=False):
        assert after[0] == before[0] + 1  # one direct call
        assert after[1] == before[1]  # no capture
        assert after[2] == before[2] + 1  # one replay
    assert got.peak_memory_bytes is not None and got.peak_memory_bytes > 0


def test_context_buckets_get_a_cuda_graph_each(lowered, monkeypatch):
    eager = example_decoder()
    compiled = magi_compile(copy.deepcopy(eager), config_patch=FULL)
    want = generate(eager, prompt_tokens(), NEW)
    buckets = [32, MAX_LEN]
    for _ in range(2):  # graphs of both buckets captured
        generate(compiled, prompt_tokens(), NEW, context_buckets=buckets)
        compiled.reset()
    calls, prompt = Recorder(compiled, lowered), prompt_tokens()
    got = without_host_sync(
        monkeypatch, lambda: generate(calls, prompt, NEW, context_buckets=buckets)
    )
    assert torch.equal(got.tokens, want.tokens)
    assert get_counters().captures == 3  # prefill, decode in bucket 32, decode in bucket 80
    replays = [after[2] for after in calls.after]
    assert replays == list(range(replays[0], replays[0] + NEW))


def test_bf16_decode_replays_without_host_sync(lowered, monkeypatch):
    compiled = magi_compile(example_decoder(torch.bfloat16), config_patch=FULL)
    warm_up(compiled)
    calls, prompt = Recorder(compiled, lowered), prompt_tokens()  # its copy to the GPU syncs
    got = without_host_sync(monkeypatch, lambda: generate(calls, prompt, NEW))
    assert got.tokens.shape == (1, NEW)
    assert calls.after[-1][2] - calls.after[0][2] == NEW - 1
    assert calls.after[-1][0] - calls.after[0][0] == NEW - 1
