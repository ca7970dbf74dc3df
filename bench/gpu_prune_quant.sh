#!/bin/sh
# bench/gpu_prune_quant.sh: what pruning and int8 buy at evaluation time on a
# device (issue 15, item 6).  A benchmark, not a test: it prints a table and
# writes OUT_DIR/bench_prune_quant.json; it asserts nothing about speed.
#
# For fmnist_mlp and fmnist_cnn it trains two checkpoints on DEVICE (STEPS
# steps each, seed 1): a dense one, and one with 50% of the output channels
# pruned (--prune-mode channels --prune 0.5 from step STEPS/2).  Then it
# evaluates all 10,000 test images with `duet run --eval-only
# --metrics-timing` (eval_seconds: the forward passes only, loading,
# compiling and calibration excluded; allocated_bytes: the program's device
# allocation), REPS times each, and reports the fastest:
#   f32             the dense checkpoint, f32 (an f32 program is the training
#                   program: its allocation holds the optimizer state too)
#   fp16            the same, --precision fp16
#   int8            --quantize int8: int8 weights, dequantized before an f32 GEMM
#   int8+act        --quantize int8 --calibrate 4: int8 activations too, the
#                   int8 GEMM (__dp4a from sm_61; a plain loop on sm_60, the P100)
#   50% unstr.      the dense checkpoint evaluated with --prune 0.5 (zeros in
#                   dense tensors: the same kernels, expected no faster)
#   ch50 masked     the channel-pruned checkpoint, masked (full-size layers)
#   ch50 shrunk     the same with --shrink (the pruned channels removed)
# The ratios are against f32 in the same run.  Accuracy is printed beside
# each row so a fast wrong variant shows.
#
# usage: sh bench/gpu_prune_quant.sh [BUILD_DIR [OUT_DIR]]   (from the repository root)
# Environment: DEVICE (default cuda:0; cpu runs the same on the CPU),
# STEPS (default 200), REPS (default 3), FMNIST_DIR, THREADS (--threads,
# for DEVICE=cpu), QUICK=1 (2,560
# training and 1,000 test images: a dry run of the script).
set -u
BUILD=${1:-build}
OUT=${2:-bench}
DUET=$BUILD/duet
DEVICE=${DEVICE:-cuda:0}
STEPS=${STEPS:-200}
REPS=${REPS:-3}
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -x "$DUET" ] || { echo "bench/gpu_prune_quant.sh: no $DUET (build first)" >&2; exit 2; }
[ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ] || { echo "bench/gpu_prune_quant.sh: no Fashion-MNIST in $FMNIST_DIR" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/duet-bench-pq.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT HUP INT TERM
D="--data $FMNIST_DIR --devices $DEVICE --seed 1 --quiet"
[ "${QUICK:-0}" = 1 ] && D="$D --train-subset 2560 --test-subset 1000"
[ -n "${THREADS:-}" ] && D="$D --threads $THREADS"
num() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1" | tail -1; }
status=0
json="$OUT/bench_prune_quant.json"
echo "[" > "$json.tmp"
sep=""
echo "duet --eval-only on $DEVICE, $REPS runs each, the fastest (eval_seconds: forward passes only)"
printf '%-11s %-12s %9s %10s %12s %8s %14s %8s\n' model variant accuracy seconds samples/s "x f32" allocated "x f32"
for model in fmnist_mlp fmnist_cnn; do
  M=models/$model.model
  half=$((STEPS / 2))
  "$DUET" run $M $D --steps "$STEPS" --save "$tmp/$model.dense.st" > "$tmp/$model.train.log" 2>&1 &&
  "$DUET" run $M $D --steps "$STEPS" --prune-mode channels --prune 0.5 --prune-start "$half" \
    --save "$tmp/$model.ch.st" >> "$tmp/$model.train.log" 2>&1 ||
    { echo "training $model on $DEVICE failed:"; tail -5 "$tmp/$model.train.log"; status=1; continue; }
  t32="" b32=""
  for v in "f32|dense|" "fp16|dense|--precision fp16" "int8|dense|--quantize int8" \
           "int8+act|dense|--quantize int8 --calibrate 4" "50% unstr.|dense|--prune 0.5" \
           "ch50 masked|ch|--prune-mode channels --prune 0.5" "ch50 shrunk|ch|--prune-mode channels --prune 0.5 --shrink"; do
    name=${v%%|*} rest=${v#*|}; ck=${rest%%|*} flags=${rest#*|}
    best="" acc="" bytes=""
    r=0
    while [ $r -lt "$REPS" ]; do
      r=$((r + 1))
      # shellcheck disable=SC2086
      if ! "$DUET" run $M $D --eval-only --checkpoint "$tmp/$model.$ck.st" $flags --metrics-timing \
           --metrics "$tmp/m.jsonl" > "$tmp/eval.log" 2>&1; then
        echo "$model $name: the evaluation failed:"; tail -3 "$tmp/eval.log"; status=1; best=""; break
      fi
      s=$(num "$tmp/m.jsonl" eval_seconds)
      acc=$(num "$tmp/m.jsonl" test_accuracy) bytes=$(num "$tmp/m.jsonl" allocated_bytes)
      best=$(awk -v a="$best" -v b="$s" 'BEGIN { print (a == "" || b + 0 < a + 0) ? b : a }')
    done
    [ -n "$best" ] || continue
    [ "$name" = f32 ] && t32=$best b32=$bytes
    awk -v m="$model" -v v="$name" -v a="$acc" -v s="$best" -v b="$bytes" -v t="$t32" -v bb="$b32" \
        -v q="$( [ "${QUICK:-0}" = 1 ] && echo 1000 || echo 10000)" 'BEGIN {
      printf "%-11s %-12s %8.2f%% %10.4f %12.0f %8.2f %14d %8.2f\n", m, v, 100 * a, s, q / s, t / s, b, b / bb }'
    printf '%s  {"model":"%s","variant":"%s","flags":"%s","test_accuracy":%s,"eval_seconds":%s,"allocated_bytes":%s}' \
      "$sep" "$model" "$name" "$flags" "$acc" "$best" "$bytes" >> "$json.tmp"
    sep=",
"
  done
done
printf '\n]\n' >> "$json.tmp" && mv "$json.tmp" "$json"
echo "(x f32: f32's seconds / the variant's, so above 1 is faster; allocated / f32's allocation)"
echo "wrote $json"
exit $status
