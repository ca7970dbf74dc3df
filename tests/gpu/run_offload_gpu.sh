#!/bin/sh
# (ctest label gpu) Optimizer offload on GPUs (--offload optimizer,
# runtime/offload.c): the optimizer state and the f32 master params in
# page-locked host memory, the update on the host with the C kernels.
#  1. cuda:0 with offload trains gpt_tiny (fp32, 2 steps, 2 micro-batches)
#     to the losses of cuda:0 without it within 1e-5 relative (the host's
#     AdamW is the C kernel, the device's the CUDA one: the same formula,
#     compiled by two compilers that may contract a*b+c differently), and
#     says its host memory is page-locked;
#  2. exactly (losses and checkpoint): cuda:0,cuda:0 (two stages, 1F1B) and
#     cuda:0 with offload (the host update and the device kernels are the
#     same in both), also in fp16 with dynamic loss scaling (started at
#     2^30: steps are skipped);
#  3. checkpoints: 1 step with offload, resumed with offload to 2, ends in
#     the uninterrupted run's checkpoint (resuming across offload and not:
#     tests/run_offload.sh);
#  4. cpu:0,cuda:0 (a CPU stage and a GPU stage) with offload trains.
# Exits 77 (ctest SKIP) with a message when there is no GPU; a missing text
# is a failure (tests/gpu/run.sh provides it).
# Environment: KJV_TEXT (default data/kjv.txt), GPU_DEVICE (default cuda;
# `GPU_DEVICE=cpu` dry-runs this script on virtual CPU devices, where the
# comparison of part 1 is exact and the memory is not page-locked).
# usage: run_offload_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_offload_gpu.sh path/to/duet}
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_require, gpu_workdir, ok, bad
gpu_require
KJV_TEXT=${KJV_TEXT:-data/kjv.txt}
if [ ! -f "$KJV_TEXT" ]; then
  echo "FAIL: no text at $KJV_TEXT (make data, or set KJV_TEXT)"
  exit 1
fi
# (on CPUs one device runs with 1 thread, as each of two stages: OpenBLAS sums alike)
if [ "$GPU_DEVICE" = cpu ]; then ONE=cpu:0 TWO=cpu:0,cpu:1 MIXED= PINNED="host memory" TH_ONE=1
else ONE=cuda:0 TWO=cuda:0,cuda:0 MIXED=cpu:0,cuda:0 PINNED="page-locked host memory" TH_ONE=2; fi
gpu_workdir
GPT="tests/models/gpt_tiny.model --batch 8 --eval-batches 2 --micro-batches 2 --data $KJV_TEXT"

# run NAME DEVICES ARGS...: trains; keeps the output, metrics and checkpoint
run() {
  n=$1 dev=$2
  shift 2
  th=2
  [ "$dev" = "$ONE" ] && th=$TH_ONE
  if ! "$DUET" run $GPT --devices "$dev" --threads $th --metrics "$tmp/$n.jsonl" --save "$tmp/$n.st" "$@" \
      > "$tmp/$n.out" 2>&1; then
    bad "$n: duet run --devices $dev $*"; tail -5 "$tmp/$n.out"
  fi
}
same() {
  if [ -s "$tmp/$1.st" ] && cmp -s "$tmp/$1.st" "$tmp/$2.st" && cmp -s "$tmp/$1.jsonl" "$tmp/$2.jsonl"; then ok "$2 equals $1"
  else bad "$2 differs from $1"; diff "$tmp/$1.jsonl" "$tmp/$2.jsonl" | head -6; fi
}
losses() { sed -n 's/.*"loss":\([^,}]*\).*/\1/p' "$tmp/$1.jsonl"; }

# 1. offload against the device's own update
run ref "$ONE" --steps 2
run off "$ONE" --steps 2 --offload optimizer
losses ref > "$tmp/l.ref"; losses off > "$tmp/l.off"
if [ "$(wc -l < "$tmp/l.ref")" = 2 ] && paste "$tmp/l.ref" "$tmp/l.off" |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (!(d <= 1e-5 * ($1 < 0 ? -$1 : $1))) bad = 1 } END { exit bad }'; then
  ok "offload losses within 1e-5 of the device update's"
else bad "offload losses differ from the device update's:"; paste "$tmp/l.ref" "$tmp/l.off"; fi
if grep -q "^duet: optimizer offload: .* in $PINNED, the update on the CPU" "$tmp/off.out"; then ok "memory line"
else bad "memory line: want '$PINNED' in:"; grep '^duet: optimizer offload' "$tmp/off.out"; fi

# 2. two stages against one device, both offloaded; fp16 too
run two "$TWO" --steps 2 --offload optimizer --schedule 1f1b
same off two
run off16 "$ONE" --steps 2 --offload optimizer --precision fp16 --loss-scale 1073741824
run two16 "$TWO" --steps 2 --offload optimizer --precision fp16 --loss-scale 1073741824
same off16 two16
if grep -q 'skipped)' "$tmp/off16.out" && ! grep -q '(0 skipped)$' "$tmp/off16.out"; then ok "fp16 skipped steps"
else bad "fp16: no step skipped:"; grep '^step' "$tmp/off16.out"; fi

# 3. checkpoints
run half "$ONE" --steps 1 --offload optimizer
run resumed "$ONE" --steps 2 --offload optimizer --resume "$tmp/half.st"
if cmp -s "$tmp/off.st" "$tmp/resumed.st"; then ok "resume with offload"; else bad "resume with offload differs"; fi

# 4. a CPU stage and a GPU stage
if [ -n "$MIXED" ]; then
  run mixed "$MIXED" --steps 2 --offload optimizer
  if [ -s "$tmp/mixed.st" ]; then ok "cpu:0,cuda:0 with offload"; fi
fi

echo "offload gpu: $pass passed, $fail failed"
[ $fail = 0 ]
