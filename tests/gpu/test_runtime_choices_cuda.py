"""Runtime choices on the GPU: the attention kernel picked per shape (attention_backend) and
direct dispatch (fast_dispatch) with and without CUDA graphs. Numerics against eager on fresh
random inputs; choices read back through inspection.attention_choices() and the dumps."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import weakref

import pytest
import torch
import torch.nn.functional as F
from magi_compiler import _dump, get_counters, inspection, magi_compile
from torch import nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

RTOL = 2e-2  # bf16


class Attention(nn.Module):
    """Projections around one SDPA call; ``mask`` adds an additive float mask (flash takes
    none)."""

    def __init__(self, hidden: int = 256, heads: int = 4, mask: bool = False):
        super().__init__()
        self.heads, self.mask = heads, mask
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.mask:
            bias = torch.triu(torch.full((s, s), -1e4, device=x.device, dtype=x.dtype), 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, h))


@pytest.fixture(autouse=True)
def _fresh(counters):
    inspection.clear()  # also forgets attention choices, so each test probes again
    yield


def _model(mask: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return Attention(mask=mask).to("cuda", torch.bfloat16).eval()


def _x(batch: int = 2, seq: int = 256) -> torch.Tensor:
    return torch.randn(batch, seq, 256, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("mode", ["NONE", "FULL"])
def test_auto_probes_each_shape_once_and_matches_eager(mode, assert_close_rel):
    eager = _model()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": mode})
    with torch.no_grad():
        for batch in (2, 2, 2, 3, 3, 3, 2):
            x = _x(batch)
            assert_close_rel(compiled(x), eager(x), RTOL)
    choices = inspection.attention_choices()
    assert len(choices) == 2, choices  # batch 2 and batch 3, each probed once
    for c in choices:
        assert "causal" in c["shape"] and c["traced"] in ("flash", "efficient", "cudnn")
        assert c["chosen"] in c["ms"], c
        assert c["ms"][c["chosen"]] == min(c["ms"].values())
        assert len(c["ms"]) + len(c["rejected"]) == 3  # every backend timed or said why not


@pytest.mark.parametrize("backend", ["graph", "flash", "cudnn", "efficient"])
def test_named_backend_matches_eager_and_does_not_probe(backend, assert_close_rel):
    eager = _model()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"attention_backend": backend})
    with torch.no_grad():
        for batch in (2, 4):
            x = _x(batch)
            assert_close_rel(compiled(x), eager(x), RTOL)
    assert inspection.attention_choices() == []


def test_mask_leaves_flash_out(assert_close_rel):
    eager = _model(mask=True)
    compiled = magi_compile(copy.deepcopy(eager))
    with torch.no_grad():
        x = _x()
        assert_close_rel(compiled(x), eager(x), RTOL)
    (choice,) = inspection.attention_choices()
    assert "mask" in choice["shape"]
    assert "flash" not in choice["ms"] and any(r.startswith("flash") for r in choice["rejected"])


def test_training_graphs_keep_the_traced_backend(assert_close_rel):
    eager = _model().train()
    compiled = magi_compile(copy.deepcopy(eager).train())
    x = _x()
    compiled(x).float().pow(2).mean().backward()
    eager(x).float().pow(2).mean().backward()
    for a, e in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert_close_rel(a.grad, e.grad, 5e-2)
    assert inspection.attention_choices() == []  # the forward's logsumexp feeds the backward


def test_choices_are_dumped(tmp_path, monkeypatch):
    monkeypatch.setenv(_dump.ENABLE_ENV, "1")
    monkeypatch.setenv(_dump.DIR_ENV, str(tmp_path))
    compiled = magi_compile(_model())
    with torch.no_grad():
        compiled(_x())
    files = list(tmp_path.rglob("attention_choices/inference.json"))
    assert len(files) == 1, sorted(str(p) for p in tmp_path.rglob("*"))
    (choice,) = json.loads(files[0].read_text())
    assert choice["chosen"] in choice["ms"]


@pytest.mark.parametrize("mode", ["NONE", "FULL"])
def test_direct_dispatch_keeps_held_outputs_and_follows_new_weights(mode, assert_close_rel):
    import blocks

    eager = blocks.LlamaStack(2, hidden=256, n_heads=8, n_kv_heads=4, intermediate=512)
    eager = blocks.init_weights_(eager, seed=0).to("cuda", torch.bfloat16).eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": mode})
    with torch.no_grad():
        xs = [_x(4, 32) for _ in range(6)]
        outs = [compiled(x) for x in xs]  # capture, ordinary call, then direct calls
        for x, out in zip(xs, outs, strict=True):  # earlier outputs were not overwritten
            assert_close_rel(out, eager(x), RTOL)
        assert get_counters().direct_calls == 4
        new = nn.Parameter(torch.randn_like(eager.layers[1].up_proj.weight) * 0.05)
        eager.layers[1].up_proj.weight = new
        compiled.layers[1].up_proj.weight = copy.deepcopy(new)
        for _ in range(3):
            x = _x(4, 32)
            assert_close_rel(compiled(x), eager(x), RTOL)
    assert get_counters().direct_calls == 4 + 3  # still direct, with the new weight


def test_direct_calls_into_graphs_see_parameters_changed_in_place(assert_close_rel):
    """A direct call tells the CUDA graph runner when the parameters are the tensors its last
    call checked, and the runner then skips comparing them. Changes that keep the Parameter
    object must still reach the graph: new memory through `.data = ...` (same layout: Dynamo's
    guards pass, the graph is captured again) and an in-place transpose (new strides)."""
    import blocks

    eager = blocks.LlamaStack(2, hidden=256, n_heads=8, n_kv_heads=4, intermediate=512)
    eager = blocks.init_weights_(eager, seed=0).to("cuda", torch.bfloat16).eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})

    def check(calls: int) -> None:
        for _ in range(calls):
            x = _x(4, 32)
            assert_close_rel(compiled(x), eager(x), RTOL)

    with torch.no_grad():
        check(5)
        direct = get_counters().direct_calls
        assert direct >= 2
        new = torch.randn_like(eager.layers[0].o_proj.weight) * 0.05
        eager.layers[0].o_proj.weight.data = new.clone()
        compiled.layers[0].o_proj.weight.data = new.clone()
        junk = [torch.full_like(new, 1e3) for _ in range(4)]  # over the freed storage
        check(3)
        assert get_counters().direct_calls == direct + 3  # the new memory is a new generation
        eager.layers[1].o_proj.weight.t_()
        compiled.layers[1].o_proj.weight.t_()
        check(4)
        del junk


def test_direct_calls_into_graphs_keep_no_argument_alive():
    """The direct call keeps the graph inputs a runner borrows from call to call, the
    parameters only: the caller's argument is dropped on the way out."""
    import blocks

    model = blocks.LlamaStack(1, hidden=256, n_heads=8, n_kv_heads=4, intermediate=512)
    model = blocks.init_weights_(model, seed=0).to("cuda", torch.bfloat16).eval()
    compiled = magi_compile(model, config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        for _ in range(4):
            compiled(_x(4, 32))
        direct = get_counters().direct_calls
        x = _x(4, 32)
        gone = weakref.ref(x)
        compiled(x)
        assert get_counters().direct_calls == direct + 1
        del x
        assert gone() is None


@pytest.mark.parametrize(
    "mode, backend",
    [
        ("NONE", "auto"),
        ("FULL", "auto"),
        ("NONE", "flash"),
        ("NONE", "cudnn"),
        ("NONE", "efficient"),
        ("NONE", "graph"),
    ],
)
def test_grouped_query_attention_reads_the_unrepeated_heads(mode, backend, assert_close_rel):
    """passes::group_query_attention: the repeat_interleave copies of the key and value heads
    are gone from the compiled graph and attention reads 2 key/value heads for 8 query heads,
    on every backend that takes them; efficient attention, which does not, runs the traced
    backend instead."""
    import blocks

    eager = blocks.LlamaStack(2, hidden=256, n_heads=8, n_kv_heads=2, intermediate=512)
    eager = blocks.init_weights_(eager, seed=0).to("cuda", torch.bfloat16).eval()
    compiled = magi_compile(
        copy.deepcopy(eager), config_patch={"cudagraph_mode": mode, "attention_backend": backend}
    )
    with torch.no_grad():
        for batch in (2, 3, 2):
            x = _x(batch)
            assert_close_rel(compiled(x), eager(x), RTOL)
    text = str(inspection.last_compiled("inference").graph)
    assert "aten::clone" not in text, text
    assert "aten::expand" not in text, text
    if backend == "auto":
        choices = inspection.attention_choices()
        assert len({c["shape"] for c in choices}) == len(choices), choices  # each probed once
        if mode == "NONE":
            assert len(choices) == 2, choices  # batch 2 and batch 3
        for c in choices:
            assert re.search(r"k \d+x2x256x32 ", c["shape"]), c["shape"]
            assert any(
                r.startswith("efficient: memory-efficient attention takes no grouped")
                for r in c["rejected"]
            ), c
            assert c["chosen"] in ("flash", "cudnn"), c


class CachedGroupedAttention(nn.Module):
    """One decode step of grouped-query attention over a key/value cache (a buffer written in
    place at ``positions``); ``mask`` hides the cache slots not written yet."""

    def __init__(self, hidden: int = 256, heads: int = 8, kv_heads: int = 2, slots: int = 64):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.d, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, kv_heads, slots, self.d))
        self.register_buffer("v_cache", torch.zeros(1, kv_heads, slots, self.d))

    def forward(self, x, positions, mask=None):
        b, s, h = x.shape
        q = self.q(x).view(b, s, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.d).unbind(2)
        self.k_cache.index_copy_(2, positions, k.transpose(1, 2))
        self.v_cache.index_copy_(2, positions, v.transpose(1, 2))
        rep = self.heads // self.kv_heads
        keys = self.k_cache.repeat_interleave(rep, dim=1)
        values = self.v_cache.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.out(o.transpose(1, 2).reshape(b, s, h))


@pytest.mark.parametrize("masked, traced", [(False, None), (True, None), (True, "cudnn")])
def test_grouped_decode_over_a_cache_matches_eager(masked, traced, assert_close_rel):
    """A decode step reads the whole cache through repeated heads. Where the trace recorded
    flash or cuDNN attention the repeats are gone (they read the 2 cached heads; cuDNN also
    with a mask, `traced="cudnn"` traces under sdpa_kernel(CUDNN_ATTENTION)); where it recorded
    memory-efficient attention they stay. Outputs and the caches written in place match eager
    over several steps."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    eager = CachedGroupedAttention().to("cuda", torch.bfloat16).eval()
    compiled = magi_compile(copy.deepcopy(eager), dynamic_arg_dims={})  # one token: static

    def tracing():  # a fresh context manager per call: sdpa_kernel's enters once
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION]) if traced else contextlib.nullcontext()

    slots = eager.k_cache.shape[2]
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(1, 1, 256, device="cuda", dtype=torch.bfloat16)
            positions = torch.tensor([step], device="cuda")
            mask = None
            if masked:
                mask = torch.full((1, 1, 1, slots), -1e4, device="cuda", dtype=torch.bfloat16)
                mask[..., : step + 1] = 0
            with tracing():
                out = compiled(x, positions, mask)
            assert_close_rel(out, eager(x, positions, mask), RTOL)
    assert_close_rel(compiled.k_cache, eager.k_cache, RTOL)
    assert_close_rel(compiled.v_cache, eager.v_cache, RTOL)
    text = str(inspection.last_compiled("inference").graph)
    if traced:
        assert f"_scaled_dot_product_{traced}_attention" in text, text
    efficient = "_scaled_dot_product_efficient_attention" in text
    assert ("aten::clone" in text) == efficient, text


@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_grouped_query_training_reads_the_unrepeated_heads(backend, assert_close_rel):
    """passes::group_query_attention in training: the forward's attention and the backward's
    attention gradient read the 2 key/value heads of each 8 query heads as they are, the
    backward returns their gradients already summed over each group, and the step's loss and
    gradients match eager's. The traced backend is the one SDPA picks under the context."""
    import blocks
    from torch.nn.attention import SDPBackend, sdpa_kernel

    eager = blocks.LlamaStack(2, hidden=256, n_heads=8, n_kv_heads=2, intermediate=512)
    eager = blocks.init_weights_(eager, seed=0).to("cuda", torch.bfloat16).train()
    compiled = magi_compile(copy.deepcopy(eager).train())
    op = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    with sdpa_kernel(op):
        for batch in (2, 3):
            x = _x(batch)
            loss_c = compiled(x).float().pow(2).mean()
            loss_e = eager(x).float().pow(2).mean()
            loss_c.backward()
            loss_e.backward()
            assert_close_rel(loss_c, loss_e, RTOL)
            for a, e in zip(compiled.parameters(), eager.parameters(), strict=True):
                assert_close_rel(a.grad, e.grad, 5e-2)
                a.grad = e.grad = None
    forward = str(inspection.last_compiled("forward").graph)
    assert f"_scaled_dot_product_{backend}_attention" in forward, forward
    assert "aten::clone" not in forward and "aten::expand" not in forward, forward
    backward = str(inspection.last_compiled("backward").graph)
    calls = [line for line in backward.splitlines() if f"{backend}_attention_backward" in line]
    assert len(calls) == 2, backward  # one per layer
    grouped = r"\[s\d+, 8, 256, 32\].*\[s\d+, 2, 256, 32\].*\[s\d+, 2, 256, 32\]"
    for call in calls:  # dq has the 8 query heads, dk and dv the 2 key/value heads
        assert re.search(grouped, call), call
    assert "aten::select.int" not in backward, backward
    assert not re.search(r"\[s\d+, 2, 4, 256, 32\] = aten::clone", backward), backward  # repeats


@pytest.mark.parametrize("mode", ["NONE", "FULL"])
def test_hugging_face_eager_attention_runs_as_one_sdpa_call(mode, assert_close_rel):
    """transformers' Llama with attn_implementation="eager" in bf16: recognize_attention turns
    each layer's written-out attention (scores + the additive mask) into one
    scaled_dot_product_attention call with the mask as attn_mask; it matches eager, also
    replayed from CUDA graphs, with left padding."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": mode})
    with torch.no_grad():
        for batch in (1, 4):
            ids = torch.randint(0, 512, (batch, 64), device="cuda")
            mask = torch.ones(batch, 64, dtype=torch.long, device="cuda")
            mask[0, :9] = 0
            want = eager(input_ids=ids, attention_mask=mask).logits
            got = compiled(input_ids=ids, attention_mask=mask).logits
            keep = mask.bool()
            assert_close_rel(got[keep].float(), want[keep].float(), RTOL)
    text = str(inspection.last_compiled().graph)
    assert text.count("aten::scaled_dot_product_attention(") == 2, text
    assert "aten::_softmax" not in text, text


@pytest.mark.parametrize("mode", ["NONE", "FULL"])
def test_hugging_face_sdpa_mask_built_under_the_trace_becomes_is_causal(mode, assert_close_rel):
    """transformers' Llama with its default SDPA attention in bf16, called without an
    attention_mask: under the trace masking_utils builds the [1, 1, S, S] causal mask from
    positions; recognize_causal_masks hands every layer's CUDA attention call is_causal
    instead, no S x S tensor is left, and the logits match eager's (which uses is_causal). The
    memory-efficient call SDPA traced for the mask runs as flash over the grouped key/value
    heads, so the repeated copies of k and v go too."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512,
    )  # fmt: skip
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    inspection.clear()
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": mode})
    with torch.no_grad():
        for batch in (1, 4):
            ids = torch.randint(0, 512, (batch, 96), device="cuda")
            want = eager(input_ids=ids, use_cache=False).logits
            got = compiled(input_ids=ids, use_cache=False).logits
            assert_close_rel(got.float(), want.float(), RTOL)
    text = str(inspection.last_compiled().graph)
    assert "96, 96]" not in text, text
    assert "_scaled_dot_product_efficient_attention" not in text, text
    assert ", 2, 2, 96, 64]" not in text, "k and v are still repeated per query head:\n" + text
    masks = [
        p for p in inspection.attention_patterns() if p.get("pass") == "recognize_causal_masks"
    ]
    assert len(masks) >= 2 and all(p["rewritten"] for p in masks), masks


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "causal+padding"])
def test_written_out_attention_trains_through_fused_kernels(padded, assert_close_rel):
    """A training step of attention written out by hand (causal tril mask, optional padding
    mask, softmax in float32) in bf16: the capture is rewritten into
    F.scaled_dot_product_attention before AOTAutograd, so neither graph holds the scores; the
    output and the gradients match eager's within bf16 rounding."""

    class Written(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(256, 768, bias=False)

        def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 64).permute(2, 0, 3, 1, 4).unbind(0)
            att = q @ k.transpose(-2, -1) * 0.125
            att = att.masked_fill(torch.tril(torch.ones(s, s, device=x.device)) == 0, float("-inf"))
            if keep is not None:
                att = att.masked_fill(~keep[:, None, None, :], float("-inf"))
            return (torch.softmax(att.float(), dim=-1).type_as(q) @ v).sum(1)

    torch.manual_seed(0)
    eager = Written().to("cuda", torch.bfloat16)
    compiled = magi_compile(copy.deepcopy(eager))
    x = torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16)
    keep = torch.rand(2, 256, device="cuda") > 0.2 if padded else None
    if keep is not None:
        keep[:, 0] = True
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(xe, keep), compiled(xc, keep)
    assert_close_rel(got.float(), want.float(), RTOL)
    want.float().square().sum().backward()
    got.float().square().sum().backward()
    assert_close_rel(xc.grad.float(), xe.grad.float(), 3 * RTOL)
    assert_close_rel(compiled.qkv.weight.grad.float(), eager.qkv.weight.grad.float(), 3 * RTOL)
    for kind in ("forward", "backward"):
        text = str(inspection.last_compiled(kind).graph)
        assert "aten::_softmax" not in text and "256, 256] = aten::bmm" not in text, text
