#!/usr/bin/env bash
# The task commands' speed on a MiniLM-sized model (6 layers, width 384, random F32 weights,
# all-MiniLM-L6-v2's tokenizer), against transformers' pipelines in the same run:
#   - `classify` of one sentence from a cold process (wall, median of RUNS);
#   - `classify --file` of 256 sentences, process start and load included, against the warm
#     `pipeline("text-classification", batch_size=32)` (ROUNDS alternations, medians);
#   - `answer` on a context of 384 tokens from a cold process (two windows of 384), beside
#     the warm `pipeline("question-answering")`.
#
# usage: scripts/bench-tasks.sh [DIR]   (after: cargo build --release -p attnscope)
#        DIR holds the checkpoints and inputs (made there by scripts/bench_tasks.py on first
#        use; default /tmp/attnscope-bench-tasks).
# env:   PYTHON   python with torch and transformers 4.57 (default python3)
#        TOKENIZER_DIR  where tokenizer.json comes from (default: the cached all-MiniLM-L6-v2)
#        ROUNDS   alternations of ours and the pipeline (default 5)
#        RUNS     cold runs of each one-text command (default 10)
#        THREADS  threads for every side (default 2)
#        OURS     the attnscope binary (default target/release/attnscope)
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
ours=${OURS:-$root/target/release/attnscope}
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-5}
RUNS=${RUNS:-10}
THREADS=${THREADS:-2}
dir=${1:-/tmp/attnscope-bench-tasks}
tokenizer_dir=${TOKENIZER_DIR:-${ATTNSCOPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/attnscope}/all-MiniLM-L6-v2}

[[ -x "$ours" ]] || { echo "error: $ours missing: run cargo build --release -p attnscope" >&2; exit 1; }
"$PYTHON" -c "import torch, transformers" 2>/dev/null ||
  { echo "error: $PYTHON cannot import torch and transformers (set PYTHON)" >&2; exit 1; }
if [[ ! -f "$dir/qa/model.safetensors" ]]; then
  [[ -f "$tokenizer_dir/tokenizer.json" ]] ||
    { echo "error: $tokenizer_dir has no tokenizer.json (run attnscope once, or set TOKENIZER_DIR)" >&2; exit 1; }
  "$PYTHON" "$root/scripts/bench_tasks.py" make "$dir" "$tokenizer_dir"
fi

# median of the numbers given as arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# wall_ms CMD...: the command's wall time in milliseconds, its output discarded.
wall_ms() {
  local start end
  start=$(date +%s%N)
  "$@" >/dev/null
  end=$(date +%s%N)
  echo $(((end - start) / 1000000))
}
# field NAME JSON: a number of a one-line JSON object.
field() { sed -E "s/.*\"$1\": ?([-0-9.eE+]+).*/\1/" <<<"$2"; }

question=$(cat "$dir/question.txt")
context=$(cat "$dir/context.txt")
sentences=$(wc -l <"$dir/sentences.txt")
echo "cpu:  $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed "s/^ //") ($(nproc) cpus; $(grep -m1 -o -w "amx_tile" /proc/cpuinfo || echo "no AMX"))"
echo "load before: $(uptime | sed 's/.*load average/load average/')"

cold=() answer=()
for ((r = 0; r < RUNS; r++)); do
  cold+=("$(wall_ms "$ours" classify "The movie was good but the ending was terrible" \
    --model "$dir/classifier" --threads "$THREADS")")
  answer+=("$(wall_ms "$ours" answer --question "$question" --context "$context" \
    --model "$dir/qa" --threads "$THREADS")")
done
ours_rates=() ref_rates=()
for ((r = 0; r < ROUNDS; r++)); do
  ms=$(wall_ms "$ours" classify --file "$dir/sentences.txt" --model "$dir/classifier" \
    --threads "$THREADS" --json)
  ours_rates+=("$(awk -v n="$sentences" -v ms="$ms" 'BEGIN {print n * 1000 / ms}')")
  out=$("$PYTHON" "$root/scripts/bench_tasks.py" classify "$dir" --threads "$THREADS" 2>/dev/null | tail -1)
  ref_rates+=("$(field sentences_per_s "$out")")
done
qa_ref=$("$PYTHON" "$root/scripts/bench_tasks.py" answer "$dir" --threads "$THREADS" 2>/dev/null | tail -1)
echo "load after:  $(uptime | sed 's/.*load average/load average/')"

ours_rate=$(median "${ours_rates[@]}")
ref_rate=$(median "${ref_rates[@]}")
printf 'classify, one sentence, cold process:   %6.0f ms  (runs %s)\n' "$(median "${cold[@]}")" "${cold[*]}"
printf 'classify --file, %d sentences, cold:   %6.1f sentences/s  (runs %s)\n' "$sentences" \
  "$ours_rate" "$(printf '%.0f ' "${ours_rates[@]}")"
printf '  pipeline batch_size 32, warm:         %6.1f sentences/s  (runs %s) -> %.2fx\n' "$ref_rate" \
  "$(printf '%.0f ' "${ref_rates[@]}")" "$(awk -v a="$ours_rate" -v b="$ref_rate" 'BEGIN {print a / b}')"
printf 'answer, 384-token context, cold:        %6.0f ms  (runs %s)\n' "$(median "${answer[@]}")" "${answer[*]}"
printf '  question-answering pipeline, warm:    %6.0f ms\n' "$(awk -v s="$(field seconds "$qa_ref")" 'BEGIN {print s * 1000}')"
