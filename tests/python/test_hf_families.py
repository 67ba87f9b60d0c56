"""More Hugging Face architectures than the zoo's six, compiled whole as a user would
(``magi_compile(model)``, default settings, keyword calls): each must capture without falling
back and give eager's outputs in float32, first at batch 1 and then at other batches and
lengths. The families are picked for what they add to the zoo: sliding-window attention
(Mistral), logit softcapping and alternating local layers (Gemma2), a fused qkv projection
(Phi-3), expert routing (Mixtral; Qwen2-MoE with a shared expert), parallel residuals and
partial rotary (GPT-NeoX), ALiBi (BLOOM), learned positions (OPT) and disentangled attention
(DeBERTa-v2), a state-space model (Mamba), shifted-window vision attention (Swin) and convolutions
(ConvNeXt). Tiny random configs: 2 layers, hidden 64. Also BART, whose default call cannot be
captured (docs/debugging.md), with the workaround that the docs give."""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import zoo_models as zm  # noqa: E402

transformers = pytest.importorskip("transformers")

DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)  # fmt: skip
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)

FAMILIES = {
    "Mistral": ("MistralForCausalLM", "MistralConfig", {**DECODER, "sliding_window": 16}),
    "Gemma2": (
        "Gemma2ForCausalLM",
        "Gemma2Config",
        {**DECODER, "head_dim": 16, "sliding_window": 16},
    ),  # fmt: skip
    "Phi3": ("Phi3ForCausalLM", "Phi3Config", {**DECODER, "pad_token_id": 0}),
    "Mixtral": (
        "MixtralForCausalLM",
        "MixtralConfig",
        {**DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),  # fmt: skip
    "Qwen2Moe": (
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        {
            **DECODER,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
        },
    ),  # fmt: skip
    "GPTNeoX": ("GPTNeoXForCausalLM", "GPTNeoXConfig", {**SMALL, "intermediate_size": 128}),
    "Bloom": (
        "BloomForCausalLM",
        "BloomConfig",
        {"hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256},
    ),  # fmt: skip
    "OPT": (
        "OPTForCausalLM",
        "OPTConfig",
        {**SMALL, "ffn_dim": 128, "word_embed_proj_dim": 64},
    ),  # fmt: skip
    "DebertaV2": ("DebertaV2Model", "DebertaV2Config", {**SMALL, "intermediate_size": 128}),
    "Mamba": (
        "MambaForCausalLM",
        "MambaConfig",
        {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 256, "state_size": 8},
    ),  # fmt: skip
    "Swin": (
        "SwinModel",
        "SwinConfig",
        {
            "image_size": 32,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 2],
            "window_size": 4,
        },
    ),  # fmt: skip
    "ConvNext": (
        "ConvNextModel",
        "ConvNextConfig",
        {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2},
    ),  # fmt: skip
}
IMAGES = {"Swin", "ConvNext"}  # called with pixel_values (batch, 3, 32, 32)


def _build(name: str) -> torch.nn.Module:
    model_class, config_class, kwargs = FAMILIES[name]
    if not hasattr(transformers, model_class):
        pytest.skip(f"transformers {transformers.__version__} has no {model_class}")
    torch.manual_seed(0)
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs)).eval()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_compiles_whole_and_matches_eager(name):
    import magi_compiler

    # Dynamo's automatic dynamic keeps sizes per code object, and transformers' forward
    # wrapper is one code object for all families: start from none.
    torch._dynamo.reset()
    ref = _build(name)
    model = magi_compiler.magi_compile(copy.deepcopy(ref))
    before = magi_compiler.get_counters().captures
    for batch, length in ((1, 24), (3, 24), (2, 40)):
        if name in IMAGES:
            kwargs = {"pixel_values": torch.randn(batch, 3, 32, 32)}
        else:
            kwargs = {"input_ids": torch.randint(3, 256, (batch, length))}
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = model(**kwargs)
            want = ref(**kwargs)
        fell = zm.fallback_warnings(caught) + zm.fallback_reasons(model)
        assert not fell, f"{name} runs eagerly: " + "; ".join(fell)
        if name == "Mamba":  # its cache object holds no keys and values for zm.tensors
            got, want = got.logits, want.logits
        for i, (a, e) in enumerate(zip(zm.tensors(got), zm.tensors(want), strict=True)):
            torch.testing.assert_close(
                a, e, rtol=1e-4, atol=1e-4, msg=lambda m, i=i: f"{name} output {i}: {m}"
            )
    assert zm.compiled_entries(model), f"no compiled entry in {name}"
    # Batch and length change once each: automatic dynamic, not a capture per shape.
    assert 1 <= magi_compiler.get_counters().captures - before <= 3


def test_a_flat_config_encoder_decoder_without_its_own_cache_compiles():
    """BART, as docs/debugging.md describes it: called with the default use_cache=True it builds
    its cache in forward through copy.deepcopy of the config, which Dynamo cannot trace, so the
    entry runs eagerly with a warning that names the call; with use_cache=False it compiles
    and matches eager."""
    import magi_compiler

    if not hasattr(transformers, "BartForConditionalGeneration"):
        pytest.skip("this transformers has no BART")
    torch._dynamo.reset()
    config = transformers.BartConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
        max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = transformers.BartForConditionalGeneration(config).eval()
    ids, decoder_ids = torch.randint(3, 256, (2, 24)), torch.randint(3, 256, (2, 12))
    eager_default = magi_compiler.magi_compile(copy.deepcopy(ref))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager_default(input_ids=ids, decoder_input_ids=decoder_ids)
    fell = zm.fallback_warnings(caught)
    assert fell and "copy.deepcopy" in fell[0], fell

    model = magi_compiler.magi_compile(copy.deepcopy(ref))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = model(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits
        want = ref(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits
    assert not zm.fallback_warnings(caught) and not zm.fallback_reasons(model)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
