#!/bin/sh
# (ctest label gpu) --shrink on cuda:0 (issue 15, items 1 and 6): a
# checkpoint of fmnist_mlp trained on the CPU (20 steps, --prune-mode
# channels --prune 0.5 --prune-start 10) evaluated on the GPU with and
# without --shrink: the same test accuracy, the test loss within 1e-5
# relative (the shrunk GEMMs sum fewer terms, the removed ones zeros), the
# shrunk parameter line, and within 0.5 points of the CPU's --shrink
# evaluation (cuBLAS and OpenBLAS sum in other orders).  The shrunk
# kernels are checked against the C kernels on the host emulator
# (cuda_emu shrink); this runs the real plugin, NVRTC and card.
# Exits 77 (ctest SKIP) with a message when there is no GPU.  Environment:
# FMNIST_DIR, GPU_DEVICE (default cuda; cpu dry-runs the script),
# GPU_QUICK=1 (the fake GPU: 2,560 training and 1,000 test images).
# usage: run_shrink_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_shrink_gpu.sh path/to/duet}
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_fmnist (ARGS, FMNIST_DIR), gpu_workdir, ok, bad
gpu_fmnist
gpu_workdir
M=models/fmnist_mlp.model
F="--data $FMNIST_DIR $ARGS"
P="--prune-mode channels --prune 0.5"
val() { sed "s/.*\"$2\":\([0-9.e-]*\).*/\1/" "$1"; }

"$DUET" run $M $F $P --prune-start 10 --quiet --steps 20 --no-eval --save "$tmp/ck.st" > "$tmp/train.out" 2>&1 ||
  { bad train; cat "$tmp/train.out"; }
for run in masked:$GPU_DEVICE: shrunk:$GPU_DEVICE:--shrink cpu:cpu:--shrink; do
  r=${run%%:*} rest=${run#*:} d=${rest%%:*} s=${rest#*:}
  "$DUET" run $M $F --devices $d --eval-only --checkpoint "$tmp/ck.st" $P $s --metrics "$tmp/$r.jsonl" \
    > "$tmp/$r.out" 2>&1 || { bad "evaluation $r on $d"; cat "$tmp/$r.out"; }
done
echo "fmnist_mlp 20 steps, channels 0.5: test accuracy / loss on $GPU_DEVICE $(val "$tmp/masked.jsonl" test_accuracy) / $(val "$tmp/masked.jsonl" test_loss), --shrink $(val "$tmp/shrunk.jsonl" test_accuracy) / $(val "$tmp/shrunk.jsonl" test_loss); cpu --shrink $(val "$tmp/cpu.jsonl" test_accuracy)"
if [ "$(val "$tmp/masked.jsonl" test_accuracy)" = "$(val "$tmp/shrunk.jsonl" test_accuracy)" ] &&
   awk -v a="$(val "$tmp/masked.jsonl" test_loss)" -v b="$(val "$tmp/shrunk.jsonl" test_loss)" \
     'BEGIN { r = (a - b) / b; if (r < 0) r = -r; exit !(a > 0 && r <= 1e-5) }'
then ok shrink_same; else bad "shrink_same: --shrink changed the GPU's evaluation"; fi
if awk -v a="$(val "$tmp/cpu.jsonl" test_accuracy)" -v b="$(val "$tmp/shrunk.jsonl" test_accuracy)" \
     'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.005) }'
then ok shrink_cpu; else bad "shrink_cpu: |cpu - gpu| > 0.005"; fi
grep -q "^duet: shrunk (--shrink): 669706 parameters in 2678824 bytes (1863690 in 7454760 before)" "$tmp/shrunk.out" &&
  ok shrink_params || bad shrink_params
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
