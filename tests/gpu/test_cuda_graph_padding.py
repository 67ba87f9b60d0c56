"""CUDA-graph size buckets on the GPU: batches padded up to the next ladder size run in that
size's graph and return exactly their own rows (numerics against eager on fresh inputs), one
graph per bucket however many batch sizes fall in it, held outputs stay valid, the ladder comes
from compile_sizes, padding can be turned off, and graphs that cannot be padded say why."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from magi_compiler import magi_compile, magi_register_custom_op
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _llama(dtype):
    import blocks

    torch.backends.cuda.matmul.allow_tf32 = False
    m = blocks.LlamaStack(2, hidden=256, n_heads=8, n_kv_heads=4, intermediate=512)
    blocks.init_weights_(m, seed=0)
    return m.to("cuda", dtype).eval()


@magi_register_custom_op(
    name="magi_t_pad_cuda::attention",
    infer_output_meta_fn=["q"],
    is_subgraph_boundary=True,
    is_compute_sensitive=True,
)
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class SplitDiT(nn.Module):
    """Two DiT blocks whose attention is a registered boundary op: PIECEWISE graphs capture
    the pieces around it, and the op itself runs eagerly at the call's own batch size."""

    def __init__(self) -> None:
        super().__init__()
        import blocks

        self.blocks = nn.ModuleList(blocks.DiTBlock(256, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            q, k, v = b.qkv_heads(x)
            x = b.finish(x, torch.ops.magi_t_pad_cuda.attention(q, k, v))
        return x


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_full_graphs_pad_batches_into_buckets(dtype, rtol, counters, lowered, assert_close_rel):
    eager = _llama(dtype)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    # Default ladder 1, 2, 4, 8, 16, ...: 3 -> 4, 5 -> 8, 7 -> 8, 4 and 8 exact.
    with torch.no_grad():
        for batch in (3, 5, 4, 7, 8, 3, 5, 7, 4, 8, 3):
            x = torch.randn(batch, 16, 256, device="cuda", dtype=dtype)
            y = compiled(x)
            assert y.shape == x.shape
            assert y.is_contiguous()
            assert_close_rel(y, eager(x), rtol)
    runner = lowered[0].magi_cuda_graphs
    assert runner.pads
    assert lowered[0].magi_executable.padding.endswith(
        "inputs 0 (x1), 1 (x1); outputs 0 (dim 0, x1)"
    )
    assert runner.num_graphs == 2  # buckets 4 and 8, whatever batch filled them first
    assert runner.num_captures == 2
    assert runner.num_padded_calls == 7  # the calls with 3, 5 and 7
    assert runner.num_replays == 9  # all but the two warm-ups (calls 1 and 2)


def test_padded_outputs_held_across_calls(counters, lowered):
    eager = _llama(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        xs = [torch.randn(b, 16, 256, device="cuda") for b in (3, 3, 4, 3, 2, 2, 4, 3)]
        outs = [compiled(x) for x in xs]
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, eager(x), rtol=1e-4, atol=1e-4)
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_graphs == 2  # 3 and 4 share bucket 4; 2 has its own
    assert runner.num_padded_calls == 4  # the four calls with 3


def test_compile_sizes_is_the_ladder(counters, lowered, assert_close_rel):
    eager = _llama(torch.float32)
    compiled = magi_compile(
        copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL", "compile_sizes": [16, 6]}
    )
    with torch.no_grad():
        # 2, 5, 6 -> 6; 7, 16 -> 16; 17 is above the ladder: its own exact-size graph.
        for batch in (2, 5, 6, 7, 16, 17, 2, 7, 17, 5):
            x = torch.randn(batch, 16, 256, device="cuda")
            assert_close_rel(compiled(x), eager(x), 1e-4)
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_graphs == 3
    assert runner.num_padded_calls == 6  # 2, 5, 7, 2, 7, 5


def test_padding_off_captures_each_size(counters, lowered, assert_close_rel):
    eager = _llama(torch.float32)
    compiled = magi_compile(
        copy.deepcopy(eager),
        config_patch={"cudagraph_mode": "FULL", "cudagraph_padding": False},
    )
    with torch.no_grad():
        for batch in (3, 4, 3, 4, 3):
            x = torch.randn(batch, 16, 256, device="cuda")
            assert_close_rel(compiled(x), eager(x), 1e-4)
    runner = lowered[0].magi_cuda_graphs
    assert not runner.pads
    assert runner.num_graphs == 2
    assert runner.num_padded_calls == 0


def test_piecewise_pads_each_piece(counters, lowered, assert_close_rel):
    torch.backends.cuda.matmul.allow_tf32 = False
    eager = SplitDiT().cuda().eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "PIECEWISE"})
    with torch.no_grad():
        for batch in (3, 4, 3, 5, 7, 3):
            x = torch.randn(batch, 32, 256, device="cuda")
            assert_close_rel(compiled(x), eager(x), 1e-4)
    exe = lowered[0].magi_executable
    assert exe.num_pieces >= 2
    assert all(p.startswith("s") for p in exe.piece_paddings), exe.piece_paddings
    assert exe.num_piece_padded_calls > 0
    # Buckets 4 and 8 per distinct piece: 3 and 4 share one graph, 5 and 7 another.
    assert exe.num_piece_graph_captures == 2 * exe.num_pieces


def test_replaced_parameter_recaptures_padded_graph(counters, lowered, assert_close_rel):
    eager = _llama(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(3, 16, 256, device="cuda"))
        captures = lowered[0].magi_cuda_graphs.num_captures
        new = torch.nn.Parameter(torch.randn(256, 256, device="cuda") * 0.02)
        for m in (eager, compiled):
            m.layers[0].o_proj.weight = copy.deepcopy(new)
        for _ in range(3):
            x = torch.randn(3, 16, 256, device="cuda")
            assert_close_rel(compiled(x), eager(x), 1e-4)
    # The moved parameter drops the padded graph (or Dynamo recompiles): either way a new
    # capture reads the new weight.
    assert sum(run.magi_cuda_graphs.num_captures for run in lowered) > captures


class OffsetLookup(nn.Module):
    """Reads a table at ids - 20: the caller's ids are in [10, 20), so zeros in the padding
    rows would index out of range; padding rows must be valid inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(10, 64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids - 20] * 2


def test_padding_rows_are_valid_inputs(counters, lowered):
    eager = OffsetLookup().cuda().eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        for batch in (3, 3, 3, 4, 3):
            ids = torch.randint(10, 20, (batch, 16), device="cuda")
            torch.testing.assert_close(compiled(ids), eager(ids))
    torch.cuda.synchronize()
    assert lowered[0].magi_cuda_graphs.num_padded_calls == 4


class RowsAndColumns(nn.Module):
    """Outputs batched in two ways: 16 rows per sample ([b * 16, 64]) and along dim 1."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.gelu(self.lin(x))
        return h.reshape(-1, 64), h.transpose(0, 1) * 3


def test_outputs_with_rows_per_sample_and_batch_in_dim_1(counters, lowered):
    eager = RowsAndColumns().cuda().eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        for batch in (5, 6, 5, 7, 5):
            x = torch.randn(batch, 16, 64, device="cuda")
            got, want = compiled(x), eager(x)
            for g, w in zip(got, want, strict=True):
                assert g.shape == w.shape
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_graphs == 1  # all in bucket 8
    assert runner.num_padded_calls == 5
    assert "(dim 0, x16)" in lowered[0].magi_executable.padding


class MixesBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return h - h.mean(0)  # every row reads every other row: padding would change it


def test_unpaddable_graph_runs_exact_sizes_and_says_why(counters, lowered, caplog):
    eager = MixesBatch().cuda().eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with caplog.at_level(logging.INFO, logger="magi_compiler"), torch.no_grad():
        for batch in (3, 3, 3, 5, 5):
            x = torch.randn(batch, 64, device="cuda")
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
    runner = lowered[0].magi_cuda_graphs
    assert not runner.pads
    assert runner.num_padded_calls == 0
    assert "works across the batch dim (dim 0)" in lowered[0].magi_executable.padding
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "captured exactly, not padded into buckets" in m and "aten::mean.dim" in m for m in messages
    ), messages
