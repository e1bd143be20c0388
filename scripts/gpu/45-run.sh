#!/usr/bin/env bash
# GPU check step: the runtime path. `weftrun run` executes the plan `weftrun plan` prints, validated
# against weft's own reference GEMM (no NCCL, no cuBLAS), and reports the plan as the launch ran it:
#   - every example it can run: the executed plan's hash equals `weftrun plan --json`'s;
#   - explicit choices run as written: two role splits (copy engines on fewer SMs, SM movers) and a
#     plan given with --plan that differs from the tuner's, each read back from the launch record;
#   - two rank groups of 1 x 2 running the same op at once, each on its own heap and flags;
#   - AllGather+GEMM, GEMM+RS and GEMM+AR across 2 emulated nodes x 2 GPUs (4 GPUs);
#   - GEMM+RS/AR's overlap variant as written (4 GPUs), and tuned: weftrun tune's stored plan executed;
#   - what it cannot run is refused before any rank starts (exit 2).
# With fewer GPUs than ranks the ranks share GPUs (--oversubscribe): correct, but not NVLink, and
# the summary says so.
set -uo pipefail
out=${1:?usage: 45-run.sh OUTDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
weftrun=$WEFT_BUILD_DIR/bin/weftrun
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
share=""
where="4 GPUs"
if [ "$gpus" -lt 4 ]; then
  share="--oversubscribe"
  where="4 ranks on $gpus GPU(s), shared: not the NVLink path"
fi
rc=0
fail() {
  echo "FAIL    run: $1 (log: 45-run.log)" >>"$WEFT_SUMMARY"
  rc=1
}

# One run: $1 label, $2 workload, $3 expected "plan" JSON (or "" for the workload's own), rest: run args.
run_one() {
  local label=$1 wl=$2 expect=$3
  shift 3
  echo "=== $label: weftrun run $share --json $* $wl"
  if ! timeout 600 "$weftrun" run $share --json "$@" "$wl" >"$out/run-$label.txt" 2>&1; then
    cat "$out/run-$label.txt"
    fail "$label exited non-zero"
    return
  fi
  cat "$out/run-$label.txt"
  [ -n "$expect" ] || { "$weftrun" plan $share --json "$wl" >"$out/plan-$label.json" && expect=$out/plan-$label.json; }
  if python3 - "$out/run-$label.txt" "$expect" <<'PY'; then
import json, sys
text = open(sys.argv[1]).read()
executed = json.loads(text[text.index("\n{") + 1:])
planned = json.load(open(sys.argv[2]))
keys = [k for k in ["hash", "roles", "execution", "heap"] if k in planned]
diff = [k for k in keys if (executed[k] if k != "roles" else {x: v for x, v in executed[k].items() if x != "explicit"})
        != (planned[k] if k != "roles" else {x: v for x, v in planned[k].items() if x != "explicit"})]
ok = "weftrun run: passed" in text and not diff
print(("executed = planned: " if ok else "DIFFERS in %s: " % diff) + json.dumps(executed["roles"]) + " " +
      executed["execution"]["variant"] + " hash " + executed["hash"])
sys.exit(0 if ok else 1)
PY
    echo "PASS    run $label: executed plan = plan, validated ($where)" >>"$WEFT_SUMMARY"
  else
    fail "$label: the executed plan differs from the plan, or validation failed"
  fi
}

for cfg in ag_gemm_m2048 ag_gemm_llama70b ag_gemm_m16384 gemm_rs_m2048 gemm_rs_m8192 gemm_ar_m256 gemm_ar_m8192 \
  moe_mixtral_4gpu moe_qwen3_4gpu moe_small_4gpu ag_gemm_two_groups_4gpu; do
  run_one "$cfg" "$root/configs/examples/$cfg.yaml" ""
done

# The ops across 2 emulated nodes of 2 GPUs (the socket backend between them where there is no RDMA
# NIC): AllGather+GEMM's copy-in, pulls, proxy puts and end-of-run freed words; GEMM+RS/AR's staged
# partials. Each rank needs a GPU of its own (a persistent kernel per GPU): 4 GPUs only.
if [ -z "$share" ]; then
  for cfg in ag_gemm_2x2 gemm_rs_2x2 gemm_ar_2x2; do
    run_one "$cfg" "$root/configs/examples/$cfg.yaml" "" --emulate-nodes 2
  done
else
  echo "SKIP    run across nodes: 2 emulated nodes x 2 need 4 GPUs, this machine has $gpus" >>"$WEFT_SUMMARY"
fi
# The MoE op across 2 emulated nodes (hierarchical): its phases are launches with one-block waits, so
# ranks may share GPUs (--oversubscribe where there are fewer than 4).
run_one moe_2x2 "$root/configs/examples/moe_2x2.yaml" "" --emulate-nodes 2

# Explicit role splits, as written.
base=$root/configs/examples/ag_gemm_m2048.yaml
sed 's/^roles:.*$//' "$base" >"$out/ce120.yaml" && echo "roles: {compute: 120, intra_comm: 0}" >>"$out/ce120.yaml"
sed 's/^roles:.*$//' "$base" >"$out/sm8.yaml" && echo "roles: {compute: 124, intra_comm: 8}" >>"$out/sm8.yaml"
run_one ce120 "$out/ce120.yaml" ""
run_one sm8 "$out/sm8.yaml" ""

# GEMM+RS / GEMM+AR's overlap variant, as written: the defaults (RS: copy sends and 4 mover SMs,
# whose own launch record gives roles.intra_comm back; AR: the epilogue sends and gathers), and AR
# with copy sends and pushes.
# Ranks sharing a GPU cannot run it (their GEMMs wait for each other): 4 GPUs only.
if [ -z "$share" ]; then
  for op in gemm_rs gemm_ar; do
    sed 's/^roles:.*$//' "$root/configs/examples/${op}_m8192.yaml" >"$out/${op}_overlap.yaml"
    echo "plan: {variant: overlap}" >>"$out/${op}_overlap.yaml"
    run_one "${op}_overlap" "$out/${op}_overlap.yaml" ""
  done
  sed 's/^roles:.*$//' "$root/configs/examples/gemm_ar_m8192.yaml" >"$out/gemm_ar_push.yaml"
  echo "plan: {variant: overlap, send: copy, gather: push}" >>"$out/gemm_ar_push.yaml"
  run_one gemm_ar_push "$out/gemm_ar_push.yaml" ""
else
  echo "SKIP    run: the overlap variant needs a GPU per rank ($where)" >>"$WEFT_SUMMARY"
fi

# A plan given whole, not the tuner's: 112 compute SMs.
"$weftrun" plan $share --json "$base" | python3 -c '
import json, sys
p = json.load(sys.stdin)
p["roles"]["compute"] = 112
del p["hash"]  # the plan changed: run computes its own
json.dump(p, open(sys.argv[1], "w"))' "$out/planted.json"
run_one planted "$base" "$out/planted.json" --plan "$out/planted.json"

# WEFT_DETERMINISTIC=1: run repeats a call on the same inputs and compares every bit, on every rank.
rs=$root/configs/examples/gemm_rs_m2048.yaml
if WEFT_DETERMINISTIC=1 timeout 300 "$weftrun" run $share "$rs" >"$out/run-deterministic.txt" 2>&1 &&
  [ "$(grep -c 'repeated bit for bit' "$out/run-deterministic.txt")" -eq 4 ]; then
  echo "PASS    run deterministic: gemm_rs_m2048 repeated bit for bit on 4 ranks ($where)" >>"$WEFT_SUMMARY"
else
  cat "$out/run-deterministic.txt"
  fail "deterministic: gemm_rs_m2048 did not report 4 ranks repeating bit for bit"
fi

# Measured tuning: weftrun tune times every candidate interleaved and stores the fastest; plan then
# says it comes from the tuning cache and run executes exactly that plan.
export WEFT_TUNE_CACHE=$out/tune.json
rm -f "$WEFT_TUNE_CACHE"
# tune_one SUFFIX WHAT WORKLOAD: tune, check plan takes the stored entry, run it (executed = planned).
tune_one() {
  local sfx=$1 what=$2 wl=$3
  local label=tuned${sfx//-/_}
  echo "=== weftrun tune $share $wl"
  if timeout 600 "$weftrun" tune $share "$wl" 2>&1 | tee "$out/tune$sfx.txt" &&
    grep -q "stored candidate" "$out/tune$sfx.txt" &&
    "$weftrun" plan $share --json "$wl" >"$out/plan-tuned$sfx.json" &&
    python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["chosen_by"] == "tuning cache" else 1)' \
      "$out/plan-tuned$sfx.json"; then
    echo "PASS    run tune$what: $(grep -o 'stored candidate.*ms)' "$out/tune$sfx.txt") ($where)" >>"$WEFT_SUMMARY"
    run_one "$label" "$wl" "$out/plan-tuned$sfx.json"
  else
    fail "tune$what: weftrun tune did not store a plan that plan then uses"
  fi
}
tune_one "" "" "$base"
# GEMM+RS's candidates (the peer variant and the overlap variant's ways) tuned the same way, and the
# stored plan executed as planned.
rs=$root/configs/examples/gemm_rs_m8192.yaml
tune_one -rs " gemm_rs" "$rs"
# MoE's two variants (staged, and ffn_combine where every rank has a GPU of its own) tuned the same way.
moe=$root/configs/examples/moe_small_4gpu.yaml
tune_one -moe " moe" "$moe"
unset WEFT_TUNE_CACHE

# Refused before any rank starts.
sed 's/^dtype:.*$/dtype: fp8/' "$base" >"$out/fp8.yaml"
"$weftrun" run $share "$out/fp8.yaml" >"$out/run-fp8.txt" 2>&1
code=$?
cat "$out/run-fp8.txt"
if [ $code -eq 2 ] && grep -q "dtype: fp8" "$out/run-fp8.txt"; then
  echo "PASS    run fp8: refused before any rank started (exit 2, names dtype)" >>"$WEFT_SUMMARY"
else
  fail "fp8: expected exit 2 naming dtype, got $code"
fi
# The public API (runtime/weft.h): its promises under test_api_gpu (4 ranks under weftrun exec), and
# the example program built against the installed library, run as a job.
if bash "$root/tests/runtime/api_gpu.sh" "$WEFT_BUILD_DIR" >"$out/api_gpu.log" 2>&1; then
  echo "PASS    run api: $(grep -o 'test cases:.*' "$out/api_gpu.log" | sort -u | paste -sd';') ($where)" >>"$WEFT_SUMMARY"
  grep -h "^order-test:" "$out/api_gpu.log" | sed 's/^/NOTE    run /' >>"$WEFT_SUMMARY"
else
  fail "api: test_api_gpu (api_gpu.log)"
fi
grep -E "MESSAGE|ERROR|CHECK|rank [0-9]" "$out/api_gpu.log" | head -40
if cmake --install "$WEFT_BUILD_DIR" --prefix "$out/prefix" >/dev/null &&
  cmake -S "$root/examples/ag_gemm_loop" -B "$out/example" -DCMAKE_PREFIX_PATH="$out/prefix" >/dev/null &&
  cmake --build "$out/example" >/dev/null &&
  timeout 300 "$weftrun" exec -n 4 $share -- "$out/example/ag_gemm_loop" "$base" 5 | tee "$out/example.log" &&
  grep -q ": ok" "$out/example.log"; then
  echo "PASS    run example: ag_gemm_loop built against the installed weft, 5 checked calls ($where)" >>"$WEFT_SUMMARY"
else
  fail "example: ag_gemm_loop"
fi
moe_cfg=$root/configs/examples/moe_small_4gpu.yaml
if cmake -S "$root/examples/moe_layer" -B "$out/moe-example" -DCMAKE_PREFIX_PATH="$out/prefix" >/dev/null &&
  cmake --build "$out/moe-example" >/dev/null &&
  timeout 300 "$weftrun" exec -n 4 $share -- "$out/moe-example/moe_layer" "$moe_cfg" 5 | tee "$out/moe-example.log" &&
  grep -q ": ok" "$out/moe-example.log"; then
  echo "PASS    run example: moe_layer built against the installed weft, 5 calls, routing and output checked ($where)" >>"$WEFT_SUMMARY"
else
  fail "example: moe_layer"
fi
exit $rc
