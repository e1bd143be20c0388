#!/usr/bin/env bash
# GPU step of `scripts/weft gpu-check`: the fused kernels' GPU tests on one GPU (reduce epilogue with
# own tiles by registers, TMA and TMA broadcast; the small-shape reduction kernel; the mover SMs of
# GEMM+RS/AR; the AllGather+GEMM kernel; the multi-node AllGather+GEMM and GEMM+RS/AR kernels between
# emulated nodes; the RDMA-write flush beside a running kernel).
# test_gemm runs in 20-gemm.sh, test_transport_gpu in 30-transport.sh. A test that skips on a GPU machine is a failure here.
# Usage: 25-kernel-tests.sh OUTDIR (WEFT_BUILD_DIR, WEFT_SUMMARY as set by scripts/weft).
set -uo pipefail
OUTDIR=${1:?usage: 25-kernel-tests.sh OUTDIR}
BUILD=${WEFT_BUILD_DIR:?WEFT_BUILD_DIR not set}
SUMMARY=${WEFT_SUMMARY:-/dev/null}
rc=0
for t in test_reduce_epilogue test_small_reduce test_piece_push test_ag_gemm_fused test_ag_gemm_nodes_gpu \
  test_gemm_reduce_nodes_gpu test_rdma_flush_gpu; do
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
      note=""
      # The 4-rank tests put their ranks on the GPUs there are: with fewer, peers share a GPU.
      case $t in
        test_ag_gemm_fused | test_ag_gemm_nodes_gpu | test_gemm_reduce_nodes_gpu)
          [ "$(nvidia-smi -L 2>/dev/null | grep -c GPU)" -lt 4 ] && note=" (ranks share GPUs: NVLink not exercised)" ;;
      esac
      echo "PASS    $t: $(grep -o 'assertions:.*' "$log" | tail -1)$note" >>"$SUMMARY"
    fi
  else
    echo "FAIL    $t ($t.log)" >>"$SUMMARY"
    tail -30 "$log"
    rc=1
  fi
done
exit $rc
