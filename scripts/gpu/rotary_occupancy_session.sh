#!/usr/bin/env bash
# Nsight Compute put the prefill's rotary kernels (4096 tokens x 16 and 8 heads) at 29% of DRAM
# throughput, stalled on memory (long scoreboard), at 66% achieved occupancy (40 registers: 6
# blocks of 256 per SM) or 44% when paired (58 registers). Per setting (one process each):
# the ncu metrics of the two rotaries, torch.compile's and ATen's neg of the same tensors (the
# copy floor), and bandwidth.py's pointwise workloads at 16384 x 8192 beside torch.compile.
# Settings: paired halves off/on, MAGI_POINTWISE_MIN_BLOCKS unset/8/6.   (carry .deps)
# Ran at 235b783 plus an uncommitted MAGI_POINTWISE_MIN_BLOCKS (the second __launch_bounds__
# bound for pointwise kernels, as MAGI_ROW_MIN_BLOCKS for row kernels); both reverted after.
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
M=$M,launch__grid_size,smsp__inst_executed.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum
i=0
for setting in "MAGI_PAIRED_HALVES=0" "MAGI_PAIRED_HALVES=0 MAGI_POINTWISE_MIN_BLOCKS=8" \
  "MAGI_PAIRED_HALVES=1 MAGI_POINTWISE_MIN_BLOCKS=8" "MAGI_PAIRED_HALVES=1 MAGI_POINTWISE_MIN_BLOCKS=6"; do
  i=$((i + 1))
  echo "== setting $i: $setting" | tee -a "$S"
  env $setting timeout 120 /usr/local/cuda/bin/ncu --clock-control none --profile-from-start off \
    --metrics "$M" --csv --page raw python scripts/gpu/ncu_kernels.py rotary_prefill \
    > "$OUT/ncu_$i.csv" 2> "$OUT/ncu_$i.err"
  python - "$OUT/ncu_$i.csv" "$M" <<'PY' | tee -a "$S"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
at = [n for n, r in enumerate(rows) if "Kernel Name" in r]
if not at:
    sys.exit(print("   no ncu rows"))
head = rows[at[0]]
for r in rows[at[0] + 2 :]:
    d = dict(zip(head, r))
    vals = " ".join(d.get(k, "?") for k in sys.argv[2].split(","))
    print(f"   {d['Kernel Name'][:50]:50} {vals}")
PY
  env $setting timeout 150 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
    --variants torch.compile,magi_compile --only rotary,silu_mul,x*y+z \
    --out "$OUT/bandwidth_$i.json" 2>&1 | grep -v "^\[magi" | tail -5 | tee -a "$S"
done
