"""Modules that update one of their buffers in a call, for the tests of the
write_inputs_in_place pass (src/passes/write_inputs_in_place.cpp) on the CPU
(tests/python/test_input_updates.py) and on CUDA (tests/gpu/test_input_updates_cuda.py).

Each module's ``forward(x, pos)`` writes rows of ``x``'s projections into a buffer at positions
``pos`` (a tensor, as a decode loop passes it) and reads the whole buffer back. ``run_steps``
runs a prefill and then decode steps through a compiled module and an eager twin, comparing
the results and every buffer after each step.
"""

from __future__ import annotations

import copy

import torch
from magi_compiler import inspection, magi_compile
from torch import nn

HEADS, SLOTS, DIM = 2, 16, 8


class IndexCopyCache(nn.Module):
    """A static key/value cache as Hugging Face's StaticCache writes it (``index_copy_``),
    attended over in full under a mask of the positions written so far."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.q = nn.Linear(hidden, HEADS * DIM, bias=False)
        self.kv = nn.Linear(hidden, 2 * HEADS * DIM, bias=False)
        self.out = nn.Linear(HEADS * DIM, hidden, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, HEADS, SLOTS, DIM), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, HEADS, SLOTS, DIM), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, HEADS, DIM).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, HEADS, DIM).transpose(1, 3).unbind(2)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        scores = q @ self.k_cache.transpose(-1, -2) / DIM**0.5
        seen = torch.arange(SLOTS, device=x.device)[None, :] <= pos[:, None]
        scores = scores.masked_fill(~seen, float("-inf"))
        o = scores.softmax(-1) @ self.v_cache
        return self.out(o.transpose(1, 2).reshape(b, s, HEADS * DIM))


class _ProjectedBuffer(nn.Module):
    """A projection of ``x`` to DIM values and one buffer of ``shape``, which the subclass's
    ``update`` writes; a call returns a product of ``x`` with the updated buffer."""

    def __init__(self, shape: tuple[int, ...], hidden: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, DIM, bias=False)
        self.register_buffer("buf", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.update(self.proj(x)[0], pos)  # rows: (s, DIM)
        return x @ self.proj.weight.t() @ self.read()

    def read(self) -> torch.Tensor:  # (DIM, DIM) of the buffer
        return self.buf[:DIM]


class IndexPutCache(_ProjectedBuffer):
    """A cache written by indexing assignment (``cache[pos] = v``: aten::index_put_)."""

    def __init__(self) -> None:
        super().__init__((SLOTS, DIM))

    def update(self, rows: torch.Tensor, pos: torch.Tensor) -> None:
        self.buf[pos] = rows


class ScatterBuffer(_ProjectedBuffer):
    """A running table updated with ``scatter_`` along dim 1."""

    def __init__(self) -> None:
        super().__init__((DIM, SLOTS))

    def update(self, rows: torch.Tensor, pos: torch.Tensor) -> None:
        self.buf.scatter_(1, pos[None, :].expand(DIM, -1), rows.transpose(0, 1))

    def read(self) -> torch.Tensor:
        return self.buf[:, :DIM]


class IndexAddTotals(_ProjectedBuffer):
    """Running totals per slot, accumulated with ``index_add_`` (positions may repeat)."""

    def __init__(self) -> None:
        super().__init__((SLOTS, DIM))

    def update(self, rows: torch.Tensor, pos: torch.Tensor) -> None:
        self.buf.index_add_(0, pos % 3, rows)


class ScatterAddHistogram(ScatterBuffer):
    """A table of sums per slot, accumulated with ``scatter_add_``."""

    def update(self, rows: torch.Tensor, pos: torch.Tensor) -> None:
        self.buf.scatter_add_(1, pos[None, :].expand(DIM, -1), rows.transpose(0, 1))


class MaskedScatterSlots(_ProjectedBuffer):
    """The slots at ``pos`` filled from a projection with ``masked_scatter_``."""

    def __init__(self) -> None:
        super().__init__((SLOTS, DIM))

    def update(self, rows: torch.Tensor, pos: torch.Tensor) -> None:
        mask = torch.zeros(SLOTS, 1, dtype=torch.bool, device=rows.device)
        mask[pos] = True
        self.buf.masked_scatter_(mask.expand(SLOTS, DIM), rows)


class ReadsOldValues(IndexCopyCache):
    """Reads the cache before the update too: the update stays a copy (the pass leaves it)."""

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        before = self.k_cache.sum(2, keepdim=True)  # (1, HEADS, 1, DIM)
        out = super().forward(x, pos)
        return out + before.flatten()[: out.shape[-1]]


MODELS = {
    "index_copy": IndexCopyCache,
    "index_put": IndexPutCache,
    "scatter": ScatterBuffer,
    "index_add": IndexAddTotals,
    "scatter_add": ScatterAddHistogram,
    "masked_scatter": MaskedScatterSlots,
    "reads_old_values": ReadsOldValues,
}
# The in-place op each model's update becomes.
IN_PLACE = {
    "index_copy": "aten::index_copy_",
    "index_put": "aten::index_put_",
    "scatter": "aten::scatter_.src",
    "index_add": "aten::index_add_",
    "scatter_add": "aten::scatter_add_",
    "masked_scatter": "aten::masked_scatter_",
}


def run_steps(name, device, dtype, assert_close_rel, rtol, config_patch=None, decode_steps=4):
    """Prefill 4 positions, then ``decode_steps`` single positions, through a compiled module
    and an eager twin (same weights); compares results and buffers after every step. Returns
    the text of the last compiled inference graph."""
    torch.manual_seed(0)
    eager = MODELS[name]().to(device, dtype).eval()
    compiled = magi_compile(
        copy.deepcopy(eager), dynamic_arg_dims={}, config_patch=config_patch or None
    )
    texts = []
    with torch.no_grad():
        steps = [torch.arange(0, 4)] + [torch.tensor([4 + i]) for i in range(decode_steps)]
        for pos in steps:
            pos = pos.to(device)
            x = torch.randn(1, pos.numel(), 16, device=device, dtype=dtype)
            assert_close_rel(compiled(x, pos), eager(x, pos), rtol)
            for got, want in zip(compiled.buffers(), eager.buffers(), strict=True):
                assert_close_rel(got, want, rtol)
            info = inspection.last_compiled("inference")
            texts.append(str(info.graph))
    return texts[-1]
