#!/usr/bin/env bash
# The README's test command: install everything, build with the C++ tests, run GoogleTest,
# pytest (GPU tests skip without a GPU) and the linters.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
bash scripts/build.sh --config-settings=cmake.define.MAGI_BUILD_TESTS=ON

echo "[test] GoogleTest (tests/cpp)"
cpp_tests="$(find build -path '*tests/cpp/magi_cpp_tests' -type f | head -n1)"
[[ -x "$cpp_tests" ]] || { echo "[test] magi_cpp_tests was not built"; exit 1; }
# Tests that provoke internal errors on purpose would log them; keep the output readable.
MAGI_LOGGING_LEVEL=off "$cpp_tests" --gtest_brief=1

echo "[test] pytest (tests/python, tests/gpu)"
python -m pytest tests/python tests/gpu -q -ra --durations=5

echo "[test] lint"
# Errors of the C++ core are magi's classes (magi/common/error.h), which the bindings map to
# Python exceptions; a bare std::runtime_error would reach Python as a plain RuntimeError.
if grep -rn "throw std::runtime_error" src include; then
  echo "[test] throw std::runtime_error in the C++ core: use MAGI_CHECK, MAGI_ASSERT,"
  echo "       MAGI_UNSUPPORTED or an error class of include/magi/common/error.h"
  exit 1
fi

echo "[test] ruff"
ruff check python tests examples benchmarks scripts tools
ruff format --check python tests examples benchmarks scripts tools
echo "[test] all green"
