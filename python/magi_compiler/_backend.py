"""Dynamo backend: Dynamo graph → AOTAutograd (functionalised ATen graphs, forward and
backward) → C++ import → pass pipeline → C++ executor.

This module is glue only: it never looks inside a graph. Everything after AOTAutograd happens
in ``magi_compiler._C``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from magi_compiler import _C, _counters, _dump, _recompute, inspection
from magi_compiler._decompositions import decomposition_table
from magi_compiler._logging import logger
from magi_compiler.config import CompileConfig


def lower_graph(gm: torch.fx.GraphModule, kind: str, config: CompileConfig) -> Callable:
    """Imports an ATen-level FX graph, runs the pipeline and returns a boxed callable."""
    start = time.perf_counter()
    lowering = _dump.lowering(kind, gm, config)  # timeline, summary and (if enabled) dumps
    graph = _C.import_fx_graph(gm)
    lowering.imported(graph)
    # Custom-op boundaries are read from the C++ op registry now, at compile time, so operators
    # registered after the model was decorated count too.
    records = graph.run_pipeline(
        list(config.pass_config.disabled_passes),
        list(config.splitting_ops),
        after_pass=lowering.after_pass,
    )
    lowering.passes_done(records)
    executable = _C.Executable(graph)
    # All CUDA kernels at once on a thread pool, rather than one by one in the first call.
    executable.precompile_kernels()
    lowering.built(executable)
    _counters.bump("compiles")
    logger.debug(
        "compiled %s graph: %d nodes, %d operator calls, %d piece calls of %d pieces, %.1f ms",
        kind,
        graph.num_nodes,
        executable.num_operator_calls,
        executable.num_piece_calls,
        executable.num_pieces,
        (time.perf_counter() - start) * 1e3,
    )

    runner = _cuda_graph_runner(gm, kind, config, executable)
    call = lowering.first_call_hook(runner.run if runner is not None else executable.run)

    def run(args: list[Any]) -> list[Any]:
        # Boxed calling convention: the list is ours to empty. The C++ side takes the inputs and
        # clears it before running, so each input (a backward's saved tensors) is freed after
        # its last use rather than when the call returns.
        return call(args, steal_inputs=True)

    run._boxed_call = True  # type: ignore[attr-defined]
    run.magi_graph = graph  # type: ignore[attr-defined]  # for inspection and tests
    run.magi_executable = executable  # type: ignore[attr-defined]
    run.magi_cuda_graphs = runner  # type: ignore[attr-defined]
    inspection.record(kind, run, config.splitting_ops)
    return run


_warned_cpu_cudagraphs = False


def _cuda_graph_runner(gm: torch.fx.GraphModule, kind: str, config: CompileConfig, executable):
    """A CUDA graph runner for FULL mode (None otherwise; PIECEWISE is set up on the
    executable itself). CUDA graphs apply to inference graphs on CUDA tensors only."""
    global _warned_cpu_cudagraphs
    mode = config.cudagraph_mode.name
    if mode == "NONE" or kind != "inference":
        return None
    devices = {
        n.meta["val"].device.type
        for n in gm.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    }
    if devices != {"cuda"} or not _C.CudaGraphRunner.available():
        if not _warned_cpu_cudagraphs:
            _warned_cpu_cudagraphs = True
            logger.warning(
                "cudagraph_mode=%s needs CUDA inputs and a CUDA build; running without CUDA "
                "graphs (inputs on %s)",
                mode,
                ", ".join(sorted(devices)) or "no device",
            )
        return None
    if mode == "PIECEWISE" and executable.num_pieces > 0:
        executable.enable_piece_cuda_graphs(config.max_cuda_graphs)
        return None
    return _C.CudaGraphRunner(executable, config.max_cuda_graphs)


def make_backend(config: CompileConfig, on_lowered: Callable[[str, Any], None] | None = None):
    """A Dynamo backend compiling every captured graph with magi's pipeline."""
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str):
        def compile_fn(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
            if config.backend == "eager":
                fn = gm.forward
            else:
                fn = lower_graph(gm, kind, config)
            if on_lowered is not None:
                on_lowered(kind, fn)
            return fn

        return compile_fn

    def partition(joint_module: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any):
        # The C++ recompute planner decides what the backward recomputes (_recompute.py).
        return _recompute.partition(joint_module, joint_inputs, config=config, **kwargs)

    aot = aot_autograd(
        fw_compiler=compiler("forward"),
        partition_fn=partition,
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decomposition_table(),
        keep_inference_input_mutations=True,
    )

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        _counters.bump("captures")
        logger.debug("captured a Dynamo graph with %d nodes", len(gm.graph.nodes))
        with _dump.compile_scope(gm, config):  # one INFO line per compile; dumps if enabled
            return aot(gm, example_inputs)

    return backend
