#!/usr/bin/env bash
# bench/moe/moe_bound.py: the bound of each shape is max(faster FFN, faster exchange), the goals
# are judged per row, and a missing table fails. Two made-up tables whose answers are worked out
# by hand below.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/weft.md" <<'MD'
# weft
| shape | T/rank | weft layer ms | graph ms | route | dispatch | arrange (+wait) | grouped FFN | combine (+wait) |
|---|---|---|---|---|---|---|---|---|
| A | 4096 | 4.400 | 4.300 | 0.100 | 0.200 | 0.100 | 4.200 | 0.300 |
| B | 4096 | 2.000 | 2.000 | 0.100 | 0.200 | 0.100 | 0.500 | 0.300 |
| C | 256 | 0.300 | 0.300 | 0.050 | 0.020 | 0.030 | 0.150 | 0.050 |
MD
cat >"$dir/seq.md" <<'MD'
# PyTorch
| shape | T/rank | experts | route ms | dispatch ms | experts ms | combine ms | layer ms | NCCL a2a-v alone ms |
|---|---|---|---|---|---|---|---|---|
| A | 4096 | x | 0.1 | 1.5 | 4.000 | 1.0 | 7.000 | 0.900 |
| B | 4096 | x | 0.1 | 1.5 | 0.600 | 1.0 | 3.000 | 0.400 |
| C | 256 | x | 0.1 | 0.2 | 0.200 | 0.2 | 0.250 | 0.100 |
MD
out=$(python3 "$ROOT/bench/moe/moe_bound.py" "$dir/weft.md" "$dir/seq.md")
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
# A: compute min(4.2, 4.0) = 4.0 (PyTorch); exchange min(0.9 NCCL, 0.6 weft) = 0.6; bound 4.0;
#    4.4 / 4.0 = 1.10x (met), speed-up 7 / 4.4 = 1.59 >= 0.8 x 1.75 = 1.40: met.
grep -q "^| A | 4096 | 4.400 | 7.000 | 4.000 (PyTorch) | 0.600 (weft) | 4.000 | 1.10x | 1.75x | 1.59x | met" <<<"$out" || fail "row A"
# B: compute 0.5 (weft), exchange min(0.4 NCCL, 0.6) = 0.4; bound 0.5; 2.0 / 0.5 = 4x: not met.
grep -q "^| B | 4096 | 2.000 | 3.000 | 0.500 (weft) | 0.400 (NCCL) | 0.500 | 4.00x | 6.00x | 1.50x | not met" <<<"$out" || fail "row B"
# C (decode): 0.300 ms against the sequential 0.250: slower, not met.
grep -q "^| C | 256 | .* | not met (no slower than sequential) |" <<<"$out" || fail "row C"
# A missing table is an error (exit 2), not an empty table.
set +e
python3 "$ROOT/bench/moe/moe_bound.py" "$dir/weft.md" "$dir/none.md" >/dev/null 2>&1
rc=$?
set -e
[ "$rc" = 2 ] || fail "a missing table exited $rc"
echo "moe_bound: 3 rows and the missing-table refusal as worked out"
