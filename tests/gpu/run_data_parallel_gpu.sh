#!/bin/sh
# (ctest label gpu) Data parallelism on GPUs, in one process:
#  1. one GPU acting as two replicas (--devices cuda:0,cuda:0
#     --data-parallel 2: a context, and a stream and arenas per replica; the
#     all-reduce copies each bucket to the host, sums it in replica order
#     and copies it back, through the same collective as virtual CPU
#     devices): gpt_tiny, 3 steps, writes exactly the losses and the
#     checkpoint of `--devices cuda:0 --micro-batches 2` (the same kernels,
#     cuBLAS GEMMs of the same shapes, the same sums: the device's
#     accumulate kernel and the host sum each round once per add), and the
#     replicas' params and optimizer state are bit-identical after every
#     step (DUET_DP_CHECK=1, which reads them back from each replica's GPU
#     memory);
#  2. fp16 with a forced overflow (loss scale 2^30): the same skipped steps,
#     losses and checkpoint as cuda:0 with 2 micro-batches;
#  3. with two GPUs, cuda:0,cuda:1 --data-parallel 2 trains with
#     bit-identical replicas, and, when both GPUs are the same model, with
#     the losses of the cuda:0 run.
# NCCL is not used yet (a later step): this is the shared-memory collective
# with host staging.  Exits 77 (ctest SKIP) with a message when there is no
# GPU; a missing text is a failure (tests/gpu/run.sh provides it).
# Environment: KJV_TEXT (default data/kjv.txt), GPU_DEVICE (default cuda;
# `GPU_DEVICE=cpu` dry-runs the script on virtual CPU devices: cpu:0,cpu:1
# against cpu:0, part 3 skipped).
# usage: run_data_parallel_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_data_parallel_gpu.sh path/to/duet}
GPU_DEVICE=${GPU_DEVICE:-cuda}
if [ "$GPU_DEVICE" != cpu ] && ! "$DUET" devices | grep -q '^cuda:0 '; then
  why=$("$DUET" devices | grep '^cuda')
  case "$why" in
    *"no CUDA driver"*|*"reports no GPU"*|*"CUresult 34)"*|*"CUresult 100)"*) echo "SKIP: no GPU: $why"; exit 77 ;;
  esac
  echo "FAIL: a CUDA driver is present but the GPU backend is unusable: $why"
  exit 1
fi
KJV_TEXT=${KJV_TEXT:-data/kjv.txt}
if [ ! -f "$KJV_TEXT" ]; then
  echo "FAIL: no text at $KJV_TEXT (make data, or set KJV_TEXT)"
  exit 1
fi
if [ "$GPU_DEVICE" = cpu ]; then ONE=cpu:0 TWO=cpu:0,cpu:1 TH_ONE=1; else ONE=cuda:0 TWO=cuda:0,cuda:0 TH_ONE=2; fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
GPT="tests/models/gpt_tiny.model --steps 3 --batch 8 --eval-batches 2 --data $KJV_TEXT"

# run NAME DEVICES THREADS ARGS...: trains (replicas compared every step); keeps output, metrics, checkpoint
run() {
  n=$1 dev=$2 th=$3
  shift 3
  if ! DUET_DP_CHECK=1 "$DUET" run $GPT --devices "$dev" --threads "$th" --metrics "$tmp/$n.jsonl" --save "$tmp/$n.st" \
      "$@" > "$tmp/$n.out" 2>&1; then
    bad "$n: duet run --devices $dev $*"; tail -5 "$tmp/$n.out"
  fi
}
# same REF NAME: identical losses and checkpoint
same() {
  if [ -s "$tmp/$1.st" ] && cmp -s "$tmp/$1.st" "$tmp/$2.st" && cmp -s "$tmp/$1.jsonl" "$tmp/$2.jsonl"; then ok "$2 equals $1"
  else bad "$2 differs from $1"; diff "$tmp/$1.jsonl" "$tmp/$2.jsonl" | head -6; fi
}
# checked NAME: the replicas were bit-identical after every one of the 3 steps
checked() {
  if grep -q "^duet: data-parallel check: the params and optimizer state of the 2 replicas were bit-identical after each of 3 training steps" "$tmp/$1.out"
  then ok "$1 replicas bit-identical"; else bad "$1: no data-parallel check line"; tail -3 "$tmp/$1.out"; fi
}

# 1. one GPU as two replicas
run ref "$ONE" "$TH_ONE" --micro-batches 2
run dp "$TWO" 2 --data-parallel 2
same ref dp
checked dp
# 2. fp16 overflows
run half_ref "$ONE" "$TH_ONE" --micro-batches 2 --precision fp16 --loss-scale 1073741824
run half_dp "$TWO" 2 --data-parallel 2 --precision fp16 --loss-scale 1073741824
same half_ref half_dp
checked half_dp
grep -q 'loss scale .* ([1-9][0-9]* skipped)' "$tmp/half_dp.out" && ok "half_dp skipped steps" || bad "half_dp: no skipped step"

if [ "$GPU_DEVICE" != cpu ]; then
  # 3. two GPUs
  if "$DUET" devices | grep -q '^cuda:1 '; then
    run pair cuda:0,cuda:1 2 --data-parallel 2
    checked pair
    n0=$("$DUET" devices | sed -n 's/^cuda:0  \([^,]*\),.*/\1/p')
    n1=$("$DUET" devices | sed -n 's/^cuda:1  \([^,]*\),.*/\1/p')
    if [ "$n0" = "$n1" ]; then same ref pair
    else echo "cuda:0 ($n0) and cuda:1 ($n1) differ: their losses are not compared"; fi
  else
    echo "skip: one GPU: the cuda:0,cuda:1 checks"
    skipped=1
  fi
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ] || exit 1
[ "${skipped:-0}" = 0 ] || { echo "the cuda:0,cuda:1 part was skipped: exit 77"; exit 77; }
