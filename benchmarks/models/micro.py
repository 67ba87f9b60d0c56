"""Memory-bound microbenchmarks: one transformer pointwise or row-reduction pattern each.

Each module maps ``(rows, cols)`` tensors to tensors of the same shape; :data:`MICRO` gives, for
each, the module class, how many full-size tensors it takes, and how many full-size tensors a
call must read plus write at the least (per-row weights are ignored: they are ``cols``
elements). Effective bandwidth = that many bytes / time; the device copy is the ceiling.
The RMSNorm is written out as Llama writes it (blocks.RMSNorm: float32 math, four or five
eager kernels); LayerNorm and softmax are PyTorch's single fused kernels, which eager already
runs in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from blocks import RMSNorm
from torch import nn


class SiluMul(nn.Module):
    """SwiGLU's pointwise part: ``silu(a) * b``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(a) * b


class AddRMSNorm(nn.Module):
    """Residual add then RMSNorm; returns the normed value and the new residual."""

    def __init__(self, cols: int) -> None:
        super().__init__()
        self.norm = RMSNorm(cols)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + residual
        return self.norm(h), h


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class Copy(nn.Module):
    """``out.copy_(x)`` into a preallocated output: the device's copy bandwidth."""

    def __init__(self) -> None:
        super().__init__()
        self.out: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.out is None or self.out.shape != x.shape or self.out.device != x.device:
            self.out = torch.empty_like(x)
        return self.out.copy_(x)


@dataclass(frozen=True)
class MicroSpec:
    make: type | None  # called with cols when it takes it, else with nothing
    n_inputs: int
    tensors_moved: int  # full-size tensors read + written per call
    takes_cols: bool = False
    compile: bool = True  # False: a reference measured eagerly only (the copy)


MICRO: dict[str, MicroSpec] = {
    "silu_mul": MicroSpec(SiluMul, 2, 3),
    "rmsnorm": MicroSpec(RMSNorm, 1, 2, takes_cols=True),
    "add_rmsnorm": MicroSpec(AddRMSNorm, 2, 4, takes_cols=True),
    "layernorm": MicroSpec(nn.LayerNorm, 1, 2, takes_cols=True),
    "softmax": MicroSpec(Softmax, 1, 2),
    "copy": MicroSpec(Copy, 1, 2, compile=False),
}


def make_micro(name: str, cols: int) -> nn.Module:
    spec = MICRO[name]
    return spec.make(cols) if spec.takes_cols else spec.make()
