"""Decoding with a static, device-resident KV cache: the cache, a Hugging Face adapter, greedy
generation.

A decode step under ``magi_compile`` should neither capture again nor wait for the host. So
everything that changes per token is a tensor on the model's device: the token, its position,
and the cache, which is preallocated once at its full length and written in place at the
positions (``index_copy_``, or ``scatter_`` for per-row positions). No shape changes from one
step to the next, so one capture serves every step; the positions' values are data, never
guarded on; and the compiler's write_inputs_in_place pass turns the functionalized update back
into a write of the cache buffer itself (src/passes/write_inputs_in_place.cpp), which is also
what a CUDA graph replays.

- :class:`StaticKVCache` holds one :class:`LayerKVCache` per layer, each with ``keys`` and
  ``values`` buffers of shape ``(batch, kv_heads, max_len, head_dim)``. It is an ``nn.Module``
  meant to be a submodule of the model: its tensors are then buffers, which direct calls read
  from C++ and CUDA graphs read in place.
- :class:`HFStaticCacheLM` lets a Hugging Face causal LM decode under ``magi_compile`` with
  Hugging Face's own ``StaticCache``.
- :func:`generate` runs a greedy prefill and decode loop over either and times it.

docs/decode.md describes the API, its relation to Hugging Face's cache and CUDA graphs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "LayerKVCache",
    "StaticKVCache",
    "HFStaticCacheLM",
    "Generation",
    "generate",
    "context_bucket",
]


class LayerKVCache(nn.Module):
    """The keys and values of one attention layer: buffers of shape
    ``(batch, kv_heads, max_len, head_dim)``, allocated once and only ever written in place."""

    def __init__(
        self,
        batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (batch, kv_heads, max_len, head_dim)
        self.register_buffer("keys", torch.zeros(shape, dtype=dtype, device=device), False)
        self.register_buffer("values", torch.zeros(shape, dtype=dtype, device=device), False)

    def update(
        self,
        positions: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        context: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes ``key`` and ``value`` (``(batch, kv_heads, seq, head_dim)``) at ``positions``
        and returns the keys and values to attend over: the first ``context`` slots (all of
        them when ``None``).

        ``positions`` is an int64 tensor on the cache's device: ``(seq,)``, the same slots for
        every row (``index_copy_``), or ``(batch, seq)``, per row (``scatter_``). Slots past the
        written ones hold stale values; mask them (:meth:`StaticKVCache.attention_mask`).
        """
        if positions.dim() == 1:
            self.keys.index_copy_(2, positions, key)
            self.values.index_copy_(2, positions, value)
        else:
            index = positions[:, None, :, None].expand_as(key)
            self.keys.scatter_(2, index, key)
            self.values.scatter_(2, index, value)
        if context is None:
            return self.keys, self.values
        return self.keys[:, :, :context], self.values[:, :, :context]


class StaticKVCache(nn.Module):
    """A static KV cache of ``layers`` :class:`LayerKVCache` s, all of shape
    ``(batch, kv_heads, max_len, head_dim)`` in ``dtype`` on ``device``.

    Make it a submodule of the model (``self.cache = StaticKVCache(...)``) and have layer ``i``
    call ``self.cache.update(i, positions, k, v)`` (or hold ``self.cache.layers[i]``). The batch
    of every call is the cache's: run fewer sequences as padding rows.
    """

    def __init__(
        self,
        layers: int,
        batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("layers", layers), ("batch", batch), ("kv_heads", kv_heads)):
            if value < 1:
                raise ValueError(f"StaticKVCache: {name} must be >= 1, got {value}")
        if max_len < 1 or head_dim < 1:
            raise ValueError(
                f"StaticKVCache: max_len and head_dim must be >= 1, got {max_len} and {head_dim}"
            )
        self.max_len = max_len
        self.layers = nn.ModuleList(
            LayerKVCache(batch, kv_heads, max_len, head_dim, dtype, device) for _ in range(layers)
        )

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(layers, batch, kv_heads, max_len, head_dim)``."""
        return (len(self.layers), *self.layers[0].keys.shape)

    def update(
        self,
        layer: int,
        positions: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        context: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`LayerKVCache.update` of layer ``layer``."""
        return self.layers[layer].update(positions, key, value, context)

    def attention_mask(self, positions: torch.Tensor, context: int | None = None) -> torch.Tensor:
        """Which cache slots each query may attend to (``True``: attend): slot ``j`` for the
        query at position ``p`` when ``j <= p``. ``(seq, context)`` for positions ``(seq,)``,
        ``(batch, 1, seq, context)`` for ``(batch, seq)``; ``context`` defaults to ``max_len``.
        Built on the device from ``positions``, so it needs no host value."""
        slots = torch.arange(context or self.max_len, device=positions.device)
        mask = slots <= positions[..., None]
        return mask if positions.dim() == 1 else mask[:, None]

    @torch.no_grad()
    def reset(self) -> None:
        """Zeroes every buffer in place (their addresses, which CUDA graphs hold, stay)."""
        for layer in self.layers:
            layer.keys.zero_()
            layer.values.zero_()

    def nbytes(self) -> int:
        """Bytes of all keys and values."""
        return sum(t.nbytes for layer in self.layers for t in (layer.keys, layer.values))


class HFStaticCacheLM(nn.Module):
    """A Hugging Face causal LM and its ``StaticCache`` as one decoder,
    ``forward(tokens (batch, seq), positions) -> logits (batch, vocab)`` of the last position.

    The cache stays Hugging Face's (``transformers.StaticCache``): it is initialised here at
    ``batch`` rows in the model's dtype and device (``early_initialization``), so no capture
    allocates it, and every call passes it as ``past_key_values``. Hugging Face's static layers
    write at their own ``cumulative_length`` counter (a device tensor advanced in place), so
    ``positions`` (``(seq,)`` or ``(batch, seq)``, used for the rotary embedding) must be the
    slots that follow the tokens already written: what :func:`generate` passes. Compile the
    adapter, not the model: the model's own output holds the cache object, which the compiled
    graph does not return, so a compiled model called with ``past_key_values`` stays on the
    ordinary path (correct, but through Dynamo on every call); the adapter returns only the
    logits, and its calls take the direct path.
    """

    def __init__(self, model: nn.Module, cache: Any, batch: int = 1) -> None:
        super().__init__()
        self.model = model
        self.cache = cache
        self.training = model.training
        config = model.config.get_text_config(decoder=True)
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        weight = next(model.parameters())
        cache.early_initialization(batch, kv_heads, head_dim, weight.dtype, weight.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if positions.dim() == 1:
            positions = positions.expand(tokens.shape[0], -1)
        out = self.model(
            input_ids=tokens,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]

    def reset(self) -> None:
        """Empties the cache in place (counters to 0, buffers zeroed) for a new prompt."""
        self.cache.reset()


def context_bucket(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length`` slots (``buckets`` ascending)."""
    for bucket in buckets:
        if bucket >= length:
            return bucket
    raise ValueError(f"no context bucket holds {length} slots (largest {buckets[-1]})")


@dataclass
class Generation:
    """What :func:`generate` produced and how long it took."""

    tokens: torch.Tensor  #: (batch, new_tokens) int64, on the prompt's device
    prompt_len: int
    time_to_first_token_s: float  #: prefill and the first token's argmax, synchronised
    decode_s: float  #: the other new_tokens - 1 steps, synchronised at the end
    peak_memory_bytes: int | None  #: torch.cuda.max_memory_allocated over the call; None on CPU

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second of the decode steps, over all rows of the batch."""
        steps = self.tokens.shape[1] - 1
        return self.tokens.shape[0] * steps / self.decode_s if steps and self.decode_s else 0.0

    @property
    def ms_per_token(self) -> float:
        """Milliseconds per decode step (one token for each row)."""
        steps = self.tokens.shape[1] - 1
        return 1e3 * self.decode_s / steps if steps else 0.0


class _Counter:
    """tqdm's interface, printing ``label i/total`` at every tenth of the way (without tqdm)."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n, self._next = total, desc, 0, 0

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n >= self._next or self.n == self.total:
            print(f"{self.desc}: {self.n}/{self.total}", file=sys.stderr, flush=True)
            self._next = self.n + max(1, self.total // 10)

    def close(self) -> None:
        pass


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, show: bool) -> Any:
    """A progress bar over ``total`` tokens: tqdm's when installed, else :class:`_Counter`."""
    if not show:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Counter(total, desc)
    return tqdm(total=total, desc=desc, unit="tok")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    new_tokens: int,
    *,
    prefill_chunk: int | None = None,
    context_buckets: Sequence[int] | None = None,
    progress: bool = False,
) -> Generation:
    """Greedy generation: prefill ``prompt`` (``(batch, prompt_len)`` int64), then
    ``new_tokens - 1`` decode steps of one token each.

    ``model(tokens, positions)`` returns the logits ``(batch, vocab)`` of the last position and
    writes the tokens' keys and values into its static cache at ``positions`` (``(seq,)``
    int64 on the prompt's device): an example decoder with a :class:`StaticKVCache`, or an
    :class:`HFStaticCacheLM`, compiled or not. The cache must start empty and hold
    ``prompt_len + new_tokens - 1`` slots.

    Per step nothing waits for the device: the next token is the argmax on the device, the
    next positions are ``positions + 1`` on the device, and the only host synchronisations
    are the two that time the call. ``prefill_chunk`` splits the prompt into calls of that
    many tokens (one capture per distinct chunk length). ``context_buckets`` (ascending)
    passes ``context=`` the smallest bucket holding the slots written so far, which the
    model uses to attend over that many slots only (one capture, or CUDA graph, per bucket).
    ``progress`` shows a progress bar (tqdm when installed, else a printed counter). A
    compiled model's first calls capture and compile, and the time they take counts: warm up
    with a short generation (then ``reset()`` the cache) to time the steady state.
    """
    batch, prompt_len = prompt.shape
    if new_tokens < 1 or prompt_len < 1:
        raise ValueError(
            f"generate: needs a prompt and new tokens, got {prompt_len} and {new_tokens}"
        )
    device = prompt.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    chunk = prefill_chunk or prompt_len
    out = torch.empty(batch, new_tokens, dtype=torch.long, device=device)

    def call(tokens: torch.Tensor, positions: torch.Tensor, end: int) -> torch.Tensor:
        if context_buckets is None:
            return model(tokens, positions)
        return model(tokens, positions, context=context_bucket(end, context_buckets))

    start = time.perf_counter()
    bar = _progress(prompt_len, "prefill", progress and prompt_len > chunk)
    for begin in range(0, prompt_len, chunk):
        end = min(begin + chunk, prompt_len)
        positions = torch.arange(begin, end, device=device)
        # contiguous: every chunk of a batch has the same layout, so the same signature
        logits = call(prompt[:, begin:end].contiguous(), positions, end)
        bar.update(end - begin)
    bar.close()
    token = logits.argmax(-1)
    out[:, 0] = token
    _synchronize(device)
    first = time.perf_counter()

    bar = _progress(new_tokens - 1, "decode", progress)
    positions = positions[-1:] + 1
    for step in range(1, new_tokens):
        logits = call(token[:, None], positions, prompt_len + step)
        token = logits.argmax(-1)
        out[:, step] = token
        positions = positions + 1
        bar.update()
    bar.close()
    _synchronize(device)
    done = time.perf_counter()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Generation(out, prompt_len, first - start, done - first, peak)
