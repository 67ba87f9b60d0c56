"""CUDA graphs (cudagraph_mode NONE / PIECEWISE / FULL) on the GPU: numerics across batch
sizes, held outputs stay valid, capture counts, and re-capture when a parameter is replaced."""

from __future__ import annotations

import copy
import gc

import magi_compiler
import pytest
import torch
from magi_compiler import magi_compile, magi_register_custom_op

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _block(dtype):
    import blocks

    torch.backends.cuda.matmul.allow_tf32 = False
    m = blocks.LlamaBlock(hidden=256, n_heads=8, n_kv_heads=4, intermediate=512)
    blocks.init_weights_(m, seed=0)
    return m.to("cuda", dtype).eval()


@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE", "FULL"])
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_modes_match_eager_across_batch_sizes(
    mode, dtype, rtol, counters, lowered, assert_close_rel
):
    eager = _block(dtype)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": mode})
    with torch.no_grad():
        for batch in (2, 3, 5, 3, 2, 5, 2):
            x = torch.randn(batch, 16, 256, device="cuda", dtype=dtype)
            assert_close_rel(compiled(x), eager(x), rtol)
    assert counters().captures == 1
    runner = lowered[0].magi_cuda_graphs
    if mode == "NONE":
        assert runner is None
    else:
        # An unsplit graph has no pieces: PIECEWISE captures it whole, like FULL.
        assert runner.num_graphs == 3  # one per batch size, each captured on its second call
        assert runner.num_captures == 3
        assert runner.num_replays == 4  # each capture replays once, and call 7 replays
        # 3 and 5 are padded into the default ladder's buckets 4 and 8 (alone in them here).
        assert runner.num_padded_calls == 4


def test_held_outputs_are_not_overwritten(counters, lowered):
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        xs = [torch.randn(4, 16, 256, device="cuda") for _ in range(4)]
        outs = [compiled(x) for x in xs]  # warm-up, capture, replay, replay
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, eager(x), rtol=1e-4, atol=1e-4)
    assert lowered[0].magi_cuda_graphs.num_replays >= 3


def test_a_loop_alternates_between_two_output_buffers(counters, lowered):
    """`y = f(x)` in a loop over one input tensor, refilled each step: each call runs while the
    previous output is still held, so replays alternate between the graph's two sets of output
    buffers; nothing new is allocated and every output keeps its values until dropped. (Fresh
    input tensors each step would come from as many addresses as the allocator cycles through,
    which depends on what ran before in the process: from three in turn a graph gets a third
    executable, test_inputs_from_a_few_addresses_get_executables_of_their_own.)"""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    addresses = []
    x = torch.empty(4, 16, 256, device="cuda")
    with torch.no_grad():
        y = None
        for _ in range(8):  # warm-up, capture, 6 replays
            x.normal_()
            previous = y
            y = compiled(x)
            torch.testing.assert_close(y, eager(x), rtol=1e-4, atol=1e-4)
            addresses.append(y.data_ptr())
            if previous is not None:
                assert previous.data_ptr() != y.data_ptr()
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_replays == 7
    assert runner.num_fresh_output_buffers == 0
    assert runner.num_executables == 2
    replayed = addresses[1:]
    assert len(set(replayed)) == 2
    assert replayed[0::2] == [replayed[0]] * 4 and replayed[1::2] == [replayed[1]] * 3


def test_outputs_held_by_the_caller_get_fresh_buffers(counters, lowered):
    """Outputs kept in a list: once both buffer sets are held, each replay writes new buffers
    and leaves the held ones to the caller."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        xs = [torch.randn(4, 16, 256, device="cuda") for _ in range(7)]
        outs = [compiled(x) for x in xs]
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, eager(x), rtol=1e-4, atol=1e-4)
    runner = lowered[0].magi_cuda_graphs
    # Calls 2 and 3 write the two sets; calls 4 to 7 find both held.
    assert runner.num_fresh_output_buffers == 4
    assert len({o.data_ptr() for o in outs}) == len(outs)


def test_a_held_view_keeps_its_output_buffer(counters, lowered):
    """A view of an output refers to the buffer's memory as the output did: later replays
    leave it alone."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        for _ in range(2):  # warm-up, capture
            compiled(torch.randn(4, 16, 256, device="cuda"))
        x = torch.randn(4, 16, 256, device="cuda")
        first_row = compiled(x)[1:2]  # the output itself is dropped at once
        for _ in range(4):
            compiled(torch.randn(4, 16, 256, device="cuda"))
        torch.testing.assert_close(first_row, eager(x)[1:2], rtol=1e-4, atol=1e-4)
    assert lowered[0].magi_cuda_graphs.num_fresh_output_buffers == 0


def test_inputs_reach_the_graph_through_its_copy_nodes(counters, lowered):
    """Dense inputs are copied by nodes at the start of the graph, pointed at each call's
    tensor: a tensor reused with new contents, fresh tensors (also ones the allocator hands out
    at a freed tensor's address), and padded calls of fewer rows (a shorter copy into the same
    node) all replay what eager computes. A node is set only when no free executable's node
    reads the call's tensor already: never for a reused tensor whose outputs the caller drops,
    once per call for distinct ones."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})

    def check(x):
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-4)

    with torch.no_grad():
        x = torch.randn(4, 16, 256, device="cuda")
        for _ in range(2):  # warm-up, capture (its replay points slot 0's node at x)
            check(x)
        runner = lowered[0].magi_cuda_graphs
        before = runner.num_input_retargets
        for _ in range(6):  # the same tensor, new contents each call
            x.copy_(torch.randn_like(x))
            check(x)
        # Slot 0's executable reads x already and the caller drops each output: no update.
        assert runner.num_input_retargets - before == 0

        before = runner.num_input_retargets
        kept = [torch.randn(4, 16, 256, device="cuda") for _ in range(5)]
        for k in kept:  # distinct live tensors: the node follows each
            check(k)
        assert runner.num_input_retargets - before == len(kept)

        for _ in range(4):  # freed at once: the next one may land at the same address
            check(torch.randn(4, 16, 256, device="cuda"))
        for batch in (3, 4, 3, 2, 4):  # 3 pads into bucket 4 (the same graph), 2 has its own
            check(torch.randn(batch, 16, 256, device="cuda"))
    assert runner.num_padded_calls >= 2
    assert runner.num_fresh_output_buffers == 0


def test_inputs_from_a_few_addresses_get_executables_of_their_own(counters, lowered):
    """Inputs arriving from four tensors in turn (a serving loop over a caching allocator's
    blocks), while the caller holds the last output: once the copy nodes have been re-pointed
    16 times the graph gets two more executables, after which each tensor has one whose nodes
    read it and replays update no node. The held output keeps its values throughout, and
    every call matches eager."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    xs = [torch.empty(4, 16, 256, device="cuda") for _ in range(4)]
    held = []  # (output, what eager made of its input)
    with torch.no_grad():

        def call(x):
            x.copy_(torch.randn_like(x))
            held.append((compiled(x), eager(x)))
            for out, want in held:
                torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
            del held[:-1]

        for i in range(30):
            call(xs[i % 4])
        runner = lowered[0].magi_cuda_graphs
        assert runner.num_executables == 4
        before = runner.num_input_retargets
        for i in range(12):
            call(xs[i % 4])
        assert runner.num_input_retargets == before
    assert runner.num_fresh_output_buffers == 0


@pytest.mark.parametrize(
    "tensors,batch,limit",
    [(7, 4, None), (4, 4, 2), (3, 272, None)],
    ids=["seven_tensors", "told_to_keep_two", "outputs_over_4MiB"],
)
def test_inputs_that_more_executables_cannot_serve_add_none(
    tensors, batch, limit, counters, lowered
):
    """The graph keeps its two executables, re-points a node on every replay and matches eager
    when more executables could not help or may not be made: seven tensors in turn (more than
    four executables could keep), the runner told to keep to two, or outputs of 4.25 MiB a set
    (over the 4 MiB for which a graph gets more)."""
    eager = _block(torch.float32)
    xs = [torch.randn(batch, 16, 256, device="cuda") for _ in range(tensors)]
    patch = {"cudagraph_mode": "FULL", "cudagraph_padding": False}
    compiled = magi_compile(copy.deepcopy(eager), config_patch=patch)
    with torch.no_grad():
        want = [eager(x) for x in xs]
        compiled(xs[0])  # warm-up
        runner = lowered[0].magi_cuda_graphs
        if limit is not None:
            runner.set_max_executables(limit)
        for i in range(1, 40):
            got = compiled(xs[i % tensors])
            torch.testing.assert_close(got, want[i % tensors], rtol=1e-4, atol=1e-4)
        assert runner.num_executables == 2
        before = runner.num_input_retargets
        for i in range(40, 54):  # picking up after call 39
            compiled(xs[i % tensors])
        assert runner.num_input_retargets - before == 14


def test_strided_inputs_are_copied_before_the_launch(counters, lowered):
    """An input that is not dense (every other column of a wider tensor) has no copy node: it
    is copied into the graph's buffer before each launch, and nothing is retargeted."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        for _ in range(5):
            wide = torch.randn(4, 16, 512, device="cuda")
            x = wide[..., ::2]
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-4)
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_replays == 4
    assert runner.num_input_retargets == 0


def test_replays_on_two_streams_match_eager(counters, lowered):
    """Calls alternating between two streams: the second executable's replay waits for the
    first's on the other stream, and buffers are recorded on both."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    side = torch.cuda.Stream()
    xs = [torch.randn(4, 16, 256, device="cuda") for _ in range(8)]
    outs = []
    with torch.no_grad():
        for i, x in enumerate(xs):
            stream = side if i % 2 else torch.cuda.current_stream()
            stream.wait_stream(torch.cuda.default_stream())
            with torch.cuda.stream(stream):
                outs.append(compiled(x).sum(-1))
        torch.cuda.synchronize()
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, eager(x).sum(-1), rtol=1e-4, atol=1e-3)


def test_an_output_read_on_its_stream_outlives_a_replay_on_another(counters, lowered):
    """y0 comes from a replay on stream A and is read there behind a long kernel, then
    dropped; meanwhile a replay on stream B wrote the other set. The next replay on B takes
    y0's set, so it waits for A's work first: the read still sees y0's values."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    xs = [torch.randn(4, 16, 256, device="cuda") for _ in range(3)]
    with torch.no_grad():
        for _ in range(2):  # warm-up, capture
            compiled(torch.randn(4, 16, 256, device="cuda"))
        expected = eager(xs[0])
        torch.cuda.synchronize()
        for s in (a, b):
            s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(a):
            y0 = compiled(xs[0])
        first = y0.data_ptr()
        with torch.cuda.stream(b):
            y1 = compiled(xs[1])  # the other set: y0 is held
        with torch.cuda.stream(a):
            torch.cuda._sleep(200_000_000)  # about 0.1 s: the read below waits behind it
            read = y0 * 1
        del y0
        with torch.cuda.stream(b):
            y2 = compiled(xs[2])  # y0's set, the only one not held
        torch.cuda.synchronize()
    torch.testing.assert_close(read, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y2, eager(xs[2]), rtol=1e-4, atol=1e-4)
    assert y2.data_ptr() == first != y1.data_ptr()
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_fresh_output_buffers == 0
    assert runner.num_executables == 2


@pytest.mark.parametrize("batches", [(4, 4), (4, 8)], ids=["one_graph", "two_graphs"])
def test_calls_from_two_threads_take_turns(batches, counters, lowered):
    """Two threads call one compiled module, each on its own stream with its own inputs,
    holding its last two outputs: every output matches eager, and the runner's counts add up
    (calls take turns inside it). With two batch sizes each thread replays its own graph, and
    the two graphs share the runner's memory pool: replays on the two streams are ordered."""
    import threading

    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    calls = 200
    xs = [[torch.randn(b, 16, 256, device="cuda") for _ in range(3)] for b in batches]
    with torch.no_grad():
        expected = [[eager(x) for x in row] for row in xs]
        for b in sorted(set(batches)):
            for _ in range(2):  # warm-up, capture
                compiled(torch.randn(b, 16, 256, device="cuda"))
    torch.cuda.synchronize()
    errors, worst = [], [None, None]
    start = threading.Barrier(2)

    def work(t: int) -> None:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.default_stream())
            diffs, held = [], []
            with torch.no_grad(), torch.cuda.stream(stream):
                start.wait()
                for i in range(calls):
                    k = (i + t) % 3
                    y = compiled(xs[t][k])
                    held = [*held[-1:], (y, k)]
                    for out, j in held:  # the held ones keep their values
                        diffs.append((out - expected[t][j]).abs().max())
            stream.synchronize()
            worst[t] = torch.stack(diffs).max().item()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert max(worst) < 1e-3, worst
    runner = lowered[0].magi_cuda_graphs
    graphs = len(set(batches))
    assert runner.num_captures == graphs
    assert runner.num_replays == graphs + 2 * calls  # each capture's replay, then every call


def test_capture_beside_another_threads_allocations(counters, lowered):
    """While the main thread warms up and captures, another thread keeps allocating and freeing
    device memory for eager work of its own (the caching allocator emptied each time, so every
    step calls cudaMalloc and cudaFree). Captures run in thread-local capture mode: neither
    thread fails, the capture counts as one, and the results match eager."""
    import threading

    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    stop, errors, steps = threading.Event(), [], [0]

    def allocate() -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    torch.cuda.empty_cache()
                    n = (2 << 20) + (steps[0] % 7) * 4096  # 8 MiB and up
                    t = torch.empty(n, device="cuda")
                    t.fill_(1.0)
                    assert t.sum().item() == t.numel()
                    del t
                    steps[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    xs = [torch.randn(4, 16, 256, device="cuda") for _ in range(3)]
    with torch.no_grad():
        expected = [eager(x) for x in xs]
        th = threading.Thread(target=allocate)
        th.start()
        try:
            got = [compiled(x) for x in xs]  # warm-up, capture, replay
            torch.cuda.synchronize()
        finally:
            stop.set()
            th.join()
    assert not errors, errors
    assert steps[0] > 0
    for y, ref in zip(got, expected, strict=True):
        assert (y - ref).abs().max().item() < 1e-3
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_captures == 1


@magi_register_custom_op(
    name="magi_t_cg_cuda::normalise_by_max", infer_output_meta_fn=["x"], is_subgraph_boundary=True
)
def normalise_by_max(x: torch.Tensor) -> torch.Tensor:
    return x / x.abs().max().item()  # .item() synchronises: a capture does not allow it


class _SyncingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

    def forward(self, x):
        return self.down(normalise_by_max(self.up(x).relu()))


def test_a_custom_op_that_synchronises_breaks_a_full_capture_with_advice(counters, lowered):
    """A custom op that synchronises (.item()) cannot be captured: FULL mode raises UserError
    saying what a capture does not allow and what to do, the allocator is left with no capture
    under way (empty_cache() would fail an internal assert), and PIECEWISE, which the message
    advises, runs the op between graphs and matches eager."""
    torch.manual_seed(0)
    eager = _SyncingModel().cuda().eval()
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        expected = eager(x)
        full = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
        full(x)  # warm-up, no capture yet
        with pytest.raises(
            magi_compiler.UserError,
            match=r"(?s)capturing a CUDA graph.*"
            r"is_subgraph_boundary=True.*PIECEWISE",
        ):
            full(x)
        # The failed capture left PyTorch's allocator consistent: no capture still under way.
        torch.cuda.empty_cache()
        piecewise = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "PIECEWISE"})
        for _ in range(3):  # warm-up, capture, replay
            y = piecewise(x)
    assert (y - expected).abs().max().item() < 1e-4


def test_replaced_parameter_recaptures(counters, lowered, assert_close_rel):
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    x = torch.randn(2, 16, 256, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # warm-up, capture, replay
            compiled(x)
        captures = lowered[0].magi_cuda_graphs.num_captures
        name, param = next(iter(eager.named_parameters()))
        owner, attr = name.rsplit(".", 1) if "." in name else ("", name)
        new = torch.nn.Parameter(torch.randn_like(param) * 0.02)
        for m in (eager, compiled):
            setattr(m.get_submodule(owner), attr, copy.deepcopy(new))
        for _ in range(3):  # the moved parameter drops the graph; it is captured again
            assert_close_rel(compiled(x), eager(x), 1e-4)
    assert lowered[-1].magi_cuda_graphs.num_captures > captures or len(lowered) > 1


def test_parameter_data_assignment_recaptures(counters, lowered, assert_close_rel):
    """`param.data = other` keeps the Parameter (the same TensorImpl) but moves its storage:
    the graph, which reads the captured address, is captured again. The old storage is freed
    and filled by another tensor, so a replay that still read it would be far off."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    x = torch.randn(2, 16, 256, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # warm-up, capture, replay
            assert_close_rel(compiled(x), eager(x), 1e-4)
        runner = lowered[0].magi_cuda_graphs
        captures = runner.num_captures
        name, _ = next(iter(eager.named_parameters()))
        new = torch.randn_like(eager.get_parameter(name)) * 0.05
        eager.get_parameter(name).data = new.clone()
        target = compiled.get_parameter(name)
        target.data = new.clone()  # the old storage goes back to the caching allocator
        junk = [torch.full_like(new, 1e3) for _ in range(4)]  # and is written over
        for _ in range(3):
            assert_close_rel(compiled(x), eager(x), 1e-4)
        del junk
    assert runner.num_captures == captures + 1


def test_cpu_inputs_degrade_to_no_graphs(counters, lowered, caplog):
    m = torch.nn.Linear(8, 8)
    compiled = magi_compile(copy.deepcopy(m), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        x = torch.randn(3, 8)
        torch.testing.assert_close(compiled(x), m(x))
    assert lowered[0].magi_cuda_graphs is None
    assert magi_compiler.get_counters().captures == 1


def test_graphs_without_random_ops_launch_directly(counters, lowered, assert_close_rel):
    """A graph none of whose kernels uses random numbers (attention at dropout_p 0 takes an
    offset but no numbers) replays through cudaGraphLaunch alone."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(4, 16, 256, device="cuda")
            assert_close_rel(compiled(x), eager(x), 1e-4)
    assert lowered[0].magi_executable.draws_random_numbers is False  # attention's dropout_p is 0
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_replays == 4
    assert runner.num_direct_launches == 4


def test_stage_timing_counts_the_replays_it_timed(counters, lowered, assert_close_rel):
    """The runner's host-stage timers (a diagnostic): off, nothing is counted; on, each replay
    adds to every stage, and the count is the replays timed while on."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    x = torch.randn(4, 16, 256, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # warm-up, capture, one replay: untimed
            compiled(x)
        runner = lowered[0].magi_cuda_graphs
        assert dict(runner.stage_times())["calls"] == 0
        replays = runner.num_replays
        runner.set_stage_timing(True)
        for _ in range(4):
            assert_close_rel(compiled(x), eager(x), 1e-4)
        times = dict(runner.stage_times())
        runner.set_stage_timing(False)
    assert times.pop("calls") == 4
    assert set(times) == {"signature", "lookup", "checks", "input_copies", "launch", "outputs"}
    assert all(t > 0 for t in times.values()), times
    assert runner.num_replays == replays + 4


class _Noisy(torch.nn.Module):
    """Adds fresh uniform noise: each replay must draw new numbers."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        h = self.proj(x)
        return h, torch.rand_like(h)


def test_graphs_with_random_ops_draw_new_numbers_on_each_replay(counters, lowered):
    model = _Noisy().cuda().eval()
    compiled = magi_compile(model, config_patch={"cudagraph_mode": "FULL"})
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        noise = [compiled(x)[1].clone() for _ in range(5)]  # warm-up, capture, 3 replays
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_replays == 4
    assert runner.num_direct_launches == 0  # replay() refreshes the generator's offset
    for i in range(len(noise)):
        assert 0.0 <= noise[i].min() and noise[i].max() < 1.0
        for j in range(i):
            assert not torch.equal(noise[i], noise[j]), (i, j)


def test_graphs_with_random_ops_keep_held_outputs(counters, lowered):
    """A graph replayed through CUDAGraph.replay() has one set of output buffers: while the
    caller holds it, each replay points the graph's copies at new buffers."""
    model = _Noisy().cuda().eval()
    compiled = magi_compile(model, config_patch={"cudagraph_mode": "FULL"})
    xs = [torch.randn(8, 64, device="cuda") for _ in range(5)]
    with torch.no_grad():
        outs = [compiled(x) for x in xs]  # warm-up, capture, 3 replays, all held
        for x, (h, noise) in zip(xs, outs, strict=True):
            torch.testing.assert_close(h, model.proj(x))
            assert 0.0 <= noise.min() and noise.max() < 1.0
    runner = lowered[0].magi_cuda_graphs
    assert runner.num_direct_launches == 0
    assert runner.num_fresh_output_buffers == 2 * 3  # two outputs; calls 3 to 5 find them held
    for i in range(1, len(outs)):
        for j in range(1, i):
            assert not torch.equal(outs[i][1], outs[j][1]), (i, j)


def test_graphs_beside_reduce_overhead_keep_their_cublas_workspace(tmp_path):
    """The Llama-1B-shaped decode with magi_compile's CUDA graphs and torch.compile's two modes
    in one process (benchmarks/run.py). Before each capture cleared cuBLAS's workspaces, a graph
    could bake in a workspace from another runner's pool; reduce-overhead's capture cleared the
    workspaces, the pool went back to the driver, and the next replay wrote to freed memory (an
    illegal memory access at magi_cg's warm-up, on the H100 in every such run; not at the
    smaller --quick shapes). Its own process: such a fault poisons the CUDA context."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "decode.json"
    cmd = [sys.executable, str(root / "benchmarks" / "run.py"), "--device", "cuda", "--only",
           "llama1b_decode", "--variants", "eager,magi_cg,inductor,inductor_ro", "--budget-s",
           "150", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (workload,) = json.loads(out.read_text())["workloads"]
    for name, r in workload["variants"].items():
        assert r["status"] == "ok", (name, r.get("phase"), (r.get("error") or "")[:500])
    assert workload["variants"]["magi_cg"]["correct"], workload["variants"]["magi_cg"]


@magi_register_custom_op(
    name="magi_t_cg_cuda::doubled_gelu", infer_output_meta_fn=["x"], is_subgraph_boundary=True
)
def doubled_gelu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x) * 2


class _BoundaryLayer(torch.nn.Module):
    """A residual MLP layer split into two pieces by a boundary op."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(doubled_gelu(self.up(self.norm(x))))


def _layers(cls, n, **shape):
    out = []
    for i in range(n):
        torch.manual_seed(i)
        layer = cls(**shape).cuda().eval()
        for p in layer.parameters():
            p.data.normal_(0, 0.05)
        out.append(layer)
    return out


@pytest.mark.parametrize("mode", ["FULL", "PIECEWISE"])
def test_a_compiled_layer_class_gets_a_graph_per_instance(
    mode, counters, lowered, assert_close_rel
):
    """The per-layer idiom: one compiled graph serves every instance of the decorated layer
    class. Its CUDA graphs are keyed by the instance's weights, so each instance gets a graph
    (FULL) or a graph per piece (PIECEWISE) that reads its own weights in place, where one
    graph copied the calling instance's weights into its buffers on every replay. Weights
    loaded in place keep the graphs; a new instance gets graphs of its own, and those of the
    instance it replaced are erased once the collector has freed it (and its weights)."""
    import blocks

    base = blocks.LlamaBlock if mode == "FULL" else _BoundaryLayer
    shape = dict(hidden=256, n_heads=8, n_kv_heads=4, intermediate=512) if mode == "FULL" else {}
    compiled_class = magi_compile(type("Layer", (base,), {}), config_patch={"cudagraph_mode": mode})
    n = 4
    layers, eagers = _layers(compiled_class, n, **shape), _layers(base, n, **shape)

    def check(rounds):
        with torch.no_grad():
            for _ in range(rounds):
                x = y = torch.randn(2, 16, 256, device="cuda")
                for layer, eager in zip(layers, eagers, strict=True):
                    x, y = layer(x), eager(y)
                assert_close_rel(x, y, 1e-4)

    check(4)  # warm-up, capture, two replays per instance
    assert counters().captures == 1
    runner, exe = lowered[0].magi_cuda_graphs, lowered[0].magi_executable
    if mode == "FULL":
        assert runner.num_graphs == n  # one per instance
        assert runner.num_replays == 3 * n  # rounds 2 (the captures) to 4
        graphs = lambda: runner.num_graphs  # noqa: E731
    else:
        assert runner is None and exe.num_pieces == 2  # split at the boundary op
        assert exe.num_piece_graphs == exe.num_piece_graph_captures == 2 * n
        graphs = lambda: exe.num_piece_graphs  # noqa: E731
    before = graphs()
    layers[1].load_state_dict(eagers[0].state_dict())
    eagers[1].load_state_dict(eagers[0].state_dict())
    layers[2] = _layers(compiled_class, 3, **shape)[2]  # the same values, new Parameters
    gc.collect()  # a compiled module sits in reference cycles (its bound forward)
    check(3)
    assert graphs() == before


def test_a_piece_called_for_each_layer_gets_a_graph_per_layer(counters, lowered, assert_close_rel):
    """A whole model in PIECEWISE mode: the piece between two layers' boundary ops is one
    piece called for every layer with that layer's weights; it gets a CUDA graph per call
    site, each reading its weights in place."""
    eager = torch.nn.Sequential(*_layers(_BoundaryLayer, 4))
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "PIECEWISE"})
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 16, 256, device="cuda")
            assert_close_rel(compiled(x), eager(x), 1e-4)
    exe = lowered[0].magi_executable
    assert exe.num_piece_calls == 5 and exe.num_pieces == 3  # the middle piece serves 3 calls
    assert exe.num_piece_graphs == exe.num_piece_graph_captures == 5


def test_weights_made_anew_every_call_stop_the_keys(counters, lowered, assert_close_rel):
    """A model that replaces a Parameter object before every call: the graphs keyed by the
    old weights are erased before their capture; after four such, the runner stops keying by
    identity and captures one graph that copies the weights in, replayed from then on."""
    eager = _block(torch.float32)
    compiled = magi_compile(copy.deepcopy(eager), config_patch={"cudagraph_mode": "FULL"})
    name = next(n for n, _ in eager.named_parameters() if n.endswith("weight"))
    owner, attr = name.rsplit(".", 1)
    x = torch.randn(2, 16, 256, device="cuda")
    with torch.no_grad():
        for _ in range(12):
            new = torch.randn_like(eager.get_parameter(name)) * 0.05
            setattr(eager.get_submodule(owner), attr, torch.nn.Parameter(new.clone()))
            setattr(compiled.get_submodule(owner), attr, torch.nn.Parameter(new.clone()))
            assert_close_rel(compiled(x), eager(x), 1e-4)
    runner = lowered[-1].magi_cuda_graphs
    assert runner.num_graphs == 1
    assert runner.num_captures == 1
    assert runner.num_replays >= 5
