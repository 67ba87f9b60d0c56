"""The recognize_causal_masks pass on CPU in float32: an attention call handed a mask that the
graph builds from token positions (``arange`` comparisons, as Hugging Face's masking_utils builds
it under a trace) gets ``is_causal`` instead, when the mask is the causal one; every other mask
(an offset diagonal, the upper triangle, a padding mask from the caller) is kept. Numerics
against eager on fresh inputs either way."""

from __future__ import annotations

import copy
import json
import os
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from magi_compiler import inspection, magi_compile
from magi_compiler.inspection import last_compiled

SEQ = 12
CPU_ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


def _masks(kind: str, t: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(t, device=device)
    if kind == "le":  # keys at or before the query: the causal mask
        return pos[None, :] <= pos[:, None]
    if kind == "lt_plus_one":  # the same mask, written with < and an offset
        return pos[None, :] < pos[:, None] + 1
    if kind == "additive":  # 0 on and below the diagonal, -inf above
        return torch.zeros(t, t, device=device).masked_fill(pos[None, :] > pos[:, None], -torch.inf)
    if kind == "finfo_min":  # Hugging Face's eager mask value
        keep = (pos[:, None] - pos[None, :]) >= 0
        return torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    if kind == "all":  # keeps every entry
        return torch.ones(t, t, dtype=torch.bool, device=device)
    if kind == "offset":  # one key ahead of the query as well: not causal
        return pos[None, :] <= pos[:, None] + 1
    if kind == "upper":  # keys at or after the query
        return pos[None, :] >= pos[:, None]
    if kind == "float_positions":  # float positions round past 2**24: not followed
        fpos = torch.arange(t, device=device, dtype=torch.float32)
        return fpos[None, :] <= fpos[:, None]
    raise ValueError(kind)


class MaskedAttention(nn.Module):
    def __init__(self, kind: str, dim: int = 64, heads: int = 4):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, keep=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = _masks(self.kind, t, x.device)[None, None]
        if keep is not None:  # a padding mask from the caller
            mask = mask & keep[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def _attention_lines() -> list[str]:
    text = str(last_compiled().graph)
    return [line for line in text.splitlines() if "scaled_dot_product" in line]


def _mask_decisions() -> list[dict]:
    return [p for p in inspection.attention_patterns() if p.get("pass") == "recognize_causal_masks"]


@pytest.mark.parametrize("kind", ["le", "lt_plus_one", "additive", "finfo_min"])
def test_a_causal_mask_built_from_positions_becomes_is_causal(kind, assert_close_rel):
    inspection.clear()
    torch.manual_seed(0)
    eager = MaskedAttention(kind).eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for batch in (1, 3):
            x = torch.randn(batch, SEQ, 64)
            assert_close_rel(compiled(x), eager(x), 1e-5)
    (line,) = _attention_lines()
    assert f"{CPU_ATTENTION}(" in line and ", 0.0, True, None, " in line, line
    assert f"{SEQ}, {SEQ}]" not in str(last_compiled().graph)  # the mask is gone
    decisions = _mask_decisions()
    assert decisions and all(d["rewritten"] for d in decisions), decisions
    assert decisions[-1]["detail"] == (
        f"{CPU_ATTENTION} with is_causal instead of a causal mask built from token positions"
    )
    assert "test_causal_masks.py" in decisions[-1]["where"], decisions  # the SDPA call's line


def test_a_mask_that_keeps_everything_is_dropped(assert_close_rel):
    inspection.clear()
    torch.manual_seed(1)
    eager = MaskedAttention("all").eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = torch.randn(2, SEQ, 64)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    (line,) = _attention_lines()
    assert ", 0.0, False, None, " in line, line
    assert _mask_decisions()[-1]["detail"].endswith("without its mask (it keeps every entry)")


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("offset", "the mask's diagonal is offset by 1 (a cached prefix or another alignment)"),
        ("upper", "the mask keeps the upper triangle (keys at or after the query), not the lower"),
        ("float_positions", "the mask is built by operators the pass does not follow"),
    ],
)
def test_other_position_masks_are_kept_with_the_reason(kind, reason, assert_close_rel):
    inspection.clear()
    torch.manual_seed(2)
    eager = MaskedAttention(kind).eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = torch.randn(2, SEQ, 64)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    (line,) = _attention_lines()
    assert ", True, None, " not in line, line
    (decision,) = _mask_decisions()
    assert not decision["rewritten"]
    assert decision["detail"].endswith("keeps its mask: " + reason), decision


def test_a_padding_mask_from_the_caller_is_kept_and_not_recorded(assert_close_rel):
    inspection.clear()
    torch.manual_seed(3)
    eager = MaskedAttention("le").eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = torch.randn(2, SEQ, 64)
        keep = torch.ones(2, SEQ, dtype=torch.bool)
        keep[0, :3] = False
        got, want = compiled(x, keep), eager(x, keep)
        assert_close_rel(got[keep], want[keep], 1e-5)
    (line,) = _attention_lines()
    assert ", True, None, " not in line, line
    assert _mask_decisions() == []


def test_disabled_by_name_keeps_the_mask(assert_close_rel):
    torch.manual_seed(4)
    eager = MaskedAttention("le").eval()
    compiled = magi_compile(
        copy.deepcopy(eager),
        config_patch={"pass_config": {"disabled_passes": ["recognize_causal_masks"]}},
    )
    with torch.no_grad():
        x = torch.randn(2, SEQ, 64)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    (line,) = _attention_lines()
    assert ", True, None, " not in line, line


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_hugging_face_sdpa_models_attend_causally_without_a_mask(
    family, tmp_path, monkeypatch, assert_close_rel
):
    """A transformers decoder with its default SDPA attention: under a trace its masking_utils
    builds the [1, 1, S, S] mask from positions; every layer's call gets is_causal instead, the
    timeline counts them, and the logits match eager at batch 1 and 3."""
    pytest.importorskip("transformers")
    from benchmarks import zoo_models

    monkeypatch.setenv("MAGI_ENABLE_FX_GRAPH_VIZ", "1")
    monkeypatch.setenv("MAGI_DUMP_DIR", str(tmp_path))
    inspection.clear()
    fam = zoo_models.FAMILIES[family]
    eager = zoo_models.build(fam, "tiny", "cpu", torch.float32, seed=5)
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for batch in (1, 3):
            ids = torch.randint(0, eager.config.vocab_size, (batch, 2 * SEQ))
            want = eager(input_ids=ids, use_cache=False).logits
            assert_close_rel(compiled(input_ids=ids, use_cache=False).logits, want, 1e-5)
    lines = _attention_lines()
    layers = eager.config.num_hidden_layers
    assert len(lines) == layers and all(", True, None, " in ln for ln in lines), lines
    assert f"{2 * SEQ}, {2 * SEQ}]" not in str(last_compiled().graph)
    decisions = _mask_decisions()
    assert len(decisions) >= layers and all(d["rewritten"] for d in decisions), decisions
    dumps = sorted(os.listdir(tmp_path))
    with open(tmp_path / dumps[-1] / "timeline.txt", encoding="utf-8") as f:
        line = next(ln for ln in f if "pass recognize_causal_masks" in ln)
    assert f"{layers} attention masks replaced" in line, line
    with open(
        tmp_path / dumps[-1] / "attention_patterns" / "inference.json", encoding="utf-8"
    ) as f:
        assert all(p["pass"] == "recognize_causal_masks" for p in json.load(f))


def test_a_sequence_length_that_changes_keeps_is_causal(assert_close_rel):
    """A prompt of another length makes the sequence dim dynamic (automatic dynamic). The
    dynamic capture builds the positions with a symbolic length (a concatenation whose last
    piece has no fixed size) and transformers' packed-sequence check from them; the mask is
    still the causal one, and every layer gets is_causal."""
    pytest.importorskip("transformers")
    from benchmarks import zoo_models

    torch._dynamo.reset()  # automatic dynamic starts from this test's sizes
    fam = zoo_models.FAMILIES["llama"]
    eager = zoo_models.build(fam, "tiny", "cpu", torch.float32, seed=6)
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for length in (2 * SEQ, 3 * SEQ, 4 * SEQ):
            ids = torch.randint(0, eager.config.vocab_size, (1, length))
            want = eager(input_ids=ids, use_cache=False).logits
            assert_close_rel(compiled(input_ids=ids, use_cache=False).logits, want, 1e-5)
    header = str(last_compiled().graph).splitlines()[0]
    assert re.search(r"i64\[1, s\d+\]", header), header  # the ids' length is symbolic
    lines = _attention_lines()
    assert len(lines) == eager.config.num_hidden_layers, lines
    assert all(", True, None, " in line for line in lines), lines
