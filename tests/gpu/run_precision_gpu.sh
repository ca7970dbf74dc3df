#!/bin/sh
# (ctest label gpu) Mixed precision on cuda:0: fp16 (with dynamic loss
# scaling) and bf16 runs against the fp32 run on the same GPU:
#  1. fmnist_mlp, one epoch: fp16 and bf16 test accuracy within 1.5 points
#     of fp32's (the CPU's long test asks 0.5 points of a 3-seed mean after
#     5 epochs; one seed after one epoch moves by about a point with any
#     change of the trajectory);
#  2. gpt_kjv, KJV_STEPS (default 400) steps: fp16 and bf16 validation loss
#     within 0.05 nats/byte of fp32's at every evaluation (every 200 steps),
#     as the CPU's long test;
#  3. the speed-up: tokens/s of fp16 and bf16 over fp32 for gpt_kjv and,
#     when GPT2_STEPS > 0 (default 20), gpt2_124m (printed, not checked);
#  4. fp16 loss scaling with 4 micro-batches on the GPU and on the GPU as
#     two pipeline stages, against the CPU (below).
# On a card below sm_80, bf16 must be refused with the error naming the
# card, and is otherwise skipped.  Exits 77 (ctest SKIP) with a message when
# there is no GPU.  Environment: FMNIST_DIR, KJV_TEXT, KJV_STEPS,
# GPT2_STEPS, GPU_DEVICE (as run_train_gpu.sh; GPU_DEVICE=cpu dry-runs the
# script's parsing on the CPU), GPU_QUICK=1 (the fake GPU of
# tests/run_fakegpu.sh: fmnist_mlp on 2,560 training and 1,000 test images,
# tests/models/gpt_tiny.model for KJV_STEPS (default 40) steps evaluated
# every 20 on 2 batches, no gpt2_124m).
# usage: run_precision_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_precision_gpu.sh path/to/duet}
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_require, gpu_workdir, ok, bad
if [ "${GPU_QUICK:-0}" = 1 ]; then
  KJV_STEPS=${KJV_STEPS:-40} GPT2_STEPS=0 GPT_MODEL=tests/models/gpt_tiny.model EVAL="--eval-every 20 --eval-batches 2"
  FMNIST_ARGS="--train-subset 2560 --test-subset 1000"
else
  KJV_STEPS=${KJV_STEPS:-400} GPT2_STEPS=${GPT2_STEPS:-20} GPT_MODEL=models/gpt_kjv.model EVAL="--eval-every 200"
  FMNIST_ARGS=
fi
gpu_require
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
KJV_TEXT=${KJV_TEXT:-data/kjv.txt}
gpu_workdir

# compute capability of cuda:0 ("compute capability 8.0" in duet devices)
cc=$("$DUET" devices | sed -n 's/^cuda:0 .*compute capability \([0-9]*\)\.\([0-9]*\).*/\1\2/p')
[ "$GPU_DEVICE" = cpu ] && cc=90
precs="fp16 bf16"
if [ -n "$cc" ] && [ "$cc" -lt 80 ]; then
  precs=fp16
  "$DUET" run models/fmnist_mlp.model --devices "$GPU_DEVICE" --precision bf16 --steps 1 --data "$FMNIST_DIR" \
    > "$tmp/bf16_refused" 2>&1
  if grep -q "bf16 tensors, which need compute capability 8.0 or later; cuda:0 .* is sm_$cc" "$tmp/bf16_refused"
  then ok "bf16 refused on sm_$cc"; else bad "bf16 on sm_$cc: expected the error naming the card"; cat "$tmp/bf16_refused"; fi
fi

# 1. fmnist_mlp accuracy
acc() { grep test_accuracy "$1" 2>/dev/null | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/'; }
if [ ! -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
  bad "fmnist: no Fashion-MNIST in $FMNIST_DIR (set FMNIST_DIR)"
else
  for p in fp32 $precs; do
    "$DUET" run models/fmnist_mlp.model --devices "$GPU_DEVICE" --precision $p --epochs 1 $FMNIST_ARGS --data "$FMNIST_DIR" \
      --quiet --metrics "$tmp/mlp_$p.jsonl" > "$tmp/mlp_$p.out" 2>&1 || { bad "fmnist $p run"; cat "$tmp/mlp_$p.out"; }
  done
  a32=$(acc "$tmp/mlp_fp32.jsonl")
  for p in $precs; do
    a=$(acc "$tmp/mlp_$p.jsonl")
    echo "fmnist_mlp 1 epoch on $GPU_DEVICE: test accuracy fp32 $a32, $p $a"
    if [ -n "$a32" ] && [ -n "$a" ] && awk -v a="$a32" -v b="$a" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.015) }'
    then ok "fmnist_mlp $p within 1.5 points of fp32"; else bad "fmnist_mlp $p within 1.5 points of fp32"; fi
  done
fi

# 2. gpt_kjv validation loss, 3. tokens/s
val() { sed -n 's/^step \([0-9]*\) | val loss \([0-9.]*\) nats.*/\1 \2/p' "$1"; }
tps() { sed -n 's/^duet: trained .*(\([0-9]*\) tokens\/s).*/\1/p' "$1" | tail -1; }
if [ ! -f "$KJV_TEXT" ]; then
  bad "kjv: no text at $KJV_TEXT (make data, or set KJV_TEXT)"
else
  for p in fp32 $precs; do
    "$DUET" run $GPT_MODEL --devices "$GPU_DEVICE" --precision $p --steps "$KJV_STEPS" $EVAL \
      --log-every 200 --data "$KJV_TEXT" > "$tmp/gpt_$p" 2>&1 || { bad "gpt_kjv $p run"; tail -5 "$tmp/gpt_$p"; }
    val "$tmp/gpt_$p" > "$tmp/val_$p"
  done
  for p in $precs; do
    echo "gpt_kjv validation loss on $GPU_DEVICE (step, fp32, $p):"
    join "$tmp/val_fp32" "$tmp/val_$p" | tee "$tmp/j_$p"
    n=$(wc -l < "$tmp/j_$p")
    if [ "$n" -ge 1 ] && awk '{ d = $2 - $3; if (d > 0.05 || d < -0.05) bad = 1 } END { exit bad }' "$tmp/j_$p"
    then ok "gpt_kjv $p within 0.05 nats of fp32 at $n evaluations"; else bad "gpt_kjv $p within 0.05 nats of fp32"; fi
    echo "speed gpt_kjv $p: $(tps "$tmp/gpt_$p") tokens/s, fp32 $(tps "$tmp/gpt_fp32") tokens/s"
  done
  if [ "$GPT2_STEPS" -gt 0 ] && [ "$GPU_DEVICE" != cpu ]; then
    for p in fp32 $precs; do
      "$DUET" run models/gpt2_124m.model --devices "$GPU_DEVICE" --precision $p --steps "$GPT2_STEPS" \
        --eval-every 100000 --log-every 1000 --data "$KJV_TEXT" > "$tmp/gpt2_$p" 2>&1 ||
        { bad "gpt2_124m $p run"; tail -5 "$tmp/gpt2_$p"; }
      echo "speed gpt2_124m $p: $(tps "$tmp/gpt2_$p") tokens/s ($GPT2_STEPS steps, compile and first steps included)"
    done
  fi
fi
# 4. fp16 loss scaling with micro-batches: a forced overflow from 2^30 with 4
#    micro-batches, on the GPU and on the GPU as two pipeline stages
#    (cuda:0,cuda:0), against the CPU: as many skipped steps (+-1: the step
#    at the edge of fp16's range may go either way with a different
#    summation order) and test accuracy within 1.5 points
skips() { grep -c '^step [0-9]*: gradient overflow' "$1"; }
if [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
  two=cuda:0,cuda:0
  [ "$GPU_DEVICE" = cpu ] && two=cpu:0,cpu:1
  MB="models/fmnist_mlp.model --precision fp16 --micro-batches 4 --loss-scale 1073741824 --steps 60 $FMNIST_ARGS --data $FMNIST_DIR"
  for run in ref:cpu one:$GPU_DEVICE two:$two; do
    r=${run%%:*} dv=${run#*:}
    "$DUET" run $MB --devices "$dv" --metrics "$tmp/mb_$r.jsonl" > "$tmp/mb_$r" 2>&1 || { bad "fp16 micro-batches on $dv"; tail -5 "$tmp/mb_$r"; }
  done
  k0=$(skips "$tmp/mb_ref") a0=$(acc "$tmp/mb_ref.jsonl")
  for r in one two; do
    k=$(skips "$tmp/mb_$r") a=$(acc "$tmp/mb_$r.jsonl")
    echo "fp16, 4 micro-batches, loss scale from 2^30 ($r): $k skipped steps, test accuracy $a; cpu $k0, $a0"
    if [ -n "$a" ] && [ -n "$a0" ] && [ "$k0" -ge 5 ] && awk -v k="$k" -v k0="$k0" -v a="$a" -v a0="$a0" \
         'BEGIN { d = a - a0; if (d < 0) d = -d; e = k - k0; if (e < 0) e = -e; exit !(d <= 0.015 && e <= 1) }'
    then ok "fp16_micro_batches_$r"; else bad "fp16_micro_batches_$r"; fi
  done
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
