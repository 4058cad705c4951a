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
# CHECK_EMULATOR runs every executable under an emulator instead, e.g. "qemu-x86_64 -cpu Haswell"
# (scripts/emulated_cpu_check.sh): the tests, on the CPU the emulator models, CHECK_JOBS at a time
# (default: the cores here) with CHECK_TEST_SECONDS each (default 600; 5400 emulated), then two
# training steps of the CLI in fp32 and bf16 (cli.log); the measurements are skipped (an
# emulator's timings say nothing about a CPU).
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
read -r -a emulator <<<"${CHECK_EMULATOR:-}"
loader=("${emulator[@]}" "$work/lib/ld-linux-x86-64.so.2" --library-path "$work/lib")
# cabm sets GOMP_SPINCOUNT (and OPENBLAS_CORETYPE where OpenBLAS does not know the CPU) and
# executes /proc/self/exe again; started through the loader, /proc/self/exe is the loader and cabm
# does not. Set the spin count here (cabm's value); OpenBLAS keeps the kernels it chooses.
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}
# The run's own wisdom file (GEMM routes, machine values): the check measures this machine afresh
# and leaves the machine's file alone (under an emulator, whose timings must not land in it).
export CABM_GEMM_WISDOM="$work/wisdom.tsv"
"${loader[@]}" "$work/bin/cabm" --version >/dev/null || { echo "the bundled loader cannot run cabm here"; exit 1; }

{
  echo "bundle commit: $(cat "$work/commit")"
  date -u
  uname -srm
  [ ${#emulator[@]} -eq 0 ] || echo "EMULATED: every executable ran under '${emulator[*]}'; lscpu below is the host's"
  lscpu
  echo "ISA flags cabm chooses by: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
    grep -E '^(avx2|fma|avx512f|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')"
} >"$results/cpu.txt" 2>&1
grep -E "^EMULATED|Model name|ISA flags" "$results/cpu.txt"

# Two threads on two distinct cores (issue 12's measurements are for two threads).
cpus=$(lscpu -p=CPU,CORE 2>/dev/null | grep -v '^#' | awk -F, '!seen[$2]++ {print $1}' | head -2 | paste -sd, -)
pin=()
pin1=()
if [ -n "$cpus" ] && taskset -c "$cpus" true 2>/dev/null; then pin=(taskset -c "$cpus") pin1=(taskset -c "${cpus%%,*}"); fi
echo "benchmarks on cpus ${cpus:-any} (${pin[*]:-not pinned})"

# 2. Tests: each executable chooses its own thread counts (1 and 2). Natively all at once; under an
# emulator (tens of times slower) CHECK_JOBS at a time, so that a timeout measures one test and not
# the crowd it shares the cores with.
mkdir -p "$work/tests"
# test_attention_random draws 500 cases natively (60 in CI; about 30 s on a Zen 4 core pair): the
# paths only this CPU has (AMX tiles, its caches) then see every option combined at random sizes.
if [ ${#emulator[@]} -eq 0 ]; then jobs_max=${CHECK_JOBS:-1000} test_seconds=${CHECK_TEST_SECONDS:-600}
  export CABM_RANDOM_CASES=${CABM_RANDOM_CASES:-500}
else jobs_max=${CHECK_JOBS:-$(nproc)} test_seconds=${CHECK_TEST_SECONDS:-5400}; fi
for t in "$work"/bin/test_*; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  name=$(basename "$t")
  (
    timeout "$test_seconds" "${loader[@]}" "$t" >"$work/tests/$name.log" 2>&1
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

if [ ${#emulator[@]} -gt 0 ]; then
  # The CLI end to end instead (the tests leave it out): two training steps, fp32 and bf16, on a
  # text made here; cli.log keeps their output.
  yes "cabm checks its kernels on a CPU it was not built on, one step at a time." | head -c 100000 >"$work/text.txt"
  for precision in fp32 bf16; do
    echo "== cabm train --precision $precision"
    timeout "$test_seconds" "${loader[@]}" "$work/bin/cabm" train --data "$work/text.txt" --precision "$precision" \
      --steps 2 --eval-interval 0 --eval-windows 4 --sample-tokens 0 --threads 2 --out "$work/run_$precision" 2>&1 |
      grep -v "^qemu-x86_64: warning"
    echo "== exit ${PIPESTATUS[0]}"
  done >"$results/cli.log"
  grep -E "^== |validation loss" "$results/cli.log"
  echo "skipped (emulated CPU, timings mean nothing there): the measurements" | tee -a "$results/skipped.log"
  echo "done at $(elapsed) s; results in $results"
  exit 0
fi

# 3. Measurements, two threads.
export OMP_NUM_THREADS=2 CABM_NUM_THREADS=2
cabm=("${pin[@]}" "${loader[@]}" "$work/bin/cabm")
time_left "bench attention" &&
  timeout 300 "${cabm[@]}" bench attention --n 4096 --d 64 128 --masks none causal --backward --precision both \
    --repeats 3 --threads 2 >"$results/bench_attention.log" 2>&1
time_left "bench_gemm_libraries" &&
  timeout 200 "${pin[@]}" "${loader[@]}" "$work/bin/bench_gemm_libraries" \
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
