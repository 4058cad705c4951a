#!/usr/bin/env bash
# Creates (or brings up to date) the virtual environment for bench/embed_compare.py:
# ${CABM_BENCH_VENV:-<repo>/.venv-bench}, from Debian's /usr/bin/python3 without its site packages
# (the benchmark wants the newest PyTorch, not Debian's 1.13), with the pinned packages of
# scripts/requirements-bench.txt. Not part of scripts/setup.sh (nothing in the build or the tests
# needs it); does nothing when the venv already matches the list.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CABM_BENCH_VENV:-$repo/.venv-bench}"
req="$repo/scripts/requirements-bench.txt"
stamp="$venv/.cabm-requirements"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  exit 0
fi
echo "setup: creating the Python environment $venv (pinned in scripts/requirements-bench.txt)"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
# The benchmark needs these to import together; fail here, not halfway through a run.
HF_HUB_OFFLINE=1 "$venv/bin/python" -c \
  'import torch, transformers, tokenizers, onnx, onnxruntime, ctranslate2, safetensors, numpy'
cp "$req" "$stamp"
