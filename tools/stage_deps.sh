#!/usr/bin/env bash
# Stages what the GPU machine lacks (spdlog and fmt headers) into .deps/ (git-ignored), to be
# carried with the device call: `carry: [".deps"]`.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deps/include
cp -r /usr/include/spdlog /usr/include/fmt .deps/include/
du -sh .deps
