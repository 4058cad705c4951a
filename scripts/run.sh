#!/usr/bin/env bash
# Installs what is missing, builds cabm, and runs the main job: `cabm train` on the built-in
# default (a character-level language model on Debian's fortunes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-venv
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target cabm
exec ./build/release/cabm train "$@"
