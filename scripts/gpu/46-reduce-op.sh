#!/usr/bin/env bash
# GPU check step: the runtime's GEMM+RS / GEMM+AR op (what `weftrun run` and the API execute) next to
# the measuring runner (`weftrun bench`) on the same 4 GPUs. For the 8192 examples and GEMM+RS 2048:
#   bench_gemm_reduce_op: the peer plan and the overlap plans (the defaults and the other ways of
#     moving pieces and rows) on one heap, each checked against the first's output, timed in
#     rotating rounds, back to back and lined up (as the runner times);
#   weftrun bench: the runner's rows (its own overlap variants, NCCL + cuBLAS), in a process of its
#     own, alternating with the op's twice, so the two can be compared on the same warm machine.
# Appends one summary row per op and plan.
set -uo pipefail
out=${1:?usage: 46-reduce-op.sh OUTDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
weftrun=$WEFT_BUILD_DIR/bin/weftrun
bench=$WEFT_BUILD_DIR/bin/bench_gemm_reduce_op
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 4 ]; then
  echo "SKIP    reduce-op: the 8192 examples need 4 GPUs (layout 1 x 4); this machine has $gpus" >>"$WEFT_SUMMARY"
  exit 0
fi
[ -x "$bench" ] || {
  echo "FAIL    reduce-op: $bench was not built" >>"$WEFT_SUMMARY"
  exit 1
}
rc=0
# The plans as the model and the plan: lines make them, not a tuning cache entry of this machine.
export WEFT_TUNE_CACHE=$out/empty-tune-cache.json
rm -f "$WEFT_TUNE_CACHE"
plan_of() {  # $1 example, $2 label, $3 plan: line (or "")
  local wl=$out/$1-$2.yaml
  sed 's/^roles:.*$//' "$root/configs/examples/$1.yaml" >"$wl"
  [ -z "$3" ] || echo "$3" >>"$wl"
  "$weftrun" plan --json "$wl" >"$out/$1-$2.json"
}
for op in gemm_rs_m8192 gemm_ar_m8192 gemm_rs_m2048; do
  plans=()
  plan_of "$op" peer "plan: {variant: peer}" && plans+=("$out/$op-peer.json")
  if [ "${op#gemm_rs}" != "$op" ]; then  # the model's plan is one of these (copy sends from 16 MiB per rank)
    plan_of "$op" copy "plan: {variant: overlap, send: copy}" && plans+=("$out/$op-copy.json")
    plan_of "$op" sm "plan: {variant: overlap, send: sm}" && plans+=("$out/$op-sm.json")
  else
    plan_of "$op" overlap "plan: {variant: overlap}" && plans+=("$out/$op-overlap.json")
    plan_of "$op" push "plan: {variant: overlap, send: copy, gather: push}" && plans+=("$out/$op-push.json")
    plan_of "$op" copy_sm "plan: {variant: overlap, send: copy, gather: sm}" && plans+=("$out/$op-copy_sm.json")
  fi
  reps="1 2"
  [ "$op" = gemm_rs_m2048 ] && reps=1
  for rep in $reps; do
    echo "=== $op, round $rep: bench_gemm_reduce_op ${plans[*]}"
    if ! timeout 300 "$weftrun" exec -n 4 -- "$bench" "${plans[@]}" --iters 30 --rounds 3 | tee "$out/$op-op-$rep.txt"; then
      echo "FAIL    reduce-op: $op: bench_gemm_reduce_op exited non-zero (log: 46-reduce-op.log)" >>"$WEFT_SUMMARY"
      rc=1
      continue 2
    fi
    echo "=== $op, round $rep: weftrun bench configs/examples/$op.yaml"
    if ! timeout 300 "$weftrun" bench -n 4 "$root/configs/examples/$op.yaml" | tee "$out/$op-bench-$rep.txt"; then
      echo "FAIL    reduce-op: $op: weftrun bench exited non-zero (log: 46-reduce-op.log)" >>"$WEFT_SUMMARY"
      rc=1
    fi
  done
  for rep in $reps; do
    # Each row's output matched the first plan's (bench_gemm_reduce_op stops otherwise); the runtime
    # op's own validation against weft's reference is 45-run's and test_api_gpu's.
    grep '^| ' "$out/$op-op-$rep.txt" | grep -v '^| plan' | sed "s/^| /INFO    reduce-op $op round $rep: runtime op /" \
      >>"$WEFT_SUMMARY"
    grep -m1 'weft fused' "$out/$op-bench-$rep.txt" | sed "s/^/INFO    reduce-op $op round $rep: weftrun bench: /" \
      >>"$WEFT_SUMMARY"
  done
done
exit $rc
