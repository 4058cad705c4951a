#!/usr/bin/env bash
# Runs the checks of a bundle made by scripts/cpu_check_bundle.sh, on the machine at hand:
#   bash run.sh [RESULTS_DIR]        (default: ./cpu_check_results; also $OUT where that is set)
# 1. the CPU (lscpu, the ISA flags that choose cabm's paths);
# 2. every bundled test executable, in parallel, against the reference kernels on every path
#    this CPU has: tests.log (one line per executable, the skipped tests with their reasons, the
#    failures) and tests_full.log.gz;
# 3. issue 12's measurements on two cores (two threads): bench_attention.log (`cabm bench
#    attention --n 4096 --d 64 128 --masks none causal --backward --precision both`),
#    bench_gemm.log (bench_gemm_libraries: gemm() against oneDNN and OpenBLAS), bench_train.log
#    (`cabm bench train`, the big preset), bench_no_amx.log (where the CPU has AMX, the vdpbf16ps
#    kernels: CABM_NO_AMX=1 CABM_BF16_PRODUCTS=vdpbf16ps), bench_amx_tile.log (one AMX forward
#    tile taken apart, one core),
#    bench_decode.log (`cabm bench decode`, KV-cache decoding at M 16384 and 65536) and
#    bench_fp32_ceiling.log (the fp32 micro-kernel and oneDNN's sgemm against the FMA loop, one core).
# CHECK_SECONDS (default 480) bounds the whole run: a step that would start after it is skipped,
# and says so.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${1:-${OUT:-$PWD/cpu_check_results}}
budget=${CHECK_SECONDS:-480}
mkdir -p "$results"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
time_left() {
  if [ "$(elapsed)" -ge "$budget" ]; then echo "skipped (CHECK_SECONDS $budget spent): $1" | tee -a "$results/skipped.log"; return 1; fi
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar xzf "$here/bundle.tar.gz" -C "$work" || { echo "cannot unpack $here/bundle.tar.gz"; exit 1; }
loader=("$work/lib/ld-linux-x86-64.so.2" --library-path "$work/lib")
# cabm sets GOMP_SPINCOUNT and executes /proc/self/exe again when neither it nor OMP_WAIT_POLICY
# is set; started through the loader, /proc/self/exe is the loader. Set it here (cabm's value).
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}
"${loader[@]}" "$work/bin/cabm" --version >/dev/null || { echo "the bundled loader cannot run cabm here"; exit 1; }

{
  echo "bundle commit: $(cat "$work/commit")"
  date -u
  uname -srm
  lscpu
  echo "ISA flags cabm chooses by: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
    grep -E '^(avx2|fma|avx512f|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
} >"$results/cpu.txt" 2>&1
grep -E "Model name|ISA flags" "$results/cpu.txt"

# Two threads on two distinct cores (issue 12's measurements are for two threads).
cpus=$(lscpu -p=CPU,CORE 2>/dev/null | grep -v '^#' | awk -F, '!seen[$2]++ {print $1}' | head -2 | paste -sd, -)
pin=()
pin1=()
if [ -n "$cpus" ] && taskset -c "$cpus" true 2>/dev/null; then pin=(taskset -c "$cpus") pin1=(taskset -c "${cpus%%,*}"); fi
echo "benchmarks on cpus ${cpus:-any} (${pin[*]:-not pinned})"

# 2. Tests: each executable chooses its own thread counts (1 and 2).
mkdir -p "$work/tests"
for t in "$work"/bin/test_*; do
  name=$(basename "$t")
  (
    timeout 600 "${loader[@]}" "$t" >"$work/tests/$name.log" 2>&1
    echo "== $name exit $?" >>"$work/tests/$name.log"
  ) &
done
wait
{
  for f in "$work"/tests/*.log; do tail -n 1 "$f"; done
  echo "-- skipped, with reasons"
  grep -h -A1 -E ": Skipped$" "$work"/tests/*.log | grep -v -E ": Skipped$|^--$" | sort | uniq -c
  echo "-- failures"
  grep -h -E "^\[  FAILED  \]" "$work"/tests/*.log | sort -u
} >"$results/tests.log"
cat "$work"/tests/*.log | gzip >"$results/tests_full.log.gz"
echo "tests done at $(elapsed) s: $(grep -c -E 'exit 0$' "$results/tests.log") of $(ls "$work"/bin/test_* | wc -l) executables passed"

# 3. Measurements, two threads.
export OMP_NUM_THREADS=2 CABM_NUM_THREADS=2
cabm=("${pin[@]}" "${loader[@]}" "$work/bin/cabm")
time_left "bench attention" &&
  timeout 300 "${cabm[@]}" bench attention --n 4096 --d 64 128 --masks none causal --backward --precision both \
    --repeats 3 --threads 2 >"$results/bench_attention.log" 2>&1
time_left "bench_gemm_libraries" &&
  CABM_GEMM_WISDOM="$work/wisdom.tsv" timeout 200 "${pin[@]}" "${loader[@]}" "$work/bin/bench_gemm_libraries" \
    >"$results/bench_gemm.log" 2>&1
time_left "bench train" &&
  timeout 200 "${cabm[@]}" bench train --layers 6 --d-model 256 --heads 8 --d-ff 1024 --seq-len 128 \
    --batch-size 32 --steps 4 --threads 2 >"$results/bench_train.log" 2>&1
if grep -q -w amx_bf16 "$results/cpu.txt"; then
  time_left "bench_amx_tile" &&
    timeout 120 "${pin1[@]}" "${loader[@]}" "$work/bin/bench_amx_tile" >"$results/bench_amx_tile.log" 2>&1
  time_left "bench attention with CABM_NO_AMX=1" &&
    CABM_NO_AMX=1 CABM_BF16_PRODUCTS=vdpbf16ps timeout 120 "${cabm[@]}" bench attention --n 4096 --d 64 128 --masks none --precision bf16 \
      --repeats 2 --threads 2 >"$results/bench_no_amx.log" 2>&1
fi
time_left "bench decode" &&
  timeout 120 "${cabm[@]}" bench decode --m 16384 65536 --repeats 5 --threads 2 >"$results/bench_decode.log" 2>&1
time_left "bench_fp32_ceiling" &&
  timeout 60 "${pin1[@]}" "${loader[@]}" "$work/bin/bench_fp32_ceiling" >"$results/bench_fp32_ceiling.log" 2>&1
echo "done at $(elapsed) s; results in $results"
