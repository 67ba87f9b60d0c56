#!/usr/bin/env bash
# Grouped key/value heads in training, the questions before the passes: do torch's cuDNN and
# flash attention backwards take them (scripts/gpu/gqa_backward_probe.py), and what do the
# training graphs magi_compile builds for a grouped-query block look like (dumped to
# $OUT/dump). Logs in $OUT.  (carry .deps)
set -uo pipefail
source "$(dirname "$0")/env.sh"
echo "== probe"
timeout 120 python scripts/gpu/gqa_backward_probe.py 2>&1 | tee "$OUT/gqa_backward_probe.log"
bash scripts/gpu/run_gpu.sh build || exit 1
echo "== dump"
MAGI_ENABLE_FX_GRAPH_VIZ=1 MAGI_DUMP_DIR="$OUT/dump" timeout 180 \
  python scripts/gpu/dump_training_graphs.py 2>&1 | grep -v "^DEBUG" | tail -20
find "$OUT/dump" -name "*.svg" -delete
du -sh "$OUT/dump"; find "$OUT/dump" -type f | head -60
