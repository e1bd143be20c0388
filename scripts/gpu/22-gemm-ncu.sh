#!/usr/bin/env bash
# GPU check step (opt-in, WEFT_NCU=1): Nsight Compute counters of weft's GEMM (1-CTA and 2-CTA
# multicast) and cuBLAS on one shape: clock, tensor-pipe use, L2 and DRAM throughput, warp stalls.
# Clocks are left alone (--clock-control none) so the power-capped clock is what is measured.
# Usage: 22-gemm-ncu.sh OUTDIR   (env: WEFT_NCU_SHAPE, bench_gemm's --shape index, default 0)
set -uo pipefail
out=${1:?usage: 22-gemm-ncu.sh OUTDIR}
BIN=${WEFT_BUILD_DIR:?}/bin
SUMMARY=${WEFT_SUMMARY:-/dev/null}
if [ "${WEFT_NCU:-0}" != 1 ]; then
  echo "SKIP    gemm ncu: opt-in (WEFT_NCU=1)" >>"$SUMMARY"
  exit 0
fi
if ! command -v ncu >/dev/null; then
  echo "SKIP    gemm ncu: ncu not installed" >>"$SUMMARY"
  exit 0
fi
shape=${WEFT_NCU_SHAPE:-0}
metrics=sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum,lts__t_bytes.sum.per_second,dram__bytes.sum.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct
rc=0
for v in weft weft2 cublas; do
  echo "=== ncu $v (shape $shape)"
  if ! timeout 240 ncu --clock-control none --profile-from-start off --launch-skip 5 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section LaunchStats --metrics "$metrics" \
      "$BIN/bench_gemm" --shape "$shape" --profile "$v" >"$out/ncu-$v.txt" 2>&1; then
    rc=1
  fi
  grep -E "^  [a-zA-Z_0-9]+.*(sm90|gemm|xmma|cutlass)|Duration|SM Frequency|cycles_elapsed.avg.per_second|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|lts__t_bytes|dram__bytes|sector_hit|Issue Slots Busy|Stall|Block Size|Grid Size|Cluster|Registers" "$out/ncu-$v.txt" | head -60
done
{
  echo "gemm ncu (shape $shape; clock, duration, L2/DRAM throughput):"
  for v in weft weft2 cublas; do
    printf '  %-7s %s\n' "$v" "$(grep -E 'SM Frequency|^ +Duration|L2 Cache Throughput|DRAM Throughput' "$out/ncu-$v.txt" | awk '{$1=$1};1' | tr '\n' ';' | cut -c1-200)"
  done
} >>"$SUMMARY"
exit $rc
