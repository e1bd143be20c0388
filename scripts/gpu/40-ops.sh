#!/usr/bin/env bash
# GPU check step: every fused op example on all GPUs of this machine (weftrun bench, embedded launcher),
# validated and timed next to NCCL + cuBLAS in the same run, then PyTorch's fused ops on the same
# shapes (bench/peers). Appends one summary row per shape to $WEFT_SUMMARY.
set -uo pipefail
out=${1:?usage: 40-ops.sh OUTDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
weftrun=$WEFT_BUILD_DIR/bin/weftrun
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 4 ]; then
  echo "SKIP    ops: the examples need 4 GPUs (layout 1 x 4); this machine has $gpus" >>"$WEFT_SUMMARY"
  exit 0
fi
export WEFT_DETERMINISTIC=1
report=$out/ops.jsonl
: >"$report"
rc=0
for cfg in ${WEFT_OPS_CONFIGS-ag_gemm_llama70b ag_gemm_m2048 ag_gemm_m16384 gemm_rs_m8192 gemm_rs_m2048 gemm_ar_m8192 gemm_ar_m256}; do
  echo "=== weftrun bench configs/examples/$cfg.yaml"
  if ! timeout 300 "$weftrun" bench -n 4 --json "$report.one" "$root/configs/examples/$cfg.yaml"; then
    echo "FAIL    ops: weftrun bench $cfg.yaml exited non-zero (log: 40-ops.log)" >>"$WEFT_SUMMARY"
    rc=1
  fi
  [ -f "$report.one" ] && cat "$report.one" >>"$report" && rm -f "$report.one"
done

# Multi-node examples on this one machine: 2 emulated nodes x 2 GPUs, the socket backend between the
# nodes (WEFT_OPS_NODES_CONFIGS= leaves them out).
for cfg in ${WEFT_OPS_NODES_CONFIGS-ag_gemm_2x2 gemm_rs_2x2 gemm_ar_2x2}; do
  echo "=== weftrun bench -n 4 --emulate-nodes 2 configs/examples/$cfg.yaml"
  if ! timeout 300 "$weftrun" bench -n 4 --emulate-nodes 2 --json "$report.one" "$root/configs/examples/$cfg.yaml"; then
    echo "FAIL    ops: weftrun bench --emulate-nodes 2 $cfg.yaml exited non-zero (log: 40-ops.log)" >>"$WEFT_SUMMARY"
    rc=1
  fi
  [ -f "$report.one" ] && cat "$report.one" >>"$report" && rm -f "$report.one"
done

# PyTorch's symmetric-memory fused ops on the same shapes, same machine, same session
# (WEFT_OPS_PEERS=0 leaves them out).
peers=$out/torch.jsonl
: >"$peers"
[ "${WEFT_OPS_PEERS:-1}" = 0 ] || while read -r op m n k; do
  echo "=== torch $op m=$m n=$n k=$k"
  timeout 300 python3 -m torch.distributed.run --nproc_per_node=4 "$root/bench/peers/torch_fused.py" \
    --op "$op" --gemm-m "$m" --gemm-n "$n" --gemm-k "$k" --json "$peers" || echo "torch $op $m $n $k failed"
done <<'SHAPES'
ag_gemm 8192 7168 8192
ag_gemm 2048 7168 8192
ag_gemm 16384 2048 8192
gemm_rs 8192 8192 7168
gemm_rs 2048 8192 7168
SHAPES

python3 - "$report" "$peers" >>"$WEFT_SUMMARY" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peers = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
by = {}
for r in rows:
    op = r["op"] + (f"/{r['nodes']}n" if r.get("nodes", 1) > 1 else "")
    by.setdefault((op, r["m"], r["n"], r["k"]), {})[r["variant"]] = r["ms"]
print("ops (4 GPUs, ms, median, max over ranks)")
print(f"  {'op':8} {'M':>6} {'N':>6} {'K':>6} {'weft':>7} {'seq':>7} {'bound':>7} {'torch':>7}  weft/bound  seq/weft")
for (op, m, n, k), v in by.items():
    fused = v.get("weft fused (one launch)", v.get("weft fused"))
    seq = next((x for name, x in v.items() if name.startswith(("nccl all-gather +", "cublas + nccl"))), None)
    bound = v.get("bound")
    tk = next((p["torch_fused_ms"] for p in peers if p["op"] == op and p["m"] == m and
               (p["n"] == n or p["n"] * p["world"] == n) and p["k"] == k), None)
    fmt = lambda x: f"{x:7.3f}" if x else "      -"
    print(f"  {op:8} {m:6} {n:6} {k:6} {fmt(fused)} {fmt(seq)} {fmt(bound)} {fmt(tk)}  "
          f"{(fused / bound if fused and bound else 0):9.2f}x {(seq / fused if fused and seq else 0):8.2f}x")
PY
exit $rc
