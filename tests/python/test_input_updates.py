"""Updates of a module's buffers (a static KV cache) on the CPU: the write_inputs_in_place pass
makes index_copy_, index_put_ and scatter_ write the buffer itself instead of a copy written
back at the end of the call; results and buffers match eager after a prefill and several
decode steps, in float32 and bfloat16. A buffer whose old values are also read keeps the copy
and still matches. A host constant an update copies into device memory (constants_to_device)
becomes a device constant, tried on the meta device."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _input_updates import IN_PLACE, run_steps  # noqa: E402

RTOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def _fresh(counters):
    yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_buffer_updates_write_the_buffer_itself(name, dtype, assert_close_rel):
    text = run_steps(name, "cpu", dtype, assert_close_rel, RTOL[dtype])
    assert IN_PLACE[name] + "(" in text, text
    assert "aten::copy_(" not in text, text


def test_an_update_whose_old_values_are_read_stays_a_copy(assert_close_rel):
    """The key cache's old values are read (a sum before the update): its update stays a copy
    written back; the value cache, read only after its update, is written in place."""
    text = run_steps(
        "reads_old_values", "cpu", torch.float32, assert_close_rel, RTOL[torch.float32]
    )
    assert text.count("aten::index_copy(") == 1, text
    assert text.count("aten::copy_(") == 1, text
    assert text.count("aten::index_copy_(") == 1, text


def test_the_pass_can_be_disabled(monkeypatch, assert_close_rel):
    monkeypatch.setenv("MAGI_DISABLE_PASSES", "write_inputs_in_place")
    text = run_steps("index_copy", "cpu", torch.float32, assert_close_rel, RTOL[torch.float32])
    assert "aten::index_copy(" in text and "aten::copy_(" in text, text


@pytest.mark.parametrize("cse", [False, True])
def test_the_layers_mask_selects_fuse_across_the_cache_updates(cse, assert_close_rel):
    """A 3-layer GPT-2-style model with a static KV cache (benchmarks/models/causal_lm.py):
    each layer's cache update is in place. The layers' mask selects (where(mask, 0, -inf), one
    per layer, between the updates) are all alike: eliminate_common_subexpressions makes them
    one select that every layer reads. Without that pass they are still one generated kernel:
    fuse_groups lets a group span a write of memory nothing in its span reads."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from magi_compiler import inspection, magi_compile

    from benchmarks.models.causal_lm import CausalLM, LMConfig

    cfg = LMConfig("gpt2", 100, 64, 3, 4, 4, 128, max_seq=16)
    eager = CausalLM(cfg).eval()
    off = {"pass_config": {"disabled_passes": ["eliminate_common_subexpressions"]}}
    compiled = magi_compile(
        CausalLM(cfg).eval(), dynamic_arg_dims={}, **({} if cse else {"config_patch": off})
    )
    compiled.load_state_dict(eager.state_dict())
    with torch.no_grad():
        for start, seq in ((0, 4), (4, 4)):
            tokens = torch.randint(0, 100, (1, seq))
            pos = torch.tensor(start)
            assert_close_rel(compiled(tokens, pos), eager(tokens, pos), RTOL[torch.float32])
            for got, want in zip(compiled.buffers(), eager.buffers(), strict=True):
                assert_close_rel(got, want, RTOL[torch.float32])
    text = str(inspection.last_compiled("inference").graph)
    assert text.count("aten::index_copy_(") == 2 * cfg.layers, text
    assert "aten::copy_(" not in text, text
    if cse:
        assert text.count("aten::where.self(") == 1, text
        assert text.count(", %where, None)") == cfg.layers, text  # each layer's attention
        return
    # One node (a fusion) makes the three layers' selects.
    names = [f"%where{'' if i == 0 else f'_{i}'}:" for i in range(cfg.layers)]
    assert any(
        all(n in line for n in names) and "= piece_" in line for line in text.splitlines()
    ), text


class _HostValueMask(torch.nn.Module):
    """A mask set from a host constant: ``mask.index_put_((pos,), torch.tensor(True))``."""

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[0], 1, dtype=torch.bool, device=x.device)
        mask.index_put_((pos,), torch.tensor(True))
        return x.masked_fill(mask, 0.0)


@pytest.mark.parametrize("disabled", [False, True], ids=["pass", "disabled"])
def test_a_host_constant_an_update_copies_becomes_a_device_constant(disabled, monkeypatch):
    """constants_to_device without a GPU: tensors on the meta device. The index_put reads a
    constant on the mask's device instead of copying the host tensor each call (which CUDA graph
    capture refuses). The pipeline runs under AOTAutograd's FakeTensorMode, and the device copy
    must still be a real tensor: a fake one failed the first call."""
    from magi_compiler import inspection, magi_compile

    if disabled:
        monkeypatch.setenv("MAGI_DISABLE_PASSES", "constants_to_device")
    compiled = magi_compile(_HostValueMask(), dynamic_arg_dims={})
    x = torch.randn(8, 4, device="meta")
    with torch.no_grad():
        out = compiled(x, torch.tensor([2], device="meta"))
    assert out.shape == (8, 4) and out.device.type == "meta"
    text = str(inspection.last_compiled("inference").graph)
    (update,) = [line for line in text.splitlines() if "aten::index_put(" in line]
    assert ("aten::lift_fresh_copy(" in text) == disabled, text
    assert ("@meta)" in update.split("aten::index_put(")[1]) == (not disabled), update
