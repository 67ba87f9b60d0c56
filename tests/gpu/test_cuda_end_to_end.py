"""``magi_compile`` and the importer on CUDA, against eager PyTorch on fresh random inputs.

float32 runs with TF32 off (eager and compiled must do the same arithmetic); bfloat16 compares
compiled bf16 with eager bf16. Three batch sizes share one capture (dim 0 is dynamic).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from blocks import GPT2Block, LlamaBlock, init_weights_
from magi_compiler import _C, magi_compile
from torch.fx.experimental.proxy_tensor import make_fx

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HIDDEN, SEQ = 256, 64
BATCHES = (2, 3, 5)
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
GRAD_RTOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])


def make_block(name: str, dtype: torch.dtype) -> torch.nn.Module:
    if name == "llama":
        block = LlamaBlock(hidden=HIDDEN, n_heads=8, n_kv_heads=4, intermediate=512)
    else:
        block = GPT2Block(hidden=HIDDEN, n_heads=8)
    return init_weights_(block, seed=0).to(device="cuda", dtype=dtype)


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@DTYPES
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_inference(name, dtype, assert_close_rel, counters):
    eager = make_block(name, dtype)
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for b in BATCHES:
            x = torch.randn(b, SEQ, HIDDEN, device="cuda", dtype=dtype)
            out = compiled(x)
            assert out.device.type == "cuda" and out.dtype == dtype
            assert_close_rel(out, eager(x), RTOL[dtype])
    c = counters()
    assert c.captures == 1, c
    assert c.compiles == 1, c


@DTYPES
def test_training_gradients(dtype, assert_close_rel, counters):
    eager = make_block("llama", dtype)
    compiled = magi_compile(copy.deepcopy(eager))
    for b in (2, 3):
        x = torch.randn(b, SEQ, HIDDEN, device="cuda", dtype=dtype)
        grad_out = torch.randn_like(x)
        x_eager, x_comp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        eager(x_eager).backward(grad_out)
        compiled(x_comp).backward(grad_out)
        assert_close_rel(x_comp.grad, x_eager.grad, GRAD_RTOL[dtype])
        named = dict(compiled.named_parameters())
        for pname, p in eager.named_parameters():
            assert named[pname].grad is not None, pname
            assert_close_rel(named[pname].grad, p.grad, GRAD_RTOL[dtype])
        eager.zero_grad()
        compiled.zero_grad()
    c = counters()
    assert c.captures == 1, c
    assert c.compiles == 2, c  # forward + backward


@DTYPES
def test_importer_runs_sdpa_graph(dtype, assert_close_rel):
    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    def qkv(n):
        return [torch.randn(n, 4, 32, 64, device="cuda", dtype=dtype) for _ in range(3)]

    gm = make_fx(attention, tracing_mode="symbolic")(*qkv(3))
    graph = _C.import_fx_graph(gm)
    graph.verify()
    assert any("scaled_dot_product" in op for op in graph.op_names()), graph.op_names()
    exe = _C.Executable(graph)
    for n in (2, 5):
        inputs = qkv(n)
        (out,) = exe.run(inputs)
        assert_close_rel(out, attention(*inputs), RTOL[dtype])
