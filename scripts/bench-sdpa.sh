#!/usr/bin/env bash
# Fused attention vs PyTorch's CPU scaled_dot_product_attention, measured in the same run.
#
# usage: scripts/bench-sdpa.sh            (after: cargo build --release -p attnscope)
# env:   PYTHON   python with torch (default python3)
#        ROUNDS   alternations per shape, ours then PyTorch (default 3); the weights-row
#                 check takes 2·ROUNDS + 1 pairs (7 by default)
#        THREADS  threads for both sides (default 2)
#
# For each shape it runs `attnscope bench sdpa --json` and `shared/bench/sdpa_torch.py`
# alternately, takes the median GFLOP/s of each side over the rounds, and prints the ratio
# ours/PyTorch next to the issue's target; then decoding steps (a few query rows against many
# keys) and masked calls the same way, against scripts/sdpa_torch_kv.py. Then the issue's
# shapes on one thread by CPU time per call (user + sys of (reps N + 1) minus (reps 1), so
# start-up and input generation cancel): per-core efficiency, which other processes on a
# shared machine disturb far less than wall time. Then: the 65536² run's peak memory, and what one query row's
# weights add to a call.
set -euo pipefail

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
shared="$root/../shared"
ours="$root/target/release/attnscope"
torch_py="$shared/bench/sdpa_torch.py"
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}

[[ -x "$ours" ]] || { echo "error: $ours missing: run cargo build --release -p attnscope" >&2; exit 1; }
[[ -f "$torch_py" ]] || { echo "error: $torch_py missing (shared/ must sit next to the repo)" >&2; exit 1; }
"$PYTHON" -c "import torch" 2>/dev/null || { echo "error: $PYTHON cannot import torch (set PYTHON)" >&2; exit 1; }

# field NAME JSON: the number after "NAME": in a one-line JSON object.
field() { sed -E "s/.*\"$1\": ?([-0-9.eE+]+).*/\1/" <<<"$2"; }
# median of the numbers given as arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# isa_of DTYPE: the kernels the forward pass runs on for DTYPE (the "isa" of bench sdpa --json).
isa_of() { sed -E 's/.*"isa": ?"([A-Za-z0-9]+)".*/\1/' <<<"$("$ours" bench sdpa --seq 64 --heads 1 --head-dim 64 --dtype "$1" --reps 1 --json)"; }
echo "kernels: f32 on $(isa_of f32), bf16 on $(isa_of bf16)"
printf '%-34s %10s %10s %8s %8s\n' "shape (threads=$THREADS, rounds=$ROUNDS)" "ours GF/s" "torch GF/s" "ratio" "target"
# compare LABEL TARGET DTYPE SEQ HEADS REPS [--causal] [--backward]: REPS calls per sample on
# each side, so that a sample takes 50-300 ms (at L=512 five calls take under 10 ms, and the
# ratio then moved by 0.2 between runs).
compare() {
  local label=$1 target=$2 dtype=$3 seq=$4 heads=$5 reps=$6; shift 6
  local ours_g=() torch_g=() r
  for ((r = 0; r < ROUNDS; r++)); do
    ours_g+=("$(field gflops "$("$ours" bench sdpa --seq "$seq" --heads "$heads" --head-dim 64 \
      --dtype "$dtype" --threads "$THREADS" --reps "$reps" --json "$@")")")
    torch_g+=("$(field gflops "$("$PYTHON" "$torch_py" --seq "$seq" --heads "$heads" --head-dim 64 \
      --dtype "$dtype" --threads "$THREADS" --reps "$reps" "$@")")")
  done
  local o t
  o=$(median "${ours_g[@]}")
  t=$(median "${torch_g[@]}")
  printf '%-34s %10.1f %10.1f %7.2fx %7sx\n' "$label" "$o" "$t" "$(awk -v o="$o" -v t="$t" 'BEGIN {print o / t}')" "$target"
}

compare "f32 B1 H8 L=S=2048 d64"         2.0 f32 2048 8 5
compare "f32 B1 H8 L=S=2048 d64 causal"  2.0 f32 2048 8 8 --causal
compare "f32 B1 H8 L=S=512 d64"          1.8 f32 512 8 50
compare "f32 B1 H2 L=S=8192 d64"         1.8 f32 8192 2 2
compare "bf16 B1 H8 L=S=2048 d64"        3.0 bf16 2048 8 10
compare "bf16 B1 H8 L=S=2048 d64 causal" 3.0 bf16 2048 8 15 --causal
compare "f32 fwd+bwd B1 H8 L=S=2048 d64" 1.5 f32 2048 8 3 --backward
compare "f32 fwd+bwd same, causal"       1.5 f32 2048 8 4 --backward --causal
compare "f32 fwd+bwd B1 H8 L=S=512 d64"  1.5 f32 512 8 20 --backward

# Decoding steps (a few query rows against many keys) and masks (not among the issue's
# targets), against scripts/sdpa_torch_kv.py, which takes the key length, key/value heads and
# mask apart.
# compare_kv LABEL DTYPE SEQ SEQ_KV HEADS KV_HEADS HEAD_DIM REPS [--mask KIND] [--backward]:
# REPS calls per sample.
compare_kv() {
  local label=$1 dtype=$2 seq=$3 seq_kv=$4 heads=$5 kv_heads=$6 head_dim=$7 reps=$8; shift 8
  local ours_g=() torch_g=() r
  local shape=(--seq "$seq" --seq-kv "$seq_kv" --heads "$heads" --kv-heads "$kv_heads" --head-dim "$head_dim"
    --dtype "$dtype" --threads "$THREADS" --reps "$reps" "$@")
  for ((r = 0; r < ROUNDS; r++)); do
    ours_g+=("$(field gflops "$("$ours" bench sdpa "${shape[@]}" --json)")")
    torch_g+=("$(field gflops "$("$PYTHON" "$root/scripts/sdpa_torch_kv.py" "${shape[@]}")")")
  done
  local o t
  o=$(median "${ours_g[@]}")
  t=$(median "${torch_g[@]}")
  printf '%-34s %10.1f %10.1f %7.2fx\n' "$label" "$o" "$t" "$(awk -v o="$o" -v t="$t" 'BEGIN {print o / t}')"
}
echo
printf '%-34s %10s %10s %8s\n' "decoding steps (threads=$THREADS)" "ours GF/s" "torch GF/s" "ratio"
compare_kv "f32 H8 L=1 S=4096 d64"           f32 1 4096 8 8 64 300
compare_kv "f32 H8 L=4 S=4096 d64"           f32 4 4096 8 8 64 300
compare_kv "bf16 H8 L=1 S=4096 d64"          bf16 1 4096 8 8 64 300
compare_kv "f32 H32 KV8 L=1 S=2048 d128"     f32 1 2048 32 8 128 300
compare_kv "bf16 H32 KV8 L=1 S=2048 d128"    bf16 1 2048 32 8 128 300
echo
printf '%-34s %10s %10s %8s\n' "masks, B1 H8 L=S=2048 d64" "ours GF/s" "torch GF/s" "ratio"
for dtype in f32 bf16; do
  reps=$([[ $dtype == f32 ]] && echo 5 || echo 10)
  compare_kv "$dtype float mask [L, S]"        "$dtype" 2048 2048 8 8 64 "$reps" --mask float
  compare_kv "$dtype bool mask [L, S]"         "$dtype" 2048 2048 8 8 64 "$reps" --mask bool
  compare_kv "$dtype key padding (a tenth)"    "$dtype" 2048 2048 8 8 64 "$reps" --mask padding
done
compare_kv "f32 fwd+bwd float mask [L, S]"    f32 2048 2048 8 8 64 3 --mask float --backward
compare_kv "f32 fwd+bwd key padding"          f32 2048 2048 8 8 64 3 --mask padding --backward

# cpu_ms CMD...: CPU milliseconds (user + sys) the command used.
cpu_ms() {
  local TIMEFORMAT='%3U %3S'
  { time "$@" >/dev/null 2>&1; } 2>&1 | awk '{print ($1 + $2) * 1000}'
}
# per_call N CMD...: CPU ms per call of a benchmark command that takes --reps, over N calls.
per_call() {
  local n=$1 one more; shift
  one=$(cpu_ms "$@" --reps 1)
  more=$(cpu_ms "$@" --reps $((n + 1)))
  awk -v a="$one" -v b="$more" -v n="$n" 'BEGIN {print (b - a) / n}'
}

echo
printf '%-34s %10s %10s %8s\n' "one thread, CPU ms per call" "ours" "torch" "ratio"
# cpu_compare LABEL CALLS DTYPE SEQ HEADS [--causal] [--backward]: CALLS long enough that the noise of
# Python's start-up (tens of ms) stays small against them.
cpu_compare() {
  local label=$1 n=$2 dtype=$3 seq=$4 heads=$5; shift 5
  local o t
  o=$(per_call "$n" "$ours" bench sdpa --seq "$seq" --heads "$heads" --head-dim 64 --dtype "$dtype" --threads 1 "$@")
  t=$(per_call "$n" "$PYTHON" "$torch_py" --seq "$seq" --heads "$heads" --head-dim 64 --dtype "$dtype" --threads 1 "$@")
  printf '%-34s %10.1f %10.1f %7.2fx\n' "$label" "$o" "$t" "$(awk -v o="$o" -v t="$t" 'BEGIN {print t / o}')"
}
cpu_compare "f32 B1 H8 L=S=2048 d64"        20 f32 2048 8
cpu_compare "f32 B1 H8 L=S=2048 d64 causal" 20 f32 2048 8 --causal
cpu_compare "f32 B1 H8 L=S=512 d64"        200 f32 512 8
cpu_compare "f32 B1 H2 L=S=8192 d64"         5 f32 8192 2
cpu_compare "bf16 B1 H8 L=S=2048 d64"       20 bf16 2048 8
cpu_compare "bf16 B1 H8 L=S=2048 d64 causal" 20 bf16 2048 8 --causal
cpu_compare "f32 fwd+bwd B1 H8 L=S=2048 d64" 10 f32 2048 8 --backward
cpu_compare "f32 fwd+bwd same, causal"       10 f32 2048 8 --backward --causal
cpu_compare "f32 fwd+bwd B1 H8 L=S=512 d64" 100 f32 512 8 --backward

echo
big=$("$ours" bench sdpa --seq 65536 --heads 1 --head-dim 64 --threads "$THREADS" --reps 1 --json)
in_mib=$(field inputs_mib "$big"); out_mib=$(field outputs_mib "$big"); peak=$(field peak_rss_mib "$big")
extra=$(awk -v p="$peak" -v i="$in_mib" -v o="$out_mib" 'BEGIN {print p - i - o}')
printf 'f32 H1 L=S=65536 d64: %.0f ms, %.1f GFLOP/s; peak RSS %.1f MiB = inputs %.1f + outputs %.1f + %.1f MiB (target < 64)\n' \
  "$(field ms "$big")" "$(field gflops "$big")" "$peak" "$in_mib" "$out_mib" "$extra"

# One row's weights against none: a difference of a few percent, so more pairs than the shapes
# above, each pair back to back, every other pair in the other order (so that a machine slowing
# down or speeding up through the pairs does not count against one side), and the median of the
# pairs' ratios.
none_ms=() row_ms=() ratios=()
weights_ms() {
  field ms "$("$ours" bench sdpa --seq 2048 --heads 8 --head-dim 64 --threads "$THREADS" --reps 20 --weights "$1" --json)"
}
for ((r = 0; r < 2 * ROUNDS + 1; r++)); do
  if ((r % 2 == 0)); then
    a=$(weights_ms none) b=$(weights_ms row)
  else
    b=$(weights_ms row) a=$(weights_ms none)
  fi
  none_ms+=("$a") row_ms+=("$b") ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN {print b / a}')")
done
printf 'f32 H8 L=S=2048 d64, one row of weights: %.2f ms vs %.2f ms without (medians of %d pairs); median pair %+.1f%% (target < 5%%)\n' \
  "$(median "${row_ms[@]}")" "$(median "${none_ms[@]}")" "${#ratios[@]}" \
  "$(awk -v q="$(median "${ratios[@]}")" 'BEGIN {print (q - 1) * 100}')"
