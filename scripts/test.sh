#!/usr/bin/env bash
# Builds cabm (release preset, warnings in cabm's code as errors) and runs every test with
# ctest. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release -DCABM_WERROR=ON >/dev/null
cmake --build --preset release -j "$(nproc)"
ctest --preset release -j "$(nproc)"
