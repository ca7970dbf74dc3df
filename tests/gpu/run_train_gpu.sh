#!/bin/sh
# (ctest label gpu) Training on cuda:0 against the CPU backend:
#  1. fmnist_mlp, one epoch on Fashion-MNIST: the GPU's final test accuracy
#     within 0.5 percentage points of the CPU's (same seed, same data order;
#     the two differ only by float32 summation order, which moves a few of
#     the 10,000 test predictions).
#  2. gpt_kjv, 200 steps on the King James text: every logged training loss
#     (every 10 steps) within 0.02 + 1% of the CPU's (the trajectories drift
#     apart slowly through rounding; both start from the same params).
# Exits 77 (ctest SKIP) with a message when there is no GPU; a missing data
# set is a failure (tests/gpu/run.sh provides them).
# Environment: FMNIST_DIR (default /usr/share/datasets/fashion-mnist),
# KJV_TEXT (default data/kjv.txt), KJV_STEPS (default 200), GPU_DEVICE
# (default cuda; `GPU_DEVICE=cpu` dry-runs this script's parsing on the CPU),
# GPU_QUICK=1 (the fake GPU of tests/run_fakegpu.sh, which emulates kernels
# on the host: the same checks on small work: fmnist_mlp on 2,560 training
# and 1,000 test images, tests/models/gpt_tiny.model for KJV_STEPS
# (default 30) steps instead of gpt_kjv).
# usage: run_train_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_train_gpu.sh path/to/duet}
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_require, gpu_workdir, ok, bad
if [ "${GPU_QUICK:-0}" = 1 ]; then
  KJV_STEPS=${KJV_STEPS:-30} GPT_MODEL=tests/models/gpt_tiny.model
  FMNIST_ARGS="--train-subset 2560 --test-subset 1000" GPT_ARGS="--eval-batches 1"
else
  KJV_STEPS=${KJV_STEPS:-200} GPT_MODEL=models/gpt_kjv.model FMNIST_ARGS= GPT_ARGS=
fi
gpu_require
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
KJV_TEXT=${KJV_TEXT:-data/kjv.txt}
gpu_workdir

# 1. fmnist_mlp accuracy
if [ ! -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
  echo "FAIL fmnist: no Fashion-MNIST in $FMNIST_DIR (set FMNIST_DIR)"; fail=$((fail + 1))
else
  for run in ref:cpu dev:$GPU_DEVICE; do
    r=${run%%:*} d=${run#*:}
    "$DUET" run models/fmnist_mlp.model --devices $d --epochs 1 $FMNIST_ARGS --data "$FMNIST_DIR" --quiet \
      --metrics "$tmp/mlp_$r.jsonl" > "$tmp/mlp_$r.out" 2>&1 || { echo "FAIL fmnist on $d:"; cat "$tmp/mlp_$r.out"; }
  done
  a_cpu=$(grep test_accuracy "$tmp/mlp_ref.jsonl" 2>/dev/null | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/')
  a_gpu=$(grep test_accuracy "$tmp/mlp_dev.jsonl" 2>/dev/null | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/')
  echo "fmnist_mlp 1 epoch: test accuracy cpu $a_cpu, gpu $a_gpu"
  if [ -n "$a_cpu" ] && [ -n "$a_gpu" ] && awk -v a="$a_cpu" -v b="$a_gpu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }'; then
    echo "ok fmnist_accuracy"; pass=$((pass + 1))
  else
    echo "FAIL fmnist_accuracy: |cpu - gpu| > 0.005"; fail=$((fail + 1))
  fi
fi

# 2. gpt_kjv losses over 200 steps
if [ ! -f "$KJV_TEXT" ]; then
  echo "FAIL kjv: no text at $KJV_TEXT (make data, or set KJV_TEXT)"; fail=$((fail + 1))
else
  for run in ref:cpu dev:$GPU_DEVICE; do
    r=${run%%:*} d=${run#*:}
    "$DUET" run $GPT_MODEL --devices $d --steps $KJV_STEPS --log-every 10 --eval-every 100000 $GPT_ARGS \
      --data "$KJV_TEXT" --quiet --metrics "$tmp/kjv_$r.jsonl" > "$tmp/kjv_$r.out" 2>&1 ||
      { echo "FAIL kjv on $d:"; cat "$tmp/kjv_$r.out"; }
    grep '"loss"' "$tmp/kjv_$r.jsonl" 2>/dev/null | sed 's/.*"step":\([0-9]*\).*"loss":\([0-9.e+-]*\).*/\1 \2/' > "$tmp/kjv_$r.txt"
  done
  n=$(wc -l < "$tmp/kjv_ref.txt")
  want=$((KJV_STEPS / 10))
  if [ "$n" -ge "$want" ] && paste "$tmp/kjv_ref.txt" "$tmp/kjv_dev.txt" | awk -v want="$want" '
      { d = $2 - $4; if (d < 0) d = -d; tol = 0.02 + 0.01 * $2
        printf "step %s: loss cpu %s gpu %s%s\n", $1, $2, $4, (d <= tol && $1 == $3) ? "" : "  <- outside tolerance"
        if (!(d <= tol && $1 == $3)) bad++ }
      END { exit bad > 0 || NR < want }'; then
    echo "ok kjv_losses ($n logged steps)"; pass=$((pass + 1))
  else
    echo "FAIL kjv_losses"; fail=$((fail + 1))
  fi
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
