"""Models whose annotations are strings (``from __future__ import annotations`` is per file),
for the dynamic-dim inference tests in test_api.py.

``TypeCheckingOnly`` annotates with a name imported only under ``TYPE_CHECKING``, so its
annotations cannot be resolved at run time and inference has to read their text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

if TYPE_CHECKING:
    from torch import Tensor


class Plain(nn.Module):
    """``x: torch.Tensor`` → dim 0 of ``x``; ``scale: float`` is not a tensor."""

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return torch.tanh(x) * scale


class WithOptional(nn.Module):
    """``Optional[torch.Tensor]`` → dim 0; ``table`` is unannotated, so it stays static."""

    def forward(
        self,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,  # noqa: UP045 - the spelling under test
        table=None,
    ):
        y = x * 2 if mask is None else x * mask[..., None]
        return y if table is None else y + table.sum()


class WithUnion(nn.Module):
    """``torch.Tensor | None`` → dim 0."""

    def forward(self, x: torch.Tensor | None, residual: torch.Tensor | None = None):
        return x + 1 if residual is None else x + residual


class TypeCheckingOnly(nn.Module):
    """``Tensor`` exists only for type checkers: ``typing.get_type_hints`` fails here."""

    def forward(self, x: Tensor, n: int = 3) -> Tensor:
        return x.relu() * n
