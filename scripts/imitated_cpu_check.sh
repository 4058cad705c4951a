#!/usr/bin/env bash
# Runs a build's ctest as if on another CPU: the machine facts that choose cabm's paths and tile
# sizes are set to another CPU's, on this one, natively. The tests that compute their expectations
# from those facts must still pass; a test that assumed the build machine's values fails here
# instead of on the other machine (docs/cpu_check.md, "Other CPUs' facts on this one").
#   scripts/imitated_cpu_check.sh [BUILD_DIR [PROFILE...]]
# BUILD_DIR defaults to build/release, which must be built and must have run ctest once (its wisdom
# files then hold this machine's values). The profiles (default: all six):
#   wide-l1     a 48 KiB L1d and two 512-bit FMA pipes (Zen 5, Intel Xeons): flash.cpp's 64 × 64
#               fp32 tiles on the avx512 set; sysconf(_SC_LEVEL1_DCACHE_SIZE) answers 48 KiB and
#               the wisdom files' avx512_fmas_per_cycle reads 2. Needs AVX-512.
#   fma-bf16    vdpbf16ps no faster than FMAs and no AMX (a Xeon whose VM hides AMX): the bf16
#               products on widened operands (CABM_BF16_PRODUCTS=fp32 CABM_NO_AMX=1).
#   many-cores  16 processors (omp_get_num_procs: the fp32 and bf16 backward's split runs).
#   avx512-no-bf16  AVX-512 without BF16 (Intel's Skylake-SP to Ice Lake server): cabm and oneDNN
#               held to it (CABM_MAX_CPU_ISA=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE); the bf16
#               kernels take their fp32 SIMD path, gemm_bf16 widens for gemm(). Needs AVX-512.
#   avx2-only   AVX2 + FMA without AVX-512 (Zen 3, Intel's desktop cores): cabm, oneDNN and OpenBLAS
#               held to it (CABM_MAX_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell).
#               Needs AVX2. Only the instruction sets: the caches and ports stay this CPU's.
#   no-avx2     SSE4.1 at most (CPUs before Haswell, low-power Atoms, hypervisors' baseline CPU
#               models): cabm's portable kernels, the libraries' SSE kernels (CABM_MAX_CPU_ISA=portable
#               ONEDNN_MAX_CPU_ISA=SSE41 OPENBLAS_CORETYPE=Nehalem).
# Each profile's summary lands in OUT_DIR (default out/imitated_cpu_check)/PROFILE.log. Exit 0
# when every profile passed, 1 when one failed, 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
shift $(($# < 1 ? $# : 1))
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(wide-l1 fma-bf16 many-cores avx512-no-bf16 avx2-only no-avx2)
out=${OUT_DIR:-out/imitated_cpu_check}
[ -f "$build/CTestTestfile.cmake" ] || { echo "imitated_cpu_check: $build is not a configured build" >&2; exit 2; }
wisdom=("$build"/tests/gemm_routes*.tsv)
[ -f "${wisdom[0]}" ] || { echo "imitated_cpu_check: no wisdom file in $build/tests: run ctest once first" >&2; exit 2; }
for p in "${profiles[@]}"; do
  case $p in wide-l1 | fma-bf16 | many-cores | avx512-no-bf16 | avx2-only | no-avx2) ;; *) echo "imitated_cpu_check: unknown profile '$p'" >&2; exit 2 ;; esac
done
flags=$(grep -m1 '^flags' /proc/cpuinfo)

work=$(mktemp -d)
# The wisdom files are put back as they were, whatever happens to the run.
for f in "${wisdom[@]}"; do cp "$f" "$work/$(basename "$f")"; done
restore() {
  for f in "${wisdom[@]}"; do cp "$work/$(basename "$f")" "$f"; done
  rm -rf "$work"
}
trap restore EXIT

# Shared objects that answer for the C library and libgomp (LD_PRELOAD): cabm reads the L1d size
# through sysconf and the processor count through omp_get_num_procs.
cat >"$work/l1d48.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
long sysconf(int name) {
  static long (*real)(int);
  if (name == _SC_LEVEL1_DCACHE_SIZE) return 48 * 1024;
  if (!real) real = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
  return real(name);
}
EOF
echo 'int omp_get_num_procs(void) { return 16; }' >"$work/nprocs16.c"
cc -O2 -shared -fPIC -o "$work/l1d48.so" "$work/l1d48.c" -ldl
cc -O2 -shared -fPIC -o "$work/nprocs16.so" "$work/nprocs16.c"

mkdir -p "$out"
failed=0
for p in "${profiles[@]}"; do
  for f in "${wisdom[@]}"; do cp "$work/$(basename "$f")" "$f"; done
  env=()
  case $p in
    wide-l1)
      if ! grep -qw avx512f <<<"$flags"; then
        echo "== $p: skipped (no AVX-512 on this CPU: the rule chooses nothing)" | tee "$out/$p.log"
        continue
      fi
      if ! grep -q $'value avx512_fmas_per_cycle\t' "${wisdom[@]}"; then
        echo "imitated_cpu_check: no avx512_fmas_per_cycle in $build's wisdom files: run ctest once first" >&2
        exit 2
      fi
      sed -i -E $'s/(value avx512_fmas_per_cycle\t).*$/\\12/' "${wisdom[@]}"
      env=(LD_PRELOAD="$work/l1d48.so")
      ;;
    fma-bf16)
      if ! grep -qw avx512_bf16 <<<"$flags"; then
        echo "== $p: skipped (no AVX512_BF16 on this CPU: the bf16 products widen already)" | tee "$out/$p.log"
        continue
      fi
      env=(CABM_BF16_PRODUCTS=fp32 CABM_NO_AMX=1)
      ;;
    many-cores) env=(LD_PRELOAD="$work/nprocs16.so") ;;
    avx512-no-bf16)
      if ! grep -qw avx512f <<<"$flags"; then
        echo "== $p: skipped (no AVX-512 on this CPU)" | tee "$out/$p.log"
        continue
      fi
      env=(CABM_MAX_CPU_ISA=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE)
      ;;
    avx2-only)
      if ! grep -qw avx2 <<<"$flags"; then
        echo "== $p: skipped (no AVX2 on this CPU)" | tee "$out/$p.log"
        continue
      fi
      env=(CABM_MAX_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell)
      ;;
    no-avx2)
      if ! grep -qw sse4_1 <<<"$flags"; then
        echo "== $p: skipped (no SSE4.1 on this CPU)" | tee "$out/$p.log"
        continue
      fi
      env=(CABM_MAX_CPU_ISA=portable ONEDNN_MAX_CPU_ISA=SSE41 OPENBLAS_CORETYPE=Nehalem)
      ;;
  esac
  echo "== $p: ${env[*]}"
  if env "${env[@]}" ctest --test-dir "$build" -j "$(nproc)" >"$out/$p.full.log" 2>&1; then
    result=passed
  else
    result=FAILED
    failed=1
  fi
  # That the imitation took: what the tests printed of the facts they read.
  log=$build/Testing/Temporary/LastTest.log
  case $p in
    wide-l1) took=("64 x 64 fp32 tiles on avx512") ;;
    fma-bf16) took=("vdpbf16ps not faster than FMAs") ;;
    many-cores) took=("backward split runs: 16") ;;
    avx512-no-bf16) took=("oneDNN multiplies bf16 here: no" "this process runs under CABM_MAX_CPU_ISA=avx512)") ;;
    avx2-only) took=("oneDNN multiplies bf16 here: no" "this process runs under CABM_MAX_CPU_ISA=avx2)") ;;
    no-avx2) took=("oneDNN multiplies bf16 here: no" "this process runs under CABM_MAX_CPU_ISA=portable)") ;;
  esac
  for line in "${took[@]}"; do
    grep -a -q "$line" "$log" && continue
    result="FAILED (the tests did not print '$line': the imitation did not take)"
    failed=1
  done
  { echo "== $p ($result): ${env[*]}"; grep -a -E "tests passed|\*\*\*|Failed  " "$out/$p.full.log"; } >"$out/$p.log"
  cat "$out/$p.log"
done
exit $failed
