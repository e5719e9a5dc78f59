#!/usr/bin/env bash
# Prints attnscope's reliability table (Markdown) on stdout: what is fuzzed and for how long,
# which properties of the attention core hold, which regressions are pinned, which bad input
# each command was tried with, and how the web app held up under load. Every row comes from a
# command run here; nothing is copied from an earlier run.
#
#   scripts/reliability.sh                     # tests only (a few minutes)
#   FUZZ_SECONDS=600 scripts/reliability.sh    # also fuzz each target 10 minutes, one at a time
#   FUZZ_TARGETS="sdpa_case text_path" FUZZ_SECONDS=600 scripts/reliability.sh   # some targets
#
# Fuzzing needs cargo-fuzz (`cargo install cargo-fuzz`); on a stable toolchain it runs with
# RUSTC_BOOTSTRAP=1 for the sanitizer flags. The BERT halves of the `model_config` and
# `text_path` targets need all-MiniLM-L6-v2 in the model cache (`attnscope embed hi` fetches it);
# without it they fuzz GPT-2 (tiny-gpt2 from tests/data) only.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
golden=$root/tests/data
fuzz_seconds=${FUZZ_SECONDS:-0}
fuzz_targets=${FUZZ_TARGETS:-safetensors_reader model_config sdpa_case text_path}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# One table row per test of a `cargo test` run: | name | result |.
test_rows() {
    local log=$1
    grep -E '^test [a-z0-9_:]+ \.\.\. (ok|FAILED)$' "$log" |
        sed -E 's/^test ([a-z0-9_:]+) \.\.\. (ok|FAILED)$/\1 \2/' |
        sort |
        while read -r name result; do
            printf '| %s | %s |\n' "${name//_/ }" "$result"
        done
}

run_tests() {
    local log=$1
    shift
    cargo test "$@" -- --show-output --test-threads 1 >"$log" 2>&1 || true
}

# Seeds for a target's corpus, from the golden data and the model cache.
seed_corpus() {
    local target=$1 dir=$root/fuzz/corpus/$1
    mkdir -p "$dir"
    [ -n "$(ls -A "$dir")" ] && return
    local minilm=${ATTNSCOPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/attnscope}/all-MiniLM-L6-v2
    case $target in
    safetensors_reader | sdpa_case)
        cp "$golden"/sdpa/*.safetensors "$dir"/
        ;;
    model_config)
        cp "$golden/tiny-gpt2/config.json" "$dir/gpt2"
        if [ -f "$minilm/config.json" ]; then
            { cat "$minilm/config.json"; printf '\0'; cat "$minilm/modules.json"; printf '\0'
              cat "$minilm/1_Pooling/config.json"; } >"$dir/minilm"
        fi
        ;;
    text_path)
        printf '\000The cat sat on the mat.' >"$dir/gpt2"
        printf '\001The Eiffel Tower is in Paris.' >"$dir/bert"
        printf '\005Where is it?\000The Eiffel Tower is in Paris.' >"$dir/bert-pair"
        printf '\004<img src=x onerror=alert(1)>\000</script><!--' >"$dir/gpt2-html"
        printf '\003caf\351 \360\237\231\202 \342\200\256 the the the' >"$dir/bert-bytes"
        ;;
    esac
    chmod -R u+w "$dir"
}

echo "# Reliability"
echo
tree() {
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates fuzz || echo ' with uncommitted changes')"
}
echo "Produced by \`scripts/reliability.sh\`, started $(date -u '+%Y-%m-%d %H:%M UTC') at $(tree)."
echo

echo "## Fuzzing (cargo fuzz, libFuzzer + AddressSanitizer, one target at a time)"
echo
if [ "$fuzz_seconds" -gt 0 ]; then
    echo "Command: \`RUSTC_BOOTSTRAP=1 cargo fuzz run -O TARGET -- -max_total_time=$fuzz_seconds\`"
    echo
    echo "| target | what it feeds | seconds | runs | runs/s | corpus | crashes |"
    echo "|---|---|---|---|---|---|---|"
    declare -A feeds=(
        [safetensors_reader]="attn-models Checkpoint::open + every tensor read, cross-checked with the safetensors crate"
        [model_config]="config.json, modules.json, pooling config → Model::load (shape checks) → a forward pass"
        [sdpa_case]="the attnscope sdpa case reader (metadata, masks, expected tensors) → fused and reference"
        [text_path]="arbitrary bytes (lossy UTF-8), pairs, --truncate → tokenizer → model → words, explain, flow, stats, rollout, explorer page (escaping checked)"
    )
    for target in $fuzz_targets; do
        seed_corpus "$target"
        extra=()
        [ "$target" = text_path ] && extra=(-max_len=1024)
        log=$logs/fuzz-$target.log
        status=0
        (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$target" -- \
            -max_total_time="$fuzz_seconds" -timeout=60 -rss_limit_mb=4096 \
            -print_final_stats=1 -close_fd_mask=1 "${extra[@]}") >"$log" 2>&1 || status=$?
        # The targets' per-process scratch directories (see fuzz/src/lib.rs).
        rm -rf /dev/shm/attnscope-fuzz-* "${TMPDIR:-/tmp}"/attnscope-fuzz-*
        runs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
        rate=$(grep -oE 'stat::average_exec_per_sec: +[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
        corpus=$(ls "fuzz/corpus/$target" | wc -l)
        crashes=$( [ "$status" -eq 0 ] && echo 0 || grep -oE 'fuzz/artifacts/[^ ]+' "$log" | head -1 || echo "exit $status")
        echo "| $target | ${feeds[$target]} | $fuzz_seconds | $runs | $rate | $corpus inputs | ${crashes:-exit $status} |"
    done
else
    echo "Not run this time (set FUZZ_SECONDS=600 to fuzz each target for 10 minutes)."
fi
echo

echo "## Properties of the attention core (proptest; each on sdpa_reference and sdpa)"
echo
echo "Command: \`cargo test -p attn-core --test properties\`"
echo
echo "| property | result |"
echo "|---|---|"
run_tests "$logs/properties.log" -p attn-core --test properties
test_rows "$logs/properties.log"
echo

echo "## Regressions (inputs that once crashed or misled)"
echo
echo "Command: \`cargo test -p attn-models --test regressions\`"
echo
echo "| regression | result |"
echo "|---|---|"
run_tests "$logs/regressions.log" -p attn-models --test regressions
test_rows "$logs/regressions.log"
echo

echo "## Bad input, command by command"
echo
echo "Command: \`cargo test -p attnscope --test hostile -- --show-output\` (exit 1 for every bad input, a usage error included; never a panic)"
echo
run_tests "$logs/hostile.log" -p attnscope --test hostile
# Shorten temporary paths and long messages so the table stays readable.
grep -E '^\|( |---)' "$logs/hostile.log" | sed -E 's#/tmp/\.tmp[A-Za-z0-9]+#…#g; s#'"$root"'/crates/attnscope/\.\./\.\./tests/data/#golden/#g' |
    awk '{ if (length($0) > 220) print substr($0, 1, 217) "… |"; else print }'
echo
echo "| hostile-input test | result |"
echo "|---|---|"
test_rows "$logs/hostile.log"
echo

echo "## The web app under load (\`attnscope serve\` on 127.0.0.1, tiny-gpt2)"
echo
echo "Command: \`cargo test -p attnscope --test serve_load -- --show-output\`"
echo
run_tests "$logs/serve.log" -p attnscope --test serve_load
grep -E '^load: ' "$logs/serve.log" | sed -E 's/^load: /- /'
echo
echo "| load test | result |"
echo "|---|---|"
test_rows "$logs/serve.log"
echo
echo "Tests ran $(date -u '+%Y-%m-%d %H:%M UTC') at $(tree)."
