"""The recognize_attention pass end to end on CPU in float32: attention written out as research
code writes it (``q @ k.transpose(-2, -1) * scale``, a ``torch.tril(torch.ones(...))`` causal
mask applied with ``masked_fill``, the softmax in float32 then cast back, ``@ v``; a
grouped-query variant with ``repeat_kv``; a padding mask passed in; Hugging Face's eager
attention with its additive mask) compiles to one fused attention call without the sequence x
sequence scores, and matches eager; a variant the pass must not touch (a padding mask filled
with a finite value) is left as written and still matches."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from magi_compiler import magi_compile
from magi_compiler.inspection import last_compiled

SEQ = 12  # distinct from the head dim, so a [.., 12, 12] type can only be the scores
HEAD_DIM = 16
ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


class WrittenOutAttention(nn.Module):
    def __init__(self, dim=64, heads=4, kv_heads=4, causal=True, fill=float("-inf")):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.causal, self.fill = causal, fill
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)

    def repeat_kv(self, x):
        b, h, t, d = x.shape
        r = self.heads // self.kv_heads
        if r == 1:
            return x
        return x[:, :, None, :, :].expand(b, h, r, t, d).reshape(b, h * r, t, d)

    def forward(self, x, keep=None):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        att = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.head_dim))
        if self.causal:
            mask = torch.tril(torch.ones(t, t, device=x.device))
            att = att.masked_fill(mask == 0, float("-inf"))
        if keep is not None:
            att = att.masked_fill(~keep[:, None, None, :], self.fill)
        att = F.softmax(att.float(), dim=-1).type_as(q)
        y = att @ v
        return self.o(y.transpose(1, 2).contiguous().view(b, t, -1))


def _graph_text() -> str:
    return str(last_compiled().graph)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_written_out_attention_becomes_one_call(kv_heads, causal, assert_close_rel):
    torch.manual_seed(0)
    eager = WrittenOutAttention(kv_heads=kv_heads, causal=causal).eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for batch in (2, 3):
            x = torch.randn(batch, SEQ, 64)
            assert_close_rel(compiled(x), eager(x), 1e-5)
    text = _graph_text()
    assert text.count(ATTENTION + "(") == 1, text
    assert f"{SEQ}, {SEQ}]" not in text, text  # no scores, masks or weights
    assert "aten::bmm" not in text and "aten::_softmax" not in text, text
    assert f", {causal}, None, 0.25)" in text, text  # is_causal, no mask, 1/sqrt(16)


def test_disabled_by_name_keeps_the_written_out_chain(assert_close_rel):
    torch.manual_seed(1)
    eager = WrittenOutAttention().eval()
    off = {"pass_config": {"disabled_passes": ["recognize_attention"]}}
    compiled = magi_compile(copy.deepcopy(eager), config_patch=off)
    with torch.no_grad():
        x = torch.randn(2, SEQ, 64)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    text = _graph_text()
    assert ATTENTION not in text and "aten::bmm" in text, text


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_a_padding_mask_passed_in_becomes_the_attn_mask(causal, assert_close_rel):
    """A boolean mask input applied with masked_fill(-inf) is SDPA's attn_mask, negated (SDPA
    keeps the true entries); with a causal mask too, the two are combined into one (SDPA takes
    is_causal or a mask, not both)."""
    torch.manual_seed(2)
    eager = WrittenOutAttention(causal=causal).eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for batch in (2, 3):
            x = torch.randn(batch, SEQ, 64)
            keep = torch.rand(batch, SEQ) > 0.3
            keep[:, 0] = True  # no row without a key (eager gives NaN there, SDPA zeros)
            assert_close_rel(compiled(x, keep), eager(x, keep), 1e-5)
    text = _graph_text()
    assert text.count("aten::scaled_dot_product_attention(") == 1, text
    assert "aten::logical_not(" in text, text
    assert ("aten::logical_or(" in text) == causal, text  # the causal mask joins the padding
    assert "aten::bmm" not in text and "aten::_softmax" not in text, text


def test_a_padding_mask_filled_with_a_finite_value_is_left_alone(assert_close_rel):
    """masked_fill(mask, -1e4) of a mask the pass cannot read: SDPA would fill -inf (a row
    with every key masked would differ), so the chain stays."""
    torch.manual_seed(3)
    eager = WrittenOutAttention(causal=False, fill=-1e4).eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = torch.randn(2, SEQ, 64)
        keep = torch.ones(2, SEQ, dtype=torch.bool)
        keep[0, -3:] = False
        assert_close_rel(compiled(x, keep), eager(x, keep), 1e-5)
    text = _graph_text()
    assert "scaled_dot_product" not in text and "aten::bmm" in text, text


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_hugging_face_eager_attention_becomes_one_call(padded, assert_close_rel):
    """A transformers Llama with attn_implementation="eager" (scores * scaling + its additive
    float mask, softmax in float32, @ v) runs every layer's attention as one SDPA call with the
    mask as attn_mask, and matches eager, with and without padding."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(4)
    eager = transformers.LlamaForCausalLM(config).eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        for batch in (2, 3):
            ids = torch.randint(0, 128, (batch, SEQ))
            mask = torch.ones(batch, SEQ, dtype=torch.long)
            if padded:
                mask[0, :4] = 0  # left padding of the first sequence
            want = eager(input_ids=ids, attention_mask=mask).logits
            got = compiled(input_ids=ids, attention_mask=mask).logits
            keep = mask.bool()  # padded query rows attend to nothing in eager: compare the rest
            assert_close_rel(got[keep], want[keep], 1e-5)
    text = _graph_text()
    assert text.count("aten::scaled_dot_product_attention(") == 2, text
    assert "aten::_softmax" not in text, text
    assert not re.search(rf"{SEQ}, {SEQ}\] = aten::bmm", text), (
        text
    )  # no scores (rotary's bmm stays)


class TwoAttentions(nn.Module):
    """One attention the pass rewrites (a padding mask applied with -inf) and one it leaves as
    written (the same mask filled with -1e4)."""

    def __init__(self):
        super().__init__()
        self.first = WrittenOutAttention(causal=False)
        self.second = WrittenOutAttention(causal=False, fill=-1e4)

    def forward(self, x, keep):
        return self.second(self.first(x, keep), keep)


def test_each_decision_is_reported(tmp_path, monkeypatch, assert_close_rel):
    """Every softmax fed by a matmul is a decision: inspection.attention_patterns() and, with
    dumps on, attention_patterns/inference.json and the timeline's recognize_attention line say
    which chains became which call, and why the others were left as written."""
    import json
    import os

    from magi_compiler import inspection

    monkeypatch.setenv("MAGI_ENABLE_FX_GRAPH_VIZ", "1")
    monkeypatch.setenv("MAGI_DUMP_DIR", str(tmp_path))
    inspection.clear()
    torch.manual_seed(5)
    eager = TwoAttentions().eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x, keep = torch.randn(2, SEQ, 64), torch.rand(2, SEQ) > 0.3
        keep[:, 0] = True
        assert_close_rel(compiled(x, keep), eager(x, keep), 1e-5)
    patterns = inspection.attention_patterns()
    done, left = sorted(patterns, key=lambda p: not p["rewritten"])
    assert done["rewritten"] and not left["rewritten"], patterns
    assert done["detail"] == "aten::scaled_dot_product_attention (boolean mask, scale 0.25)"
    assert left["detail"].startswith("masked_fill with a value other than -inf"), patterns
    assert all("test_attention_recognition.py" in p["where"] for p in patterns), patterns
    (dump,) = os.listdir(tmp_path)
    with open(tmp_path / dump / "attention_patterns" / "inference.json", encoding="utf-8") as f:
        assert json.load(f) == patterns
    with open(tmp_path / dump / "timeline.txt", encoding="utf-8") as f:
        line = next(ln for ln in f if "pass recognize_attention" in ln)
    assert "1 attention chain rewritten, 1 left as written (masked_fill with a value" in line, line
    with open(tmp_path / dump / "index.html", encoding="utf-8") as f:
        page = f.read()
    assert '<section id="attention-section">' in page
    assert "<td>rewritten</td><td>aten::scaled_dot_product_attention (boolean mask" in page
    assert "<td>left as written</td><td>masked_fill with a value other than -inf" in page


def _train_step_matches(eager, compiled, x, *args, assert_close_rel):
    """One training step of each (loss: the sum of squares of the output): the output, the
    input's gradient and every parameter's gradient of ``compiled`` match ``eager``'s."""
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(xe, *args), compiled(xc, *args)
    assert_close_rel(got, want, 1e-5)
    want.square().sum().backward()
    got.square().sum().backward()
    assert_close_rel(xc.grad, xe.grad, 1e-4)
    for pe, pc in zip(eager.parameters(), compiled.parameters(), strict=True):
        assert_close_rel(pc.grad, pe.grad, 1e-4)
        pe.grad = pc.grad = None


@pytest.mark.parametrize(
    "causal,padded", [(True, False), (False, True), (True, True)], ids=["causal", "padded", "both"]
)
def test_training_steps_run_written_out_attention_fused(causal, padded, assert_close_rel):
    """In a training step the capture's written-out attention becomes one
    F.scaled_dot_product_attention call before AOTAutograd, so the forward runs the fused
    kernel and the backward its fused gradient (no [.., L, S] scores in either graph); the
    loss and every gradient match eager."""
    from magi_compiler import inspection

    inspection.clear()
    torch.manual_seed(6)
    eager = WrittenOutAttention(causal=causal, kv_heads=2).train()
    compiled = magi_compile(copy.deepcopy(eager))
    for batch in (2, 3):
        x = torch.randn(batch, SEQ, 64)
        keep = torch.rand(batch, SEQ) > 0.3 if padded else None
        if keep is not None:
            keep[:, 0] = True
        _train_step_matches(eager, compiled, x, keep, assert_close_rel=assert_close_rel)
    for kind in ("forward", "backward"):
        text = str(last_compiled(kind).graph)
        assert "aten::_softmax" not in text and f"{SEQ}, {SEQ}] = aten::bmm" not in text, text
    assert ATTENTION + "(" in str(last_compiled("forward").graph)
    assert "_scaled_dot_product_flash_attention_for_cpu_backward" in str(
        last_compiled("backward").graph
    )
    done = [p for p in inspection.attention_patterns() if p.get("graph") == "training"]
    assert done and all(p["rewritten"] for p in done), done
    assert ("causal" in done[0]["detail"]) == (causal and not padded), done


@pytest.mark.parametrize("key_form", ["transpose", "torch.transpose", "mT", "permute"])
def test_training_capture_reads_each_way_of_transposing_the_key(key_form, assert_close_rel):
    """k.transpose(-2, -1), torch.transpose(k, -2, -1), k.mT and k.permute(0, 1, 3, 2) are the
    same key side; scale by division; dropout at p=0 while training."""
    forms = {
        "transpose": lambda k: k.transpose(-2, -1),
        "torch.transpose": lambda k: torch.transpose(k, -2, -1),
        "mT": lambda k: k.mT,
        "permute": lambda k: k.permute(0, 1, 3, 2),
    }

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
            att = (q @ forms[key_form](k)) / 4.0
            att = F.dropout(F.softmax(att, dim=-1), p=0.0, training=self.training)
            return (att @ v).sum(1)

    torch.manual_seed(7)
    eager = Plain().train()
    compiled = magi_compile(copy.deepcopy(eager))
    x = torch.randn(2, SEQ, 64)
    _train_step_matches(eager, compiled, x, assert_close_rel=assert_close_rel)
    assert ATTENTION + "(" in str(last_compiled("forward").graph)


def test_a_softmax_over_logits_is_no_attention_decision(assert_close_rel):
    """A training capture's softmax over a linear layer's logits is not attention: nothing is
    rewritten and nothing is reported."""
    from magi_compiler import inspection

    inspection.clear()
    torch.manual_seed(8)
    eager = nn.Sequential(nn.Linear(16, 8), nn.Softmax(dim=-1)).train()
    compiled = magi_compile(copy.deepcopy(eager))
    x = torch.randn(4, 16, requires_grad=True)
    assert_close_rel(compiled(x), eager(x), 1e-6)
    compiled(x).sum().backward()
    assert inspection.attention_patterns() == []
    assert "aten::_softmax" in str(last_compiled("forward").graph)


def test_training_rewrite_handles_chains_reading_each_other_and_keyword_forms(assert_close_rel):
    """Attention whose value is another attention's output is rewritten after it (both become
    calls); a floor division is no scale, eval-mode torch.dropout(train=False) is no dropout,
    and masked_fill with keywords is left as written. Each matches eager."""

    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
            a = torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v
            a2 = torch.dropout(torch.softmax(q @ k.transpose(-2, -1), -1), p=0.5, train=False) @ a
            floor = torch.softmax(torch.div(q @ k.mT, 3.0, rounding_mode="floor"), -1) @ v
            ones = torch.zeros(t, t, dtype=torch.bool)
            kw = torch.softmax((q @ k.mT).masked_fill(mask=ones, value=float("-inf")), -1) @ v
            return (a2 + floor + kw).sum(1)

    from magi_compiler import inspection

    inspection.clear()
    torch.manual_seed(9)
    eager = Nested().train()
    compiled = magi_compile(copy.deepcopy(eager))
    x = torch.randn(2, SEQ, 64)
    _train_step_matches(eager, compiled, x, assert_close_rel=assert_close_rel)
    patterns = inspection.attention_patterns()
    decisions = {(p["rewritten"], p["detail"]) for p in patterns if p.get("graph") == "training"}
    assert decisions == {
        (True, "F.scaled_dot_product_attention (scale 0.25)"),  # a
        (True, "F.scaled_dot_product_attention (scale 1)"),  # a2: no dropout in eval mode
        (False, "the softmax reads div of the scores"),  # the floor division
        (False, "masked_fill with keyword arguments"),
    }, decisions
    assert str(last_compiled("forward").graph).count(ATTENTION + "(") == 2


def test_inference_chain_reading_another_chains_output_drops_both_score_chains(assert_close_rel):
    """The second attention's value is the first one's output: after the first rewrite it reads
    the first call, so no bmm of scores is left for either."""

    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(64, 192, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
            a = torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v
            return torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ a

    torch.manual_seed(10)
    eager = Nested().eval()
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = torch.randn(2, SEQ, 64)
        assert_close_rel(compiled(x), eager(x), 1e-5)
    text = _graph_text()
    assert text.count(ATTENTION + "(") == 2, text
    assert "aten::bmm" not in text and "aten::_softmax" not in text, text


def test_an_unforeseen_form_is_left_as_written(monkeypatch, assert_close_rel):
    """An error while matching a training capture's chain leaves that chain as written (its
    reason names the error) and the compile goes on."""
    from magi_compiler import _attention_fx, inspection

    def broken(node):
        raise KeyError("odd node")

    monkeypatch.setattr(_attention_fx, "_match", broken)
    inspection.clear()
    torch.manual_seed(11)
    eager = WrittenOutAttention().train()
    compiled = magi_compile(copy.deepcopy(eager))
    x = torch.randn(2, SEQ, 64, requires_grad=True)
    assert_close_rel(compiled(x), eager(x), 1e-5)
    (decision,) = [p for p in inspection.attention_patterns() if p.get("graph")]
    assert not decision["rewritten"] and "KeyError" in decision["detail"], decision
    assert "aten::_softmax" in str(last_compiled("forward").graph)
