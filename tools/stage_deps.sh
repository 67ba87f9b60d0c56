#!/usr/bin/env bash
# Usage: bash tools/stage_deps.sh   (on the development machine, before a GPU run)
# Stages what the GPU machine lacks (spdlog and fmt headers) into .deps/ (git-ignored), to be
# carried along with the working tree to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/include
cp -r /usr/include/spdlog /usr/include/fmt .deps/include/
du -sh .deps
