#!/usr/bin/env bash
# The README's quick start: install everything, build, compile a Llama-style and a GPT-2-style
# block with @magi_compile and compare them with eager PyTorch (error and time).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
bash scripts/build.sh
python examples/quickstart.py
