#!/usr/bin/env bash
# Builds and installs magi-compiler into the active environment (editable: Python edits take
# effect at once; rerun after C++ edits, which rebuilds only what changed). Extra arguments
# are passed to pip, e.g. --config-settings=cmake.define.MAGI_BUILD_TESTS=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "[build] building the C++ core and magi_compiler._C (progress below)"
start=$(date +%s)
log="$(mktemp)"
set +e
python -m pip install --no-build-isolation --no-deps -e . \
  --config-settings=build.verbose=true "$@" 2>&1 | tee "$log" |
  grep --line-buffered -E '^\[[0-9]+/[0-9]+\]|error:|Successfully installed'
status=${PIPESTATUS[0]}
set -e
if [[ $status -ne 0 ]]; then
  echo "[build] pip install failed (exit $status); the last 60 lines of its output:"
  tail -n 60 "$log"
  exit "$status"
fi
python -c "import magi_compiler._C" || { echo "[build] import of magi_compiler._C failed"; exit 1; }
echo "[build] done in $(( $(date +%s) - start )) s"
