"""Model definitions for the benchmark suite: random weights, no downloads.

The Llama-style stack is ``blocks.LlamaStack`` from ``examples/blocks.py`` (put on ``sys.path``
by ``benchmarks/run.py``); the rest lives here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .bert import BertConfig, BertForMLM
from .causal_lm import GPT2_SMALL, LLAMA_3_2_1B, CausalLM, LMConfig
from .dit import DiTBlock
from .micro import MICRO, MicroSpec, make_micro

__all__ = [
    "BertConfig",
    "BertForMLM",
    "CausalLM",
    "DiTBlock",
    "GPT2_SMALL",
    "LLAMA_3_2_1B",
    "LMConfig",
    "MICRO",
    "MicroSpec",
    "MSELossHead",
    "make_micro",
]


class MSELossHead(nn.Module):
    """``forward(x, target) -> mse(model(x), target)`` in float32: a training step's whole
    forward as one module, so the compiled region ends at the loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.model(x).float(), target.float())
