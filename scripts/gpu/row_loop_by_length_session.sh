#!/usr/bin/env bash
# Issue 5 (2026-11-28, third session): MAGI_ROW_GRID_LOOP=auto now leaves the loop over rows
# out of streamed rows of at most 64 KiB per input only (rows of 128 KiB lost 3-16 points
# without it, stream_no_loop_session.sh), choosing per row length at each launch (the variant
# key has the choice). The CUDA fusion tests (test_long_rows: 4095 and 9000 columns without
# the loop, 65535 and 65536 with it), then the four row kernels at 2048 x 65536 beside
# torch.compile, which should match the loop's numbers. (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
echo "== pytest GPU fusion" | tee -a "$S"
gpu_pytest gpu_fusion.log 120 tests/gpu/test_fusion_cuda.py | tee -a "$S"
echo "== auto (2048 x 65536)" | tee -a "$S"
timeout 60 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
  --variants torch.compile,magi_compile --only rmsnorm,add_rmsnorm,layer_norm,softmax \
  --rows 2048 --cols 65536 --out "$OUT/band_auto_65536.json" 2>&1 |
  grep -v "^\[magi" | grep -E "%|copy" | tail -5 | tee -a "$S"
