#!/usr/bin/env bash
# Greedy decoding with the KV cache: `attnscope bench generate` vs transformers' `model.generate`
# (greedy, use_cache=True) on the same checkpoint and prompt, measured in the same run.
#
# usage: scripts/bench-generate.sh [MODEL_DIR...]   (after: cargo build --release -p attnscope)
#        default MODEL_DIR: tests/data/tiny-gpt2 (2 layers, 32 wide: overheads dominate)
#        A GPT-2-small-shaped checkpoint (random weights, nothing downloaded):
#          $PYTHON scripts/generate_ref.py --make-gpt2-small /tmp/gpt2-small-random
# env:   PYTHON   python with torch + transformers (default python3)
#        ROUNDS   alternations per case, ours then transformers (default 3)
#        THREADS  threads for both sides (default 2)
#        SHORT    new tokens of the short generation (default 16)
#        LONG     new tokens of the long one (default, and at most: as many as the model's
#                 positions allow)
#        LONG_REPS  timed runs per round of the long one (default 1; the short one takes 5)
#        PROMPT   the prompt (default: the bench's own)
#
# For each model and each length it runs both sides ROUNDS times, alternating, and prints the
# median tokens/s (the whole generation, prefill included) of each side, the ratio
# ours/transformers, whether the greedy ids agree, and our per-token ms in the first and last
# quarter of the steps (flat when a step costs the same whatever the cache length). Then the
# short generation on one thread by CPU time per generation (user + sys of (reps N + 1) minus
# (reps 1), so start-up, loading and the warm-up cancel).
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
ours="$root/target/release/attnscope"
ref="$root/scripts/generate_ref.py"
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
SHORT=${SHORT:-16}
PROMPT=${PROMPT:-The cat sat on the mat because it was tired}
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=("$root/tests/data/tiny-gpt2")

[[ -x "$ours" ]] || { echo "error: $ours missing: run cargo build --release -p attnscope" >&2; exit 1; }
"$PYTHON" -c "import torch, transformers, tokenizers" 2>/dev/null ||
  { echo "error: $PYTHON cannot import torch, transformers and tokenizers (set PYTHON)" >&2; exit 1; }

# field NAME JSON: the value after "NAME": in a one-line JSON object (a number or null).
field() { sed -E "s/.*\"$1\": ?(null|[-0-9.eE+]+).*/\1/" <<<"$2"; }
# ids JSON: the "ids" list, without spaces.
ids() { sed -E 's/.*"ids": ?\[([^]]*)\].*/\1/; s/ //g' <<<"$1"; }
# median of the numbers given as arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "load: $(uptime | sed 's/.*load average/load average/')"
printf '%-22s %5s %11s %11s %7s %5s %9s %9s %9s\n' "model (threads=$THREADS)" "new" "ours tok/s" "hf tok/s" \
  "ratio" "ids" "prefill" "ms/tok 1" "ms/tok 4"
# compare DIR N: one table row.
compare() {
  local dir=$1 n=$2 r o t o_s=() t_s=() same=yes
  for ((r = 0; r < ROUNDS; r++)); do
    o=$("$ours" bench generate --model "$dir" --prompt "$PROMPT" --max-new-tokens "$n" --threads "$THREADS" --reps "$reps" --json)
    t=$("$PYTHON" "$ref" "$dir" --prompt "$PROMPT" --new-tokens "$n" --threads "$THREADS" --reps "$reps" 2>/dev/null)
    o_s+=("$(field tokens_per_s "$o")")
    t_s+=("$(field tokens_per_s "$t")")
    [[ "$(ids "$o")" == "$(ids "$t")" ]] || same=no
  done
  local om tm
  om=$(median "${o_s[@]}")
  tm=$(median "${t_s[@]}")
  printf '%-22s %5d %11.1f %11.1f %6.2fx %5s %6.2f ms %9s %9s\n' "$(basename "$dir")" "$n" "$om" "$tm" \
    "$(awk -v o="$om" -v t="$tm" 'BEGIN {print o / t}')" "$same" "$(field prefill_ms "$o")" \
    "$(field per_token_ms_first_quarter "$o" | awk '{printf ($1 == "null" ? "-" : "%.2f"), $1}')" \
    "$(field per_token_ms_last_quarter "$o" | awk '{printf ($1 == "null" ? "-" : "%.2f"), $1}')"
}

for dir in "${models[@]}"; do
  n_positions=$(sed -nE 's/.*"n_positions": ?([0-9]+).*/\1/p' "$dir/config.json")
  prompt_tokens=$(field prompt_tokens "$("$ours" bench generate --model "$dir" --prompt "$PROMPT" --max-new-tokens 1 --reps 1 --json)")
  long=$((n_positions - prompt_tokens + 1))
  [[ -z "${LONG:-}" ]] || ((LONG > long)) || long=$LONG
  reps=5 compare "$dir" "$SHORT"
  reps=${LONG_REPS:-1} compare "$dir" "$long"
done

# cpu_ms CMD...: CPU milliseconds (user + sys) the command used.
cpu_ms() {
  local TIMEFORMAT='%3U %3S'
  { time "$@" >/dev/null 2>&1; } 2>&1 | awk '{print ($1 + $2) * 1000}'
}
# per_run CMD...: CPU ms per generation of a command that takes --reps: (reps N + 1) minus
# (reps 1), over N generations, N growing tenfold until the difference is at least 500 ms.
per_run() {
  local n=10 one more
  one=$(cpu_ms "$@" --reps 1)
  while :; do
    more=$(cpu_ms "$@" --reps $((n + 1)))
    awk -v a="$one" -v b="$more" 'BEGIN {exit !(b - a < 500)}' && ((n < 100000)) || break
    n=$((n * 10))
  done
  awk -v a="$one" -v b="$more" -v n="$n" 'BEGIN {print (b - a) / n}'
}

echo
printf '%-22s %5s %11s %11s %7s\n' "one thread, CPU ms/gen" "new" "ours" "hf" "hf/ours"
for dir in "${models[@]}"; do
  o=$(per_run "$ours" bench generate --model "$dir" --prompt "$PROMPT" --max-new-tokens "$SHORT" --threads 1)
  t=$(per_run "$PYTHON" "$ref" "$dir" --prompt "$PROMPT" --new-tokens "$SHORT" --threads 1 --no-prefill)
  printf '%-22s %5d %11.3f %11.1f %6.2fx\n' "$(basename "$dir")" "$SHORT" "$o" "$t" \
    "$(awk -v o="$o" -v t="$t" 'BEGIN {print t / o}')"
done
