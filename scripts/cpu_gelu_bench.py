"""CPU timing of a fused GELU pattern, F.gelu(x + b, approximate=...) * 1.5 on [512, 3072]
float32: eager against magi_compile's generated C++ kernel, median of 20 calls after 3
warm-ups, for both GELU forms. Behind the GELU figures of
benchmarks/results/extra/cpu_bandwidth_silu_vectorized_exp.json."""

import time

import torch
import torch.nn.functional as F
from magi_compiler import magi_compile
from torch import nn


class Gelu(nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + b, approximate=self.approximate) * 1.5


def median_ms(fn, *args, n: int = 20) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2] * 1e3


x, b = torch.randn(512, 3072), torch.randn(3072)
with torch.no_grad():
    for approximate in ("tanh", "none"):
        eager = Gelu(approximate)
        compiled = magi_compile(Gelu(approximate), dynamic_arg_dims={})
        err = (compiled(x, b) - eager(x, b)).abs().max().item()
        print(f"gelu approximate={approximate}: eager {median_ms(eager, x, b):.2f} ms, "
              f"magi_compile {median_ms(compiled, x, b):.2f} ms, max abs err {err:.1e}")  # fmt: skip
