"""Decoding with a static KV cache (magi_compiler.kv_cache, docs/decode.md) on the CPU.

The cache API: shapes, writes in place at tensor positions (the same slots for every row, or
per row), the attention mask, reset. Greedy decoding under magi_compile gives eager's tokens
for 20 steps with the example decoder (examples/decoder.py) and with a tiny Hugging Face Llama
through HFStaticCacheLM and Hugging Face's own StaticCache; after warm-up every step takes the
direct path (one direct call per step), captures nothing, writes the cache in place
(index_copy_, no write-back copy) and calls no host-synchronising tensor method.
examples/generate.py runs on the CPU and finds eager's tokens.
"""

from __future__ import annotations

import builtins
import copy
import os
import subprocess
import sys

import pytest
import torch
from blocks import init_weights_
from decoder import LlamaDecoder
from magi_compiler import get_counters, inspection, magi_compile
from magi_compiler.kv_cache import (
    Generation,
    HFStaticCacheLM,
    StaticKVCache,
    context_bucket,
    generate,
)

PROMPT, NEW = 8, 20


@pytest.fixture(autouse=True)
def _fresh(counters):
    yield


# --- the cache API -------------------------------------------------------------------------
def test_the_cache_has_one_key_and_value_buffer_per_layer():
    cache = StaticKVCache(3, 2, 4, 16, 8, dtype=torch.bfloat16)
    assert cache.shape == (3, 2, 4, 16, 8)
    assert cache.max_len == 16
    names = [name for name, _ in cache.named_buffers()]
    assert names == [f"layers.{i}.{kind}" for i in range(3) for kind in ("keys", "values")]
    for buf in cache.buffers():
        assert buf.shape == (2, 4, 16, 8) and buf.dtype == torch.bfloat16
        assert not buf.any()
    assert cache.nbytes() == 6 * 2 * 4 * 16 * 8 * 2
    assert cache.state_dict() == {}  # not persistent: a model's checkpoint does not hold it
    with pytest.raises(ValueError, match="max_len"):
        StaticKVCache(1, 1, 1, 0, 8)


def test_an_update_writes_in_place_at_tensor_positions():
    cache = StaticKVCache(1, 2, 2, 8, 4)
    layer = cache.layers[0]
    ptrs = (layer.keys.data_ptr(), layer.values.data_ptr())
    k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    positions = torch.tensor([2, 3, 4])
    keys, values = cache.update(0, positions, k, v)
    assert keys is layer.keys and values is layer.values
    assert (layer.keys.data_ptr(), layer.values.data_ptr()) == ptrs
    assert torch.equal(layer.keys[:, :, 2:5], k) and torch.equal(layer.values[:, :, 2:5], v)
    assert not layer.keys[:, :, [0, 1, 5, 6, 7]].any()
    # A context bucket: a view of the first slots, no copy.
    keys, values = cache.update(0, torch.tensor([5]), k[:, :, :1], v[:, :, :1], context=6)
    assert keys.shape == (2, 2, 6, 4) and keys.data_ptr() == ptrs[0]
    assert torch.equal(keys[:, :, 5], k[:, :, 0])


def test_per_row_positions_scatter_each_row():
    cache = StaticKVCache(1, 2, 2, 8, 4)
    k, v = torch.randn(2, 2, 2, 4), torch.randn(2, 2, 2, 4)
    positions = torch.tensor([[0, 1], [5, 6]])  # row 0 at slots 0-1, row 1 at 5-6
    keys, values = cache.update(0, positions, k, v)
    assert torch.equal(keys[0, :, 0:2], k[0]) and torch.equal(keys[1, :, 5:7], k[1])
    assert torch.equal(values[0, :, 0:2], v[0]) and torch.equal(values[1, :, 5:7], v[1])
    assert not keys[0, :, 2:].any() and not keys[1, :, :5].any()


def test_the_attention_mask_and_reset():
    cache = StaticKVCache(2, 2, 1, 6, 4)
    mask = cache.attention_mask(torch.tensor([2, 3]))
    assert mask.tolist() == [[True] * 3 + [False] * 3, [True] * 4 + [False] * 2]
    assert cache.attention_mask(torch.tensor([1]), context=4).tolist() == [[1, 1, 0, 0]]
    per_row = cache.attention_mask(torch.tensor([[0], [4]]))
    assert per_row.shape == (2, 1, 1, 6) and per_row[1, 0, 0].sum() == 5
    cache.update(1, torch.tensor([0]), torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    ptr = cache.layers[1].keys.data_ptr()
    cache.reset()
    assert not any(buf.any() for buf in cache.buffers())
    assert cache.layers[1].keys.data_ptr() == ptr


def test_context_bucket():
    assert context_bucket(1, [16, 32]) == 16
    assert context_bucket(17, [16, 32]) == 32
    with pytest.raises(ValueError, match="no context bucket holds 33"):
        context_bucket(33, [16, 32])


# --- decoding under magi_compile -----------------------------------------------------------
class Recorder:
    """Calls ``model`` and records the counters after each call."""

    def __init__(self, model) -> None:
        self.model, self.after = model, []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.after.append(get_counters())
        return out


def check_decode(eager, compiled, prompt, warmup: int = 3) -> Generation:
    """Greedy tokens equal eager's; after ``warmup`` calls (prefill, the decode capture and
    the call that learns the direct path), each step is one direct call and no capture."""
    want = generate(eager, prompt, NEW)
    calls = Recorder(compiled)
    got = generate(calls, prompt, NEW)
    assert torch.equal(got.tokens, want.tokens), (got.tokens, want.tokens)
    assert len(set(want.tokens[0].tolist())) > NEW // 2  # not one token over and over
    steady = calls.after[warmup - 1 :]
    assert len(steady) == NEW - warmup + 1
    for before, after in zip(steady, steady[1:], strict=False):
        assert after.captures == before.captures
        assert after.direct_calls == before.direct_calls + 1
    return got


def in_place(text: str, layers: int = 2) -> bool:
    """Each layer's keys and values are written in place (index_copy_ on the buffer), with no
    write-back copy of a cache; Hugging Face's per-layer length counters (0-d int64, advanced
    with add_) are the only copies back."""
    copies = [line for line in text.splitlines() if "aten::copy_(" in line]
    return text.count("aten::index_copy_(") == 2 * layers and all(": i64[] =" in c for c in copies)


def example_decoder(**kwargs) -> LlamaDecoder:
    model = init_weights_(LlamaDecoder(max_len=32, **kwargs), std=0.3, seed=0).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.embed.weight.copy_(torch.randn(model.embed.weight.shape, generator=gen))
    return model


def prompt_tokens(batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, PROMPT), generator=torch.Generator().manual_seed(2))


def test_the_example_decoder_decodes_as_eager_does():
    eager = example_decoder()
    compiled = magi_compile(copy.deepcopy(eager))
    got = check_decode(eager, compiled, prompt_tokens())
    assert get_counters().captures == 2  # prefill and decode
    assert in_place(str(inspection.last_compiled("inference").graph))
    assert got.peak_memory_bytes is None and got.time_to_first_token_s > 0
    assert got.decode_tokens_per_s > 0 and got.tokens.shape == (1, NEW)


def test_context_buckets_capture_once_per_bucket():
    """Prefill in chunks of 3 (two lengths: 3 and 2) in bucket 16, then decode in buckets 16
    and 32: one capture each, eager's tokens, the cache still written in place."""
    eager = example_decoder()
    compiled = magi_compile(copy.deepcopy(eager))
    want = generate(eager, prompt_tokens(), NEW)
    got = generate(compiled, prompt_tokens(), NEW, prefill_chunk=3, context_buckets=[16, 32])
    assert torch.equal(got.tokens, want.tokens)
    assert get_counters().captures == 4
    assert in_place(str(inspection.last_compiled("inference").graph))


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    from benchmarks.zoo_models import FAMILIES

    config = transformers.LlamaConfig(
        **FAMILIES["llama"].configs["tiny"],
        initializer_range=0.3,  # decisive logits: greedy tokens vary from step to step
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
    return model, lambda: transformers.StaticCache(config=config, max_cache_len=32)


def test_hugging_face_llama_decodes_with_its_static_cache():
    model, new_cache = tiny_llama()
    eager = HFStaticCacheLM(model, new_cache())
    compiled = magi_compile(HFStaticCacheLM(model, new_cache()))
    first = check_decode(eager, compiled, prompt_tokens())
    assert get_counters().captures == 2
    assert in_place(str(inspection.last_compiled("inference").graph))
    # reset() empties Hugging Face's cache in place: the same tokens again, every decode step
    # direct (the prefill's signature learns its direct path now).
    compiled.reset()
    before = get_counters()
    again = generate(compiled, prompt_tokens(), NEW)
    assert torch.equal(again.tokens, first.tokens)
    assert get_counters().captures == before.captures
    assert get_counters().direct_calls == before.direct_calls + NEW - 1


def test_a_whole_hugging_face_model_called_with_its_static_cache():
    """The model compiled itself and called with ``past_key_values``: eager's tokens and no
    capture per step, but the result holds the cache object (not a graph output), so calls
    stay on the ordinary path (docs/decode.md: compile the adapter instead)."""
    model, new_cache = tiny_llama()
    compiled = magi_compile(copy.copy(model))

    def step(m, cache):
        def call(tokens, positions):
            return m(input_ids=tokens, past_key_values=cache, use_cache=True).logits[:, -1]

        return call

    want = generate(step(model, new_cache()), prompt_tokens(), NEW)
    calls = Recorder(step(compiled, new_cache()))
    got = generate(calls, prompt_tokens(), NEW)
    assert torch.equal(got.tokens, want.tokens)
    assert calls.after[-1].captures == calls.after[1].captures == 2


@pytest.mark.parametrize("which", ["example", "hugging_face"])
def test_no_host_synchronisation_in_a_decode_step(which, monkeypatch):
    """After warm-up, a decode step (generate's loop and the compiled call) calls none of the
    tensor methods that read a value back to the host."""
    if which == "example":
        compiled = magi_compile(example_decoder())
    else:
        model, new_cache = tiny_llama()
        compiled = magi_compile(HFStaticCacheLM(model, new_cache()))
    for _ in range(2):  # warm-up: captures, and learns the direct paths of prefill and decode
        generate(compiled, prompt_tokens(), 4)
        compiled.reset()
    reads = []
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    before = get_counters()
    generate(compiled, prompt_tokens(), NEW)
    monkeypatch.undo()
    assert reads == []
    assert get_counters().direct_calls == before.direct_calls + NEW
    assert get_counters().captures == before.captures


def test_progress_without_tqdm_prints_a_counter(monkeypatch, capsys):
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    generate(example_decoder(), prompt_tokens(), 11, prefill_chunk=4, progress=True)
    err = capsys.readouterr().err
    assert "prefill: 8/8" in err and "decode: 10/10" in err and "decode: 1/10" in err


def test_the_generate_example_runs_on_the_cpu():
    """examples/generate.py --size tiny: eager's greedy tokens, and the lines it prints."""
    pytest.importorskip("transformers")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [
        sys.executable, os.path.join(root, "examples", "generate.py"), "--device", "cpu",
        "--prompt-len", "8", "--new-tokens", "12", "--no-progress",
    ]  # fmt: skip
    env = dict(os.environ, MAGI_LOGGING_LEVEL="warning", OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=root)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "greedy tokens equal eager's (12 tokens)" in out, out[-4000:]
    assert "magi_compile: 2 captures" in out and "peak memory n/a (CPU)" in out, out[-4000:]
