#!/usr/bin/env bash
# Issue 5 (2026-11-28, sixth session): every raw Nsight Compute metric (--set full) of one
# RMSNorm call (16384 x 8192 bf16) under magi_compile with the default vector I/O (cs), under
# MAGI_VECTOR_IO=l2last, and under torch.compile, as CSV in $OUT (compared on the build
# machine), beside the CUDA source we generate. ncu leaves the clocks alone.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
rm -f "$OUT/cmake.log" "$OUT/build.log"
NCU="/usr/local/cuda/bin/ncu --clock-control none --set full"
raw() {  # raw LABEL REGEX [VAR=VALUE...]
  local label="$1" regex="$2"
  shift 2
  env "$@" timeout 240 $NCU --kernel-name regex:"$regex" --launch-skip 2 --launch-count 1 \
    -o "/tmp/$label" python scripts/gpu/ncu_kernels.py rmsnorm > "/tmp/$label.log" 2>&1
  /usr/local/cuda/bin/ncu --import "/tmp/$label.ncu-rep" --page raw --csv > "$OUT/raw_$label.csv" 2>&1
  echo "$label: $(wc -c < "$OUT/raw_$label.csv") bytes; $(grep -c "==PROF==" "/tmp/$label.log") profiler lines" | tee -a "$S"
  grep -E "==ERROR==|==WARNING==" "/tmp/$label.log" | head -3 | tee -a "$S"
}
raw magi_cs fused
raw magi_l2last fused MAGI_VECTOR_IO=l2last
raw inductor triton
timeout 120 python scripts/gpu/kernel_sources.py rmsnorm 2>&1 | grep -v "^\[magi" | tail -2
tar -C "$OUT" -czf "$OUT/sources.tgz" sources && rm -rf "$OUT/sources"
