#!/usr/bin/env bash
# Direct calls from C++ (issue 6, host time): a compiled method's wrapper tries its
# DirectEntry before any Python, and parameter dicts are re-read only when their version tag
# moved. input_nodes_session.sh with the CUDA-graph, padding, API and runtime-choice tests:
# build; those tests; the busy-GPU host breakdown (scripts/gpu/host_floor.py) with 4 rotating
# inputs and with one; benchmarks/host_overhead.py beside eager and reduce-overhead, both ways.
# Logs and JSON in $OUT.   (carry .deps)
TESTS="tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py tests/gpu/test_api_cuda.py
  tests/gpu/test_runtime_choices_cuda.py" TESTS_S=300 exec bash "$(dirname "$0")/input_nodes_session.sh"
