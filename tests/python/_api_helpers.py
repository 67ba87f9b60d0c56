"""Models and helpers shared by test_api.py and test_api_runtime.py."""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from magi_compiler import get_counters
from torch import nn

H, SEQ = 16, 4
BATCHES = (2, 3, 5)
RTOL = 1e-5


class Tiny(nn.Module):
    """A small residual MLP with a norm: linear, pointwise and reduction ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(H, 2 * H)
        self.fc2 = nn.Linear(2 * H, H)
        self.norm = nn.LayerNorm(H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(F.gelu(self.fc1(x))))


def tiny_fn(x: torch.Tensor, weight, bias):  # only x is annotated: only x gets a dynamic dim
    return F.layer_norm(x + F.silu(x @ weight + bias), (x.shape[-1],))


def pointwise(x):
    return torch.tanh(x) * 2 + x.mean(-1, keepdim=True)


def inputs(b: int, *rest: int, **kwargs) -> torch.Tensor:
    return torch.randn(b, *(rest or (SEQ, H)), **kwargs)


def captures() -> int:
    return get_counters().captures


@contextlib.contextmanager
def no_magi_warnings():
    """Fails the test on any magi_compiler warning inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="magi_compiler")
        yield


def assert_training_step_matches(model, eager, eager_forward, x, assert_close_rel) -> None:
    """One forward and backward of ``model`` and of ``eager_forward(eager, ...)`` on copies of
    ``x``: outputs, input gradients and parameter gradients agree; gradients are then reset."""
    x_eager, x_comp = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_eager, out_comp = eager_forward(x_eager), model(x_comp)
    assert out_comp.requires_grad
    assert_close_rel(out_comp, out_eager, RTOL)
    grad = torch.randn_like(out_eager)
    out_eager.backward(grad)
    out_comp.backward(grad)
    assert_close_rel(x_comp.grad, x_eager.grad, 1e-4)
    for (name, p_comp), p_eager in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert p_comp.grad is not None, name
        assert_close_rel(p_comp.grad, p_eager.grad, 1e-4)
    model.zero_grad()
    eager.zero_grad()
