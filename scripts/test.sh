#!/usr/bin/env bash
# Builds cabm (release preset, warnings in cabm's code as errors) and runs every test with
# ctest; then builds the suite again with AddressSanitizer + UBSan (asan preset) and runs it
# there too (issue 16: memory errors and undefined behaviour that pass unnoticed in a release
# build). The asan build is also the portable one (-DCABM_NATIVE=OFF, issue 12): its tests run
# the variants chosen at run time from CPUID with the rest of the library compiled for baseline
# x86-64, where the release build compiles that rest for this machine's CPU. Then it builds the
# libFuzzer targets (fuzz preset, clang 14) and runs every one of them for a bounded time, two
# at a time, from a corpus written fresh from the seeds
# (scripts/fuzz.sh with FUZZ_OUT=build/fuzz/ci): a crash, sanitizer report, leak, out-of-memory
# or timeout fails the command. The fuzz pass also proves that scripts/setup.sh installs what
# the fuzz build needs. This is the README's test command and what CI runs.
#   CABM_SKIP_SANITIZERS=1  skips the asan pass, CABM_SKIP_FUZZ=1 the fuzz pass (quicker local
#                           runs; CI runs both)
#   CABM_FUZZ_SECONDS=N     seconds per fuzz target (default 30)
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
if [ "${CABM_SKIP_FUZZ:-0}" != "1" ]; then
  # A fresh corpus and no crashes kept from an earlier run: the result depends on this tree only.
  rm -rf build/fuzz/ci
  FUZZ_OUT=build/fuzz/ci FUZZ_JOBS=2 bash scripts/fuzz.sh "${CABM_FUZZ_SECONDS:-30}"
  # What the fuzz build used is installed by setup.sh's list, and each of the three packages
  # that the list holds for it is needed (the check fails without it).
  check=(python3 scripts/check_setup_packages.py --build-dir build/fuzz)
  "${check[@]}"
  out=$(sh tests/setup/expect_missing.sh clang-14 libclang-rt-14-dev libomp-14-dev -- "${check[@]}" 2>&1) ||
    { printf '%s\n' "$out"; exit 1; }
fi
