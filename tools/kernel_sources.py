"""Writes the CUDA source magi generates for some of the bandwidth benchmark's workloads
(16384 x 8192 bf16) under $OUT/sources, one file per kernel,.

    python scripts/gpu/kernel_sources.py softmax layer_norm rmsnorm
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bandwidth  # noqa: E402
from magi_compiler import inspection  # noqa: E402

out = Path(os.environ.get("OUT", "/tmp/magi_out")) / "sources"
out.mkdir(parents=True, exist_ok=True)
rows, cols = 16384, 8192
for name in sys.argv[1:] or ["softmax", "layer_norm", "rmsnorm"]:
    (w,) = [w for w in bandwidth.WORKLOADS if w.name == name]
    f = bandwidth.make_variant("magi_compile", w)
    f(*w.inputs(rows, cols, torch.bfloat16, "cuda"))
    for k in inspection.last_compiled().executable.generated_kernels():
        (out / f"{name}.{k['symbol']}.{k['target']}.txt").write_text(k["source"])
        print(name, k["symbol"])
