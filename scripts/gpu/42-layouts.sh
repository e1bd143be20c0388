#!/usr/bin/env bash
# GPU check step: the tensor-parallel ops on the group layouts a 4-GPU machine can hold, each validated
# and timed next to NCCL + cuBLAS in the same run (weftrun bench): 1 x 2 (one node, two GPUs), 2 x 2
# and 4 x 1 (emulated nodes: one GPU per node, every byte between nodes through the proxy). 1 x 4 is
# 40-ops.sh's. The workloads are the one-node examples with their layout changed, written to OUTDIR.
# Then two 1 x 2 groups at once (ag_gemm_two_groups_4gpu.yaml).
# Appends one summary row per (op, layout).
set -uo pipefail
out=${1:?usage: 42-layouts.sh OUTDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
weftrun=$WEFT_BUILD_DIR/bin/weftrun
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 4 ]; then
  echo "SKIP    layouts: 1x2, 2x2 and 4x1 need 4 GPUs (one per rank); this machine has $gpus" >>"$WEFT_SUMMARY"
  exit 0
fi
export WEFT_DETERMINISTIC=1
rc=0
for cfg in ${WEFT_LAYOUT_CONFIGS-ag_gemm_llama70b gemm_rs_m8192 gemm_ar_m8192}; do
  for layout in ${WEFT_LAYOUTS-1x2 2x2 4x1}; do
    nodes=${layout%x*} per=${layout#*x}
    ranks=$((nodes * per))
    wl=$out/${cfg}_$layout.yaml
    sed "s/^layout:.*$/layout: {nodes: $nodes, gpus_per_node: $per}/" "$root/configs/examples/$cfg.yaml" >"$wl"
    report=$out/layout-${cfg}_$layout.jsonl
    : >"$report"
    echo "=== weftrun bench -n $ranks --emulate-nodes $nodes $wl"
    if timeout 240 "$weftrun" bench -n "$ranks" --emulate-nodes "$nodes" --json "$report" "$wl"; then
      python3 - "$report" "$cfg" "$layout" >>"$WEFT_SUMMARY" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = {r["variant"]: r["ms"] for r in rows}
fused = v.get("weft fused (one launch)", v.get("weft fused"))
seq = next((x for name, x in v.items() if name.startswith(("nccl all-gather +", "cublas + nccl"))), None)
f = lambda x: f"{x:.3f}" if x else "-"
print(f"PASS    layout {sys.argv[3]} {sys.argv[2]}: weft {f(fused)} ms, NCCL + cuBLAS {f(seq)} ms"
      + (f" ({seq / fused:.2f}x)" if fused and seq else ""))
PY
    else
      echo "FAIL    layout $layout $cfg: weftrun bench exited non-zero (log: 42-layouts.log)" >>"$WEFT_SUMMARY"
      rc=1
    fi
  done
done
# Two tensor-parallel groups of 1 x 2 at once (the workload's `group:`), each timed against NCCL +
# cuBLAS on its own two GPUs: each group's rank 0 reports its rows.
report=$out/layout-two-groups.jsonl
: >"$report"
echo "=== weftrun bench configs/examples/ag_gemm_two_groups_4gpu.yaml"
if timeout 240 "$weftrun" bench --json "$report" "$root/configs/examples/ag_gemm_two_groups_4gpu.yaml"; then
  python3 - "$report" >>"$WEFT_SUMMARY" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fused = [r["ms"] for r in rows if r["variant"] in ("weft fused (one launch)", "weft fused")]
seq = [r["ms"] for r in rows if r["variant"].startswith("nccl all-gather +")]
ok = len(fused) == 2 and len(seq) == 2
print(("PASS" if ok else "FAIL") + "    layout two 1x2 groups at once ag_gemm: weft " +
      " / ".join(f"{x:.3f}" for x in fused) + " ms, NCCL + cuBLAS " + " / ".join(f"{x:.3f}" for x in seq) +
      " ms" + ("" if ok else " (expected one row of each per group)"))
sys.exit(0 if ok else 1)
PY
  [ $? -eq 0 ] || rc=1
else
  echo "FAIL    layout two 1x2 groups at once: weftrun bench exited non-zero (log: 42-layouts.log)" >>"$WEFT_SUMMARY"
  rc=1
fi
# The fused ops across 2 emulated nodes x 2 over the ofi backend (libfabric's tcp provider between the
# nodes; `scripts/weft vendor` brings libfabric where the machine has none), validated and timed next
# to NCCL + cuBLAS, when this build has the backend and it moves bytes here.
if WEFT_NET_BACKEND=ofi timeout 120 "$weftrun" check -n 4 --emulate-nodes 2 --transport ofi >"$out/ofi-check.txt" 2>&1; then
  for cfg in ag_gemm_2x2 gemm_rs_2x2 gemm_ar_2x2; do
    report=$out/layout-ofi-$cfg.jsonl
    : >"$report"
    echo "=== WEFT_NET_BACKEND=ofi weftrun bench -n 4 --emulate-nodes 2 configs/examples/$cfg.yaml"
    if WEFT_NET_BACKEND=ofi timeout 240 "$weftrun" bench -n 4 --emulate-nodes 2 --json "$report" \
      "$root/configs/examples/$cfg.yaml"; then
      python3 - "$report" "$cfg" >>"$WEFT_SUMMARY" <<'PY'
import json, sys
v = {r["variant"]: r["ms"] for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip())}
fused = v.get("weft fused (one launch)", v.get("weft fused"))
seq = next((x for name, x in v.items() if name.startswith(("nccl all-gather +", "cublas + nccl"))), None)
f = lambda x: f"{x:.3f}" if x else "-"
print(f"PASS    ofi 2x2 {sys.argv[2]}: weft {f(fused)} ms, NCCL + cuBLAS {f(seq)} ms")
PY
    else
      echo "FAIL    ofi 2x2 $cfg: weftrun bench exited non-zero (log: 42-layouts.log)" >>"$WEFT_SUMMARY"
      rc=1
    fi
  done
else
  echo "SKIP    ofi 2x2: weftrun check --transport ofi did not pass here ($(tail -1 "$out/ofi-check.txt"))" >>"$WEFT_SUMMARY"
fi
exit $rc
