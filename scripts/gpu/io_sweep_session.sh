#!/usr/bin/env bash
# Issues 5 and 6 (2026-11-27, evening): does the streaming (evict-first) store of generated
# kernels cost the matmul that reads their output next? The Llama prefill beside torch.compile
# under each MAGI_VECTOR_IO mode; then RMSNorm's launch shape and column loads on this device
# (the H200's RMSNorm trails torch.compile's by about two points of copy bandwidth).
# Logs and JSON in $OUT.   (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
bash scripts/gpu/run_gpu.sh build || exit 1
prefill() {  # prefill LABEL: the Llama prefill beside torch.compile, one process
  timeout 150 python benchmarks/run.py --device cuda --only llama_prefill \
    --variants inductor,magi --out "$OUT/prefill_$1.json" 2>&1 | grep -v "^\[magi" | tail -1
  python scripts/gpu/prefill_ratio.py "$OUT/prefill_$1.json" "$1"
}
for io in cs ldg stcs ldcs; do
  echo "== prefill, MAGI_VECTOR_IO=$io"
  MAGI_VECTOR_IO=$io prefill "io_$io"
done
rms() {  # rms LABEL ENV...: RMSNorm and add+RMSNorm beside torch.compile
  env "${@:2}" timeout 100 python benchmarks/bandwidth.py --device cuda --only rmsnorm,add_rmsnorm \
    --variants torch.compile,magi_compile --no-compile-latency --out "$OUT/rms_$1.json" 2>&1 |
    grep -E "^(rmsnorm|add_rmsnorm) " | sed "s/^/$1 /"
}
echo "== RMSNorm sweep"
rms default MAGI_DEPENDENT_LAUNCH=1
rms threads512 MAGI_MAX_BLOCK_THREADS=512 MAGI_ROW_CHUNKS=2
rms threads1024 MAGI_MAX_BLOCK_THREADS=1024 MAGI_ROW_CHUNKS=1
rms late MAGI_ROW_COLUMN_LOADS=late
rms block MAGI_ROW_COLUMN_LOADS=block
rms ldg MAGI_VECTOR_IO=ldg
rms nodep MAGI_DEPENDENT_LAUNCH=0
rms default2 MAGI_DEPENDENT_LAUNCH=1
