#!/usr/bin/env bash
# Fuzzes cabm's parsers of untrusted input with libFuzzer (tests/fuzz/): configures and builds
# the fuzz preset (clang 14, ASan + UBSan, build/fuzz), writes seed corpora into
# $FUZZ_OUT/corpus/<target>, runs each target with its dictionary for SECONDS_PER_TARGET
# (default 60), keeps crashing inputs in $FUZZ_OUT/crashes/<target>/ and prints, per target,
# the executions, coverage (cov/ft of libFuzzer's last line), crashes and status. Exits 1 if any
# target failed: a crash, sanitizer report, leak, out-of-memory or timeout (an input kept in
# crashes/, including one kept by an earlier run into the same FUZZ_OUT), or a fuzzer that
# exited non-zero, printed no statistics or ran past its time.
#   scripts/fuzz.sh                         # every target, 60 s each
#   scripts/fuzz.sh 300 forward safetensors # those two, 5 minutes each
# Reproduce a crash: build/fuzz/tests/fuzz/fuzz_<target> build/fuzz/crashes/<target>/crash-…
# FUZZ_OUT (default build/fuzz) holds corpus/, crashes/ and logs/; the corpus grows there from
# run to run (scripts/test.sh uses a fresh build/fuzz/ci). Targets run one after another;
# FUZZ_JOBS=2 runs two at a time. FUZZ_BUILD_JOBS sets the build's parallelism (default: nproc).
# Each fuzzer runs with OMP_NUM_THREADS=1 unless it is set.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(safetensors state_json model_metadata forward text_data hf_tokenizer hf_config attention_file word_lists
  adamw_state checkpoint_dir)
seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]  (targets: ${ALL_TARGETS[*]})" >&2
  exit 2
fi
shift $(($# > 0 ? 1 : 0))
targets=("$@")
((${#targets[@]})) || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  if [[ ! " ${ALL_TARGETS[*]} " =~ " $t " ]]; then
    echo "scripts/fuzz.sh: unknown target '$t' (one of: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
done

# libFuzzer comes with clang: the compiler, its runtimes and its OpenMP are separate Debian
# packages (scripts/setup.sh installs them).
need_packages="clang-14 libclang-rt-14-dev libomp-14-dev"
if ! command -v clang++-14 >/dev/null; then
  echo "scripts/fuzz.sh: clang++-14 not found; install the Debian packages: apt-get install $need_packages" >&2
  exit 1
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
  clang++-14 -x c++ -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null; then
  echo "scripts/fuzz.sh: clang++-14 cannot link libFuzzer with ASan/UBSan (the runtime is missing);" \
    "install the Debian packages: apt-get install $need_packages" >&2
  exit 1
fi

build=build/fuzz
out=${FUZZ_OUT:-$build}
cmake --preset fuzz >/dev/null
cmake --build "$build" -j "${FUZZ_BUILD_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"
python3 tests/fuzz/make_corpus.py "$out/corpus" "${targets[@]}" >/dev/null

run_target() {
  local t=$1 crashes=$out/crashes/$1 rc=0
  mkdir -p "$crashes" "$out/logs"
  # -fork=1: a crash is recorded and the campaign goes on; the corpus grows in place. timeout:
  # a fuzzer that outlives its -max_total_time by two minutes is hung (exit 124, a failure).
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} timeout -k 10 $((seconds + 120)) \
    "$build/tests/fuzz/fuzz_$t" "$out/corpus/$t" -dict="tests/fuzz/$t.dict" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=10 -max_len=8192 -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -artifact_prefix="$crashes/" -print_final_stats=1 -print_funcs=0 >"$out/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$out/logs/$t.rc"
}

summary() {
  local t=$1 log=$out/logs/$1.log
  # With -fork, the parent prints "#N: cov: C ft: F corp: ... exec/s E ..." (N: executions so
  # far in this run); the last such report.
  local last execs cov ft found rc status=ok
  last=$(grep -oE '#[0-9]+: cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1 || true)
  execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$last")
  cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$last")
  found=$(find "$out/crashes/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' \
    -o -name 'leak-*' \) | wc -l)
  rc=$(cat "$out/logs/$t.rc" 2>/dev/null || echo '?')
  # libFuzzer exits 0 after a clean campaign; a crash it ignored (-ignore_crashes) also leaves
  # an input in crashes/. Anything else is a failure even without an input: a fuzzer that did
  # not start, was killed, or hung.
  if ((found > 0)); then status=FAILED
  elif [ "$rc" != 0 ]; then status="FAILED (exit $rc)"
  elif [ -z "$execs" ]; then status="FAILED (no statistics)"
  fi
  printf '%-15s %12s %8s %8s %8s   %-22s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$found" "$status" "$log"
  [ "$status" = ok ]
}

jobs=${FUZZ_JOBS:-1}
running=0
for t in "${targets[@]}"; do
  echo "fuzzing $t for ${seconds}s ..."
  run_target "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=0
printf '\n%-15s %12s %8s %8s %8s   %-22s %s\n' target executions cov ft crashes status log
for t in "${targets[@]}"; do summary "$t" || failed=1; done
if ((failed)); then
  echo "scripts/fuzz.sh: a fuzz target failed; see its log. Inputs kept are in $out/crashes/<target>/" \
    "(reproduce: $build/tests/fuzz/fuzz_<target> FILE)" >&2
fi
exit $failed
