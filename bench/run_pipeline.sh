#!/bin/sh
# bench/run_pipeline.sh: pipeline efficiency of duet's micro-batch pipeline
# on the CPU.  gpt_kjv (models/gpt_kjv.model) trains
#   A. on one device with THREADS cores (no micro-batches, and with the same
#      M micro-batches as B, so that B's only extra cost is the pipeline), and
#   B. on two virtual devices (--devices cpu:0,cpu:1) with THREADS/2 cores
#      each, M micro-batches, GPipe and 1F1B.
# Pipeline efficiency = tokens/s of B / tokens/s of A with the same M: 1.0
# means the two stages keep their cores as busy as one device does.  The
# ideal with a perfectly balanced split is 1 - bubble = M / (M + S - 1),
# times the split's balance (duet plan prints both).  A benchmark, not a
# test: it never fails on a slow result.  From the repository root:
#
#     sh bench/run_pipeline.sh
#
# Environment: STEPS (default 20), RUNS (default 3), THREADS (default 2),
# M (micro-batches, default 8), BUILD_DIR (default build).  About 2-3
# minutes on 2 cores.
set -eu

STEPS=${STEPS:-20}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
M=${M:-8}
BUILD_DIR=${BUILD_DIR:-build}
MODEL=models/gpt_kjv.model
OMP_WAIT_POLICY=PASSIVE
export OMP_WAIT_POLICY

if [ ! -f "$MODEL" ] || [ ! -d bench ]; then
  echo "bench/run_pipeline.sh: run me from the repository root" >&2
  exit 2
fi
if [ ! -f data/kjv.txt ]; then
  echo "bench/run_pipeline.sh: data/kjv.txt missing; 'make data' writes it" >&2
  exit 2
fi

. bench/common.sh
interference_start

# best-of-RUNS median tokens/s of `duet run MODEL ARGS`
measure() {
  "$BUILD_DIR/duet" run "$MODEL" --steps 2 --no-eval --quiet "$@" >/dev/null # compile/cache kernels
  : >"$tmp/rates"
  i=0
  while [ "$i" -lt "$RUNS" ]; do
    i=$((i + 1))
    "$BUILD_DIR/duet" run "$MODEL" --steps "$STEPS" --no-eval --quiet "$@" | rate_of tokens >>"$tmp/rates"
  done
  median <"$tmp/rates"
}

echo "bench: gpt_kjv, $STEPS steps, median of $RUNS runs, $THREADS cores, M = $M"
one=$(measure --threads "$THREADS")
echo "  one device, $THREADS cores:                        $one tokens/s"
one_m=$(measure --threads "$THREADS" --micro-batches "$M")
echo "  one device, $THREADS cores, $M micro-batches:       $one_m tokens/s"
gp=$(measure --threads "$THREADS" --micro-batches "$M" --devices cpu:0,cpu:1)
echo "  cpu:0,cpu:1 ($((THREADS / 2)) core each), gpipe, $M micro-batches: $gp tokens/s"
fb=$(measure --threads "$THREADS" --micro-batches "$M" --devices cpu:0,cpu:1 --schedule 1f1b)
echo "  cpu:0,cpu:1 ($((THREADS / 2)) core each), 1f1b, $M micro-batches:  $fb tokens/s"
"$BUILD_DIR/duet" plan "$MODEL" --devices cpu:0,cpu:1 --threads "$THREADS" --micro-batches "$M" |
  grep -E '^(bubble|estimated step)' | sed 's/^/  plan: /'
# predicted (duet plan) against measured (DUET_PROFILE=1) time per stage
"$BUILD_DIR/duet" plan "$MODEL" --devices cpu:0,cpu:1 --threads "$THREADS" --micro-batches "$M" |
  sed -n 's/^  estimated time: .*; \([0-9.]*\) ms per step$/\1/p' >"$tmp/pred"
DUET_PROFILE=1 "$BUILD_DIR/duet" run "$MODEL" --steps "$STEPS" --no-eval --quiet --threads "$THREADS" \
  --micro-batches "$M" --devices cpu:0,cpu:1 2>&1 >/dev/null | sed -n 's/^  stage \([0-9]*\): computing \([0-9.]*\), waiting for transfers \([0-9.]*\)$/\1 \2 \3/p' >"$tmp/meas"
paste "$tmp/pred" "$tmp/meas" | awk '{ printf "  stage %d: predicted %.1f ms per step, measured %.1f computing + %.1f waiting\n", $2, $1, $3, $4 }'
awk -v a="$one" -v am="$one_m" -v g="$gp" -v f="$fb" 'BEGIN {
  printf "  pipeline efficiency (vs one device, same micro-batches): gpipe %.2f, 1f1b %.2f\n", g / am, f / am
  printf "  against one device without micro-batches:                gpipe %.2f, 1f1b %.2f\n", g / a, f / a
}'
interference_end
echo "  other processes used $others CPU seconds meanwhile (steal $steal s): figures are skewed when that is large"
