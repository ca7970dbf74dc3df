#!/bin/sh
# tests/fuzz/run.sh: a bounded libFuzzer run of fuzz_frontend.
#
#   usage: tests/fuzz/run.sh BUILD_DIR [SECONDS]    (default 60 seconds)
#
# BUILD_DIR is a DUET_FUZZ=ON build (`make fuzz` configures and builds it).
# The run starts from a fresh copy of the committed seed corpus in
# BUILD_DIR/fuzz-run/corpus (the committed tests/fuzz/corpus is never
# written), logs to BUILD_DIR/fuzz-run/fuzz.log and prints the number of
# executions.  Any crash, sanitizer report, leak, timeout (10 s per input) or
# running over 2 GiB fails the run; the input is left in BUILD_DIR as
# crash-*, leak-*, timeout-* or oom-* with the command that reproduces it.
set -u
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 BUILD_DIR [SECONDS]" >&2
  exit 2
fi
B=$(cd "$1" && pwd) || exit 2
T=${2:-60}
HERE=$(cd "$(dirname "$0")" && pwd)
FUZZER=$B/fuzz_frontend
if [ ! -x "$FUZZER" ]; then
  echo "$0: $FUZZER is missing (CC=clang cmake -S . -B build-fuzz -DDUET_FUZZ=ON)" >&2
  exit 2
fi

work=$B/fuzz-run
rm -rf "$work"
mkdir -p "$work/corpus" || exit 2
cp "$HERE"/corpus/* "$work/corpus/" || exit 2
seeds=$(ls "$work/corpus" | wc -l)

# UBSan findings abort (the build uses -fno-sanitize-recover=undefined)
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS UBSAN_OPTIONS
echo "fuzz: $T s of fuzz_frontend from $seeds seeds (log: $work/fuzz.log)"
"$FUZZER" "$work/corpus" -dict="$HERE/model.dict" -max_total_time="$T" -max_len=4096 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$B/" \
  > "$work/fuzz.log" 2>&1
rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log" | tail -n 1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/fuzz.log" | tail -n 1)
cov=$(grep -E '^#[0-9]+' "$work/fuzz.log" | tail -n 1)
[ -n "$cov" ] && echo "fuzz: last status: $cov"
echo "fuzz: ${runs:-?} executions, ${rate:-?} per second, corpus $(ls "$work/corpus" | wc -l) inputs"
if [ "$rc" -ne 0 ]; then
  echo "FAIL fuzz: fuzz_frontend exited with status $rc; its report:"
  # from the first line of the report (sanitizer, libFuzzer, duet_fatal, verifier)
  first=$(grep -n -m 1 -E 'ERROR: |runtime error: |internal error|verifier failed|IR verifier' "$work/fuzz.log" | cut -d: -f1)
  if [ -n "$first" ]; then sed -n "$first,\$p" "$work/fuzz.log" | head -n 60; else tail -n 60 "$work/fuzz.log"; fi
  art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$work/fuzz.log" | tail -n 1)
  if [ -n "$art" ]; then
    echo "fuzz: the input is $art; reproduce with:"
    echo "  $FUZZER $art"
    echo "  build/duet check $art"
  fi
  exit 1
fi
echo "ok fuzz"
