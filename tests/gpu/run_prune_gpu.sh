#!/bin/sh
# (ctest label gpu) Pruning on cuda:0 against the CPU backend:
#  1. fmnist_mlp, one epoch, 50% unstructured after 5 steps (AdamW): the
#     GPU's test accuracy within 0.5 points of the CPU's (as gpu_train), and
#     in the GPU's checkpoint every pruned weight and its AdamW state is
#     +0.0 with exactly half of each layer pruned (prune_check);
#  2. the same with SGD + momentum in fp16 and 2:4: the checkpoint's master
#     weights and momentum buffers (prune_check --nm 2:4).
# Exits 77 (ctest SKIP) with a message when there is no GPU; a missing data
# set is a failure.  Environment: FMNIST_DIR, GPU_DEVICE (default cuda;
# cpu dry-runs the script), GPU_QUICK=1 (the fake GPU of
# tests/run_fakegpu.sh: 2,560 training and 1,000 test images).
# usage: run_prune_gpu.sh path/to/duet   (from the repository root; prune_check
# next to it in tests/)
DUET=${1:?usage: run_prune_gpu.sh path/to/duet}
CHECK=$(dirname "$DUET")/tests/prune_check
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_fmnist (ARGS, FMNIST_DIR), gpu_workdir, ok, bad
gpu_fmnist
[ -x "$CHECK" ] || { echo "FAIL: no $CHECK"; exit 1; }
gpu_workdir
M=models/fmnist_mlp.model

# 1. accuracy against the CPU, and the GPU's checkpoint
for run in ref:cpu dev:$GPU_DEVICE; do
  r=${run%%:*} d=${run#*:}
  "$DUET" run $M --devices $d --epochs 1 $ARGS --data "$FMNIST_DIR" --quiet --prune 0.5 --prune-start 5 \
    --metrics "$tmp/$r.jsonl" --save "$tmp/$r.st" > "$tmp/$r.out" 2>&1 || { bad "run on $d"; cat "$tmp/$r.out"; }
done
a_cpu=$(grep test_accuracy "$tmp/ref.jsonl" 2>/dev/null | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/')
a_gpu=$(grep test_accuracy "$tmp/dev.jsonl" 2>/dev/null | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/')
echo "fmnist_mlp 1 epoch, 50% pruned: test accuracy cpu $a_cpu, gpu $a_gpu"
if [ -n "$a_cpu" ] && [ -n "$a_gpu" ] && awk -v a="$a_cpu" -v b="$a_gpu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }'
then ok accuracy; else bad "accuracy: |cpu - gpu| > 0.005"; fi
"$CHECK" "$tmp/dev.st" --sparsity 0.5 --masks 3 > "$tmp/check1" 2>&1 && ok regrowth_adamw || { bad regrowth_adamw; cat "$tmp/check1"; }

# 2. SGD with momentum, fp16, 2:4
sed 's/optimizer = adamw(.*)/optimizer = sgd(lr = 0.05, momentum = 0.9, weight_decay = 0.01)/' $M > "$tmp/sgd.model"
"$DUET" run "$tmp/sgd.model" --devices $GPU_DEVICE --steps 20 --train-subset 2560 --no-eval --data "$FMNIST_DIR" --quiet \
  --precision fp16 --prune-mode 2:4 --prune-start 5 --save "$tmp/sgd.st" > "$tmp/sgd.out" 2>&1 || { bad "sgd run"; cat "$tmp/sgd.out"; }
"$CHECK" "$tmp/sgd.st" --nm 2:4 --sparsity 0.5 --masks 3 > "$tmp/check2" 2>&1 && ok regrowth_sgd_fp16_2_4 ||
  { bad regrowth_sgd_fp16_2_4; cat "$tmp/check2"; }
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
