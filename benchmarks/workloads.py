"""The workloads of the suite: what each builds, at which shapes, and how a step drives it.

A :class:`Workload` is a recipe; :meth:`Workload.build` makes a :class:`Case` on a device: the
module every variant compiles, a few sets of random inputs to rotate through, and how one
timed step uses them. Three shape presets:

- ``full``: the headline shapes (GPU, bfloat16);
- ``quick``: small shapes that keep the CPU suite under five minutes on two cores (float32);
- ``smoke``: tiny shapes for the test suite (correctness only).

``weight`` is a rough relative cost (mostly compile time) used to share the time budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from blocks import LlamaStack, RMSNorm
from torch import nn

from benchmarks.models import (
    GPT2_SMALL,
    LLAMA_3_2_1B,
    MICRO,
    BertConfig,
    BertForMLM,
    CausalLM,
    DiTBlock,
    LMConfig,
    MSELossHead,
    make_micro,
)

PRESETS = ("full", "quick", "smoke")
N_INPUT_SETS = 3  # rotating input sets per workload (2 for the large microbenchmarks)


@dataclass
class Case:
    """One workload built on a device."""

    module: nn.Module  # what every variant wraps and compiles; eager runs it as is
    inputs: list[tuple]  # argument sets, rotated through sample by sample
    kind: str  # "forward" | "train" | "decode"
    shape: str  # human-readable shapes, for the report
    tokens: int = 0  # tokens processed (or generated) per step: throughput in tokens/s
    bytes_moved: int = 0  # least bytes read + written per step: effective bandwidth
    decode_steps: int = 0
    positions: list[torch.Tensor] = field(default_factory=list)  # decode: start_pos per step
    state: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (buf, copy)
    compile: bool = True  # False: measured eagerly only (the copy ceiling)

    def params(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def drop_grads(self) -> None:
        for p in self.params():
            p.grad = None

    def reset_state(self) -> None:
        """Restores mutable buffers (KV caches) to their initial random contents."""
        for buf, initial in self.state:
            buf.copy_(initial)

    def step(self, fn: Callable, args: tuple, before_call: Callable[[], None]) -> Any:
        """One timed unit of work: a forward, a training step, or a whole greedy decode."""
        if self.kind == "train":
            self.drop_grads()
            before_call()
            loss = fn(*args)
            loss.backward()
            return loss
        if self.kind == "decode":
            tok = args[0]
            for pos in self.positions:
                before_call()
                tok = fn(tok, pos).argmax(-1, keepdim=True)
            return tok
        before_call()
        return fn(*args)

    def check(self, fn: Callable, args: tuple, before_call: Callable[[], None]) -> list[Any]:
        """The values compared against eager: outputs; loss and gradients; first-step logits."""
        if self.kind == "train":
            loss = self.step(fn, args, before_call)
            return [loss.detach()] + [p.grad for p in self.params()]
        if self.kind == "decode":
            self.reset_state()
            before_call()
            return [fn(args[0], self.positions[0])]
        out = self.step(fn, args, before_call)
        return list(out) if isinstance(out, (tuple, list)) else [out]


@dataclass(frozen=True)
class Workload:
    name: str
    group: str  # workloads of one group share a model family and run in one worker
    title: str
    builder: Callable[[str, torch.device, torch.dtype], Case]
    weight: float = 1.0
    quick: bool = True  # in the CPU subset that ``--quick`` runs when no ``--only`` is given

    def build(self, preset: str, device: torch.device, dtype: torch.dtype) -> Case:
        return self.builder(preset, device, dtype)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def _finish(module: nn.Module, dtype: torch.dtype, train: bool = False) -> nn.Module:
    """Casts and re-initialises ``module`` in place on its device: matrices and embeddings
    N(0, 0.02), norm weights 1 + N(0, 0.1) and biases N(0, 0.02) (GPT-2's scheme; drawing on
    the device keeps a 1B-parameter model's set-up in milliseconds)."""
    module = module.to(dtype=dtype)
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.weight.normal_(0.0, 0.02)
        elif isinstance(m, (nn.LayerNorm, RMSNorm)) and getattr(m, "weight", None) is not None:
            m.weight.normal_(1.0, 0.1)
        if isinstance(getattr(m, "bias", None), torch.Tensor):
            m.bias.normal_(0.0, 0.02)
    for p in module.parameters():
        p.requires_grad_(train)
    return module.train(train)


def _randn(*shape, device, dtype) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype)


def _tokens(vocab: int, *shape, device) -> torch.Tensor:
    return torch.randint(0, vocab, shape, device=device)


# --------------------------------------------------------------------------------------------
# Llama-style stack (examples/blocks.py): prefill, small batch, training step
# --------------------------------------------------------------------------------------------

_LLAMA_STACK = {
    "full": dict(n_layers=4, hidden=2048, n_heads=16, n_kv_heads=8, intermediate=8192),
    "quick": dict(n_layers=2, hidden=256, n_heads=8, n_kv_heads=4, intermediate=768),
    "smoke": dict(n_layers=1, hidden=64, n_heads=4, n_kv_heads=2, intermediate=128),
}
_LLAMA_SHAPES = {  # (batch, seq) per workload and preset
    "llama_prefill": {"full": (1, 4096), "quick": (1, 256), "smoke": (1, 32)},
    "llama_small_batch": {"full": (4, 32), "quick": (4, 16), "smoke": (2, 8)},
    # 3 samples: magi's CUDA graphs run them padded in the graph of batch 4 (docs/config.md).
    "llama_padded_batch": {"full": (3, 32), "quick": (3, 16), "smoke": (3, 8)},
    "llama_train": {"full": (2, 2048), "quick": (2, 128), "smoke": (2, 16)},
}


def _llama_stack(name: str) -> Callable:
    def build(preset, device, dtype) -> Case:
        cfg = _LLAMA_STACK[preset]
        batch, seq = _LLAMA_SHAPES[name][preset]
        train = name == "llama_train"
        with torch.device(device):
            stack = LlamaStack(**cfg)
        module = _finish(MSELossHead(stack) if train else stack, dtype, train)
        h = cfg["hidden"]
        if train:
            inputs = [
                (_randn(batch, seq, h, device=device, dtype=dtype),
                 _randn(batch, seq, h, device=device, dtype=dtype))
                for _ in range(N_INPUT_SETS)
            ]  # fmt: skip
        else:
            inputs = [
                (_randn(batch, seq, h, device=device, dtype=dtype),) for _ in range(N_INPUT_SETS)
            ]
        shape = f"{cfg['n_layers']} layers, hidden {h}, batch {batch} x seq {seq}"
        return Case(module, inputs, "train" if train else "forward", shape, tokens=batch * seq)

    return build


# --------------------------------------------------------------------------------------------
# Decoder LMs with a static KV cache: GPT-2 small and Llama-3.2-1B shapes
# --------------------------------------------------------------------------------------------

_LM = {
    "gpt2": {
        "full": GPT2_SMALL,
        "quick": LMConfig("gpt2", 4096, 256, 2, 4, 4, 1024, max_seq=96),
        "smoke": LMConfig("gpt2", 256, 64, 1, 2, 2, 128, max_seq=16),
    },
    "llama1b": {
        "full": LLAMA_3_2_1B,
        "quick": LMConfig("llama", 8192, 256, 2, 8, 2, 1024, max_seq=64, rope_base=500000.0),
        "smoke": LMConfig("llama", 256, 64, 1, 4, 2, 128, max_seq=16),
    },
}
_PROMPT = {  # prompt length (prefill) and generated tokens (decode), per family and preset
    "gpt2": {"full": (128, 128), "quick": (64, 16), "smoke": (8, 4)},
    "llama1b": {"full": (32, 128), "quick": (32, 16), "smoke": (8, 4)},
}


def _lm(family: str, phase: str) -> Callable:
    def build(preset, device, dtype) -> Case:
        cfg = _LM[family][preset]
        prompt, new = _PROMPT[family][preset]
        assert prompt + new <= cfg.max_seq
        with torch.device(device):
            module = _finish(CausalLM(cfg), dtype)
        # The cache holds random keys and values, as if a prompt had been prefilled: never
        # zeros (they can run faster than real data and hide unwritten slots).
        state = []
        for buf in module.kv_caches():
            buf.normal_()
            state.append((buf, buf.clone()))
        desc = f"{cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads}/{cfg.kv_heads} heads, "
        desc += f"vocab {cfg.vocab}, batch {cfg.batch}"
        zero = torch.zeros((), dtype=torch.long, device=device)
        if phase == "prefill":
            inputs = [
                (_tokens(cfg.vocab, cfg.batch, prompt, device=device), zero)
                for _ in range(N_INPUT_SETS)
            ]
            return Case(module, inputs, "forward", f"{desc}, prompt {prompt}", cfg.batch * prompt)
        inputs = [(_tokens(cfg.vocab, cfg.batch, 1, device=device),) for _ in range(N_INPUT_SETS)]
        positions = [torch.full((), prompt + i, device=device) for i in range(new)]
        shape = f"{desc}, {new} tokens after a {prompt}-token prompt, cache {cfg.max_seq}"
        return Case(
            module, inputs, "decode", shape, cfg.batch * new, decode_steps=new,
            positions=positions, state=state,
        )  # fmt: skip

    return build


# --------------------------------------------------------------------------------------------
# BERT-style encoder training step, video-DiT block, memory-bound microbenchmarks
# --------------------------------------------------------------------------------------------

_BERT = {
    "full": (BertConfig(), 4, 512),
    "quick": (BertConfig(vocab=4096, hidden=256, layers=2, heads=4, intermediate=1024), 4, 64),
    "smoke": (BertConfig(vocab=256, hidden=64, layers=1, heads=2, intermediate=128), 2, 16),
}


def _bert(preset, device, dtype) -> Case:
    cfg, batch, seq = _BERT[preset]
    with torch.device(device):
        module = _finish(BertForMLM(cfg), dtype, train=True)
    inputs = [
        (
            _tokens(cfg.vocab, batch, seq, device=device),
            _tokens(cfg.vocab, batch, seq, device=device),
        )
        for _ in range(N_INPUT_SETS)
    ]
    shape = (
        f"{cfg.layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab}, batch {batch} x seq {seq}"
    )
    return Case(module, inputs, "train", shape, tokens=batch * seq)


_DIT = {"full": (3072, 24, 16384), "quick": (256, 4, 512), "smoke": (64, 2, 64)}


def _dit(preset, device, dtype) -> Case:
    hidden, heads, seq = _DIT[preset]
    with torch.device(device):
        module = _finish(DiTBlock(hidden, heads, seq), dtype)
    inputs = [
        (
            _randn(1, seq, hidden, device=device, dtype=dtype),
            _randn(1, hidden, device=device, dtype=dtype),
        )
        for _ in range(N_INPUT_SETS)
    ]
    return Case(
        module, inputs, "forward", f"hidden {hidden}, {heads} heads, batch 1 x seq {seq}", seq
    )


_MICRO_SHAPE = {"full": (16384, 8192), "quick": (2048, 2048), "smoke": (64, 128)}


def _micro(name: str) -> Callable:
    def build(preset, device, dtype) -> Case:
        spec = MICRO[name]
        rows, cols = _MICRO_SHAPE[preset]
        with torch.device(device):
            module = _finish(make_micro(name, cols), dtype)
        sets = 2 if preset == "full" else N_INPUT_SETS
        inputs = [
            tuple(_randn(rows, cols, device=device, dtype=dtype) for _ in range(spec.n_inputs))
            for _ in range(sets)
        ]
        moved = spec.tensors_moved * rows * cols * torch.finfo(dtype).bits // 8
        shape = f"{rows} x {cols} {str(dtype).removeprefix('torch.')}"
        return Case(module, inputs, "forward", shape, bytes_moved=moved, compile=spec.compile)

    return build


# --------------------------------------------------------------------------------------------
# Registry, in run order
# --------------------------------------------------------------------------------------------

_MICRO_TITLES = {
    "silu_mul": "pointwise silu(a)*b",
    "rmsnorm": "RMSNorm",
    "add_rmsnorm": "add + RMSNorm",
    "layernorm": "LayerNorm",
    "softmax": "softmax",
    "copy": "device copy (ceiling)",
}

WORKLOADS: list[Workload] = [
    *(
        Workload(f"micro_{n}", "micro", _MICRO_TITLES[n], _micro(n), 0.2 if n == "copy" else 0.8)
        for n in MICRO
    ),
    Workload("llama_prefill", "llama_stack", "Llama stack prefill", _llama_stack("llama_prefill"), 3, quick=False),
    Workload("llama_small_batch", "llama_stack", "Llama stack small batch", _llama_stack("llama_small_batch"), 2.5),
    Workload("llama_padded_batch", "llama_stack", "Llama stack batch 3 (padded to 4)", _llama_stack("llama_padded_batch"), 2.5, quick=False),
    Workload("llama_train", "llama_stack", "Llama stack training step", _llama_stack("llama_train"), 5),
    Workload("gpt2_prefill", "gpt2", "GPT-2 small prefill", _lm("gpt2", "prefill"), 3),
    Workload("gpt2_decode", "gpt2", "GPT-2 small greedy decode", _lm("gpt2", "decode"), 3.5),
    Workload("bert_train", "bert", "BERT-base-style training step", _bert, 5, quick=False),
    Workload("llama1b_prefill", "llama1b", "Llama-3.2-1B-shape prefill", _lm("llama1b", "prefill"), 4, quick=False),
    Workload("llama1b_decode", "llama1b", "Llama-3.2-1B-shape decode", _lm("llama1b", "decode"), 4.5, quick=False),
    Workload("dit_block", "dit", "Video-DiT block forward", _dit, 2.5),
]  # fmt: skip
BY_NAME = {w.name: w for w in WORKLOADS}


def select(only: str | None, preset: str = "full") -> list[Workload]:
    """Workloads named in ``only`` (comma-separated workload or group names, or ``all``), in
    run order; without ``only``: all of them, or the CPU subset for the quick preset (Inductor
    compiles each model for 10 to 50 s on a 2-core machine, too long for all of them in five
    minutes)."""
    if not only:
        return [w for w in WORKLOADS if w.quick or preset != "quick"]
    if only.strip() == "all":
        return list(WORKLOADS)
    wanted = {s.strip() for s in only.split(",") if s.strip()}
    known = set(BY_NAME) | {w.group for w in WORKLOADS}
    unknown = wanted - known
    if unknown:
        raise SystemExit(
            f"--only: unknown workload(s) {', '.join(sorted(unknown))}; known: "
            + ", ".join(w.name for w in WORKLOADS)
            + "; groups: "
            + ", ".join(dict.fromkeys(w.group for w in WORKLOADS))
        )
    return [w for w in WORKLOADS if w.name in wanted or w.group in wanted]


def describe(w: Workload) -> dict[str, Any]:
    return {"name": w.name, "group": w.group, "title": w.title, "weight": w.weight}
