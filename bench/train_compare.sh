#!/usr/bin/env bash
# Trains the same character-level causal LM (architecture, hyper-parameters, data split,
# initial weights, and the same training windows in the same order: bench/train_pytorch.py draws
# cabm's) with PyTorch and with cabm, one after the other on the same threads, and prints a
# markdown table: training tokens/s and validation loss after the same steps.
#
#   bench/train_compare.sh [--preset default|big] [--steps N] [--threads N] [--seed S] [--cabm PATH]
#                          [--precision fp32|bf16] [--python PATH]
#
# --precision bf16: `cabm train --precision bf16` against PyTorch under torch.autocast('cpu',
# torch.bfloat16) (bf16 products, fp32 master weights in both). --python: the interpreter whose
# PyTorch runs (default /usr/bin/python3, Debian's 1.13; .venv-bench/bin/python has a current one,
# scripts/setup_bench_venv.sh).
#
# default: `cabm train`'s default model; big: the 6-layer E=256, H=8, F=1024, B=32, T=128
# encoder of the reference numbers. Data: the fortunes corpus concatenated into one UTF-8 file
# (both sides then split it the same way: the last 10% held out).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
preset=default steps="" threads=2 seed=1337 cabm="$root/build/release/cabm" python=/usr/bin/python3 precision=fp32
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --cabm) cabm="$2"; shift 2 ;;
    --precision) precision="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "train_compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

case "$preset" in
  default) model=(--layers 4 --heads 4 --d-model 128 --d-ff 512 --batch-size 16 --seq-len 64); steps="${steps:-200}" ;;
  big) model=(--layers 6 --heads 8 --d-model 256 --d-ff 1024 --batch-size 32 --seq-len 128); steps="${steps:-20}" ;;
  *) echo "train_compare.sh: unknown preset $preset (default, big)" >&2; exit 2 ;;
esac
case "$precision" in
  fp32 | bf16) ;;
  *) echo "train_compare.sh: unknown precision $precision (fp32, bf16)" >&2; exit 2 ;;
esac
hyper=(--precision "$precision" --lr 2e-3 --warmup $((steps / 10 > 0 ? steps / 10 : 1)) --weight-decay 0.01 --clip 1.0 --dropout 0 --seed "$seed")

work="$(mktemp -d "${TMPDIR:-/tmp}/cabm-train-bench-XXXXXX")"
trap 'rm -rf "$work"' EXIT
corpus="$work/fortunes.txt"
for f in /usr/share/games/fortunes/*; do
  [ -f "$f" ] && [ ! -L "$f" ] && [ "${f%.dat}" = "$f" ] && cat "$f"
done >"$corpus"

echo "preset $preset: ${model[*]} ${hyper[*]}, $steps steps, $threads threads, $(wc -c <"$corpus") bytes of fortunes" >&2
torch_json="$("$python" "$here/train_pytorch.py" --data "$corpus" --steps "$steps" --threads "$threads" \
  --init-out "$work/init.safetensors" "${model[@]}" "${hyper[@]}")"
cabm_log="$("$cabm" train --data "$corpus" --out "$work/run" --init "$work/init.safetensors" --steps "$steps" \
  --threads "$threads" --eval-interval "$steps" --sample-tokens 0 --log-interval "$steps" "${model[@]}" "${hyper[@]}")"

cabm_tps="$(sed -n 's/.*(\([0-9,]*\) tokens\/s in training steps).*/\1/p' <<<"$cabm_log" | tr -d ,)"
cabm_val="$(sed -n "s/^step $steps: validation loss \([0-9.]*\).*/\1/p" <<<"$cabm_log")"
torch_tps="$("$python" -c 'import json,sys; print(round(json.loads(sys.argv[1])["tokens_per_second"]))' "$torch_json")"
torch_val="$("$python" -c 'import json,sys; print("%.4f" % json.loads(sys.argv[1])["val_loss"])' "$torch_json")"
ratio="$("$python" -c "print('%.2f' % ($cabm_tps / $torch_tps))")"
torch_name="$("$python" -c 'import json,sys; print(json.loads(sys.argv[1])["framework"].replace("pytorch", "PyTorch"))' "$torch_json")"

echo "| framework | precision | threads | steps | training tokens/s | validation loss (nats/byte) |"
echo "|---|---|---|---|---|---|"
echo "| $torch_name | $precision | $threads | $steps | $torch_tps | $torch_val |"
echo "| cabm | $precision | $threads | $steps | $cabm_tps (x$ratio) | $cabm_val |"
