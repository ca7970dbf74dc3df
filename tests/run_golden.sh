#!/bin/sh
# Golden files: the IR printer after chosen passes, the C emitter and the
# CUDA emitter, for
# every model in models/.  UPDATE_GOLDEN=1 rewrites them (for deliberate
# changes; review the diff before committing) from commands that succeed: a
# command that fails is reported and its golden left as it was.
# usage: run_golden.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_golden.sh path/to/duet}
pass=0 fail=0
check() { # name command...
  name=$1; shift
  out=$("$@" 2>&1); rc=$?
  file=tests/golden/$name
  if [ "${UPDATE_GOLDEN:-}" = 1 ]; then
    # a golden records a successful command's output: never an error's
    if [ $rc -ne 0 ]; then
      echo "FAIL $name: not updated: the command exited $rc (a golden records the output of a successful run)"
      printf '%s\n' "$out" | head -20; fail=$((fail + 1)); return
    fi
    printf '%s\n' "$out" > "$file"; echo "updated $file"; pass=$((pass + 1)); return
  fi
  if [ $rc -ne 0 ]; then
    echo "FAIL $name: exit $rc"; printf '%s\n' "$out" | head -20; fail=$((fail + 1)); return
  fi
  if printf '%s\n' "$out" | diff -u "$file" - > /tmp/duet-golden.$$; then
    echo "ok $name"; pass=$((pass + 1))
  else
    echo "FAIL $name (UPDATE_GOLDEN=1 to accept)"; head -40 /tmp/duet-golden.$$; fail=$((fail + 1))
  fi
  rm -f /tmp/duet-golden.$$
}
mkdir -p tests/golden
for m in models/*.model; do
  base=$(basename "$m" .model)
  for p in shape autodiff fuse memplan; do
    check "$base.$p.ir" "$DUET" ir "$m" --after $p
  done
  check "$base.c" "$DUET" emit "$m" --target c
  check "$base.cu" "$DUET" emit "$m" --target cuda
done
# mixed precision: the precision pass's dtypes and casts, and fused 16-bit kernels
check fmnist_mlp.fp16.precision.ir "$DUET" ir models/fmnist_mlp.model --precision fp16 --after precision
check fmnist_mlp.fp16.c "$DUET" emit models/fmnist_mlp.model --precision fp16 --target c
check gpt_kjv.bf16.fuse.ir "$DUET" ir models/gpt_kjv.model --precision bf16 --after fuse
# 16-bit CUDA C: raw-bit storage, the prelude's conversions, paired
# elementwise access, unscale kernels with their overflow flags (fp16),
# half2 kernels (fp16: f16x2 arithmetic and bit operations on pairs)
check fmnist_mlp.fp16.cu "$DUET" emit models/fmnist_mlp.model --precision fp16 --target cuda
check gpt_kjv.fp16.cu "$DUET" emit models/gpt_kjv.model --precision fp16 --target cuda
check gpt_kjv.bf16.cu "$DUET" emit models/gpt_kjv.model --precision bf16 --target cuda
# data parallelism: the all-reduce buckets (small, so that there are four)
check fmnist_mlp.data_parallel.ir "$DUET" ir models/fmnist_mlp.model --data-parallel 2 --bucket-mb 1 --after data_parallel
# pruning: the masks (state initialised to ones) and the prune_mask ops after
# the updates; their kernels in C and CUDA C, in fp32 and after the
# precision pass's reordering (fp16)
check fmnist_mlp.prune.prune.ir "$DUET" ir models/fmnist_mlp.model --prune 0.5 --after prune
check fmnist_mlp.prune.c "$DUET" emit models/fmnist_mlp.model --prune 0.5 --target c
check fmnist_mlp.prune.cu "$DUET" emit models/fmnist_mlp.model --prune 0.5 --target cuda
check fmnist_mlp.prune.fp16.precision.ir "$DUET" ir models/fmnist_mlp.model --prune 0.5 --precision fp16 --after precision
# activation recomputation: the recomputed copies of each block (dropout
# sites kept) before the first backward use, the backward ops reading them
check gpt_tiny_dropout.recompute.ir "$DUET" ir tests/recompute/gpt_tiny_dropout.model --recompute blocks --after recompute
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
