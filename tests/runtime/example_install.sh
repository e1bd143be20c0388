#!/usr/bin/env bash
# The example program builds against an installed weft: cmake --install, then find_package(weft) from
# examples/ag_gemm_loop and examples/moe_layer in projects of their own. Started outside a job each
# must say how to launch it.
# Usage: example_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=${1:?usage: example_install.sh BUILD_DIR SOURCE_DIR}
src=${2:?usage: example_install.sh BUILD_DIR SOURCE_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
test -f "$tmp/prefix/include/weft/weft.h"
test -f "$tmp/prefix/include/weft/base/status.h"
cmake -S "$src/examples/ag_gemm_loop" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log"
cmake --build "$tmp/ex" >"$tmp/build.log"
test -x "$tmp/ex/ag_gemm_loop"
set +e
"$tmp/ex/ag_gemm_loop" "$src/configs/examples/ag_gemm_m2048.yaml" >"$tmp/run.log" 2>&1
code=$?
set -e
cat "$tmp/run.log"
[ "$code" -ne 0 ] && grep -q "not started in a job" "$tmp/run.log"
echo "example built against the installed weft; outside a job it refuses with the launch hint (exit $code)"
cmake -S "$src/examples/moe_layer" -B "$tmp/moe" -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure-moe.log"
cmake --build "$tmp/moe" >"$tmp/build-moe.log"
test -x "$tmp/moe/moe_layer"
set +e
"$tmp/moe/moe_layer" "$src/configs/examples/moe_small_4gpu.yaml" >"$tmp/run-moe.log" 2>&1
code=$?
set -e
[ "$code" -ne 0 ] && grep -q "not started in a job" "$tmp/run-moe.log"
echo "moe_layer built against the installed weft; outside a job it refuses with the launch hint (exit $code)"
