#!/usr/bin/env bash
# GPU step of `scripts/weft gpu-check`: transport GPU test (device FIFO producers, socket between 2 emulated
# nodes, NVLink peers), the all-gather benchmark (weft over socket, and ofi where `check --transport ofi` passes)
# against NCCL with NCCL_HOSTID per emulated node (--quick: 1 and 16 MiB chunks), and the socket put/signal
# benchmark (--quick). The CPU transport tests are CI's job (ctest -R
# test_transport), not repeated here; the step takes well under a minute when nothing hangs, and every command is
# bounded. Full all-gather sizes: build/bin/bench_allgather_gpu --json FILE.
# Usage: 30-transport.sh OUTDIR (WEFT_BUILD_DIR, WEFT_SUMMARY as set by scripts/weft).
set -uo pipefail

OUTDIR=${1:?usage: 30-transport.sh OUTDIR}
BUILD=${WEFT_BUILD_DIR:?WEFT_BUILD_DIR not set}
SUMMARY=${WEFT_SUMMARY:-/dev/null}
BIN=$BUILD/bin
rc=0
say() { echo "== 30-transport: $*"; }
row() { echo "$*" | tee -a "$SUMMARY"; }

say "GPU test"
if (cd "$BUILD" && ctest -R '^test_transport_gpu$' --output-on-failure) >"$OUTDIR/transport-gpu-test.log" 2>&1; then
  if grep -q "Skipped\|SKIPPED" "$OUTDIR/transport-gpu-test.log"; then
    row "FAIL transport gpu test: skipped on a GPU machine (transport-gpu-test.log)"; rc=1
  else
    if [ "$(nvidia-smi -L 2>/dev/null | grep -c GPU)" -ge 4 ]; then
      row "PASS transport gpu test: device FIFO pushes, socket 2x2 emulated nodes, NVLink peers, 3 signal modes"
    else  # the test's 4 ranks share the GPUs: the peer copies stay on one GPU
      row "PASS transport gpu test: device FIFO pushes, socket 2x2 emulated nodes, 3 signal modes (ranks share GPUs: NVLink not exercised)"
    fi
  fi
else
  row "FAIL transport gpu test (transport-gpu-test.log)"; rc=1
fi
grep -E "MESSAGE|rank [0-9] GPU" "$OUTDIR/transport-gpu-test.log" || true

# The ofi backend's GPU heap registered with the provider (FI_HMEM): a libfabric built with CUDA
# (scripts/libfabric-cuda.sh; the distributions' packages are built without it) at
# .deps/libfabric-cuda, its shm provider between the emulated nodes of this host.
say "GPU test, ofi with FI_HMEM"
LFC=$(cd "$(dirname "$0")/../.." && pwd)/.deps/libfabric-cuda/lib
if [ ! -e "$LFC/libfabric.so.1" ]; then
  row "SKIP transport gpu test with FI_HMEM: no libfabric built with CUDA at $LFC (scripts/libfabric-cuda.sh)"
else
  LD_LIBRARY_PATH="$LFC:${LD_LIBRARY_PATH:-}" WEFT_OFI_PROVIDER=shm timeout 300 "$BIN/test_transport_gpu" -s \
    >"$OUTDIR/transport-gpu-hmem.log" 2>&1
  code=$?
  if [ $code -eq 0 ] && grep -q "the GPU heap registered with the provider (FI_HMEM)" "$OUTDIR/transport-gpu-hmem.log"; then
    row "PASS transport gpu test with FI_HMEM: ofi (shm, libfabric with CUDA) with the GPU heap registered with the provider, 3 signal modes"
  elif [ $code -eq 0 ]; then
    row "FAIL transport gpu test with FI_HMEM: passed, but staged the GPU heap (transport-gpu-hmem.log)"; rc=1
  else
    row "FAIL transport gpu test with FI_HMEM: exit $code (transport-gpu-hmem.log)"; rc=1
  fi
fi

say "all-gather: weft vs NCCL (NCCL_HOSTID per emulated node)"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
if [ "$gpus" -lt 4 ]; then
  # Its NCCL baseline needs a GPU per rank (NCCL refuses ranks that share one: ncclCommInitRank).
  row "SKIP transport all-gather bench: its 4 ranks need 4 GPUs for the NCCL baseline; this machine has $gpus"
elif [ -x "$BIN/bench_allgather_gpu" ]; then
  # The ofi backend (libfabric's tcp provider between the emulated nodes) beside the socket backend and
  # NCCL, where this build has it and it moves bytes here.
  backends=socket
  if WEFT_NET_BACKEND=ofi timeout 120 "$BIN/weftrun" check -n 4 --emulate-nodes 2 --transport ofi \
    >"$OUTDIR/transport-ofi-check.txt" 2>&1; then
    backends=socket,ofi
  else
    row "SKIP transport all-gather bench over ofi: weftrun check --transport ofi did not pass ($(tail -1 "$OUTDIR/transport-ofi-check.txt"))"
  fi
  if timeout 300 "$BIN/bench_allgather_gpu" --quick --backends "$backends" --json "$OUTDIR/transport-allgather.json" \
      >"$OUTDIR/transport-allgather.txt" 2>"$OUTDIR/transport-allgather.err"; then
    cat "$OUTDIR/transport-allgather.txt"
    row "PASS transport all-gather bench, weft over $backends and NCCL (transport-allgather.txt)"
  else
    tail -20 "$OUTDIR/transport-allgather.err"
    row "FAIL transport all-gather bench (transport-allgather.err)"; rc=1
  fi
else
  row "FAIL transport all-gather bench: bench_allgather_gpu not built (NCCL not found?)"; rc=1
fi

say "put bandwidth / signal latency (host heaps, --quick)"
if timeout 120 "$BIN/bench_transport" --quick --json "$OUTDIR/transport-bench.json" >"$OUTDIR/transport-bench.txt" 2>&1; then
  cat "$OUTDIR/transport-bench.txt"
  row "PASS transport bench (transport-bench.txt)"
else
  row "FAIL transport bench (transport-bench.txt)"; rc=1
fi
exit $rc
