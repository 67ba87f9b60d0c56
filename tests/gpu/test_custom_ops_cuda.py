"""``magi_register_custom_op`` and boundary splitting on CUDA: the end-to-end checks of
tests/python/test_custom_ops.py on CUDA tensors, against eager PyTorch on fresh random inputs.

float32 runs with TF32 off; bfloat16 compares compiled bf16 with eager bf16. Operator names
differ from the CPU tier's (one process may run both files; each name registers once).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from blocks import LlamaBlock, apply_rotary, init_weights_, rotary_cos_sin
from magi_compiler import inspection, magi_compile, magi_register_custom_op
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ROOT = Path(__file__).resolve().parents[2]
SEQ, HIDDEN = 64, 256
BATCHES = (2, 3, 5)
RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@magi_register_custom_op(
    name="magi_t_co_cuda::attention_backward",
    infer_output_meta_fn=["q", "k", "v"],
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def attention_backward(
    grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scale = q.shape[-1] ** -0.5
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    p = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    g = grad.float()
    dv = p.transpose(-1, -2) @ g
    dp = g @ v.float().transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq, dk = ds @ k.float() * scale, ds.transpose(-1, -2) @ q.float() * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _attention_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _attention_backward(ctx, grad):
    return attention_backward(grad, *ctx.saved_tensors)


@magi_register_custom_op(
    name="magi_t_co_cuda::attention",
    infer_output_meta_fn=["q"],
    setup_context_fn=_attention_setup,
    backward_fn=_attention_backward,
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class BoundaryLlamaBlock(LlamaBlock):
    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.shape
        q = self.q_proj(x).view(bsz, seq_len, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(bsz, seq_len, self.n_kv_heads, self.head_dim)
        cos, sin = rotary_cos_sin(seq_len, self.head_dim, self.rope_base, x.device, x.dtype)
        q = apply_rotary(q, cos, sin).transpose(1, 2)
        k = apply_rotary(k, cos, sin).transpose(1, 2).repeat_interleave(self.n_rep, dim=1)
        v = v.transpose(1, 2).repeat_interleave(self.n_rep, dim=1)
        out = attention(q, k, v).transpose(1, 2)
        return self.o_proj(out.reshape(bsz, seq_len, self.n_heads * self.head_dim))


class LlamaStack(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(
            BoundaryLlamaBlock(hidden=HIDDEN, n_heads=8, n_kv_heads=4, intermediate=512)
            for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def make_stack(layers: int, dtype: torch.dtype) -> nn.Module:
    return init_weights_(LlamaStack(layers), seed=0).to(device="cuda", dtype=dtype)


@DTYPES
def test_llama_stack_splits_at_attention(dtype, counters, assert_close_rel):
    eager = make_stack(4, dtype)
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.randn(batch, SEQ, HIDDEN, device="cuda", dtype=dtype)
            out = compiled(x)
            assert out.device.type == "cuda" and out.dtype == dtype
            assert_close_rel(out, eager(x), RTOL[dtype])
    assert counters().captures == 1
    info = inspection.last_compiled()
    assert info.boundary_ops == ("magi_t_co_cuda::attention",) * 4
    assert info.num_pieces == 5 and info.num_unique_pieces == 3
    assert info.piece_sequence == (0, 1, 1, 1, 2)


@DTYPES
def test_llama_stack_trains_through_boundaries(dtype, counters, assert_close_rel):
    eager = make_stack(2, dtype)
    compiled = magi_compile(copy.deepcopy(eager))
    for batch in (2, 3):
        x = torch.randn(batch, SEQ, HIDDEN, device="cuda", dtype=dtype)
        grad = torch.randn_like(x)
        for model in (eager, compiled):
            model.zero_grad()
            model(x).backward(grad)
        for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
            assert_close_rel(q.grad, p.grad, RTOL[dtype] * 2)
    assert inspection.last_compiled("forward").num_pieces == 3
    backward = inspection.last_compiled("backward")
    assert backward.boundary_ops == ("magi_t_co_cuda::attention_backward",) * 2
    assert counters().captures == 1


@magi_register_custom_op(name="magi_t_co_cuda::accumulate", mutates_args=("acc",))
def accumulate(x: torch.Tensor, acc: torch.Tensor) -> None:
    acc.add_(x * 2)


@magi_register_custom_op(
    name="magi_t_co_cuda::scaled_accumulate", mutates_args=("acc",), is_subgraph_boundary=True
)
def scaled_accumulate(x: torch.Tensor, acc: torch.Tensor, scale: float) -> torch.Tensor:
    acc.mul_(scale).add_(x)
    return x * scale


def test_op_with_mutates_args(counters, assert_close_rel):
    def fn(x, acc):
        h = x.sin()
        accumulate(h, acc)
        buf = torch.zeros_like(x)
        accumulate(h[1:], buf[1:])
        y = scaled_accumulate(h, buf, 0.5)
        return acc * 3 + buf + y

    compiled = magi_compile(fn)
    for batch in (3, 4, 6):
        x, acc = torch.randn(batch, 8, device="cuda"), torch.randn(batch, 8, device="cuda")
        acc_eager, acc_compiled = acc.clone(), acc.clone()
        expected = fn(x, acc_eager)
        assert_close_rel(compiled(x, acc_compiled), expected, 1e-5)
        assert_close_rel(acc_compiled, acc_eager, 1e-5)
    assert inspection.last_compiled().boundary_ops == ("magi_t_co_cuda::scaled_accumulate",)
    assert counters().captures == 1


@magi_register_custom_op(name="magi_t_co_cuda::sum_prod", is_subgraph_boundary=True)
def sum_prod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return a + b, a * b


def test_two_output_op(counters, assert_close_rel):
    def fn(x, y):
        p, q = sum_prod(x.sin(), y.exp())
        return p * q, q - p

    compiled = magi_compile(fn)
    for batch in BATCHES:
        x, y = torch.randn(batch, 8, device="cuda"), torch.randn(batch, 8, device="cuda")
        assert_close_rel(compiled(x, y), fn(x, y), 1e-5)
    assert inspection.last_compiled().num_pieces == 2
    assert counters().captures == 1


def test_registration_after_decoration_still_splits(counters, assert_close_rel):
    @magi_compile
    class Late(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return late_op(x.relu()) + 1  # noqa: F821 - defined below, after decoration

    @magi_register_custom_op(name="magi_t_co_cuda::late", is_subgraph_boundary=True)
    def late_op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    globals()["late_op"] = late_op
    try:
        x = torch.randn(3, 4, device="cuda")
        assert_close_rel(Late()(x), late_op(x.relu()) + 1, 1e-5)
        assert inspection.last_compiled().boundary_ops == ("magi_t_co_cuda::late",)
    finally:
        del globals()["late_op"]


def test_readme_example_on_cuda(tmp_path):
    """The README's code block with CUDA as the default device."""
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    prelude = "import torch\ntorch.set_default_device('cuda')\n"
    checks = textwrap.dedent(
        """
        from magi_compiler import inspection

        info = inspection.last_compiled()
        assert info.boundary_ops == ("athena::attention",) and info.num_pieces == 2, info
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.no_grad():
            x = torch.randn(4, 64, 256)
            a, e = block(x), Block.forward(block, x)
            assert a.is_cuda
            err = ((a - e).abs().max() / e.abs().max()).item()
            assert err <= 1e-4, err
        print("README OK")
        """
    )
    script = tmp_path / "readme_example_cuda.py"
    script.write_text(prelude + code + checks)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "README OK" in result.stdout
