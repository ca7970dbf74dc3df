#!/bin/sh
# bench/run_dp.sh: data-parallel scaling on the CPU, gpt_kjv from 1 to 2
# ranks (1 thread each, the same global batch of 16 windows), duet over MPI
# (mpirun --mca btl tcp,self: the TCP transport separate machines use)
# against PyTorch DistributedDataParallel over gloo (bench/gpt_kjv_ddp.py),
# in the same run, rounds interleaved (each round runs every configuration
# once), medians and spread (min..max) printed.  Also duet's communication
# time and the fraction hidden behind the backward pass (DUET_PROFILE=1's
# all-reduce line), with the default buckets (25 MiB: one bucket, at the end
# of the backward pass) and with --bucket-mb 1.  A benchmark, not a test.
# Run from the repository root (make bench-dp does, after make data):
#
#     sh bench/run_dp.sh
#
# Environment: STEPS (default 20), ROUNDS (default 3), BUILD_DIR (default
# build), PYTHON (default: the first of python3, /usr/bin/python3 that can
# import torch).  About 5 minutes on 2 cores.
set -eu

STEPS=${STEPS:-20}
ROUNDS=${ROUNDS:-3}
BUILD_DIR=${BUILD_DIR:-build}
MODEL=models/gpt_kjv.model
DATA=data/kjv.txt
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self"
OMP_WAIT_POLICY=PASSIVE
export OMP_WAIT_POLICY

if [ ! -f "$MODEL" ] || [ ! -d bench ]; then
  echo "bench/run_dp.sh: run me from the repository root" >&2
  exit 2
fi
if [ ! -f "$DATA" ]; then
  echo "bench/run_dp.sh: $DATA missing; 'make data' writes it" >&2
  exit 2
fi
if ! command -v mpirun > /dev/null 2>&1; then
  echo "bench/run_dp.sh: mpirun missing (apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 2
fi

. bench/common.sh
py=""
for cand in ${PYTHON:-python3 /usr/bin/python3}; do
  if command -v "$cand" > /dev/null 2>&1 && "$cand" -c 'import torch, numpy' > /dev/null 2>&1; then
    py=$cand
    break
  fi
done
[ -n "$py" ] || echo "bench: no python3 with torch (apt-get install python3-torch): duet alone"
interference_start

DUET_ARGS="run $MODEL --steps $STEPS --no-eval --threads 1 --log-every $STEPS --data $DATA"
"$BUILD_DIR/duet" run "$MODEL" --steps 1 --no-eval --threads 1 --quiet --data "$DATA" > /dev/null # compile/cache kernels
"$BUILD_DIR/duet" run "$MODEL" --steps 1 --no-eval --threads 1 --quiet --data "$DATA" --data-parallel 2 > /dev/null
echo "bench: gpt_kjv, global batch 16 x 128 tokens, $STEPS steps a run, $ROUNDS rounds, 1 thread per rank"
echo "bench: duet 1:    $BUILD_DIR/duet $DUET_ARGS"
echo "bench: duet 2:    DUET_PROFILE=1 $MPIRUN -np 2 $BUILD_DIR/duet $DUET_ARGS"
echo "bench: duet 2/1M: the same with --bucket-mb 1"
[ -n "$py" ] && echo "bench: torch 1:   $py bench/gpt_kjv_ddp.py --procs 1 --steps $STEPS"
[ -n "$py" ] && echo "bench: torch 2:   $py bench/gpt_kjv_ddp.py --procs 2 --steps $STEPS  (DDP, gloo)"
for f in d1 d2 d2b t1 t2 comm2 hid2 comm2b hid2b tcomm; do : > "$tmp/$f"; done
r=0
while [ "$r" -lt "$ROUNDS" ]; do
  r=$((r + 1))
  # shellcheck disable=SC2086
  "$BUILD_DIR/duet" $DUET_ARGS 2>&1 | rate_of tokens >> "$tmp/d1"
  # shellcheck disable=SC2086
  DUET_PROFILE=1 $MPIRUN -np 2 "$BUILD_DIR/duet" $DUET_ARGS > "$tmp/out" 2>&1
  rate_of tokens < "$tmp/out" >> "$tmp/d2"
  sed -n 's/.*rank 0: all-reduce profile .*; \([0-9.]*\) ms per step with a bucket in flight .* \([0-9]*\)% hidden.*/\1 \2/p' "$tmp/out" > "$tmp/prof"
  cut -d' ' -f1 "$tmp/prof" >> "$tmp/comm2"
  cut -d' ' -f2 "$tmp/prof" >> "$tmp/hid2"
  # shellcheck disable=SC2086
  DUET_PROFILE=1 $MPIRUN -np 2 "$BUILD_DIR/duet" $DUET_ARGS --bucket-mb 1 > "$tmp/out" 2>&1
  rate_of tokens < "$tmp/out" >> "$tmp/d2b"
  sed -n 's/.*rank 0: all-reduce profile .*; \([0-9.]*\) ms per step with a bucket in flight .* \([0-9]*\)% hidden.*/\1 \2/p' "$tmp/out" > "$tmp/prof"
  cut -d' ' -f1 "$tmp/prof" >> "$tmp/comm2b"
  cut -d' ' -f2 "$tmp/prof" >> "$tmp/hid2b"
  if [ -n "$py" ]; then
    timeout 900 "$py" bench/gpt_kjv_ddp.py --procs 1 --steps "$STEPS" 2>&1 | rate_of tokens >> "$tmp/t1"
    timeout 900 "$py" bench/gpt_kjv_ddp.py --procs 2 --steps "$STEPS" > "$tmp/out" 2>&1 || true
    rate_of tokens < "$tmp/out" >> "$tmp/t2"
    sed -n 's/^torch: all_reduce of .*: \([0-9.]*\) ms$/\1/p' "$tmp/out" >> "$tmp/tcomm"
  fi
  echo "bench: round $r: duet $(tail -1 "$tmp/d1") -> $(tail -1 "$tmp/d2") (1 MiB buckets $(tail -1 "$tmp/d2b")) tokens/s;" \
    "torch $(tail -1 "$tmp/t1" 2> /dev/null) -> $(tail -1 "$tmp/t2" 2> /dev/null) tokens/s"
done
interference_end

# "median (min..max)"
stat() { printf '%s (%s..%s)' "$(median < "$1")" "$(sort -n "$1" | head -1)" "$(sort -n "$1" | tail -1)"; }
ratio() { awk -v a="$(median < "$1")" -v b="$(median < "$2")" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else printf "n/a" }'; }
echo
echo "tokens/s, median (min..max) of $ROUNDS rounds:"
echo "  duet 1 process:                 $(stat "$tmp/d1")"
echo "  duet 2 ranks (MPI, TCP):        $(stat "$tmp/d2")   scaling $(ratio "$tmp/d2" "$tmp/d1")x"
echo "  duet 2 ranks, --bucket-mb 1:    $(stat "$tmp/d2b")   scaling $(ratio "$tmp/d2b" "$tmp/d1")x"
if [ -n "$py" ]; then
  echo "  torch 1 process:                $(stat "$tmp/t1")"
  echo "  torch 2 processes (DDP, gloo):  $(stat "$tmp/t2")   scaling $(ratio "$tmp/t2" "$tmp/t1")x"
  echo "  duet / torch: 1 process $(ratio "$tmp/d1" "$tmp/t1")x, 2 ranks $(ratio "$tmp/d2" "$tmp/t2")x (1 MiB buckets $(ratio "$tmp/d2b" "$tmp/t2")x)"
  [ -s "$tmp/tcomm" ] && echo "  torch: one gloo all_reduce of the gradients: $(stat "$tmp/tcomm") ms"
fi
echo "duet all-reduce per step (rank 0, DUET_PROFILE=1): time with a bucket in flight (overlapping buckets once), and the part hidden"
echo "behind the backward pass (not waited for before the optimizer):"
echo "  25 MiB buckets (1 bucket): $(stat "$tmp/comm2") ms, hidden $(stat "$tmp/hid2") %"
echo "  1 MiB buckets (21):        $(stat "$tmp/comm2b") ms, hidden $(stat "$tmp/hid2b") %"
echo "other processes used ${others} CPU s during the benchmark (steal ${steal} s); on 2 cores with 2 ranks of 1 thread each, any other load slows the ranks"
