"""The decomposition table handed to AOTAutograd.

AOTAutograd always applies PyTorch's CompositeImplicitAutograd decompositions (``F.linear`` →
``aten.t`` + ``aten.addmm``, ``F.scaled_dot_product_attention`` → the backend's SDPA op, ...);
this table adds ours on top. The executor can run any ATen op, so the table exists to give
later passes (fusion) a small, stable op set, not for correctness. It is deliberately empty
until the fusion pass needs it: every decomposition changes numerics slightly and costs
compile time, so one is added only with the pass that benefits from it.
"""

from __future__ import annotations

from typing import Any


def decomposition_table() -> dict[Any, Any]:
    return {}
