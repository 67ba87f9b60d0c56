"""Executable.draws_random_numbers: whether a lowered graph may use random numbers, which decides
whether its CUDA graphs replay without refreshing the generator (tests/gpu/test_cuda_graphs.py
runs both kinds of replay)."""

from __future__ import annotations

import blocks
import torch
import torch.nn.functional as F
from magi_compiler import magi_compile, magi_register_custom_op


@magi_register_custom_op(name="magi_t_rng::twice", infer_output_meta_fn=["x"])
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _draws(fn, *args, lowered) -> bool:
    with torch.no_grad():
        fn(*args)
    (run,) = lowered
    return run.magi_executable.draws_random_numbers


def test_llama_block_draws_no_random_numbers(lowered):
    """Its attention has dropout_p 0: it takes a Philox offset but uses no numbers."""
    block = blocks.LlamaBlock(hidden=64, n_heads=4, n_kv_heads=2, intermediate=128).eval()
    compiled = magi_compile(block)
    assert _draws(compiled, torch.randn(2, 8, 64), lowered=lowered) is False


def test_rand_like_draws_random_numbers(lowered):
    f = magi_compile(lambda x: x + torch.rand_like(x))
    assert _draws(f, torch.randn(4, 8), lowered=lowered) is True


def test_attention_with_dropout_draws_random_numbers(lowered):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)

    f = magi_compile(attend)
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    assert _draws(f, q, k, v, lowered=lowered) is True


def test_custom_op_counts_as_drawing_random_numbers(lowered):
    """A custom op is opaque: it may draw (a CUDA graph then refreshes the generator)."""
    f = magi_compile(lambda x: _twice(x) + 1)
    assert _draws(f, torch.randn(4, 8), lowered=lowered) is True


def test_training_mode_dropout_draws_random_numbers(lowered):
    f = magi_compile(lambda x: F.dropout(x, 0.5, training=True) * 2)
    assert _draws(f, torch.randn(4, 8), lowered=lowered) is True


def test_in_place_uniform_draws_random_numbers(lowered):
    f = magi_compile(lambda x: x + torch.empty_like(x).uniform_())
    assert _draws(f, torch.randn(4, 8), lowered=lowered) is True


def test_pointwise_graph_draws_no_random_numbers(lowered):
    """Names close to the random words (layer_norm, normalize) do not count."""
    f = magi_compile(lambda x: F.normalize(F.layer_norm(x, (8,)).relu(), dim=-1))
    assert _draws(f, torch.randn(4, 8), lowered=lowered) is False
