#!/usr/bin/env bash
# test_api_gpu, then test_api_groups_gpu, as 4 ranks under `weftrun exec` (ranks share GPUs where the
# machine has fewer than 4), then test_api_nodes_gpu on 2 emulated nodes of 2 GPUs (4 GPUs only).
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
# Rank groups through the API: two 1 x 2 groups at once, each gathering its own members' shards.
timeout 180 "$build/bin/weftrun" exec -n 4 $share -- "$build/bin/test_api_groups_gpu" || exit 1
# AllGather+GEMM across 2 emulated nodes of 2 GPUs: a persistent kernel per GPU, so 4 GPUs only.
if [ -n "$share" ]; then
  echo "SKIPPED: test_api_nodes_gpu needs 4 GPUs (one per rank), this machine has $gpus"
  exit 0
fi
exec timeout 300 "$build/bin/weftrun" exec -n 4 --emulate-nodes 2 -- "$build/bin/test_api_nodes_gpu"
