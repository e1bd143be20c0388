#!/usr/bin/env bash
# test_api_gpu, test_api_abort_gpu, then test_api_groups_gpu, as 4 ranks under `weftrun exec` (ranks share GPUs where the
# machine has fewer than 4); test_api_order_gpu with and without the context's call order (a GPU per
# rank, 2 to 4 ranks); then test_api_nodes_gpu on 2 emulated nodes of 2 GPUs (4 GPUs only).
# Usage: api_gpu.sh BUILD_DIR. Exit 77 (skipped) without a GPU.
set -uo pipefail
build=${1:?usage: api_gpu.sh BUILD_DIR}
if ! gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU) || [ "$gpus" -eq 0 ]; then
  echo "SKIPPED: no GPU on this machine (test_api_gpu needs one)"
  exit 77
fi
share=""
[ "$gpus" -lt 4 ] && share=--oversubscribe && echo "4 ranks share $gpus GPU(s): the API's promises, not NVLink"
export WEFT_DEVICE_TIMEOUT=${WEFT_DEVICE_TIMEOUT:-5}  # the timeout case waits this long
timeout 400 "$build/bin/weftrun" exec -n 4 $share -- "$build/bin/test_api_gpu" || exit 1
# ctx.abort(): rank 1 aborts while the others wait for its shard; each other rank must print a PASS
# line (it learned of the abort from the launcher, well before its 60 s device timeout); the job
# itself ends non-zero, as an aborted job does.
out=$(WEFT_DEVICE_TIMEOUT=60 timeout 120 "$build/bin/weftrun" exec -n 4 $share -- "$build/bin/test_api_abort_gpu" 2>&1)
abort_rc=$?
echo "$out" | grep -E "abort-test|aborted the job"
passes=$(echo "$out" | grep -c "abort-test: rank [023]: PASS")
if [ "$abort_rc" -eq 0 ] || [ "$abort_rc" -eq 124 ] || [ "$passes" -ne 3 ] || ! echo "$out" | grep -q "rank 1 aborted the job"; then
  echo "$out" | tail -40
  echo "FAILED: ctx.abort(): job exit $abort_rc (want non-zero, not the timeout), $passes of 3 PASS lines"
  exit 1
fi
# A user kernel holding half the SMs beside the op (the copy-engine plan, which must complete, then
# the SM-mover plan, which may fail fast instead), each in a job of its own with one rank per GPU (up to 4).
half_ranks=$gpus
[ "$half_ranks" -gt 4 ] && half_ranks=4
for plan in copy-engine SM-mover; do
  timeout 200 "$build/bin/weftrun" exec -n $half_ranks -- "$build/bin/test_api_gpu" --no-skip \
    -tc="*half the SMs: the $plan plan*" || exit 1
done
# One call in flight per context, with two ops that need it (GEMM+RS and GEMM+AR's overlap variant,
# a GPU per rank): with the order every output is right; with it turned off (a test-only switch) the
# same calls are expected to fail, which shows the test can. The second run's outcome is reported,
# not required: the race it needs may not show in every run.
if [ "$half_ranks" -ge 2 ]; then
  timeout 300 "$build/bin/weftrun" exec -n $half_ranks -- "$build/bin/test_api_order_gpu" || exit 1
  WEFT_DEVICE_TIMEOUT=5 timeout 300 "$build/bin/weftrun" exec -n $half_ranks -- "$build/bin/test_api_order_gpu" \
    --no-order >"$build/order-off.log" 2>&1
  off_rc=$?
  if [ "$off_rc" -eq 124 ] || [ "$off_rc" -eq 137 ] || ! grep -q "call pairs made" "$build/order-off.log"; then
    tail -30 "$build/order-off.log"
    echo "FAILED: test_api_order_gpu --no-order hung or never ran its calls (exit $off_rc): every wait must end"
    exit 1
  elif [ "$off_rc" -eq 0 ]; then
    echo "order-test: without the order the calls passed this time (the race did not show)"
  else
    echo "order-test: without the order the calls failed, as expected (exit $off_rc):"
    grep -E "call pairs made|timed out|wrong" "$build/order-off.log" | head -8
  fi
else
  echo "SKIPPED: test_api_order_gpu needs a GPU per rank and 2 ranks (the overlap variant), this machine has $gpus"
fi
# Rank groups through the API: two 1 x 2 groups at once, each gathering its own members' shards.
timeout 180 "$build/bin/weftrun" exec -n 4 $share -- "$build/bin/test_api_groups_gpu" || exit 1
# AllGather+GEMM across 2 emulated nodes of 2 GPUs: a persistent kernel per GPU, so 4 GPUs only.
if [ -n "$share" ]; then
  echo "SKIPPED: test_api_nodes_gpu needs 4 GPUs (one per rank), this machine has $gpus"
  exit 0
fi
exec timeout 300 "$build/bin/weftrun" exec -n 4 --emulate-nodes 2 -- "$build/bin/test_api_nodes_gpu"
