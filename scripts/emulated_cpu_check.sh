#!/usr/bin/env bash
# Runs the portable build's tests on CPUs that this machine is not, under QEMU's user-mode
# emulator: issue 12's "a binary built on one CPU runs correctly on another" checked here for the
# CPUs QEMU models without AVX-512 (its translator has AVX2 and FMA but no AVX-512), where the
# AVX2 or portable variants are chosen from CPUID itself and not by an override, and where any
# instruction that the CPU lacks (an AVX-512 instruction outside its dispatch) is SIGILL.
#   scripts/emulated_cpu_check.sh [BUILD_DIR [OUT_DIR [CPU...]]]
# Defaults: build/portable (configured -DCABM_NATIVE=OFF if new), out/emulated_cpu_check, and the
# CPUs Haswell (Intel, AVX2 + FMA), EPYC-Milan (AMD Zen 3, AVX2 + FMA: AMD's CPUID leaves, the
# vendor OpenBLAS and oneDNN look at) and Nehalem (SSE4.2 only: the portable set). The bundle of
# scripts/cpu_check_bundle.sh runs under `qemu-x86_64 -cpu CPU` (scripts/cpu_check_run.sh with
# CHECK_EMULATOR; tests only); OUT_DIR/CPU/tests.log says what passed, what skipped and why.
# About 25-40 times slower than native: on 2 cores roughly half an hour per CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/portable}
out=${2:-out/emulated_cpu_check}
shift $(($# < 2 ? $# : 2))
cpus=("$@")
[ ${#cpus[@]} -gt 0 ] || cpus=(Haswell EPYC-Milan Nehalem)

if ! command -v qemu-x86_64 >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user >/dev/null ||
      { echo "emulated_cpu_check: apt-get install qemu-user failed" >&2; exit 2; }
  else
    echo "emulated_cpu_check: needs qemu-x86_64 (Debian: apt-get install qemu-user)" >&2
    exit 2
  fi
fi
models=$(qemu-x86_64 -cpu help || true)  # it exits 1 after the list
for cpu in "${cpus[@]}"; do
  grep -q -E "^x86 +$cpu( |$)" <<<"$models" ||
    { echo "emulated_cpu_check: qemu-x86_64 models no CPU named '$cpu' (qemu-x86_64 -cpu help)" >&2; exit 2; }
done

# The sweeps over every float in a range (GeluFastAccuracyOverAllFloats: 10^8 evaluations, 14 s
# here, hours under the emulator) test arithmetic that the native runs test, not the dispatch.
export GTEST_FILTER=${GTEST_FILTER:--*OverAllFloats}
bash scripts/cpu_check_bundle.sh "$build" "$out/bundle"
# Every function, and not only the paths the tests run, before hours of emulation: no AVX or
# AVX-512 code outside the dispatched variants (the bundle's copies are stripped: the build's).
python3 scripts/isa_scan.py "$build/cabm" "$build"/tests/test_*
for cpu in "${cpus[@]}"; do
  echo "== $cpu"
  CHECK_EMULATOR="qemu-x86_64 -cpu $cpu" bash "$out/bundle/run.sh" "$out/$cpu"
  sed -n '/^-- skipped/,$p' "$out/$cpu/tests.log"
done
