#!/usr/bin/env bash
# Issue 5 (2026-11-27, night): the same RMSNorm kernel measured 93% of copy bandwidth in a
# process timing magi_compile alone and 98.4% in one timing torch.compile beside it (H200).
# Suspect: the clocks had not ramped up. Each set of variants twice, the SM clock, power and
# throttle reasons logged every 50 ms, each run's median SM clock printed. (The run recorded in
# benchmarks/RESULTS.md had a quarter-second spin-up before the timed calls in its second round,
# an uncommitted patch of bandwidth.py that changed nothing: the clocks sat at 1980 MHz.)
# One summary in $OUT.
set -uo pipefail
source "$(dirname "$0")/env.sh"
S="$OUT/summary.txt"
gpu_build "$S" 2
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 50 > /tmp/clocks.csv 2>&1 &
logger=$!
: > /tmp/phases.txt
for round in 1 2; do
  for variants in magi_compile torch.compile,magi_compile; do
    tag="round${round}_${variants//,/+}"
    echo "== $tag" | tee -a "$S"
    t0=$(date +%s.%N)
    timeout 150 python benchmarks/bandwidth.py --device cuda --no-compile-latency \
      --variants "$variants" --only rmsnorm,add_rmsnorm,layer_norm,softmax --out "/tmp/$tag.json" 2>&1 |
      grep -v "^\[magi\|^wrote\|GB/s  % of copy" | tee -a "$S"
    echo "$tag $t0 $(date +%s.%N)" >> /tmp/phases.txt
  done
done
kill $logger
python - <<'PY' | tee -a "$S"
import datetime, statistics
rows = []
for line in open("/tmp/clocks.csv"):
    f = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((t, float(f[1]), float(f[2]), float(f[3]), f[5]))
    except (ValueError, IndexError):
        pass
for line in open("/tmp/phases.txt"):
    tag, a, b = line.split()
    sel = [r for r in rows if float(a) <= r[0] <= float(b)]
    busy = [r for r in sel if r[3] > 200]  # samples under load
    if not busy:
        print(tag, "no samples under load", len(sel)); continue
    print(f"{tag}: {len(busy)} loaded samples, SM MHz median {statistics.median(r[1] for r in busy):.0f} "
          f"min {min(r[1] for r in busy):.0f}, mem MHz {statistics.median(r[2] for r in busy):.0f}, "
          f"power W median {statistics.median(r[3] for r in busy):.0f} max {max(r[3] for r in busy):.0f}, "
          f"throttle reasons {sorted(set(r[4] for r in busy))}")
PY
