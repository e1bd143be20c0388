#!/usr/bin/env bash
# The source layers (docs/runtime.md, "The public API"): base/ below everything and including only itself; nothing in bootstrap/,
# topology/, kernels/, transport/ or runtime/ includes launcher/ (the launcher is built on them, never
# the other way round). Fails naming each offending line.
# Usage: layering.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: layering.sh SOURCE_DIR}
cd "$src" || exit 1
bad=0
if out=$(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' '#include "' base |
  grep -v '#include "base/'); then
  echo "base/ includes something above it:"
  echo "$out"
  bad=1
fi
for d in bootstrap topology kernels transport runtime; do
  if out=$(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' '#include "launcher/' "$d"); then
    echo "$d/ includes launcher/:"
    echo "$out"
    bad=1
  fi
done
[ $bad = 0 ] && echo "layering: base/ includes only base/; no library layer includes launcher/"
exit $bad
