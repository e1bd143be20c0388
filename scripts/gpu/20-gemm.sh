#!/usr/bin/env bash
# GPU step of `scripts/weft gpu-check`: GEMM tests, compute-sanitizer on the small case, SASS
# checks of the main kernel, and the weft-vs-cuBLAS benchmark. Usage: 20-gemm.sh OUTDIR
# (WEFT_BUILD_DIR: configured + built tree; WEFT_SUMMARY: file the short table is appended to).
set -uo pipefail

OUTDIR=${1:?usage: 20-gemm.sh OUTDIR}
BUILD=${WEFT_BUILD_DIR:?WEFT_BUILD_DIR not set}
SUMMARY=${WEFT_SUMMARY:-/dev/null}
BIN=$BUILD/bin
rc=0
say() { echo "== 20-gemm: $*"; }
summ() { echo "$*" >>"$SUMMARY"; }

for exe in test_gemm test_tile_scheduler bench_gemm; do
  if [ ! -x "$BIN/$exe" ]; then
    say "missing $BIN/$exe (build targets: test_gemm test_tile_scheduler bench_gemm)"
    summ "gemm: FAILED, $exe not built"
    exit 1
  fi
done

# 1. Tests (scheduler on the host, GEMM on the GPU).
say "tests"
if "$BIN/test_tile_scheduler" >"$OUTDIR/gemm-tests.log" 2>&1 &&
  "$BIN/test_gemm" --duration=true >>"$OUTDIR/gemm-tests.log" 2>&1; then
  summ "gemm tests: PASS ($(grep -c 'rel err' "$OUTDIR/gemm-tests.log") checks against the fp32 reference)"
else
  rc=1
  summ "gemm tests: FAILED (gemm-tests.log)"
fi
tail -5 "$OUTDIR/gemm-tests.log"

# 2. compute-sanitizer on the small case.
say "compute-sanitizer"
san_log=$OUTDIR/gemm-sanitizer.log
: >"$san_log"
san_status=""
if command -v compute-sanitizer >/dev/null; then
  # racecheck twice: on static striding (must be clean), and on claimed tiles, where it reports
  # the unit slot that the producer hands to the consumers through an mbarrier (release/acquire,
  # which racecheck does not follow): accepted only if every hazard it reports is that slot.
  # memcheck-ring / racecheck-ring: GEMM+RS/AR's own tiles with their staged partials through the
  # TMA ring (test_reduce_epilogue's small case).
  for tool in memcheck racecheck racecheck-claims memcheck-ring racecheck-ring; do
    echo "---- $tool" >>"$san_log"
    dyn=0
    [ "$tool" = racecheck ] || dyn=1
    part=$OUTDIR/gemm-sanitizer-$tool.log
    test_bin=$BIN/test_gemm filter='--test-case=gemm small*'
    case $tool in *-ring) test_bin=$BIN/test_reduce_epilogue filter='--test-case=reduce epilogue small*' ;; esac
    if WEFT_GEMM_DYNAMIC=$dyn compute-sanitizer --tool "${tool%-*}" --error-exitcode 9 "$test_bin" "$filter" \
      >"$part" 2>&1; then
      san_status+="$tool clean; "
    elif [ "$tool" = racecheck-claims ] && grep -q "Status: SUCCESS" "$part" &&
      [ "$(grep -c 'Race reported' "$part")" -gt 0 ] &&
      [ "$(grep -A1 'Race reported' "$part" | grep -c 'hand_unit')" = "$(grep -c 'Race reported' "$part")" ]; then
      san_status+="$tool: only the mbarrier-ordered unit slot; "
    else
      rc=1
      san_status+="$tool FAILED; "
    fi
    cat "$part" >>"$san_log"
    rm -f "$part"
  done
else
  san_status="compute-sanitizer not installed"
fi
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$san_log"
summ "gemm compute-sanitizer (gemm small): $san_status"

# 3. SASS of the GEMM kernels: tensor-core instructions present, no local memory.
say "SASS"
if command -v cuobjdump >/dev/null; then
  sass=$(cuobjdump --dump-sass "$BIN/bench_gemm" 2>/dev/null |
    awk '/Function : .*gemm_persistent_kernel/ {on=1} /Function : / && !/gemm_persistent_kernel/ {on=0} on')
  hgmma=$(grep -c 'HGMMA' <<<"$sass")
  local_mem=$(grep -cE '\b(LDL|STL)\b' <<<"$sass")
  echo "HGMMA instructions: $hgmma; LDL/STL instructions: $local_mem"
  grep -m3 'HGMMA' <<<"$sass"
  summ "gemm SASS: $hgmma HGMMA, $local_mem LDL/STL in gemm_persistent_kernel<*>"
  if [ "$hgmma" -eq 0 ] || [ "$local_mem" -ne 0 ]; then rc=1; fi
else
  summ "gemm SASS: cuobjdump not installed"
fi

# 4. Benchmark (table last).
say "benchmark"
if "$BIN/bench_gemm" --iters 30 --markdown "$OUTDIR/gemm-bench.md" >"$OUTDIR/gemm-bench.log" 2>&1; then
  :
else
  rc=1
  summ "gemm bench: FAILED (gemm-bench.log)"
fi
cat "$OUTDIR/gemm-bench.log"
if [ -s "$OUTDIR/gemm-bench.md" ]; then
  summ "gemm vs cuBLAS ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)):"
  cat "$OUTDIR/gemm-bench.md" >>"$SUMMARY"
fi
# 5. What a copy beside the GEMM costs it (one GPU; interleaved launch by launch).
if [ -x "$BIN/bench_gemm_contention" ]; then
  say "GEMM beside a copy"
  if "$BIN/bench_gemm_contention" --rounds 2 --iters 30 >"$OUTDIR/gemm-contention.log" 2>&1; then
    summ "$(grep -A12 'GEMM alone and beside' "$OUTDIR/gemm-contention.log")"
  else
    rc=1
    summ "gemm contention bench: FAILED (gemm-contention.log)"
  fi
  cat "$OUTDIR/gemm-contention.log"
else
  summ "gemm contention bench: SKIPPED (not built: it needs the ops library, which needs NCCL)"
fi
exit $rc
