#!/usr/bin/env bash
# Data-parallel training on one machine (issue 15): K ranks x T threads against one process
# with K·T threads, the same global batch, `cabm train` on the built-in default corpus.
# Prints tokens/s (median over the logged steps after the first 10) and the share of a step
# spent averaging gradients (comm_seconds / seconds), from each run's metrics.jsonl.
# Usage: bench/mpi_scaling.sh [CABM_BINARY] [STEPS] [extra cabm train flags...]
set -euo pipefail
cabm="${1:-build/release/cabm}"
steps="${2:-120}"
shift $(( $# > 2 ? 2 : $# ))
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(train --steps "$steps" --log-interval 1 --eval-interval 0 --sample-tokens 0 "$@")
summary() {  # run_dir label
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")][10:]
tps = statistics.median(r["tokens_per_s"] for r in rows)
comm = statistics.median(r["comm_seconds"] / r["seconds"] for r in rows)
step = statistics.median(r["seconds"] for r in rows)
print(f"| {sys.argv[2]:<28} | {tps:>10,.0f} | {1000*step:>8.1f} | {100*comm:>6.1f}% |")
PY
}
lscpu | sed -n 's/^Model name: *//p'
echo "| run                          |   tokens/s |  step ms |  comm   |"
echo "|------------------------------|-----------:|---------:|--------:|"
"$cabm" "${common[@]}" --batch-size 16 --threads 2 --out "$work/one" >/dev/null 2>&1
summary "$work/one" "1 process x 2 threads, B 16"
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
  "$cabm" "${common[@]}" --batch-size 8 --threads 1 --out "$work/two" >/dev/null 2>&1
summary "$work/two" "2 ranks x 1 thread, B 2x8"
"$cabm" "${common[@]}" --batch-size 16 --threads 1 --out "$work/single" >/dev/null 2>&1
summary "$work/single" "1 process x 1 thread, B 16"
