#!/usr/bin/env bash
# Checks that every tracked C++/CUDA source is formatted by .clang-format (Google base, 120 columns).
# Exit 0: all formatted; 1: the files that are not, and how to fix them; 77 (skipped, with the reason):
# no clang-format 14 (the version the tree is formatted with: Debian 12's) or not a git checkout.
# Usage: scripts/check-format.sh [--fix]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
want=14
if ! command -v clang-format >/dev/null; then
  echo "SKIP: clang-format is not installed (scripts/weft deps installs it)"
  exit 77
fi
version=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$version" != "$want" ]; then
  echo "SKIP: clang-format $version here; the tree is formatted with clang-format $want and other versions differ"
  exit 77
fi
if ! files=$(git -C "$root" ls-files '*.cpp' '*.h' '*.cu' '*.cuh' 2>/dev/null) || [ -z "$files" ]; then
  echo "SKIP: $root is not a git checkout: no list of tracked sources"
  exit 77
fi
cd "$root"
if [ "${1:-}" = --fix ]; then
  xargs clang-format -i <<<"$files"
  exit 0
fi
bad=()
for f in $files; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "not formatted (${#bad[@]}): ${bad[*]}"
  echo "fix with: scripts/check-format.sh --fix"
  exit 1
fi
echo "all $(wc -w <<<"$files") sources formatted (clang-format $version)"
