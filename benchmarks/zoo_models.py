"""The model zoo: Hugging Face ``transformers`` models with random weights, shared by
``benchmarks/zoo.py`` (timing on the GPU) and ``tests/python/test_zoo.py`` (numerics on the CPU),
so both build exactly the same models and call them exactly the same way.

Every model comes from a ``transformers`` config object (nothing is downloaded) in one of two
sizes: ``real`` (the published shapes: Llama-3.2-1B, Qwen3-0.6B, GPT-2 124M, BERT-base,
ViT-base, T5-small) and ``tiny`` (2 layers, hidden 64, for the CPU tests). Each model is called
as its users call it, with keyword arguments (``model(input_ids=..., use_cache=False)``).

Scenarios:

- ``whole``: ``magi_compile(model)`` with the default settings; models with a cache are called
  with ``use_cache=False``.
- ``layers``: the decoder/encoder-layer class decorated, as MagiCompiler's users do it
  (``@magi_compile class LlamaDecoderLayer``): the class is decorated while the model is built,
  so every layer instance shares one compiled entry, and restored afterwards so that other
  models in the process stay eager. The rest of the model runs eagerly.
- ``cache``: ``magi_compile(model)`` called with ``use_cache=True`` (a prefill that returns the
  new ``Cache``), for the models that have one. The decoder-only models make the cache in
  their forward; T5 is handed a fresh empty one, as ``generate()`` does (``_seq2seq_cache``
  says why).

``transformers`` is imported only when a model is built, so importing this module needs only
torch.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

SIZES = ("tiny", "real")
SCENARIOS = ("whole", "layers", "cache")


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Input shapes of one size: the batches to run (the first is the first call), the
    sequence length (tokens; for T5 the encoder's, the decoder gets a quarter of it, at least 4) and the
    image side (ViT)."""

    batches: tuple[int, ...]
    seq: int
    image: int


SHAPES = {
    "tiny": Shapes(batches=(1, 3), seq=8, image=32),
    "real": Shapes(batches=(1, 8), seq=128, image=224),
}


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    model_class: str  # attribute of the transformers package
    config_class: str
    layer_class: str  # the decoder/encoder-layer class the "layers" scenario decorates
    configs: dict[str, dict[str, Any]]  # size -> config keyword arguments
    inputs: Callable[[Any, int, Shapes, torch.device, torch.dtype], dict[str, Any]]
    has_cache: bool
    # Makes the empty cache of a "cache" call when the model cannot make it in a traced
    # forward; None: the model makes it (use_cache=True alone).
    new_cache: Callable[[Any], Any] | None
    describe: str  # what the real size is

    def scenarios(self) -> tuple[str, ...]:
        return SCENARIOS if self.has_cache else tuple(s for s in SCENARIOS if s != "cache")


# --- inputs ------------------------------------------------------------------------------
def _tokens(config: Any, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (batch, seq), device=device)


def _decoder_inputs(config, batch, shapes, device, dtype) -> dict[str, Any]:
    return {"input_ids": _tokens(config, batch, shapes.seq, device)}


def _encoder_inputs(config, batch, shapes, device, dtype) -> dict[str, Any]:
    ids = _tokens(config, batch, shapes.seq, device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _image_inputs(config, batch, shapes, device, dtype) -> dict[str, Any]:
    size = (batch, config.num_channels, shapes.image, shapes.image)
    return {"pixel_values": torch.randn(size, device=device, dtype=dtype)}


def _seq2seq_inputs(config, batch, shapes, device, dtype) -> dict[str, Any]:
    ids = _tokens(config, batch, shapes.seq, device)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "decoder_input_ids": _tokens(config, batch, max(4, shapes.seq // 4), device),
    }


def _seq2seq_cache(config: Any) -> Any:
    """A fresh, empty cache for T5, made outside the model as ``generate()`` makes it. T5's
    ``forward`` would build it with ``DynamicCache(config=...)``, whose
    ``config.get_text_config(decoder=True)`` deep-copies T5's flat encoder-decoder config
    (transformers/configuration_utils.py, ``get_text_config``): Dynamo does not trace
    ``copy.deepcopy``, so no compiler captures that call in one graph (torch.compile with
    ``fullgraph=True`` fails the same way)."""
    from transformers import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))


# --- the families -------------------------------------------------------------------------
_TINY_DECODER = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            name="llama",
            model_class="LlamaForCausalLM",
            config_class="LlamaConfig",
            layer_class="LlamaDecoderLayer",
            configs={
                "tiny": dict(_TINY_DECODER, tie_word_embeddings=True),
                "real": dict(
                    hidden_size=2048,
                    intermediate_size=8192,
                    num_hidden_layers=16,
                    num_attention_heads=32,
                    num_key_value_heads=8,
                    head_dim=64,
                    vocab_size=128256,
                    max_position_embeddings=131072,
                    rms_norm_eps=1e-5,
                    tie_word_embeddings=True,
                    rope_parameters={
                        "rope_type": "llama3",
                        "rope_theta": 500000.0,
                        "factor": 32.0,
                        "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192,
                    },
                ),
            },
            inputs=_decoder_inputs,
            has_cache=True,
            new_cache=None,
            describe="Llama-3.2-1B shape: 16 layers, hidden 2048, 32/8 heads, SwiGLU 8192",
        ),
        Family(
            name="qwen3",
            model_class="Qwen3ForCausalLM",
            config_class="Qwen3Config",
            layer_class="Qwen3DecoderLayer",
            configs={
                "tiny": dict(_TINY_DECODER, head_dim=16, tie_word_embeddings=True),
                "real": dict(
                    hidden_size=1024,
                    intermediate_size=3072,
                    num_hidden_layers=28,
                    num_attention_heads=16,
                    num_key_value_heads=8,
                    head_dim=128,
                    vocab_size=151936,
                    max_position_embeddings=40960,
                    rms_norm_eps=1e-6,
                    tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                ),
            },
            inputs=_decoder_inputs,
            has_cache=True,
            new_cache=None,
            describe="Qwen3-0.6B shape: 28 layers, hidden 1024, 16/8 heads of 128, MLP 3072",
        ),
        Family(
            name="gpt2",
            model_class="GPT2LMHeadModel",
            config_class="GPT2Config",
            layer_class="GPT2Block",
            configs={
                "tiny": dict(
                    n_embd=64,
                    n_layer=2,
                    n_head=4,
                    n_positions=128,
                    vocab_size=256,
                    bos_token_id=0,
                    eos_token_id=0,
                ),
                "real": dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257),
            },
            inputs=_decoder_inputs,
            has_cache=True,
            new_cache=None,
            describe="GPT-2 124M: 12 layers, hidden 768, 12 heads",
        ),
        Family(
            name="bert",
            model_class="BertModel",
            config_class="BertConfig",
            layer_class="BertLayer",
            configs={
                "tiny": dict(
                    hidden_size=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=128,
                    vocab_size=256,
                    max_position_embeddings=128,
                ),
                "real": dict(
                    hidden_size=768,
                    num_hidden_layers=12,
                    num_attention_heads=12,
                    intermediate_size=3072,
                    vocab_size=30522,
                    max_position_embeddings=512,
                ),
            },
            inputs=_encoder_inputs,
            has_cache=False,
            new_cache=None,
            describe="BERT-base: 12 layers, hidden 768, 12 heads (input_ids + attention_mask)",
        ),
        Family(
            name="vit",
            model_class="ViTModel",
            config_class="ViTConfig",
            layer_class="ViTLayer",
            configs={
                "tiny": dict(
                    hidden_size=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=128,
                    image_size=32,
                    patch_size=8,
                ),
                "real": dict(
                    hidden_size=768,
                    num_hidden_layers=12,
                    num_attention_heads=12,
                    intermediate_size=3072,
                    image_size=224,
                    patch_size=16,
                ),
            },
            inputs=_image_inputs,
            has_cache=False,
            new_cache=None,
            describe="ViT-base/16 at 224 px: 12 layers, hidden 768, 12 heads",
        ),
        Family(
            name="t5",
            model_class="T5ForConditionalGeneration",
            config_class="T5Config",
            layer_class="T5Block",
            configs={
                "tiny": dict(
                    d_model=64,
                    d_ff=128,
                    d_kv=16,
                    num_layers=2,
                    num_decoder_layers=2,
                    num_heads=4,
                    vocab_size=256,
                ),
                "real": dict(
                    d_model=512,
                    d_ff=2048,
                    d_kv=64,
                    num_layers=6,
                    num_decoder_layers=6,
                    num_heads=8,
                    vocab_size=32128,
                ),
            },
            inputs=_seq2seq_inputs,
            has_cache=True,
            new_cache=_seq2seq_cache,
            describe="T5-small: 6+6 layers, d_model 512, 8 heads (decoder gets seq/4 tokens)",
        ),
    ]
}


# --- building ------------------------------------------------------------------------------
def _transformers_attr(name: str) -> Any:
    import transformers

    return getattr(transformers, name)


def make_config(family: Family, size: str) -> Any:
    """The family's config object at ``size`` (sdpa attention, no dropout)."""
    config = _transformers_attr(family.config_class)(
        **family.configs[size], attn_implementation="sdpa"
    )
    return config


def build(
    family: Family, size: str, device: torch.device | str, dtype: torch.dtype, seed: int = 0
) -> nn.Module:
    """The eager reference model: random weights (seeded), eval mode, on ``device`` in
    ``dtype``."""
    device = torch.device(device)
    config = make_config(family, size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = _transformers_attr(family.model_class)(config)
    return model.to(dtype=dtype).eval()


def layer_class(family: Family) -> type:
    module = _transformers_attr(family.model_class).__module__
    return getattr(importlib.import_module(module), family.layer_class)


@contextlib.contextmanager
def _decorated(cls: type, **magi_kwargs: Any) -> Iterator[None]:
    """``magi_compile(cls)`` for the duration of the block: instances built inside share its
    compiled entry; the class's own ``__init__`` is put back afterwards."""
    from magi_compiler import magi_compile

    had_init = "__init__" in cls.__dict__
    saved = cls.__dict__.get("__init__")
    magi_compile(cls, **magi_kwargs)
    try:
        yield
    finally:
        if had_init:
            cls.__init__ = saved
        else:
            del cls.__init__


def compiled(
    family: Family,
    scenario: str,
    reference: nn.Module,
    size: str,
    config_patch: dict[str, Any] | None = None,
) -> nn.Module:
    """The model of ``scenario`` compiled with magi_compile (``config_patch`` for every entry),
    sharing ``reference``'s parameters and buffers; ``reference`` stays eager."""
    from magi_compiler import magi_compile

    kwargs = {} if config_patch is None else {"config_patch": config_patch}
    if scenario in ("whole", "cache"):
        # A shallow copy shares the submodules (and so the weights); magi_compile installs the
        # compiled forward on the copy only.
        model = copy.copy(reference)
        return magi_compile(model, **kwargs)
    if scenario != "layers":
        raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
    param = next(reference.parameters())
    with _decorated(layer_class(family), **kwargs):
        with torch.device(param.device):
            model = _transformers_attr(family.model_class)(reference.config)
    model = model.to(dtype=param.dtype).eval()
    # The reference's own tensors (tied ones stay tied): no second copy of the weights.
    model.load_state_dict(reference.state_dict(keep_vars=True), assign=True)
    for name, buf in reference.named_buffers():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, buf)
    return model


def call_kwargs(family: Family, scenario: str) -> dict[str, Any]:
    """Keyword arguments besides the inputs: the cache switch of models that have one."""
    if not family.has_cache:
        return {}
    return {"use_cache": scenario == "cache"}


def make_inputs(
    family: Family,
    scenario: str,
    config: Any,
    batch: int,
    size: str,
    device: torch.device | str,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """Fresh random inputs (the global RNG) of one call, as keyword arguments."""
    device = torch.device(device)
    kwargs = family.inputs(config, batch, SHAPES[size], device, dtype)
    kwargs.update(call_kwargs(family, scenario))
    return kwargs


def call_arguments(
    family: Family, scenario: str, config: Any, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of one call of ``kwargs``: with a fresh empty cache where the
    scenario hands the model one (``Family.new_cache``), since a call fills it."""
    if scenario == "cache" and family.new_cache is not None:
        return {**kwargs, "past_key_values": family.new_cache(config)}
    return kwargs


# --- inspecting what was compiled ------------------------------------------------------------
def compiled_entries(model: nn.Module) -> list[Any]:
    """The distinct magi_compile entries (``_CompiledCallable``) installed in ``model``."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        entry = module.__dict__.get("_magi_compiled")
        if entry is not None:
            seen.setdefault(id(entry), entry)
    return list(seen.values())


def fallback_reasons(model: nn.Module) -> list[str]:
    """Why entries of ``model`` run eagerly (empty: none does)."""
    return [
        f"{e.model_tag}: {e.fallback_reason}"
        for e in compiled_entries(model)
        if e.fallback_reason is not None
    ]


def magi_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The texts of magi_compiler's warnings among ``caught`` (``warnings.catch_warnings(
    record=True)``)."""
    return [str(w.message) for w in caught if str(w.message).startswith("magi_compiler:")]


def fallback_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """magi_compiler's warnings that an entry runs eagerly."""
    return [m for m in magi_warnings(caught) if "eager" in m]


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a model output, in a fixed order: ModelOutput fields, tuples, lists,
    dicts and ``Cache`` objects (their keys and values per layer)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if value is None or isinstance(value, (int, float, bool, str)):
        return []
    if isinstance(value, dict):  # ModelOutput is an OrderedDict of its non-None fields
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    if hasattr(value, "self_attention_cache"):  # EncoderDecoderCache
        return tensors(value.self_attention_cache) + tensors(value.cross_attention_cache)
    if hasattr(value, "layers"):  # DynamicCache and its kin
        return [t for layer in value.layers for t in (layer.keys, layer.values)]
    raise TypeError(f"cannot take the tensors of a {type(value).__name__}")


def max_errors(actual: Any, expected: Any) -> tuple[float, float]:
    """(max absolute error, max absolute error relative to max |expected|), worst tensor."""
    got, want = tensors(actual), tensors(expected)
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} output tensors, eager has {len(want)}")
    abs_err = rel_err = 0.0
    for a, e in zip(got, want, strict=True):
        if a.shape != e.shape:
            raise AssertionError(f"output shape {tuple(a.shape)}, eager has {tuple(e.shape)}")
        if e.numel() == 0:
            continue
        err = (a.detach().double() - e.detach().double()).abs().max().item()
        scale = e.detach().double().abs().max().item()
        abs_err = max(abs_err, err)
        rel_err = max(rel_err, err / scale if scale > 0 else err)
    return abs_err, rel_err
