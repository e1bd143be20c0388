#!/usr/bin/env bash
# test_moe_gpu under `weftrun exec`: 1 rank, then as many ranks as GPUs (2, 4 or 8 on NVLink), then 4
# ranks sharing the GPUs where there are fewer than 4 (the protocol, not NVLink); the hierarchical
# variant across 2 emulated nodes.
# Usage: moe_gpu.sh BUILD_DIR. Exit 77 (skipped) without a GPU.
set -uo pipefail
build=${1:?usage: moe_gpu.sh BUILD_DIR}
if ! gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU) || [ "$gpus" -eq 0 ]; then
  echo "SKIPPED: no GPU on this machine (test_moe_gpu needs one)"
  exit 77
fi
export WEFT_DEVICE_TIMEOUT=${WEFT_DEVICE_TIMEOUT:-20}
rc=0
run() {
  echo "== test_moe_gpu: $*"
  timeout 300 "$build/bin/weftrun" exec "$@" -- "$build/bin/test_moe_gpu" || rc=1
}
most=$([ "$gpus" -ge 8 ] && echo 8 || { [ "$gpus" -ge 4 ] && echo 4 || echo 2; })
run -n 1
[ "$gpus" -ge 2 ] && run -n "$most"
[ "$gpus" -lt 4 ] && run -n 4 --oversubscribe
# The FFN, combine and home reduction in one launch (a GPU per rank), against the staged op's bits.
echo "== test_moe_gpu --variant ffn_combine: -n 1"
timeout 300 "$build/bin/weftrun" exec -n 1 -- "$build/bin/test_moe_gpu" --variant ffn_combine || rc=1
if [ "$gpus" -ge 2 ]; then
  echo "== test_moe_gpu --variant ffn_combine: -n $most"
  timeout 300 "$build/bin/weftrun" exec -n "$most" -- "$build/bin/test_moe_gpu" --variant ffn_combine || rc=1
  echo "== test_moe_gpu --overflow --variant ffn_combine: -n 2"
  timeout 120 "$build/bin/weftrun" exec -n 2 -- "$build/bin/test_moe_gpu" --overflow --variant ffn_combine || rc=1
  echo "== test_moe_gpu --stall --variant ffn_combine: -n 2"
  WEFT_DEVICE_TIMEOUT=3 timeout 120 "$build/bin/weftrun" exec -n 2 -- "$build/bin/test_moe_gpu" --stall \
    --variant ffn_combine || rc=1
fi
# Across 2 emulated nodes (the socket backend between them): one rank per node, then 2 per node
# (the relay forwards to its node-mate; ranks share the GPUs where there are fewer than 4); a rank
# that never calls; counts first overflowing on one owner.
share1=""
[ "$gpus" -lt 2 ] && share1=--oversubscribe
share2=""
[ "$gpus" -lt 4 ] && share2=--oversubscribe
echo "== test_moe_gpu --variant hierarchical: -n 2 --emulate-nodes 2 $share1"
timeout 300 "$build/bin/weftrun" exec -n 2 --emulate-nodes 2 $share1 -- "$build/bin/test_moe_gpu" \
  --variant hierarchical || rc=1
echo "== test_moe_gpu --variant hierarchical: -n 4 --emulate-nodes 2 $share2"
timeout 300 "$build/bin/weftrun" exec -n 4 --emulate-nodes 2 $share2 -- "$build/bin/test_moe_gpu" \
  --variant hierarchical || rc=1
echo "== test_moe_gpu --stall --variant hierarchical: -n 2 --emulate-nodes 2 $share1"
WEFT_DEVICE_TIMEOUT=3 timeout 120 "$build/bin/weftrun" exec -n 2 --emulate-nodes 2 $share1 -- \
  "$build/bin/test_moe_gpu" --stall --variant hierarchical || rc=1
echo "== test_moe_gpu --overflow --variant hierarchical: -n 2 --emulate-nodes 2 $share1"
timeout 120 "$build/bin/weftrun" exec -n 2 --emulate-nodes 2 $share1 -- "$build/bin/test_moe_gpu" --overflow \
  --variant hierarchical || rc=1
# Counts first with one tile fewer than the routing needs: the owner's call fails naming the rows.
for n in 1 2; do
  echo "== test_moe_gpu --overflow: -n $n"
  share=""
  [ "$gpus" -lt "$n" ] && share=--oversubscribe
  timeout 120 "$build/bin/weftrun" exec -n $n $share -- "$build/bin/test_moe_gpu" --overflow || rc=1
done
# A rank that never calls: the peer's call ends within the device timeout, naming it.
echo "== test_moe_gpu --stall: -n 2"
share=""
[ "$gpus" -lt 2 ] && share=--oversubscribe
WEFT_DEVICE_TIMEOUT=3 timeout 120 "$build/bin/weftrun" exec -n 2 $share -- "$build/bin/test_moe_gpu" --stall || rc=1
exit $rc
