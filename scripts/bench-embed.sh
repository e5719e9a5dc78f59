#!/usr/bin/env bash
# Sentence-embedding throughput: `attnscope bench embed` (its default multiply, and f32 GEMMs
# forced) vs ONNX Runtime (and optionally PyTorch) through ../shared/bench/minilm_ref.py, on the
# same model and workload (256 sentences of 25 tokens, batches of 64), measured in the same run.
#
# usage: scripts/bench-embed.sh [MODEL_DIR]   (after: cargo build --release -p attnscope)
#        default MODEL_DIR: $ATTNSCOPE_MODEL, else ~/.cache/attnscope/all-MiniLM-L6-v2
# env:   PYTHON   python with torch, transformers, onnxruntime, onnx (default python3)
#        ROUNDS   alternations: ours (auto), ours (f32), ONNX Runtime [, PyTorch] (default 3)
#        THREADS  threads for every side (default 2)
#        TORCH    1 to run PyTorch too (default 0)
#        CPU_REPS timed repetitions for the one-thread CPU-time figures (default 3)
#        OURS     the attnscope binary (default target/release/attnscope)
#
# Prints the load average, then each side's median sentences/s over ROUNDS runs (each run is
# itself the median of 5 repetitions after a warm-up) and ours/ONNX Runtime. Then one thread by
# CPU time per repetition: user + sys of (reps CPU_REPS + 1) minus (reps 1), over CPU_REPS, so
# start-up, loading, ONNX export and the warm-up cancel.
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
ours=${OURS:-$root/target/release/attnscope}
ref="$root/../shared/bench/minilm_ref.py"
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
TORCH=${TORCH:-0}
CPU_REPS=${CPU_REPS:-3}
model=${1:-${ATTNSCOPE_MODEL:-$HOME/.cache/attnscope/all-MiniLM-L6-v2}}

[[ -x "$ours" ]] || { echo "error: $ours missing: run cargo build --release -p attnscope" >&2; exit 1; }
[[ -f "$ref" ]] || { echo "error: $ref missing (the repository's ../shared)" >&2; exit 1; }
[[ -f "$model/model.safetensors" ]] ||
  { echo "error: $model has no model.safetensors (give the all-MiniLM-L6-v2 directory)" >&2; exit 1; }
"$PYTHON" -c "import torch, transformers, onnxruntime, onnx" 2>/dev/null ||
  { echo "error: $PYTHON cannot import torch, transformers, onnxruntime and onnx (set PYTHON)" >&2; exit 1; }

# rate JSON: the sentences_per_s of a one-line JSON object.
rate() { sed -E 's/.*"sentences_per_s": ?([-0-9.eE+]+).*/\1/' <<<"$1"; }
# median of the numbers given as arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

sides=(auto f32 ort)
[[ "$TORCH" == 1 ]] && sides+=(torch)
# run SIDE THREADS [ARGS...]: one run of a side, its JSON line on stdout.
run() {
  local side=$1 threads=$2
  shift 2
  case $side in
    auto | f32) "$ours" bench embed --model "$model" --threads "$threads" --gemm "$side" --json "$@" ;;
    *) "$PYTHON" "$ref" "$model" --engine "$side" --threads "$threads" "$@" 2>/dev/null | tail -1 ;;
  esac
}

echo "load before: $(uptime | sed 's/.*load average/load average/')"
declare -A rates
for ((r = 0; r < ROUNDS; r++)); do
  for side in "${sides[@]}"; do
    out=$(run "$side" "$THREADS")
    [[ -n "$out" ]] || { echo "error: no result from $side" >&2; exit 1; }
    rates[$side]+=" $(rate "$out")"
  done
done
echo "load after:  $(uptime | sed 's/.*load average/load average/')"
printf '%-22s %14s %12s   %s\n' "threads=$THREADS" "sentences/s" "vs ORT" "runs"
ort=$(median ${rates[ort]})
for side in "${sides[@]}"; do
  m=$(median ${rates[$side]})
  printf '%-22s %14.1f %11.2fx  %s\n' "$side" "$m" "$(awk -v a="$m" -v b="$ort" 'BEGIN {print a / b}')" \
    "$(printf '%.0f ' ${rates[$side]})"
done

# cpu_ms CMD...: CPU milliseconds (user + sys) the command used.
cpu_ms() {
  local TIMEFORMAT='%3U %3S'
  { time "$@" >/dev/null 2>&1; } 2>&1 | awk '{print ($1 + $2) * 1000}'
}
echo
printf '%-22s %14s %12s\n' "one thread" "CPU ms/rep" "ORT/ours"
declare -A per_rep
for side in "${sides[@]}"; do
  one=$(cpu_ms run "$side" 1 --reps 1)
  more=$(cpu_ms run "$side" 1 --reps $((CPU_REPS + 1)))
  per_rep[$side]=$(awk -v a="$one" -v b="$more" -v n="$CPU_REPS" 'BEGIN {print (b - a) / n}')
done
for side in "${sides[@]}"; do
  printf '%-22s %14.1f %11.2fx\n' "$side" "${per_rep[$side]}" \
    "$(awk -v o="${per_rep[$side]}" -v t="${per_rep[ort]}" 'BEGIN {print t / o}')"
done
