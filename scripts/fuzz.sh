#!/usr/bin/env bash
# Fuzzes every decoder target in fuzz/ for a bounded time each (libFuzzer through
# libfuzzer-sys), on stable Rust and without installing cargo-fuzz.
#
#   scripts/fuzz.sh                          # every target, 20 s each
#   FUZZ_SECONDS=60 scripts/fuzz.sh          # longer runs
#   FUZZ_TARGETS="label dnode" scripts/fuzz.sh
#   FUZZ_JOBS=1 scripts/fuzz.sh              # one target at a time (default: one per core)
#
# Each target starts from its committed seeds (fuzz/corpus/<target>/) and its saved
# crashes (fuzz/regressions/<target>/, which must no longer crash), and grows a
# scratch corpus in fuzz/work/<target>/ (git-ignored, kept between local runs).
# Exits non-zero if any target crashed, failed a property check, hung or ran out
# of memory, after printing the input that did it and the command that replays it.
#
# The build uses the RUSTFLAGS that `cargo fuzz build --sanitizer none`
# (cargo-fuzz 0.13) uses, in the same target directory, so `cargo fuzz run
# --sanitizer none <target>` reuses this build. No sanitizer: the decoders are
# safe Rust, where a bug shows as a panic, which libFuzzer catches as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
fuzz_dir=$root/fuzz
seconds_per_target=${FUZZ_SECONDS:-20}
# Slowest single input before libFuzzer calls it a hang (every input here is at
# most a few KiB; a decoder taking a second on one is a bug).
input_timeout_seconds=10
# Memory ceiling per target process: a decoder that allocates from an untrusted
# length shows up as an out-of-memory crash.
rss_limit_mb=2048

command -v cargo >/dev/null || { echo "fuzz: cargo is required: install Rust (https://rustup.rs)" >&2; exit 1; }
# libfuzzer-sys compiles libFuzzer's C++ sources.
if ! command -v c++ >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "fuzz: installing g++ (libFuzzer is C++)"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq g++ >/dev/null
fi

# The [[bin]] sections of fuzz/Cargo.toml are the targets.
all_targets=$(awk '/^\[\[bin\]\]/ { in_bin = 1; next } /^\[/ { in_bin = 0 } in_bin && /^name = / { gsub(/"/, "", $3); print $3 }' "$fuzz_dir/Cargo.toml")
targets=${FUZZ_TARGETS:-$all_targets}
host=$(rustc -vV | sed -n 's/^host: //p')
binary_dir=$fuzz_dir/target/$host/release

# The flags of cargo-fuzz 0.13 (src/project.rs) for a release build with debug
# assertions (its default) and no sanitizer: coverage counters and comparison
# tracing for libFuzzer, overflow checks and debug assertions in the engine.
instrumentation=" -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Cllvm-args=-sanitizer-coverage-stack-depth -Cdebug-assertions -Ccodegen-units=1"
build_started=$SECONDS
bin_arguments=()
for target in $targets; do bin_arguments+=(--bin "$target"); done
# --target keeps the instrumentation off build scripts and proc macros.
RUSTFLAGS="$instrumentation ${RUSTFLAGS:-}" cargo build --quiet \
    --manifest-path "$fuzz_dir/Cargo.toml" --target-dir "$fuzz_dir/target" --target "$host" \
    --release --config 'profile.release.debug="line-tables-only"' "${bin_arguments[@]}"
echo "fuzz: built $(echo $targets | wc -w) targets in $((SECONDS - build_started)) s"

# Prints libFuzzer's final statistic `name` from `log`.
final_stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }

# Targets run side by side, one per core: each is one single-threaded libFuzzer
# process, so on CI's two cores the pass takes half the wall time for the same
# executions per target.
parallel_jobs=${FUZZ_JOBS:-$(nproc)}
run_target() {
    local target=$1
    local binary=$binary_dir/$target
    local work=$fuzz_dir/work/$target
    local artifacts=$fuzz_dir/artifacts/$target
    local log=$fuzz_dir/artifacts/$target.log
    mkdir -p "$work" "$artifacts"
    local corpora=("$work" "$fuzz_dir/corpus/$target")
    [ -d "$fuzz_dir/regressions/$target" ] && corpora+=("$fuzz_dir/regressions/$target")
    local status=0
    # New inputs go to the first corpus folder only: the committed seeds stay as they are.
    "$binary" -max_total_time="$seconds_per_target" -timeout="$input_timeout_seconds" -rss_limit_mb="$rss_limit_mb" \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "${corpora[@]}" >"$log" 2>&1 || status=$?
    echo "$status" >"$fuzz_dir/artifacts/$target.status"
}
running=0
for target in $targets; do
    rm -f "$fuzz_dir/artifacts/$target.status"
    run_target "$target" &
    running=$((running + 1))
    if [ "$running" -ge "$parallel_jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

passed_count=0
failed_count=0
executions_total=0
failures=()
printf '%-14s %12s %10s %8s %s\n' target executions exec/s "new" result
for target in $targets; do
    log=$fuzz_dir/artifacts/$target.log
    status=$(cat "$fuzz_dir/artifacts/$target.status" 2>/dev/null || echo "no status")
    executions=$(final_stat number_of_executed_units "$log")
    executions_total=$((executions_total + ${executions:-0}))
    if [ "$status" = 0 ]; then
        result=ok
        passed_count=$((passed_count + 1))
    else
        result="FAILED (exit $status)"
        failed_count=$((failed_count + 1))
        failures+=("$target")
    fi
    printf '%-14s %12s %10s %8s %s\n' "$target" "${executions:-?}" "$(final_stat average_exec_per_sec "$log")" "$(final_stat new_units_added "$log")" "$result"
done

for target in "${failures[@]}"; do
    log=$fuzz_dir/artifacts/$target.log
    echo
    echo "fuzz: target $target failed; the end of its log ($log):"
    grep -E "ERROR: libFuzzer|SUMMARY: libFuzzer" "$log" | head -3 || true
    sed -n '/panicked at/,/^note:/p' "$log" | head -20 || true
    for input in $(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log"); do
        echo "fuzz: reproducer: $input"
        echo "fuzz:   replay:   $binary_dir/$target $input"
        echo "fuzz:   or:       cargo fuzz run --sanitizer none $target $input  (from the repo root)"
        echo "fuzz:   keep it:  cp $input fuzz/regressions/$target/"
    done
done
echo
echo "fuzz: $executions_total executions in all, ${seconds_per_target} s per target"
echo "fuzz: $passed_count passed, $failed_count failed"
[ "$failed_count" -eq 0 ]
