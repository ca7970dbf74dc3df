#!/bin/sh
# (ctest label gpu) 8-bit AdamW state (--optimizer-state int8) on cuda:0:
#  1. fmnist_mlp, one epoch: the GPU's test accuracy within 0.5 points of
#     the CPU's with the same state (as gpu_train);
#  2. exact resume on the GPU: 12 steps, then resumed to 25, prints the
#     losses of 25 uninterrupted steps and writes the same checkpoint byte for
#     byte (the codes and scales round-trip; cuBLAS and the adamw8 kernel are
#     deterministic for a given card and launch);
#  3. the checkpoint holds U8 codes and F32 scales.
# The adamw8 kernel itself is checked bit for bit against the C kernel on
# the host emulator (cuda_emu); this runs the real plugin, NVRTC and card.
# Exits 77 (ctest SKIP) with a message when there is no GPU; a missing data
# set is a failure.  Environment: FMNIST_DIR, GPU_DEVICE (default cuda;
# cpu dry-runs the script), GPU_QUICK=1 (the fake GPU of
# tests/run_fakegpu.sh: 2,560 training and 1,000 test images).
# usage: run_adamw8_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_adamw8_gpu.sh path/to/duet}
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_fmnist (ARGS, FMNIST_DIR), gpu_workdir, ok, bad
gpu_fmnist
gpu_workdir
M="models/fmnist_mlp.model --optimizer-state int8 --data $FMNIST_DIR --quiet"

# 1. accuracy against the CPU
for run in ref:cpu dev:$GPU_DEVICE; do
  r=${run%%:*} d=${run#*:}
  "$DUET" run $M --devices $d --epochs 1 $ARGS --metrics "$tmp/$r.jsonl" > "$tmp/$r.out" 2>&1 || { bad "run on $d"; cat "$tmp/$r.out"; }
done
a_cpu=$(grep test_accuracy "$tmp/ref.jsonl" 2>/dev/null | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/')
a_gpu=$(grep test_accuracy "$tmp/dev.jsonl" 2>/dev/null | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/')
echo "fmnist_mlp 1 epoch, 8-bit AdamW state: test accuracy cpu $a_cpu, gpu $a_gpu"
if [ -n "$a_cpu" ] && [ -n "$a_gpu" ] && awk -v a="$a_cpu" -v b="$a_gpu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }'
then ok accuracy; else bad "accuracy: |cpu - gpu| > 0.005"; fi

# 2. exact resume on the GPU
E="--devices $GPU_DEVICE --train-subset 2560 --no-eval --log-every 1"
"$DUET" run $M $E --steps 25 --metrics "$tmp/a.jsonl" --save "$tmp/a.st" > /dev/null 2>&1 &&
  "$DUET" run $M $E --steps 12 --save "$tmp/ck.st" --metrics "$tmp/b.jsonl" > /dev/null 2>&1 &&
  "$DUET" run $M $E --steps 25 --resume "$tmp/ck.st" --metrics "$tmp/b.jsonl" --save "$tmp/b.st" > /dev/null 2>&1 &&
  cmp -s "$tmp/a.jsonl" "$tmp/b.jsonl" && cmp -s "$tmp/a.st" "$tmp/b.st" && ok resume_exact ||
  { bad resume_exact; diff "$tmp/a.jsonl" "$tmp/b.jsonl" | head -5; }

# 3. the state in the checkpoint
if [ -s "$tmp/a.st" ]; then
  hl=$(od -An -tu8 -N8 "$tmp/a.st" | tr -d ' \n')
  head -c $((8 + hl)) "$tmp/a.st" | tail -c +9 > "$tmp/header"
  grep -qF '"linear1.w.exp_avg.codes":{"dtype":"U8","shape":[784,1024]' "$tmp/header" &&
    grep -qF '"linear1.w.exp_avg_sq.absmax":{"dtype":"F32","shape":[392]' "$tmp/header" && ok checkpoint_state ||
    bad checkpoint_state
else
  bad "checkpoint_state: no checkpoint"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
