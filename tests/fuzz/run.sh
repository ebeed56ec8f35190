#!/usr/bin/env bash
# A fixed-length run of each fuzz target: a benchmark-style check run by hand (not in CI, which
# only replays the seed corpus through the unit test `the_fuzz_corpus_replays`).
#
# Builds the targets with cargo-fuzz (`cargo install cargo-fuzz`) on a nightly toolchain
# (FUZZ_TOOLCHAIN, default `nightly`; libFuzzer's sanitizer flags need one), runs each for
# FUZZ_SECONDS (default 300) starting from a copy of its seed corpus (the seeds are left as they
# are), and prints one line per target: executions, seconds, crashes. A crash keeps its input in
# tests/fuzz/artifacts/<target>/ and makes the script exit non-zero.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
secs=${FUZZ_SECONDS:-300}
toolchain=${FUZZ_TOOLCHAIN:-nightly}
targets=(spdy_frames)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"

failed=0
for target in "${targets[@]}"; do
    artifacts="$root/tests/fuzz/artifacts/$target"
    mkdir -p "$work/$target" "$artifacts"
    status=0
    cargo +"$toolchain" fuzz run --fuzz-dir tests/fuzz "$target" "$work/$target" "tests/fuzz/corpus/$target" -- \
        -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$artifacts/" \
        >"$work/$target.log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$target.log" | tail -n1)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$work/$target.log" | tail -n1)
    crashes=$(find "$artifacts" -type f | wc -l)
    echo "$target: ${runs:-?} executions in ${took:-?} s, crashes: $crashes (exit $status)"
    if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        failed=1
        tail -n 40 "$work/$target.log"
    fi
done
exit "$failed"
