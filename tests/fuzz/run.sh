#!/usr/bin/env bash
# run.sh FUZZER SEEDS SECONDS: runs one libFuzzer target for SECONDS over
# a scratch copy of its seed corpus, so the committed corpus is never
# written to. Every seed runs first (they include the inputs of bugs
# found before); then the fuzzer mutates. Fails on any crash, sanitizer
# report, leak, timeout or broken invariant, and keeps the input that
# caused it in fuzz-artifacts/ beside the fuzzer. Prints one line with
# the executions made.
set -euo pipefail
bin=${1:?usage: run.sh FUZZER SEEDS SECONDS}
seeds=${2:?}
secs=${3:?}
name=$(basename "$bin")
base=/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && base=/dev/shm
work=$(mktemp -d "$base/volley-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/tmp"
art="$(dirname "$bin")/fuzz-artifacts"
mkdir -p "$art"
rc=0
TMPDIR="$work/tmp" ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  "$bin" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2560 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$art/$name-" "$work/corpus" "$seeds" \
  > "$work/log" 2>&1 || rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n1)
if [ "$rc" != 0 ] || [ -z "$execs" ]; then
  tail -n 60 "$work/log" >&2
  echo "fuzz $name: FAILED (exit $rc); inputs kept in $art" >&2
  exit 1
fi
cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -n1 | cut -d' ' -f2)
inputs=$(ls "$work/corpus" | wc -l)
nseeds=$(ls "$seeds" | wc -l)
line="fuzz $name: $execs executions in $secs s ($((execs / secs))/s), $nseeds seeds, $inputs new inputs, coverage $cov, no crash"
echo "$line"
# deploy/run-tests.sh prints these after the run.
mkdir -p "$(dirname "$bin")/fuzz-results"
echo "$line" > "$(dirname "$bin")/fuzz-results/$name.txt"
