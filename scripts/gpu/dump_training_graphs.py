"""Dumps (MAGI_ENABLE_FX_GRAPH_VIZ) the forward and backward graphs magi_compile builds for one
training step of a one-layer grouped-query Llama block on CUDA, and checks its gradients against
eager. Set MAGI_DUMP_DIR to choose where the dump goes."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from blocks import LlamaStack  # noqa: E402
from magi_compiler import magi_compile  # noqa: E402

torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaStack(1, hidden=256, n_heads=4, n_kv_heads=2, intermediate=512).to(torch.bfloat16)
x = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
grads = {}
for name, fn in (("eager", model), ("magi", magi_compile(model, dynamic_arg_dims={}))):
    model.zero_grad(set_to_none=True)
    fn(x).float().pow(2).mean().backward()
    grads[name] = {n: p.grad.float() for n, p in model.named_parameters()}
for n, g in grads["eager"].items():
    err = ((grads["magi"][n] - g).norm() / g.norm()).item()
    print(f"{n}: normwise error {err:.2e}")
