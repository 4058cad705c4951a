#!/usr/bin/env bash
# Builds cabm (release preset, warnings in cabm's code as errors) and runs every test with
# ctest; then builds the suite again with AddressSanitizer + UBSan (asan preset) and runs it
# there too (issue 16: memory errors and undefined behaviour that pass unnoticed in a release
# build). This is the README's test command and what CI runs. CABM_SKIP_SANITIZERS=1 skips the
# second pass (a quicker local run; CI always runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release -DCABM_WERROR=ON >/dev/null
cmake --build --preset release -j "$(nproc)"
ctest --preset release -j "$(nproc)"
if [ "${CABM_SKIP_SANITIZERS:-0}" != "1" ]; then
  cmake --preset asan >/dev/null  # no -Werror: GCC 12 warns falsely inside libstdc++ under -fsanitize
  cmake --build --preset asan -j "$(nproc)"
  ctest --preset asan -j "$(nproc)"
fi
