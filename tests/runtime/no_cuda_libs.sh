#!/usr/bin/env bash
# weftrun's CPU commands on a machine without CUDA libraries (a login node): the binary needs no CUDA
# runtime, cuBLAS, NCCL or driver library to load, and --help, --version, plan and topo neither
# load nor look for one, even with every CUDA directory left off the loader's path.
# Usage: no_cuda_libs.sh WEFTRUN SOURCE_DIR HAVE_CUDA. Exit 77 (skipped) for a build without CUDA.
set -uo pipefail
weftrun=${1:?usage: no_cuda_libs.sh WEFTRUN SOURCE_DIR HAVE_CUDA}
src=${2:?usage: no_cuda_libs.sh WEFTRUN SOURCE_DIR HAVE_CUDA}
have_cuda=${3:-OFF}
case "$have_cuda" in
  ON | on | 1 | TRUE | true) ;;
  *)
    echo "SKIPPED: this build has no CUDA code, so it links no CUDA library; the check is for a CUDA build"
    exit 77
    ;;
esac
command -v ldd >/dev/null || { echo "SKIPPED: no ldd on this machine"; exit 77; }
cuda_libs='lib(cudart|cublas|cublasLt|nccl|cuda)\.so'
fail=0

deps=$(ldd "$weftrun" 2>&1) || { echo "FAIL: ldd $weftrun: $deps"; exit 1; }
if grep -E "$cuda_libs" <<<"$deps"; then
  echo "FAIL: $weftrun needs the CUDA libraries above to start"
  fail=1
else
  echo "ok: ldd $weftrun lists no CUDA runtime, cuBLAS, NCCL or driver library"
fi

# Each command with the CUDA directories off LD_LIBRARY_PATH; the loader's log (LD_DEBUG=libs) says
# which libraries it looked for. (hwloc's own plugins may probe for libcuda to find GPUs; that is
# topology discovery, not a dependency, so the driver is not checked here.)
weft_libs='lib(cudart|cublas|cublasLt|nccl)\.so'
path=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -v -i cuda | paste -sd: -)
run() {
  local log
  log=$(mktemp)
  if ! LD_LIBRARY_PATH="$path" LD_DEBUG=libs LD_DEBUG_OUTPUT="$log" "$weftrun" "$@" >/dev/null 2>"$log.err"; then
    echo "FAIL: weftrun $* exited non-zero:"
    cat "$log.err"
    fail=1
  elif cat "$log".* 2>/dev/null | grep -E "find library=$weft_libs" >/dev/null; then
    echo "FAIL: weftrun $* looked for a CUDA library:"
    cat "$log".* | grep -E "find library=$weft_libs" | head -5
    fail=1
  else
    echo "ok: weftrun $*"
  fi
  rm -f "$log" "$log".* "$log.err"
}
run --help
run --version
run plan "$src/configs/examples/ag_gemm_llama70b.yaml"
run plan --json "$src/configs/examples/gemm_rs_m8192.yaml"
run topo --topology "$src/tests/data/hwloc-nvidiaDGX2.xml"
exit $fail
