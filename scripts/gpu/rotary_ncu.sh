#!/usr/bin/env bash
# Why the Llama prefill's rotary kernels (4096 tokens x 16 and 8 heads of 128, bf16) run at
# about 57% of copy bandwidth: Nsight Compute metrics of magi_compile's kernels (paired halves
# on and off, MAGI_PAIRED_HALVES), torch.compile's and a clone of the same tensors (the copy
# floor at these sizes), one launch each after warm-up.   (carry .deps)
# Ran at 235b783 (H200, 2026-11-27), where MAGI_PAIRED_HALVES existed (reverted after).
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,launch__registers_per_thread,launch__grid_size,launch__block_size,smsp__inst_executed.sum
M=$M,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
M=$M,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sector_hit_rate.pct
M=$M,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
M=$M,sm__cycles_elapsed.avg,smsp__cycles_active.avg
for p in 1 0; do
  echo "== MAGI_PAIRED_HALVES=$p" | tee -a "$S"
  MAGI_PAIRED_HALVES=$p timeout 200 /usr/local/cuda/bin/ncu --clock-control none \
    --profile-from-start off --metrics "$M" --csv --page raw \
    python scripts/gpu/ncu_kernels.py rotary_prefill > "$OUT/ncu_p$p.csv" 2> "$OUT/ncu_p$p.err"
  python - "$OUT/ncu_p$p.csv" <<'PY' | tee -a "$S"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
for r in rows[2:]:
    d = dict(zip(head, r))
    name = d.get("Kernel Name", "")[:60]
    keys = [k for k in head if "__" in k]
    print(name)
    print("   " + "  ".join(f"{k.split('.')[0].replace('smsp__average_warps_issue_stalled_', 'stall_')}={d[k]}" for k in keys))
PY
done
