"""torch.compile's RMSNorm kernel (16384 x 8192 bf16, bandwidth.py's rmsnorm) as Inductor
generated it: the Triton source, its launch settings, and the PTX and SASS resource use, written
into one text file, to compare with our generated kernel instruction by instruction.

    python scripts/gpu/inductor_rmsnorm_ptx.py OUT.txt
"""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/rmsnorm_triton")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/rmsnorm_inductor")
import torch  # noqa: E402
import torch.utils.cpp_extension  # noqa: E402  (CUDA_HOME)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bandwidth import rmsnorm  # noqa: E402


def main(out: str) -> None:
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    x = torch.randn(16384, 8192, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(8192, dtype=torch.bfloat16, device="cuda")
    torch.compile(rmsnorm)(x, w)
    torch.cuda.synchronize()
    parts = []
    for f in sorted(Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.py")):
        text = f.read_text(errors="replace")
        if "@triton.jit" in text:
            parts.append(f"===== {f.name}\n{text}")
    for ext in ("ttgir", "ptx", "json"):
        for f in sorted(cache.rglob(f"*.{ext}")):
            parts.append(f"===== {f.name}\n{f.read_text(errors='replace')}")
    cuobjdump = Path(torch.utils.cpp_extension.CUDA_HOME or "/usr/local/cuda") / "bin/cuobjdump"
    for f in sorted(cache.rglob("*.cubin")):
        try:
            sass = subprocess.run(
                [str(cuobjdump), "-sass", "-res-usage", str(f)],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            sass = f"cuobjdump failed: {e}"
        parts.append(f"===== {f.name} (cuobjdump -sass -res-usage)\n{sass}")
    Path(out).write_text("\n".join(parts))
    print(f"wrote {out}: {len(parts)} parts")


if __name__ == "__main__":
    main(sys.argv[1])
