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
from magi_compiler import magi_compile  # noqa: E402

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


def test_a_written_argument_is_the_callers_tensor_under_cuda_graphs(lowered, assert_close_rel):
    """A function that adds into a cache passed as an argument, under FULL CUDA graphs. With
    the same cache on every call the graph writes it in place (replays). With a new cache on
    every call a graph would write its own copy of the argument, so those calls run without
    one and every cache is updated once, as eager updates it; a cache passed twice in a row
    then gets a graph."""

    def step(x, pos, cache):
        cache.index_add_(0, pos, x * 2)  # a write done twice, or not at all, shows
        return cache.sum(0) + x[0]

    compiled = magi_compile(step, dynamic_arg_dims={}, config_patch={"cudagraph_mode": "FULL"})
    same = torch.zeros(8, 16, device="cuda")
    same_eager = same.clone()
    for i in range(4):  # one cache: warm-up, capture, replays
        x, pos = torch.randn(1, 16, device="cuda"), torch.tensor([i], device="cuda")
        assert_close_rel(compiled(x, pos, same), step(x, pos, same_eager), 1e-5)
        assert_close_rel(same, same_eager, 1e-5)
    assert lowered[0].magi_cuda_graphs.num_replays >= 2
    assert lowered[0].magi_cuda_graphs.num_ungraphed_calls == 0
    caches = [torch.randn(8, 16, device="cuda") for _ in range(4)]
    caches.append(caches[-1])  # the last one twice in a row
    for i, cache in enumerate(caches):  # another graph: 2 positions
        cache_eager = cache.clone()
        x, pos = torch.randn(2, 16, device="cuda"), torch.tensor([i % 4, 4 + i % 4], device="cuda")
        assert_close_rel(compiled(x, pos, cache), step(x, pos, cache_eager), 1e-5)
        assert_close_rel(cache, cache_eager, 1e-5)
    runner = lowered[1].magi_cuda_graphs
    assert len(lowered) == 2
    assert runner.num_ungraphed_calls == 3  # calls 2-4: each cache another than the last
    assert runner.num_graphs == 1  # call 5: the same cache as call 4, captured
