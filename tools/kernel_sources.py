"""Usage: python tools/kernel_sources.py [WORKLOAD ...] [--rows R --cols C --dtype D --device cuda]

Writes the kernel sources magi_compile generates for workloads of benchmarks/bandwidth.py
(default: softmax, layer_norm, rmsnorm at 16384 x 8192 bf16 on CUDA) under $OUT/sources (default
/tmp/magi_out/sources), one file per kernel: ``<workload>.<symbol>.<target>.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bandwidth  # noqa: E402
from magi_compiler import inspection  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", default=["softmax", "layer_norm", "rmsnorm"])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "/tmp/magi_out")) / "sources"
    out.mkdir(parents=True, exist_ok=True)
    for name in args.workloads:
        (w,) = [w for w in bandwidth.WORKLOADS if w.name == name]
        f = bandwidth.make_variant("magi_compile", w)
        f(*w.inputs(args.rows, args.cols, getattr(torch, args.dtype), args.device))
        for k in inspection.last_compiled().executable.generated_kernels():
            path = out / f"{name}.{k['symbol']}.{k['target']}.txt"
            path.write_text(k["source"])
            print(path)


if __name__ == "__main__":
    main()
