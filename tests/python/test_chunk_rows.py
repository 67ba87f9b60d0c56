"""The chunk_rows pass on CPU in float32: an MLP-like stretch of row-wise work (norm, matmuls into
a wider hidden size, activation, matmul back, residual) runs as a piece called over chunks of
rows when a call has more rows than ``chunk_rows``; results match eager at lengths that are and
are not multiples of the chunk, below the threshold, at dynamic batch sizes, and on Hugging Face
models from the zoo."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from magi_compiler import magi_compile
from magi_compiler.errors import UserError
from magi_compiler.inspection import last_compiled


class MLPBlock(nn.Module):
    def __init__(self, dim: int = 32, hidden: int = 128):
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Stack(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(MLPBlock() for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo remembers the sizes a code object was called with (automatic dynamic): each test
    starts from none, so its first call compiles with static sizes."""
    torch._dynamo.reset()


def _chunked_calls() -> list[str]:
    return [ln for ln in str(last_compiled().graph).splitlines() if " in chunks of " in ln]


@pytest.mark.parametrize("seq", [100, 64], ids=["ragged", "multiple"])
def test_a_long_call_runs_the_mlp_in_row_chunks(seq, assert_close_rel):
    torch.manual_seed(0)
    eager = Stack().eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"chunk_rows": 16})
    with torch.no_grad():
        x = torch.randn(1, seq, 32)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    calls = _chunked_calls()
    assert len(calls) == 1, calls  # both layers: one region, one piece call
    assert f"f32[{seq}, 32] = piece_0(" in calls[0] and "in chunks of 16 rows of" in calls[0]


def test_batch_and_sequence_both_dynamic(assert_close_rel):
    """After calls of different batch and length, both dims are symbolic: the rows are their
    product, and the results' shapes are read back from an input at run time."""
    torch.manual_seed(4)
    eager = Stack().eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"chunk_rows": 16})
    with torch.no_grad():
        for batch, seq in ((1, 40), (2, 40), (2, 50), (3, 37)):
            x = torch.randn(batch, seq, 32)
            assert_close_rel(compiled(x), eager(x), 1e-5)
    (call,) = _chunked_calls()
    assert "*s" in call.split(" = ")[0], call


def test_dynamic_batches_are_chunked_per_call(assert_close_rel):
    """Batch 1 compiles static; batch 3 recaptures with a symbolic batch, whose rows are
    chunked (or not) per call: 3 x 20 rows and 5 x 20 rows both match eager."""
    torch.manual_seed(1)
    eager = Stack().eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"chunk_rows": 16})
    with torch.no_grad():
        for batch in (1, 3, 5):
            x = torch.randn(batch, 20, 32)
            assert_close_rel(compiled(x), eager(x), 1e-5)
    (call,) = _chunked_calls()
    assert "f32[20*s" in call, call  # rows: 20 times the symbolic batch


def test_short_static_calls_and_chunk_rows_zero_are_not_chunked(assert_close_rel):
    torch.manual_seed(2)
    eager = Stack().eval()
    for rows, seq in ((16, 20), (0, 100)):  # 20 rows < 2 x 16; chunk_rows=0: off
        compiled = magi_compile(copy.deepcopy(eager), config_patch={"chunk_rows": rows})
        with torch.no_grad():
            x = torch.randn(1, seq, 32)
            assert_close_rel(compiled(x), eager(x), 1e-5)
        assert _chunked_calls() == []


def test_disabled_by_name(assert_close_rel):
    torch.manual_seed(3)
    eager = Stack().eval()
    patch = {"chunk_rows": 16, "pass_config": {"disabled_passes": ["chunk_rows"]}}
    compiled = magi_compile(copy.deepcopy(eager), config_patch=patch)
    with torch.no_grad():
        x = torch.randn(1, 100, 32)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    assert _chunked_calls() == []


def test_a_negative_chunk_rows_is_a_user_error():
    with pytest.raises(UserError, match=r"chunk_rows=-1 is not a row count \(an int >= 0"):
        magi_compile(Stack(), config_patch={"chunk_rows": -1})


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2", "bert"])
def test_hugging_face_models_match_eager_with_small_chunks(family, assert_close_rel):
    """The zoo's tiny models at 70 tokens with 16-row chunks: whatever the pass outlines (their
    last layer's MLP, whose intermediates outweigh its inputs and outputs) matches eager, at
    batch 1 and at a dynamic batch of 3."""
    pytest.importorskip("transformers")
    from benchmarks import zoo_models

    fam = zoo_models.FAMILIES[family]
    eager = zoo_models.build(fam, "tiny", "cpu", torch.float32, seed=6)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"chunk_rows": 16})
    with torch.no_grad():
        for batch in (1, 3):
            kwargs = {"input_ids": torch.randint(0, 100, (batch, 70))}
            if fam.has_cache:
                kwargs["use_cache"] = False
            assert_close_rel(compiled(**kwargs)[0], eager(**kwargs)[0], 1e-5)
    assert _chunked_calls(), str(last_compiled().graph)
