"""One process of the compiled-module cache tests (test_compile_cache.py): compiles the model in
``cache_model.py`` (next to the cache directory the test made), calls it on the shapes given,
checks each result against eager and prints one JSON line with the counters.

Usage: python _cache_driver.py SPEC_JSON, where SPEC holds
  dir:      the test's directory (cache_model.py and cache/ live there)
  shapes:   [[rows, cols], ...] inputs of the calls, in order
  dtype:    "float32" (default) or "float64"
  patch:    config_patch entries (the cache directory is added)
  fake:     {"torch": "...", "device": "..."}: what this process claims to run on
  op_flag:  registers cache_model's custom op with this is_compute_sensitive value
  train:    call with grad enabled (a training capture) and check the gradients too
  grad:     call with grad enabled (default: train) without a backward
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch

spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["dir"])

import magi_compiler  # noqa: E402
from magi_compiler import _compile_cache, inspection  # noqa: E402

if "torch" in spec.get("fake", {}):
    torch.__version__ = spec["fake"]["torch"]
if "device" in spec.get("fake", {}):
    _compile_cache._device_part = lambda: spec["fake"]["device"]

records: list[str] = []


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append(record.getMessage())


logging.getLogger("magi_compiler").addHandler(_Keep())
logging.getLogger("magi_compiler").setLevel(logging.INFO)

import cache_model  # noqa: E402

if "op_flag" in spec:
    cache_model.register_op(spec["op_flag"])

torch.manual_seed(0)
dtype = getattr(torch, spec.get("dtype", "float32"))
model = cache_model.Model().to(dtype).eval()
patch = {"cache_root_dir": os.path.join(spec["dir"], "cache"), "disable_cache": False}
patch.update(spec.get("patch", {}))
compiled = magi_compiler.magi_compile(model, config_patch=patch)


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach(), expected.detach()
    return float((actual - expected).abs().max() / expected.abs().max())


errors = []
train = bool(spec.get("train"))
grad = bool(spec.get("grad", train))
for rows, cols in spec["shapes"]:
    x = torch.randn(rows, cols, dtype=dtype, requires_grad=train)
    with torch.set_grad_enabled(grad):
        expected = cache_model.Model.forward(model, x)
        actual = compiled(x)
    errors.append(relative(actual, expected))
    if train:  # the gradients of the input and of every parameter, against eager's
        weights = torch.randn_like(expected)
        eager = torch.autograd.grad((expected * weights).sum(), [x, *model.parameters()])
        ours = torch.autograd.grad((actual * weights).sum(), [x, *model.parameters()])
        errors += [relative(a, e) for a, e in zip(ours, eager, strict=True)]

counters = magi_compiler.get_counters().as_dict()
# Piece calls in row chunks (chunk_rows) in the graphs this process compiled or loaded.
chunked = sum(
    str(info.graph).count(" in chunks of ")
    for info in inspection.compiled_graphs()
    if info.graph is not None
)
counters.update(magi_compiler._C.compiler_stats())
# Modules a capture needs and a call served from the cache does not.
capture_only = ("torch._functorch.aot_autograd", "torch._dynamo.repro.after_dynamo")
imported = [name for name in capture_only if name in sys.modules]
print(
    json.dumps(
        {
            "counters": counters,
            "errors": errors,
            "log": records,
            "imported": imported,
            "chunked": chunked,
        }
    )
)
