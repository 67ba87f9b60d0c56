"""Weight offload on the CPU tier: the planner through ``_C.plan_offload`` (policies on
synthetic programs with given bytes and times; the C++ tests cover the invariants), config
validation, and what ``model_cpu_offload`` does where there is no CUDA device (a warning, the
weights untouched, eager's numbers). The engine itself is CUDA-only:
tests/gpu/test_offload_cuda.py."""

from __future__ import annotations

import logging

import pytest
import torch
from magi_compiler import _C, _offload, inspection, magi_compile
from magi_compiler.config import CompileConfig, OffloadConfig
from magi_compiler.errors import UserError
from torch import nn

MB = 1 << 20


def _layers(n: int, layer_us: float, nbytes: int = 10 * MB) -> tuple[list[float], list[dict]]:
    steps, weights = [], []
    for _ in range(n):
        weights.append({"bytes": nbytes, "first_use": len(steps)})
        steps += [layer_us, 1.0]
    return steps, weights


def test_base_streams_everything_through_two_buffers():
    steps, weights = _layers(8, 1000.0)
    plan = _C.plan_offload(steps, weights, {"policy": "BASE", "resident_ratio": 0.9})
    assert plan["resident"] == [False] * 8 and plan["resident_bytes"] == 0
    assert plan["buffer_bytes"] == 2 * 10 * MB
    assert [g["gate"] for g in plan["groups"][2:]] == [g["release"] for g in plan["groups"][:-2]]
    assert plan["hidden"] and plan["overlap"] == pytest.approx(1.0)


def test_cost_effective_keeps_the_weights_with_least_compute_per_byte():
    steps = [100.0, 4000.0, 50.0, 2000.0]
    weights = [{"bytes": 10 * MB, "first_use": i} for i in range(4)]
    plan = _C.plan_offload(steps, weights, {"policy": "cost_effective", "resident_ratio": 0.5})
    assert plan["resident"] == [True, False, True, False]
    assert plan["offset"][0] == plan["offset"][2] == -1
    assert plan["streamed_bytes"] == 20 * MB
    assert plan["summary"].startswith("COST_EFFECTIVE: 0.042 GB of weights, 0.021 GB resident")


def test_copy_bound_programs_are_predicted_exposed_with_the_ratio_that_would_hide_them():
    steps, weights = _layers(12, 50.0, 30 * MB)
    plan = _C.plan_offload(steps, weights, {"policy": "HEURISTIC", "link_gbps": 50.0})
    assert not plan["hidden"]
    assert plan["overlap"] < 0.2
    assert plan["ratio_to_hide"] > 0.9
    assert plan["call_us"] == pytest.approx(plan["copy_us"], rel=0.05)
    # The same program with 100x the compute hides everything.
    plan = _C.plan_offload([s * 100 for s in steps], weights, {"policy": "HEURISTIC"})
    assert plan["hidden"] and plan["stall_us"] == pytest.approx(0.0, abs=1e-6)


def test_planner_errors_name_what_is_wrong():
    with pytest.raises(UserError, match="weight 0 is read by steps 3..3 of a program of 2 steps"):
        _C.plan_offload([1.0, 1.0], [{"bytes": 1, "first_use": 3}], {})
    with pytest.raises(UserError, match="unknown offload policy 'cheap'"):
        _C.plan_offload([1.0], [], {"policy": "cheap"})
    with pytest.raises(UserError, match="offload settings: unknown key 'ratio'"):
        _C.plan_offload([1.0], [], {"ratio": 0.5})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gpu_resident_weight_ratio", 1.5, "gpu_resident_weight_ratio=1.5 is outside \\[0, 1\\]"),
        ("bandwidth_safety_factor", 0.0, "bandwidth_safety_factor=0.0 is outside \\(0, 1\\]"),
    ],
)
def test_out_of_range_offload_settings_raise_at_decoration(field, value, message):
    with pytest.raises(UserError, match=message):
        magi_compile(nn.Linear(4, 4), config_patch={"offload_config": {field: value}})


def test_engine_settings_follow_the_config(caplog):
    cfg = CompileConfig(offload_config=OffloadConfig(model_cpu_offload=True))
    assert _offload.engine_settings(cfg, "inference") == {
        "policy": "COST_EFFECTIVE",
        "resident_ratio": 0.3,
        "safety_factor": 0.9,
    }
    assert _offload.engine_settings(CompileConfig(), "inference") is None
    with caplog.at_level(logging.WARNING, logger="magi_compiler"):
        assert _offload.engine_settings(cfg, "forward") is None
    assert "the offload engine streams weights for inference graphs only" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA behaviour")
def test_without_cuda_offload_warns_and_leaves_the_weights(caplog):
    _offload._warned.discard("no-cuda")
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    eager = [p.detach().clone() for p in model.parameters()]
    ptrs = [p.data_ptr() for p in model.parameters()]
    with caplog.at_level(logging.WARNING, logger="magi_compiler"):
        compiled = magi_compile(model, config_patch={"offload_config": {"model_cpu_offload": True}})
    assert "model_cpu_offload=True needs a CUDA device; Sequential keeps its weights" in caplog.text
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    assert not any(_C.is_offloaded(p) for p in model.parameters())
    x = torch.randn(4, 16)
    with torch.no_grad():
        expected = nn.functional.linear(
            nn.functional.gelu(nn.functional.linear(x, eager[0], eager[1])), eager[2], eager[3]
        )
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-5)
    # The graph was compiled with the engine's settings; with nothing offloaded it stays out.
    assert inspection.offload_reports() == []
    assert _C.offload_host_bytes() == 0
