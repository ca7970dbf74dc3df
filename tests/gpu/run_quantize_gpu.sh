#!/bin/sh
# (ctest label gpu) int8 weights on cuda:0 (issue 15, items 2, 3 and 6):
#  1. a checkpoint of fmnist_mlp (CPU, 20 steps) evaluated with
#     --eval-only --quantize int8 on the GPU: test accuracy within 0.5
#     points of the CPU's int8 evaluation (cuBLAS and OpenBLAS sum in other
#     orders) and the line of its weights' bytes;
#  2. quantization-aware training on the GPU (the model with `quantize {
#     weights = int8, mode = qat }`, 20 steps): its checkpoint evaluated
#     with --quantize int8 on the GPU gives the accuracy the QAT run
#     reported, bit for bit (the same int8 weights reach the same GEMMs);
#  3. duet compile --devices cuda --quantize int8 --checkpoint CK: the
#     executable's embedded int8 weights, copied to the device at load,
#     evaluate as duet run --eval-only --checkpoint CK --quantize int8 on
#     the device does (its --metrics byte for byte).
# The dequantize and fake_quantize kernels are checked against the C
# kernels on the host emulator (cuda_emu quantize, qat); this runs the real
# plugin, NVRTC and card.  On the P100 (sm_60, no DP4A) int8 saves memory
# only: the GEMMs run in f32 (or fp16) after the dequantize kernel.
# Exits 77 (ctest SKIP) with a message when there is no GPU.  Environment:
# FMNIST_DIR, GPU_DEVICE (default cuda; cpu dry-runs the script),
# GPU_QUICK=1 (the fake GPU: 2,560 training and 1,000 test images).
# usage: run_quantize_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_quantize_gpu.sh path/to/duet}
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_fmnist (ARGS, FMNIST_DIR), gpu_workdir, ok, bad
gpu_fmnist
gpu_workdir
M=models/fmnist_mlp.model
F="--data $FMNIST_DIR $ARGS"
acc() { sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/' "$1"; }

# 1. PTQ on the GPU against the CPU
"$DUET" run $M $F --quiet --steps 20 --save "$tmp/ck.st" > "$tmp/train.out" 2>&1 || { bad train; cat "$tmp/train.out"; }
for run in ref:cpu dev:$GPU_DEVICE; do
  r=${run%%:*} d=${run#*:}
  "$DUET" run $M $F --devices $d --eval-only --checkpoint "$tmp/ck.st" --quantize int8 --metrics "$tmp/$r.jsonl" \
    > "$tmp/$r.out" 2>&1 || { bad "int8 evaluation on $d"; cat "$tmp/$r.out"; }
done
a_cpu=$(acc "$tmp/ref.jsonl") a_gpu=$(acc "$tmp/dev.jsonl")
echo "fmnist_mlp 20 steps, --quantize int8: test accuracy cpu $a_cpu, gpu $a_gpu"
if [ -n "$a_cpu" ] && [ -n "$a_gpu" ] && awk -v a="$a_cpu" -v b="$a_gpu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }'
then ok int8_accuracy; else bad "int8_accuracy: |cpu - gpu| > 0.005"; fi
grep -q "^duet: int8 weights: 3 tensors, 1861632 bytes" "$tmp/dev.out" && ok int8_bytes || bad int8_bytes
# an evaluation executable for the device with the int8 weights embedded
# (duet compile --checkpoint): the embedded file is copied to the device as
# it loads, and it prints what duet run printed on the same device
if "$DUET" compile $M --devices $GPU_DEVICE --quantize int8 --checkpoint "$tmp/ck.st" -o "$tmp/e8" > "$tmp/e8.compile" 2>&1; then
  "$tmp/e8" $F --metrics "$tmp/e8.jsonl" > "$tmp/e8.out" 2>&1 || { bad "./e8 on $GPU_DEVICE"; cat "$tmp/e8.out"; }
  cmp -s "$tmp/e8.jsonl" "$tmp/dev.jsonl" && grep -q "^duet: embedded weights (step 20): " "$tmp/e8.out" &&
    ok "compiled_embedded_int8 ($(acc "$tmp/e8.jsonl"))" ||
    { bad compiled_embedded_int8; cat "$tmp/e8.out" "$tmp/e8.jsonl" "$tmp/dev.jsonl"; }
else
  bad "duet compile --devices $GPU_DEVICE --quantize int8 --checkpoint"; cat "$tmp/e8.compile"
fi

# 2. QAT on the GPU: its checkpoint's int8 evaluation is its own
{ cat $M; printf '\nquantize { weights = int8, mode = qat }\n'; } > "$tmp/qat.model"
"$DUET" run "$tmp/qat.model" $F --devices $GPU_DEVICE --quiet --steps 20 --save "$tmp/q.st" --metrics "$tmp/q.jsonl" \
  > "$tmp/q.out" 2>&1 || { bad "QAT on $GPU_DEVICE"; cat "$tmp/q.out"; }
"$DUET" run $M $F --devices $GPU_DEVICE --eval-only --checkpoint "$tmp/q.st" --quantize int8 --metrics "$tmp/qe.jsonl" \
  > "$tmp/qe.out" 2>&1 || { bad "QAT checkpoint evaluation"; cat "$tmp/qe.out"; }
want=$(grep test_accuracy "$tmp/q.jsonl" | tail -1 | sed 's/.*\("test_accuracy":[^,}]*,"test_loss":[^,}]*\).*/\1/')
got=$(sed 's/.*\("test_accuracy":[^,}]*,"test_loss":[^,}]*\).*/\1/' "$tmp/qe.jsonl")
[ -n "$want" ] && [ "$want" = "$got" ] && ok "qat_int8_same ($got)" || { bad qat_int8_same; echo "  QAT: $want"; echo "  int8: $got"; }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
