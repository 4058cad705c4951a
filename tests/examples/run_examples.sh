#!/usr/bin/env bash
# Installs cabm from a built tree into a temporary prefix, then builds and runs every project
# in examples/ from a copy outside the source tree, against the installed package only (CMake
# find_package, and once through pkg-config), and checks what each prints.
#   run_examples.sh SOURCE_DIR BUILD_DIR FIXTURES_DIR
set -euo pipefail
src=$(realpath "$1") build=$(realpath "$2") fixtures=$3
work=$(mktemp -d /tmp/cabm-examples.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
if grep -rIl -e "$src" -e "$build" "$work/prefix"; then fail "installed files name the source or build tree"; fi

# Every installed header compiles on its own against the prefix (no include of a header that
# was left out of the install, no include that only worked through the source tree).
headers=$(cd "$work/prefix/include" && find cabm -name '*.h' | sort)
[ -n "$headers" ] || fail "no headers installed"
for h in $headers; do
  printf '#include <%s>\n' "$h" >"$work/header_check.cpp"
  g++ -std=c++20 -fopenmp -fsyntax-only -I"$work/prefix/include" "$work/header_check.cpp" >"$work/header_check.log" 2>&1 ||
    { cat "$work/header_check.log"; fail "installed header $h does not compile on its own"; }
done
echo "installed headers: $(echo "$headers" | wc -l) compile on their own"

build_example() {  # NAME: copy, configure against the prefix, build
  cp -r "$src/examples/$1" "$work/$1"
  cmake -S "$work/$1" -B "$work/$1/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/$1.configure.log" || { cat "$work/$1.configure.log"; fail "$1: configure"; }
  cmake --build "$work/$1/build" >"$work/$1.build.log" 2>&1 || { cat "$work/$1.build.log"; fail "$1: build"; }
  if grep -e "$src" -e "$build" "$work/$1/build/build.ninja" "$work/$1/build/CMakeCache.txt"; then
    fail "$1: its build uses a path into cabm's source or build tree"
  fi
}
expect() {  # FILE PATTERN
  grep -q -e "$2" "$1" || { cat "$1"; fail "expected '$2' in the output above"; }
}

for example in "$src"/examples/*/; do build_example "$(basename "$example")"; done

"$work/attention_on_buffers/build/attention_on_buffers" | tee "$work/attention.out"
expect "$work/attention.out" '^ok$'

ran=0
# Encoders without an attention mask, without padding or with suffix padding (rows where
# every key is padding are NaN in PyTorch, and NaN reaches other rows through 0 · NaN).
for case in "$fixtures"/forward/*_encoder_*_{pre,post}_none_{none,suffix}*; do
  "$work/run_pytorch_encoder/build/run_pytorch_encoder" "$case/model.safetensors" "$case/input.safetensors" \
    "$case/expected.safetensors" >"$work/encoder.out" || { cat "$work/encoder.out"; fail "$(basename "$case")"; }
  expect "$work/encoder.out" '^ok$'
  ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || fail "no encoder fixtures in $fixtures/forward"
echo "run_pytorch_encoder: $ran PyTorch encoders matched"

"$work/train_and_generate/build/train_and_generate" "$work/run" | tee "$work/train.out"
expect "$work/train.out" '^reloaded .*step-00000300: validation loss'
# The command-line tool from the same install reads the example's checkpoint.
"$work/prefix/bin/cabm" eval --checkpoint "$work/run" >"$work/eval.out" || { cat "$work/eval.out"; fail "cabm eval"; }
expect "$work/eval.out" 'validation loss'

# pkg-config, without CMake.
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
g++ -O2 -o "$work/attention_pc" "$src/examples/attention_on_buffers/main.cpp" $(pkg-config --cflags --libs cabm) \
  || fail "pkg-config build"
"$work/attention_pc" | tee "$work/attention_pc.out"
expect "$work/attention_pc.out" '^ok$'
echo "examples: all built against the installed package and ran"
