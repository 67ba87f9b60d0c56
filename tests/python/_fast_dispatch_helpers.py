"""Helpers shared by the direct-dispatch tests (test_fast_dispatch.py and
test_fast_dispatch_native.py)."""

from __future__ import annotations

import copy

import torch
from _api_helpers import RTOL, inputs
from magi_compiler import get_counters, magi_compile
from torch import nn

LLAMA = dict(hidden=32, n_heads=4, n_kv_heads=2, intermediate=64)


def direct_calls() -> int:
    return get_counters().direct_calls


def compiled_with_eager(model: nn.Module, **kwargs) -> tuple[nn.Module, nn.Module]:
    """(magi_compile(model), an uncompiled copy with the same weights)."""
    eager = copy.deepcopy(model)
    return magi_compile(model, **kwargs), eager


def llama_inputs(b: int) -> torch.Tensor:
    return torch.randn(b, 8, LLAMA["hidden"])


def warm_up(model, eager, assert_close_rel, make=inputs) -> None:
    """Three calls matching eager: capture, the ordinary call that learns, one direct call."""
    for b in (2, 3, 4):
        x = make(b)
        assert_close_rel(model(x), eager(x), RTOL)
    assert direct_calls() == 1
