# Usage: source tools/gpu_env.sh   (from the other tools; sets up a shell on the GPU machine)
# Moves to the repository root and sets what every run on the GPU machine shares. $OUT (default
# /tmp/magi_out) receives logs and JSON. The copy of the checkout there may carry older git
# metadata than its files: pass MAGI_GIT_COMMIT=<this commit> so results name the right one.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/magi_out}"
mkdir -p "$OUT"
# The GPU machine's default CXX wraps g++ with a static libstdc++; an extension built that way
# carries a second libstdc++ beside torch's, and iostreams crash. Use the system compiler, also
# for generated CPU kernels.
export CC=/usr/bin/gcc CXX=/usr/bin/g++ MAGI_CXX=/usr/bin/g++
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python"
export MAGI_CACHE_DIR="${MAGI_CACHE_DIR:-/tmp/magi_kernel_cache}"
