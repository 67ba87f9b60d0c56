"""``magi_compile`` training and guards on CUDA, against eager PyTorch on fresh random inputs.

float32 runs with TF32 off (eager and compiled must do the same arithmetic; gradients within
1e-4 relative); bfloat16 compares compiled bf16 with eager bf16 (gradients within 5e-2).
Guards: a dtype change (float32 → bfloat16) captures exactly once more, a dynamic-dim change
never does, a device or autocast change misses.
"""

from __future__ import annotations

import copy

import pytest
import torch
from blocks import LlamaBlock, init_weights_
from magi_compiler import get_counters, magi_compile

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BLOCK = dict(hidden=256, n_heads=8, n_kv_heads=4, intermediate=512)
SEQ = 64
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
GRAD_RTOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])


@pytest.fixture(autouse=True)
def _no_tf32_fresh_counters(counters):
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def llama(dtype: torch.dtype) -> LlamaBlock:
    return init_weights_(LlamaBlock(**BLOCK), seed=0).to(device="cuda", dtype=dtype)


def inputs(b: int, dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor:
    return torch.randn(b, SEQ, BLOCK["hidden"], device="cuda", dtype=dtype, **kwargs)


@DTYPES
@pytest.mark.parametrize("form", ["instance", "class"])
def test_training_gradients_match_eager(form, dtype, assert_close_rel):
    eager = llama(dtype)
    if form == "instance":
        model = magi_compile(copy.deepcopy(eager))
    else:

        @magi_compile
        class Block(LlamaBlock):
            pass

        model = Block(**BLOCK).to(device="cuda", dtype=dtype)
        model.load_state_dict(eager.state_dict())
    for b in (2, 3, 5):
        x = inputs(b, dtype)
        x_eager, x_comp = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_eager, out_comp = LlamaBlock.forward(eager, x_eager), model(x_comp)
        assert_close_rel(out_comp, out_eager, RTOL[dtype])
        grad = torch.randn_like(out_eager)
        out_eager.backward(grad)
        out_comp.backward(grad)
        assert_close_rel(x_comp.grad, x_eager.grad, GRAD_RTOL[dtype])
        named = dict(model.named_parameters())
        for name, p in eager.named_parameters():
            assert named[name].grad is not None, name
            assert_close_rel(named[name].grad, p.grad, GRAD_RTOL[dtype])
        model.zero_grad()
        eager.zero_grad()
    c = get_counters()
    assert (c.captures, c.compiles, c.guard_misses) == (1, 2, 0), c  # forward + backward


def test_dtype_change_captures_once_more(assert_close_rel):
    eager = llama(torch.float32)
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (2, 3):
            x = inputs(b)
            assert_close_rel(model(x), LlamaBlock.forward(eager, x), RTOL[torch.float32])
        assert get_counters().captures == 1
        model.to(torch.bfloat16)
        eager.to(torch.bfloat16)
        for b in (2, 4, 3):
            x = inputs(b, torch.bfloat16)
            out = model(x)
            assert out.dtype == torch.bfloat16
            assert_close_rel(out, LlamaBlock.forward(eager, x), RTOL[torch.bfloat16])
    c = get_counters()
    assert (c.captures, c.guard_misses) == (2, 1), c


@DTYPES
def test_dynamic_dim_change_never_captures(dtype, assert_close_rel):
    eager = llama(dtype)
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in (2, 7, 3, 16, 2):
            x = inputs(b, dtype)
            assert_close_rel(model(x), LlamaBlock.forward(eager, x), RTOL[dtype])
    c = get_counters()
    assert (c.captures, c.compiles, c.guard_misses) == (1, 1, 0), c


def test_static_dim_change_captures_once_more(assert_close_rel):
    eager = llama(torch.float32)
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for seq, expected in ((SEQ, 1), (SEQ // 2, 2), (SEQ // 2, 2)):
            x = torch.randn(3, seq, BLOCK["hidden"], device="cuda")
            assert_close_rel(model(x), LlamaBlock.forward(eager, x), RTOL[torch.float32])
            assert get_counters().captures == expected


def test_device_change_misses(assert_close_rel):
    def scale(x):
        return torch.tanh(x) * 2 + x.mean(-1, keepdim=True)

    compiled = magi_compile(scale)
    for device in ("cpu", "cuda", "cpu"):
        x = torch.randn(3, 8, 16, device=device)
        out = compiled(x)
        assert out.device == x.device
        assert_close_rel(out, scale(x), 1e-5)
    c = get_counters()
    assert (c.captures, c.guard_misses) == (2, 1), c


def test_autocast_change_misses(assert_close_rel):
    eager = llama(torch.float32)
    model = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = inputs(2)
        assert_close_rel(model(x), LlamaBlock.forward(eager, x), RTOL[torch.float32])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            expected = LlamaBlock.forward(eager, x)
        assert out.dtype == expected.dtype
        assert_close_rel(out, expected, RTOL[torch.bfloat16])
    assert get_counters().guard_misses == 1
