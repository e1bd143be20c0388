#!/usr/bin/env bash
# GPU step of `scripts/weft gpu-check`: weftrun's embedded launcher starts one rank per GPU; each rank
# binds GPU (local rank % visible GPUs) and reports its PCI bus id, which must be nvidia-smi's, one
# distinct GPU per rank; again with 2 emulated nodes (each node gets its own half of the GPUs), and
# under mpirun when Open MPI is installed. Usage: 10-launch.sh OUTDIR (WEFT_BUILD_DIR, WEFT_SUMMARY).
set -uo pipefail

OUTDIR=${1:?usage: 10-launch.sh OUTDIR}
WEFTRUN=${WEFT_BUILD_DIR:?WEFT_BUILD_DIR not set}/bin/weftrun
SUMMARY=${WEFT_SUMMARY:-/dev/null}
rc=0
pass() { echo "PASS launch: $*" | tee -a "$SUMMARY"; }
fail() { echo "FAIL launch: $*" | tee -a "$SUMMARY"; rc=1; }

[ -x "$WEFTRUN" ] || { fail "$WEFTRUN not built"; exit 1; }
command -v nvidia-smi >/dev/null || { fail "nvidia-smi not found"; exit 1; }
# One bus id a line, lower case, 4-digit domain ("00000000:00:06.0" from nvidia-smi -> "0000:00:06.0").
norm() { tr 'A-F' 'a-f' | sed -E 's/^[[:space:]]*0*([0-9a-f]{4}):/\1:/; s/[[:space:]]+$//' | { grep . || true; } | sort; }
smi=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | norm)
N=$(printf '%s\n' "$smi" | grep -c .)
[ "$N" -gt 0 ] || { fail "nvidia-smi lists no GPU"; exit 1; }
echo "nvidia-smi: ${smi//$'\n'/ } ($N GPUs)"
export WEFT_BOOTSTRAP_TIMEOUT=${WEFT_BOOTSTRAP_TIMEOUT:-60}

# verify NAME NODES JSONFILE: passed, N ranks on NODES nodes, every rank on a GPU, rank r's GPU is
# local_rank % gpu_count, bus ids distinct and exactly nvidia-smi's.
verify() {
  local name=$1 nodes=$2 json=$3 ids st
  ids=$(python3 - "$json" "$N" "$nodes" 2>"$json.verify" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1])); n = int(sys.argv[2]); nodes = int(sys.argv[3])
errs = []
if doc.get("passed") is not True: errs.append("passed is not true: %s" % doc.get("problems"))
if doc.get("ranks") != n: errs.append("ranks %s, expected %d" % (doc.get("ranks"), n))
if doc.get("nodes") != nodes: errs.append("nodes %s, expected %d" % (doc.get("nodes"), nodes))
for e in doc.get("per_rank", []):
    if e.get("gpu") is None:
        errs.append("rank %s has no GPU" % e.get("rank")); continue
    if e["gpu"] != e["local_rank"] % e["gpu_count"]:
        errs.append("rank %d bound GPU %d, local rank %d of %d GPUs" % (e["rank"], e["gpu"], e["local_rank"], e["gpu_count"]))
    print(e["pci_bus_id"])
    sys.stderr.write("rank %d node %d local %d -> GPU %d %s\n" % (e["rank"], e["node"], e["local_rank"], e["gpu"], e["pci_bus_id"]))
for m in errs: sys.stderr.write("ERROR " + m + "\n")
sys.exit(1 if errs else 0)
PY
  )
  st=$?
  cat "$json.verify"
  if [ $st -ne 0 ]; then
    fail "$name: $(grep -h '^ERROR\|Error' "$json.verify" | head -3 | tr '\n' ' ')"
    return 1
  fi
  ids=$(printf '%s\n' "$ids" | norm)
  if [ "$ids" != "$smi" ]; then
    fail "$name: ranks bound [${ids//$'\n'/ }], nvidia-smi lists [${smi//$'\n'/ }]"
    return 1
  fi
  pass "$name: $N ranks on $nodes node(s), each bound its own GPU by local rank, bus ids match nvidia-smi"
}

run_check() {  # run_check NAME NODES CMD...
  local name=$1 nodes=$2; shift 2
  local tag=${name// /-}
  echo "== $name: $*"
  if ! "$@" >"$OUTDIR/launch-$tag.json" 2>"$OUTDIR/launch-$tag.err"; then
    fail "$name: exit non-zero (launch-$tag.err: $(tail -2 "$OUTDIR/launch-$tag.err" | tr '\n' ' '))"
    return
  fi
  verify "$name" "$nodes" "$OUTDIR/launch-$tag.json"
}

# Lines mode: the per-rank lines carry the bus id and the last line is the summary.
if "$WEFTRUN" check -n "$N" --iters 5 >"$OUTDIR/launch-lines.txt" 2>&1; then
  cat "$OUTDIR/launch-lines.txt"
  last=$(grep . "$OUTDIR/launch-lines.txt" | tail -1)
  [ "$last" = "check passed: $N ranks, 1 nodes" ] && pass "weftrun check -n $N: '$last'" ||
    fail "weftrun check -n $N: last line '$last'"
else
  fail "weftrun check -n $N exited non-zero (launch-lines.txt: $(tail -2 "$OUTDIR/launch-lines.txt" | tr '\n' ' '))"
fi

run_check "embedded" 1 "$WEFTRUN" check -n "$N" --iters 5 --json
if [ "$N" -ge 2 ]; then
  run_check "embedded emulate-nodes 2" 2 "$WEFTRUN" check -n "$N" --emulate-nodes 2 --iters 5 --json
fi
if command -v mpirun >/dev/null; then
  run_check "mpirun" 1 mpirun --allow-run-as-root --oversubscribe -np "$N" "$WEFTRUN" check --iters 5 --json
else
  echo "mpirun not installed: mpirun launch not checked"
fi
exit $rc
