#!/usr/bin/env bash
# Installs what magi-compiler needs on a Debian machine and activates its virtual environment.
# Sourced by scripts/quickstart.sh and scripts/test.sh; safe to run again (reuses what exists).
#
#   MAGI_VENV     where the virtual environment lives (default ~/.cache/magi-compiler/venv)
#   MAGI_TORCH    the torch requirement (default torch==2.11.0)
set -euo pipefail

MAGI_VENV="${MAGI_VENV:-$HOME/.cache/magi-compiler/venv}"
MAGI_TORCH="${MAGI_TORCH:-torch==2.11.0}"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# 1. Debian packages: compiler, build tools, spdlog/fmt headers, GoogleTest, ccache; Graphviz
#    (dumps render graphs to SVG) and Chromium (the dump index page's screenshot test).
apt_packages=(g++ cmake ninja-build ccache libspdlog-dev libfmt-dev libgtest-dev python3-venv
  graphviz chromium)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  say "Debian packages present"
fi

# 2. Python virtual environment with torch and the build/test tools.
if [[ ! -x "$MAGI_VENV/bin/python" ]]; then
  say "creating virtual environment $MAGI_VENV"
  python3 -m venv "$MAGI_VENV"
fi
# shellcheck disable=SC1091
source "$MAGI_VENV/bin/activate"
want_torch="${MAGI_TORCH#torch==}"
have_torch="$(python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [[ "$have_torch" != "$want_torch" ]]; then
  say "installing $MAGI_TORCH (a CUDA build of several GB; pip's cache serves reinstalls)"
  python -m pip install -q --upgrade pip
  python -m pip install -q "$MAGI_TORCH"
fi
# pillow: the index page test reads its screenshot; transformers: the model zoo (tests/python/test_zoo.py);
# pytest-xdist: scripts/test.sh runs the tests on every core.
python -m pip install -q numpy pytest pytest-xdist "scikit-build-core>=0.10" ninja ruff pillow \
  "transformers==5.17.0"
say "python $(python --version 2>&1 | cut -d' ' -f2), torch $(python -c 'import torch; print(torch.__version__)')"

# 3. ccache: keep its cache across clones and let it cache precompiled-header builds.
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Paths under the checkout are hashed relative to it, so a fresh clone elsewhere hits the cache.
CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export CCACHE_BASEDIR
