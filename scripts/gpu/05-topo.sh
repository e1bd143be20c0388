#!/usr/bin/env bash
# GPU step of `scripts/weft gpu-check`: the GPUs hwloc finds (weftrun topo --json) must be the ones
# nvidia-smi lists, by PCI bus id. Usage: 05-topo.sh OUTDIR (WEFT_BUILD_DIR, WEFT_SUMMARY as set by it).
set -uo pipefail

OUTDIR=${1:?usage: 05-topo.sh OUTDIR}
WEFTRUN=${WEFT_BUILD_DIR:?WEFT_BUILD_DIR not set}/bin/weftrun
SUMMARY=${WEFT_SUMMARY:-/dev/null}
fail() { echo "FAIL topo: $*" | tee -a "$SUMMARY"; exit 1; }

[ -x "$WEFTRUN" ] || fail "$WEFTRUN not built"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found"
"$WEFTRUN" topo >"$OUTDIR/topo.txt" 2>&1 || fail "weftrun topo failed (topo.txt)"
"$WEFTRUN" topo --json >"$OUTDIR/topo.json" 2>"$OUTDIR/topo.err" || fail "weftrun topo --json failed (topo.err)"
cat "$OUTDIR/topo.txt"

# One bus id a line, lower case, 4-digit domain ("00000000:00:06.0" from nvidia-smi -> "0000:00:06.0").
norm() { tr 'A-F' 'a-f' | sed -E 's/^[[:space:]]*0*([0-9a-f]{4}):/\1:/; s/[[:space:]]+$//' | { grep . || true; } | sort; }
hw=$(python3 -c 'import json,sys; [print(g["pci_bus_id"]) for g in json.load(sys.stdin)["gpus"]]' \
  <"$OUTDIR/topo.json" | norm) || fail "topo.json does not parse"
smi=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | norm) || fail "nvidia-smi --query-gpu failed"
echo "hwloc:      ${hw//$'\n'/ }"
echo "nvidia-smi: ${smi//$'\n'/ }"

n=$(printf '%s\n' "$smi" | grep -c .)
[ "$n" -gt 0 ] || fail "nvidia-smi lists no GPU"
[ "$hw" = "$smi" ] || fail "hwloc found [${hw//$'\n'/ }], nvidia-smi lists [${smi//$'\n'/ }]"
echo "PASS topo: $n GPUs found by hwloc match nvidia-smi" | tee -a "$SUMMARY"
