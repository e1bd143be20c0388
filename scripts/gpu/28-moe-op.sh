#!/usr/bin/env bash
# GPU step of `scripts/weft gpu-check`: the MoE op (routing, dispatch, grouped expert FFN, combine)
# on 1 rank, on every GPU of the machine, and as 4 ranks sharing the GPUs where there are fewer than 4
# (tests/runtime/moe_gpu.sh); then the layer timed on every GPU (bench_moe_layer: near-uniform and
# Zipf-skewed routing, direct calls and graph replays) and, in the same
# call, the PyTorch sequential layer on the same GPUs (bench/peers/moe_sequential.py under torchrun),
# and the layer against its bound from the two tables (bench/moe/moe_bound.py); last, `weftrun bench` of a
# 1 x n copy of the small example (weft next to a sequential NCCL + cuBLAS layer, both validated), and
# of a 2 x 1 copy across 2 emulated nodes (the hierarchical variant).
# Usage: 28-moe-op.sh OUTDIR (WEFT_BUILD_DIR, WEFT_SUMMARY as set by scripts/weft).
set -uo pipefail
OUTDIR=${1:?usage: 28-moe-op.sh OUTDIR}
BUILD=${WEFT_BUILD_DIR:?WEFT_BUILD_DIR not set}
SUMMARY=${WEFT_SUMMARY:-/dev/null}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rc=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU || echo 0)
if [ ! -x "$BUILD/bin/test_moe_gpu" ]; then
  echo "SKIP    test_moe_gpu: not built (WEFT_BUILD_TARGETS)" >>"$SUMMARY"
elif bash "$ROOT/tests/runtime/moe_gpu.sh" "$BUILD" >"$OUTDIR/test_moe_gpu.log" 2>&1; then
  echo "PASS    test_moe_gpu: $(grep -c 'matched' "$OUTDIR/test_moe_gpu.log") (rank, case) runs matched over $(grep -c '^== ' "$OUTDIR/test_moe_gpu.log") layouts" >>"$SUMMARY"
else
  echo "FAIL    test_moe_gpu (test_moe_gpu.log)" >>"$SUMMARY"
  grep -E "FAILED|error|timed out" "$OUTDIR/test_moe_gpu.log" | head -20
  rc=1
fi
n=$gpus
[ "$n" -gt 8 ] && n=8
if [ -x "$BUILD/bin/bench_moe_layer" ] && [ "$n" -ge 1 ]; then
  # Near-uniform routing (direct calls and the call captured in a graph), then Zipf-skewed routing.
  for routing in uniform zipf; do
    md=$OUTDIR/moe-layer-$routing.md
    if timeout 500 "$BUILD/bin/weftrun" exec -n "$n" -- "$BUILD/bin/bench_moe_layer" --iters "${MOE_LAYER_ITERS:-20}" \
      --routing $routing --graph >"$md" 2>"$OUTDIR/moe-layer-$routing.log"; then
      echo "moe layer, weft op on $n GPU(s), $routing routing:" >>"$SUMMARY"
      cat "$md" >>"$SUMMARY"
    else
      echo "FAIL    bench_moe_layer --routing $routing (moe-layer-$routing.log)" >>"$SUMMARY"
      tail -20 "$OUTDIR/moe-layer-$routing.log"
      rc=1
    fi
  done
  if python3 -c "import torch" 2>/dev/null && command -v torchrun >/dev/null; then
    if timeout 500 torchrun --nproc-per-node "$n" "$ROOT/bench/peers/moe_sequential.py" --iters 10 \
      >"$OUTDIR/moe-sequential.md" 2>"$OUTDIR/moe-sequential.log"; then
      echo "moe layer, PyTorch sequential (NCCL all-to-all-v) on $n GPU(s):" >>"$SUMMARY"
      cat "$OUTDIR/moe-sequential.md" >>"$SUMMARY"
      # The bound of the same call's rows (near-uniform routing): compute and communication terms.
      if python3 "$ROOT/bench/moe/moe_bound.py" "$OUTDIR/moe-layer-uniform.md" "$OUTDIR/moe-sequential.md" \
        >"$OUTDIR/moe-bound.md" 2>>"$OUTDIR/moe-sequential.log"; then
        echo "moe layer against its bound (near-uniform routing, this call's rows; bench/moe/moe_bound.py):" >>"$SUMMARY"
        cat "$OUTDIR/moe-bound.md" >>"$SUMMARY"
      fi
    else
      echo "FAIL    moe_sequential.py under torchrun (moe-sequential.log)" >>"$SUMMARY"
      tail -20 "$OUTDIR/moe-sequential.log"
      rc=1
    fi
  else
    echo "SKIP    moe_sequential.py: no PyTorch/torchrun on this machine" >>"$SUMMARY"
  fi
fi
# weftrun bench for moe: weft next to the sequential NCCL + cuBLAS layer on its routing, both validated,
# on a 1 x n copy of the small example (n = 2 or 4 GPUs).
bn=$gpus
[ "$bn" -gt 4 ] && bn=4
if [ "$bn" -ge 2 ]; then
  sed "s/gpus_per_node: 4/gpus_per_node: $bn/; s/tokens: 4096/tokens: $((1024 * bn))/" \
    "$ROOT/configs/examples/moe_small_4gpu.yaml" >"$OUTDIR/moe-bench.yaml"
  if timeout 300 "$BUILD/bin/weftrun" bench --json "$OUTDIR/moe-bench.jsonl" "$OUTDIR/moe-bench.yaml" \
    >"$OUTDIR/moe-bench.log" 2>&1 && [ "$(grep -c 'moe validated' "$OUTDIR/moe-bench.log")" -eq "$bn" ] &&
    grep -q '"variant":"weft moe"' "$OUTDIR/moe-bench.jsonl"; then
    echo "PASS    weftrun bench moe: $bn ranks validated; $(grep -E '^  weft moe ' "$OUTDIR/moe-bench.log" | head -1)" >>"$SUMMARY"
  else
    echo "FAIL    weftrun bench moe (moe-bench.log)" >>"$SUMMARY"
    tail -20 "$OUTDIR/moe-bench.log"
    rc=1
  fi
else
  echo "SKIP    weftrun bench moe: needs 2 or more GPUs, this machine has $gpus" >>"$SUMMARY"
fi
# Across 2 emulated nodes of 1 GPU (the hierarchical variant, the socket backend between them): weft
# next to the sequential layer, NCCL_HOSTID per node.
if [ "$gpus" -ge 2 ]; then
  sed "s/nodes: 1, gpus_per_node: 4/nodes: 2, gpus_per_node: 1/; s/tokens: 4096/tokens: 2048/" \
    "$ROOT/configs/examples/moe_small_4gpu.yaml" >"$OUTDIR/moe-bench-nodes.yaml"
  if timeout 300 "$BUILD/bin/weftrun" bench "$OUTDIR/moe-bench-nodes.yaml" >"$OUTDIR/moe-bench-nodes.log" 2>&1 &&
    [ "$(grep -c 'moe validated' "$OUTDIR/moe-bench-nodes.log")" -eq 2 ] &&
    grep -q 'the plan (hierarchical)' "$OUTDIR/moe-bench-nodes.log"; then
    echo "PASS    weftrun bench moe across 2 emulated nodes: validated; $(grep -E '^  weft moe ' "$OUTDIR/moe-bench-nodes.log" | head -1)" >>"$SUMMARY"
  else
    echo "FAIL    weftrun bench moe across 2 emulated nodes (moe-bench-nodes.log)" >>"$SUMMARY"
    tail -20 "$OUTDIR/moe-bench-nodes.log"
    rc=1
  fi
else
  echo "SKIP    weftrun bench moe across nodes: needs 2 or more GPUs, this machine has $gpus" >>"$SUMMARY"
fi
exit $rc
