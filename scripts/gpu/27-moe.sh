#!/usr/bin/env bash
# GPU step of `scripts/weft gpu-check`: the MoE pieces on one GPU: the plan's host test, the router
# and grouped GEMM GPU tests, and weft's grouped-GEMM expert FFN against per-expert cuBLAS
# (bench_moe_single), then the PyTorch sequential layer at world 1 (bench/peers/moe_sequential.py).
# A test that skips on a GPU machine is a failure here.
# Usage: 27-moe.sh OUTDIR (WEFT_BUILD_DIR, WEFT_SUMMARY as set by scripts/weft).
set -uo pipefail
OUTDIR=${1:?usage: 27-moe.sh OUTDIR}
BUILD=${WEFT_BUILD_DIR:?WEFT_BUILD_DIR not set}
SUMMARY=${WEFT_SUMMARY:-/dev/null}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rc=0
for t in test_moe_plan test_moe_router test_grouped_gemm; do
  log=$OUTDIR/$t.log
  if [ ! -x "$BUILD/bin/$t" ]; then
    echo "SKIP    $t: not built (WEFT_BUILD_TARGETS)" >>"$SUMMARY"
    continue
  fi
  if (cd "$BUILD" && timeout 300 ctest -V -R "^$t\$") >"$log" 2>&1; then
    if grep -q "Skipped\|SKIPPED" "$log"; then
      echo "FAIL    $t: skipped on a GPU machine ($t.log)" >>"$SUMMARY"
      rc=1
    else
      echo "PASS    $t: $(grep -o 'assertions:.*' "$log" | tail -1)" >>"$SUMMARY"
    fi
  else
    echo "FAIL    $t ($t.log)" >>"$SUMMARY"
    tail -30 "$log"
    rc=1
  fi
done
if [ -x "$BUILD/bin/bench_moe_single" ]; then
  if timeout 400 "$BUILD/bin/bench_moe_single" --rounds "${WEFT_MOE_ROUNDS:-20}" --markdown "$OUTDIR/moe-bench.md" \
    >"$OUTDIR/moe-bench.log" 2>&1; then
    echo "moe expert FFN, weft grouped GEMM vs per-expert cuBLAS:" >>"$SUMMARY"
    cat "$OUTDIR/moe-bench.md" >>"$SUMMARY"
  else
    echo "FAIL    bench_moe_single (moe-bench.log)" >>"$SUMMARY"
    rc=1
  fi
  cat "$OUTDIR/moe-bench.log"
else
  echo "SKIP    bench_moe_single: not built" >>"$SUMMARY"
fi
if command -v python3 >/dev/null && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  if timeout 300 python3 "$ROOT/bench/peers/moe_sequential.py" >"$OUTDIR/moe-sequential.log" 2>&1; then
    echo "moe sequential layer (PyTorch, world 1):" >>"$SUMMARY"
    grep '^|' "$OUTDIR/moe-sequential.log" >>"$SUMMARY"
  else
    echo "FAIL    moe_sequential.py (moe-sequential.log)" >>"$SUMMARY"
    rc=1
  fi
  cat "$OUTDIR/moe-sequential.log"
else
  echo "SKIP    moe_sequential.py: no PyTorch with CUDA" >>"$SUMMARY"
fi
exit $rc
