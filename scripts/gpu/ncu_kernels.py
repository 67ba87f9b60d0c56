"""Runs what scripts/gpu/ncu_session.sh and rmsnorm_ncu.sh profile with Nsight Compute: the
bandwidth benchmark's rotary or RMSNorm workload (16384 x 8192 bf16) under magi_compile, then
torch.compile (``rotary``, ``rmsnorm``), the prefill's rotaries (``rotary_prefill``), or two steps of the Llama training workload
(``train``, full preset, bf16)."""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT / "benchmarks"), str(ROOT / "examples"), str(ROOT)):
    sys.path.insert(0, p)

from magi_compiler import magi_compile  # noqa: E402

if sys.argv[1] == "rmsnorm":
    from bandwidth import rmsnorm

    x = torch.randn(16384, 8192, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(8192, dtype=torch.bfloat16, device="cuda")
    for f in (magi_compile(rmsnorm), torch.compile(rmsnorm)):
        for _ in range(3):
            f(x, w)
elif sys.argv[1] == "rotary":
    from bandwidth import rotary

    x = torch.randn(16384, 8192, dtype=torch.bfloat16, device="cuda")
    cos = torch.randn(16384, 128, dtype=torch.bfloat16, device="cuda")
    sin = torch.randn(16384, 128, dtype=torch.bfloat16, device="cuda")
    f = magi_compile(rotary)
    for _ in range(3):
        f(x, cos, sin)
    g = torch.compile(rotary)
    for _ in range(3):
        g(x, cos, sin)
elif sys.argv[1] == "rotary_prefill":
    # The Llama prefill's q and k rotaries (4096 tokens x 16 and 8 heads of 128) under
    # magi_compile and torch.compile, and ATen's neg of q and k (the copy floor at these sizes;
    # a contiguous clone is a memcpy, not a kernel):
    # each once, after warm-up, between cudaProfilerStart and Stop (ncu --profile-from-start off).
    from bandwidth import rotary

    cos = torch.randn(4096, 128, dtype=torch.bfloat16, device="cuda")
    sin = torch.randn(4096, 128, dtype=torch.bfloat16, device="cuda")
    xs = [torch.randn(4096, h * 128, dtype=torch.bfloat16, device="cuda") for h in (16, 8)]
    fns = [magi_compile(rotary, dynamic_arg_dims={}), torch.compile(rotary)]

    def each_once():
        for f in fns:
            for x in xs:
                f(x, cos, sin)
        for x in xs:
            x.neg()
        torch.cuda.synchronize()

    for _ in range(3):
        each_once()
    torch.cuda.profiler.start()
    each_once()
    torch.cuda.profiler.stop()
else:
    from benchmarks import harness, workloads

    case = workloads.BY_NAME["llama_train"].build("full", torch.device("cuda"), torch.bfloat16)
    fn, hook = harness.make_variant("magi", case.module)
    for _ in range(2):
        case.step(fn, case.inputs[0], hook)
torch.cuda.synchronize()
