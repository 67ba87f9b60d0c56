#!/usr/bin/env bash
# Issue 5, for the next session (written 2026-11-28, third session; run in the fourth). Rows longer
# than 8192 bf16 values are streamed (two reads per row, the second from L2), and trail
# torch.compile's: RMSNorm 95.0% of copy bandwidth at 16384 columns (torch.compile 96.9%),
# 91.5% at 32768 (98.9%), LayerNorm 69.1% at 16384 (85.9%). With more threads per row
# (MAGI_MAX_BLOCK_THREADS) they are held in registers instead and read once: 512 threads x 4
# vectors hold 16384 values, 1024 x 4 hold 32768. ptxas for sm_90: the held kernels take 58
# (RMSNorm), 50 (LayerNorm), 52 (softmax) and 93 (add+RMSNorm) registers at 512 threads, so
# 2 blocks of 512 per SM (add+RMSNorm 1); at 1024 threads add+RMSNorm spills 148 bytes.
# Each setting in its own process beside torch.compile, the default first and last.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
# First the tests written after the last GPU run: test_long_rows's exact suffix (_s_g up to
# 64 KiB, _s beyond) and one kernel launching both forms over a dynamic row length.
echo "== pytest: streamed rows with and without the row loop" | tee -a "$S"
gpu_pytest gpu_row_loop_tests.log 120 tests/gpu/test_fusion_cuda.py -k "long_rows or one_kernel" |
  tee -a "$S"
# 38bf95f named the driver's sticky-fault codes and logs what an allocator refused when an
# invalidated capture's pool is released: the driver and CUDA-graph files once over it.
echo "== pytest: driver and CUDA graphs" | tee -a "$S"
gpu_pytest gpu_graph_tests.log 150 tests/gpu/test_cuda_driver.py tests/gpu/test_cuda_graphs.py \
  tests/gpu/test_cuda_graph_padding.py | tee -a "$S"
gpu_row_run "$S" default_16384 8192 16384
gpu_row_run "$S" t512_16384 8192 16384 MAGI_MAX_BLOCK_THREADS=512
gpu_row_run "$S" t512_16384_noloop 8192 16384 MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_GRID_LOOP=0
gpu_row_run "$S" default_32768 4096 32768
gpu_row_run "$S" t1024_32768 4096 32768 MAGI_MAX_BLOCK_THREADS=1024
gpu_row_run "$S" t1024_32768_noloop 4096 32768 MAGI_MAX_BLOCK_THREADS=1024 MAGI_ROW_GRID_LOOP=0
gpu_row_run "$S" default_16384_again 8192 16384
