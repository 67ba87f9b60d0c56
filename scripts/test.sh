#!/usr/bin/env bash
# The README's test command: install everything, build with the C++ tests, run GoogleTest,
# pytest (GPU tests skip without a GPU) and the linters.
#
#   bash scripts/test.sh             what CI runs: every test but the slow tier
#   bash scripts/test.sh --all       the slow tier too (pytest's `slow` marker: long sweeps,
#                                    benchmark and example scripts run in child processes)
#   bash scripts/test.sh --sanitize  the C++ tests built with AddressSanitizer and
#                                    UndefinedBehaviorSanitizer in build/sanitize, and run
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
case "$mode" in
  "" | --all | --sanitize) ;;
  *)
    echo "usage: bash scripts/test.sh [--all | --sanitize]"
    exit 2
    ;;
esac
source scripts/setup_env.sh

if [[ "$mode" == "--sanitize" ]]; then
  echo "[test] GoogleTest (tests/cpp) with ASan and UBSan, built in build/sanitize"
  # No vptr check: it needs the typeinfo of LibTorch's classes, which LibTorch does not export.
  sanitizers="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined"
  cmake -S . -B build/sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMAGI_BUILD_TESTS=ON -DMAGI_BUILD_PYTHON=OFF -DPython3_EXECUTABLE="$(command -v python)" \
    -DCMAKE_CXX_FLAGS="$sanitizers -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$sanitizers" >/dev/null
  cmake --build build/sanitize --target magi_cpp_tests
  # LibTorch is not instrumented, and what it allocates for the life of the process is not a
  # leak of ours: leak checking is off, every other error stops the run.
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=0" UBSAN_OPTIONS="print_stacktrace=1" \
    MAGI_LOGGING_LEVEL=off build/sanitize/tests/cpp/magi_cpp_tests --gtest_brief=1
  echo "[test] sanitizers clean"
  exit 0
fi

echo "[test] lint"
# Errors of the C++ core are magi's classes (magi/common/error.h), which the bindings map to
# Python exceptions; a bare std::runtime_error would reach Python as a plain RuntimeError.
if grep -rn "throw std::runtime_error" src include; then
  echo "[test] throw std::runtime_error in the C++ core: use MAGI_CHECK, MAGI_ASSERT,"
  echo "       MAGI_UNSUPPORTED or an error class of include/magi/common/error.h"
  exit 1
fi
ruff check python tests examples benchmarks scripts tools
ruff format --check python tests examples benchmarks scripts tools

bash scripts/build.sh --config-settings=cmake.define.MAGI_BUILD_TESTS=ON

echo "[test] GoogleTest (tests/cpp)"
cpp_tests="$(find build -path '*tests/cpp/magi_cpp_tests' -not -path 'build/sanitize/*' -type f | head -n1)"
[[ -x "$cpp_tests" ]] || { echo "[test] magi_cpp_tests was not built"; exit 1; }
# Tests that provoke internal errors on purpose would log them; keep the output readable.
MAGI_LOGGING_LEVEL=off "$cpp_tests" --gtest_brief=1

echo "[test] pytest (tests/python, tests/gpu)"
# A worker per core, at most four (each imports torch): the tests are single-threaded
# (tests/python/conftest.py), so two workers on a 2-core machine take about half the time.
# Tests marked `serial` time themselves and run alone afterwards.
workers=$(nproc)
((workers > 4)) && workers=4
tier="not slow and "
[[ "$mode" == "--all" ]] && tier=""
python -m pytest tests/python tests/gpu -q -ra --durations=10 -n "$workers" -m "${tier}not serial"
python -m pytest tests/python tests/gpu -q -ra -m "${tier}serial"
echo "[test] all green"
