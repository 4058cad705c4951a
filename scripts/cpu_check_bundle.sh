#!/usr/bin/env bash
# Packs a portable cabm build (-DCABM_NATIVE=OFF: every ISA variant chosen at run time) with the
# shared libraries it runs on, the dynamic loader included, into one folder that runs on any
# x86-64 Linux machine with nothing installed: the instruction-set checks of issue 12 on a CPU
# that the build machine does not have (AMX, AVX512_BF16, AVX2 only), without building there.
#   scripts/cpu_check_bundle.sh [BUILD_DIR [OUT_DIR]]   (defaults build/portable, out/cpu_check)
# BUILD_DIR is configured when it has no build yet, then brought up to date (an incremental build:
# a bundle of stale executables would test other code than the commit it names). OUT_DIR receives
# bundle.tar.gz and run.sh (scripts/cpu_check_run.sh); on the other machine:
#   bash OUT_DIR/run.sh [RESULTS_DIR]
# The bundle holds the test executables that need neither the build tree nor Python (all but
# test_cli_*, test_hf_* and test_parity_*), the cabm CLI, bench_gemm_libraries, bench_amx_tile and
# bench_fp32_ceiling.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/portable}
out=${2:-out/cpu_check}

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCABM_NATIVE=OFF >/dev/null
fi
if ! grep -q '^CABM_NATIVE:BOOL=OFF' "$build/CMakeCache.txt"; then
  echo "cpu_check_bundle: $build is not a portable build (configure it with -DCABM_NATIVE=OFF)" >&2
  exit 2
fi
cmake --build "$build" -j "$(nproc)" >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
binaries=("$build/cabm" "$build/bench/bench_gemm_libraries" "$build/bench/bench_amx_tile" "$build/bench/bench_fp32_ceiling")
for t in "$build"/tests/test_*; do
  case $(basename "$t") in
    test_cli_* | test_hf_* | test_parity_*) ;;
    *) [ -x "$t" ] && [ -f "$t" ] && binaries+=("$t") ;;
  esac
done
cp "${binaries[@]}" "$stage/bin/"
strip "$stage"/bin/*
# Every library the executables load, and the loader itself: run.sh starts each executable
# through this loader, so the other machine's C library (any version) is never used.
ldd "${binaries[@]}" | grep -o '/[^ ]*\.so[^ ]*' | sort -u | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
[ -e "$stage/lib/ld-linux-x86-64.so.2" ] || { echo "cpu_check_bundle: no ld-linux-x86-64.so.2 found" >&2; exit 1; }
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes')" >"$stage/commit"

mkdir -p "$out"
tar czf "$out/bundle.tar.gz.tmp" -C "$stage" bin lib commit
mv "$out/bundle.tar.gz.tmp" "$out/bundle.tar.gz"
cp scripts/cpu_check_run.sh "$out/run.sh"
echo "cpu_check_bundle: $out/bundle.tar.gz ($(du -h "$out/bundle.tar.gz" | cut -f1), ${#binaries[@]} executables), $out/run.sh"
