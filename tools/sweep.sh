#!/usr/bin/env bash
# Usage: bash tools/sweep.sh "SETTING" ...   e.g. bash tools/sweep.sh "" "MAGI_KERNEL_SCHEDULE=row_chunks=8"
# On the GPU machine, after `tools/run_gpu.sh build`: for each setting (a string of environment
# assignments; "" for the defaults), one process of benchmarks/bandwidth.py timing torch.compile
# and magi_compile side by side, into $OUT/sweep_N.json; then one table of every setting, each
# cell as % of that process's own copy bandwidth (compare rows only within one sweep).
# SWEEP_ONLY picks the workloads (default: the row kernels), SWEEP_ARGS adds arguments to
# bandwidth.py (another shape: "--rows 4096 --cols 32768").
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
i=0
for setting in "$@"; do
  i=$((i + 1))
  echo "== setting $i: ${setting:-defaults}"
  env $setting timeout 180 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
    --variants torch.compile,magi_compile --only "${SWEEP_ONLY:-rmsnorm,add_rmsnorm,layer_norm,softmax}" \
    ${SWEEP_ARGS:-} --out "$OUT/sweep_$i.json" 2>&1 | tail -6
done
python - "$OUT" "$@" <<'PY'
import json
import sys
from pathlib import Path

out, settings = Path(sys.argv[1]), sys.argv[2:]
print("\nmagi_compile / torch.compile, % of copy bandwidth")
for i, setting in enumerate(settings, 1):
    path = out / f"sweep_{i}.json"
    if not path.exists():
        print(f"{setting or 'defaults'}: no result")
        continue
    cells = []
    for w in json.loads(path.read_text())["bandwidth"]["workloads"]:
        pct = [w["variants"].get(v, {}).get("pct_of_copy") for v in ("magi_compile", "torch.compile")]
        cells.append(f"{w['workload']} " + " / ".join("error" if p is None else f"{p:.1f}" for p in pct))
    print(f"{setting or 'defaults'}: " + "; ".join(cells))
PY
