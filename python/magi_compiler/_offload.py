"""Weight offload, Python side: a module's parameters moved into pinned host memory, what
``.to()``, ``.cuda()``, ``.cpu()`` and dtype casts do to them afterwards, and the settings
handed to the C++ engine (``runtime/offload.h``) of each compiled inference graph.

An offloaded parameter is a CUDA tensor whose memory is pinned host memory the GPU can read
(``_C.offload_to_host``). Dynamo and eager code see an ordinary CUDA parameter; compiled
inference graphs get a GPU copy of it from the engine, streamed or kept resident by the plan.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from magi_compiler import _C
from magi_compiler._logging import logger
from magi_compiler.config import CompileConfig

_warned: set[str] = set()


def warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def engine_settings(config: CompileConfig, kind: str) -> dict[str, Any] | None:
    """The engine settings of a graph of ``kind``, or None when it does not offload."""
    oc = config.offload_config
    if not oc.model_cpu_offload:
        return None
    if kind != "inference":
        warn_once(
            "training",
            "model_cpu_offload: %s graphs read offloaded weights in place over the host link "
            "(slow); the offload engine streams weights for inference graphs only",
            kind,
        )
        return None
    return {
        "policy": oc.offload_policy.name,
        "resident_ratio": float(oc.gpu_resident_weight_ratio),
        "safety_factor": float(oc.bandwidth_safety_factor),
    }


def _parameters(module: nn.Module, recurse: bool = True) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for sub in module.modules() if recurse else [module]:
        for p in sub._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def offload_module(module: nn.Module) -> int:
    """Moves every parameter of ``module`` into pinned host memory, one at a time (each
    original is freed as soon as its copy exists, so the host never holds the model twice),
    and makes ``.to()`` and friends keep them there. Returns the bytes moved; 0 without CUDA."""
    if not torch.cuda.is_available():
        warn_once(
            "no-cuda",
            "model_cpu_offload=True needs a CUDA device; %s keeps its weights where they are",
            type(module).__name__,
        )
        return 0
    default = torch.device("cuda", torch.cuda.current_device())
    moved = 0
    with torch.no_grad():
        for p in _parameters(module):
            if _C.is_offloaded(p):
                continue
            device = p.device if p.device.type == "cuda" else default
            p.data = _C.offload_to_host(p.data, str(device))
            moved += p.numel() * p.element_size()
    for sub in module.modules():
        if not getattr(sub, "_magi_offloaded", False):
            object.__setattr__(sub, "_apply", types.MethodType(_offloaded_apply, sub))
            object.__setattr__(sub, "_magi_offloaded", True)
    logger.info(
        "model_cpu_offload: %s: %.3f GB of parameters in pinned host memory (%.3f GB held)",
        type(module).__name__,
        moved / 1e9,
        _C.offload_host_bytes() / 1e9,
    )
    return moved


def _retarget(p: nn.Parameter, device: torch.device, dtype: torch.dtype) -> None:
    """Points ``p`` at its pinned memory seen from ``device`` (no copy), converting into new
    pinned memory first when ``dtype`` differs."""
    if dtype != p.dtype and p.is_floating_point():
        converted = _C.offloaded_view(p.data, "cpu").to(dtype)
        p.data = _C.offload_to_host(converted, str(device))
    elif device != p.device:
        p.data = _C.offloaded_view(p.data, str(device))


def _offloaded_apply(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
    """``nn.Module._apply`` for an offloaded module: what ``fn`` would do to a parameter is
    read off a one-element probe of the same dtype and device; an offloaded parameter then
    stays in pinned host memory, seen from the target device (CUDA or CPU), converted when the
    dtype changes. Everything else (buffers, parameters not offloaded) goes through ``fn``."""
    params = [p for p in _parameters(self, recurse) if _C.is_offloaded(p)]
    handled: set[int] = set()
    with torch.no_grad():
        targets: dict[tuple[torch.dtype, torch.device], Any] = {}
        for p in params:
            key = (p.dtype, p.device)
            if key not in targets:
                probe = torch.empty(1, dtype=p.dtype, device=p.device)
                try:
                    out = fn(probe)
                except Exception:  # noqa: BLE001 - not a conversion: let fn see the parameter
                    out = None
                targets[key] = out if isinstance(out, torch.Tensor) else None
            out = targets[key]
            if out is None or out.device.type not in ("cuda", "cpu"):
                continue  # e.g. to("meta"): the parameter goes through fn like any tensor
            device = out.device
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            _retarget(p, device, out.dtype)
            handled.add(id(p))

    def rest(t: torch.Tensor) -> torch.Tensor:
        return t if id(t) in handled else fn(t)

    return type(self)._apply(self, rest, recurse)
