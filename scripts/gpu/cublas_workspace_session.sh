#!/usr/bin/env bash
# Graphs own their cuBLAS workspace: the CUDA-graph, padding and runtime-choice tests at the fix
# and the workspace scenario on its own (its set-up line printed), then the scenario with the
# fix reverted (.deps/cublas_fix.patch, carried) to see it fail. Logs in $OUT. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
scenario() {
  python -c "import sys, subprocess; sys.path.insert(0, 'tests/gpu'); import test_cuda_graphs as t
p = subprocess.run([sys.executable, '-c', t._CUBLAS_WORKSPACE_SCENARIO], capture_output=True, text=True)
print('exit', p.returncode, '|', p.stdout.strip(), '|', ' '.join(p.stderr.strip().splitlines()[-2:])[:300])"
}
bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
echo "== with the fix"
gpu_pytest pytest_cublas_fixed.log 200 tests/gpu/test_cuda_graphs.py tests/gpu/test_cuda_graph_padding.py \
  tests/gpu/test_runtime_choices_cuda.py
scenario
echo "== without the fix"
patch -R -p1 < .deps/cublas_fix.patch && bash scripts/gpu/run_gpu.sh build > /dev/null 2>&1 || { echo rebuild failed; exit 1; }
scenario
