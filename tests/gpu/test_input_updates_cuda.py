"""Updates of a module's buffers (a static KV cache) on CUDA, without and with CUDA graphs: the
write_inputs_in_place pass makes index_copy_, index_put_ and scatter_ write the buffer itself;
results and buffers match eager after a prefill and several decode steps, and a graph replay
leaves the buffer as eager does."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _input_updates import IN_PLACE, run_steps  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

RTOL = 2e-2  # bf16


@pytest.fixture(autouse=True)
def _fresh(counters):
    yield


@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE", "FULL"])
@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_buffer_updates_write_the_buffer_itself(name, mode, assert_close_rel):
    text = run_steps(
        name, "cuda", torch.bfloat16, assert_close_rel, RTOL, {"cudagraph_mode": mode}, 6
    )
    assert IN_PLACE[name] + "(" in text, text
    assert "aten::copy_(" not in text, text


def test_an_update_whose_old_values_are_read_stays_a_copy(assert_close_rel):
    text = run_steps(
        "reads_old_values",
        "cuda",
        torch.bfloat16,
        assert_close_rel,
        RTOL,
        {"cudagraph_mode": "FULL"},
    )
    assert text.count("aten::copy_(") == 1 and text.count("aten::index_copy_(") == 1, text
