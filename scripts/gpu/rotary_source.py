"""Writes the CUDA source magi generates for the bandwidth benchmark's rotary workload (and its
time beside torch.compile's) under $OUT/rotary: what the rotary kernel does per element."""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bandwidth import rotary  # noqa: E402
from magi_compiler import inspection, magi_compile  # noqa: E402

out = Path(os.environ.get("OUT", "/tmp/magi_out")) / "rotary"
out.mkdir(parents=True, exist_ok=True)
x = torch.randn(16384, 8192, dtype=torch.bfloat16, device="cuda")
cos = torch.randn(16384, 128, dtype=torch.bfloat16, device="cuda")
sin = torch.randn(16384, 128, dtype=torch.bfloat16, device="cuda")
f = magi_compile(rotary)
f(x, cos, sin)
for k in inspection.last_compiled().executable.generated_kernels():
    (out / f"{k['symbol']}.{k['target']}.txt").write_text(k["source"])
g = torch.compile(rotary)
g(x, cos, sin)
for name, fn in (("magi", f), ("inductor", g), ("eager", rotary)):
    for _ in range(3):
        fn(x, cos, sin)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ts = []
    for _ in range(20):
        ev[0].record()
        fn(x, cos, sin)
        ev[1].record()
        torch.cuda.synchronize()
        ts.append(ev[0].elapsed_time(ev[1]))
    ts.sort()
    print(f"rotary {name}: {ts[len(ts) // 2] * 1e3:.1f} us")
