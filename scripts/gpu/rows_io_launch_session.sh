#!/usr/bin/env bash
# For the session after 2026-11-28 afternoon (issues 5 and 6), one call:
# - RMSNorm's last gap on the H200 (98.1% of copy against torch.compile's 100.4%). Inductor's
#   kernel loads plainly with L1/L2 keep hints and stores plainly; ours loads and stores with
#   the streaming hint (MAGI_VECTOR_IO=cs), which was measured on the H100 only. The row kernels
#   beside torch.compile with ldg and plain vector I/O, in the default layout and in
#   torch.compile's shape (512 threads of 2 held vectors, the weight in the output pass).
# - The driver's graph-launch floor by node count on the host (host_floor.py's graphs of 16, 64
#   and 128 kernels) beside the stack's own launch stage, to read the 10 µs target against it;
#   and whether the programmatic edges of dependent launches (MAGI_DEPENDENT_LAUNCH, on by
#   default, also inside graphs) make the graph's launch dearer: host time with it off and on,
#   alternating processes.
# (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
for io in ldg plain; do
  MAGI_VECTOR_IO=$io gpu_row_bandwidth "$S" "io_$io"
  MAGI_VECTOR_IO=$io MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_CHUNKS=2 MAGI_ROW_COLUMN_LOADS=late \
    gpu_row_bandwidth "$S" "io_${io}_t512_k2_late"
done
gpu_row_bandwidth "$S" default
echo "== host floor (launch by node count)" | tee -a "$S"
timeout 200 python scripts/gpu/host_floor.py --modes default --json "$OUT/host_floor.json" > /dev/null 2>&1
python - "$OUT/host_floor.json" <<'PY' | tee -a "$S"
import json, sys
d = json.load(open(sys.argv[1]))
print({k: round(v, 2) for k, v in d.items() if isinstance(v, float)})
v = d.get("default", {})
print({k: round(x, 2) for k, x in v.items() if k in ("call", "native_alone", "stage_launch")})
PY
for dl in 0 1 0 1; do
  echo "== host time, MAGI_DEPENDENT_LAUNCH=$dl" | tee -a "$S"
  MAGI_DEPENDENT_LAUNCH=$dl timeout 90 python benchmarks/host_overhead.py --device cuda \
    --variants magi_cg,magi_cg --out "$OUT/host_dl$dl.json" 2>&1 | grep "CUDA graphs" | tee -a "$S"
done
