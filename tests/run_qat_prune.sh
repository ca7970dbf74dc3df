#!/bin/sh
# Quantization-aware training together with pruning (issue 15, items 1 and
# 3): fmnist_mlp with `quantize { weights = int8, mode = qat }` and
# --prune flags, short runs (2,560 training images, 20 steps, pruned after
# step 8; evaluated on the first 2,000 test images), in three modes:
# unstructured 50%, 2:4 and channels 50%.  For each:
#   - the run reports the sparsity (its end line: 0.5000 of 1861632 weights);
#   - the checkpoint (prune_check): every mask prunes exactly round(0.5 x n)
#     weights (channels: whole output channels; 2:4: 2 of every 4 inputs),
#     the pruned weights and their AdamW state are +0.0, and each weight
#     holds exactly as many zeros as its mask prunes (--weight-zeros);
#   - `duet run fmnist_mlp.model --eval-only --checkpoint CK --quantize int8`
#     (post-training int8 of the f32 weights the QAT run saved) reports the
#     QAT run's final test accuracy and loss, bit for bit (the metrics
#     lines' digits), and the loss is a number (channels mode: whole pruned
#     channels, whose max |w| is 0, take the safe scale 1 in the
#     fake_quantize of training and in the quantizer alike, never 0/0).
# A dump after the qat pass (`duet ir --after qat`), pruned by the same
# flags, trains to the same checkpoint, byte for byte.
# Before the prune pass looked through `fake_quantize`, every run here
# failed: `pruning selects no parameter: the model has no trainable matmul
# or convolution weight` (with --prune-params naming the weights, 2:4 and
# channels: `... of linear1.w ...: it is no matmul or convolution weight`).
# Exits 77 without Fashion-MNIST.
# usage: run_qat_prune.sh path/to/duet path/to/prune_check   (from the repository root)
DUET=${1:?usage: run_qat_prune.sh path/to/duet path/to/prune_check}
CHECK=${2:?usage: run_qat_prune.sh path/to/duet path/to/prune_check}
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-qatprune.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
{ cat $M; printf '\nquantize { weights = int8, mode = qat }\n'; } > "$d/qat.model"
T="--threads 2 --seed 1 --test-subset 2000"
# evaluation NAME FILE: the test accuracy and loss of the last evaluation in a metrics file
evaluation() { grep test_accuracy "$2" | tail -1 | sed -n 's/.*\("test_accuracy":[^,}]*,"test_loss":[^,}]*\).*/\1/p'; }

# mode NAME PRUNE_FLAGS PRUNE_CHECK_FLAGS END_LINE
mode() {
  name=$1 flags=$2 cflags=$3 want_end=$4
  if "$DUET" run "$d/qat.model" $T --train-subset 2560 --steps 20 $flags --prune-start 8 --save "$d/$name.st" \
    --metrics "$d/$name.jsonl" > "$d/$name.out" 2>&1; then ok "$name: QAT with $flags trains"
  else bad "$name: QAT with $flags"; tail -3 "$d/$name.out"; return; fi
  grep -qxF "$want_end" "$d/$name.out" && ok "$name: reports its sparsity" ||
    { bad "$name: the sparsity line"; grep sparsity "$d/$name.out"; echo "  want: $want_end"; }
  if "$CHECK" "$d/$name.st" $cflags --weight-zeros --masks 3 > "$d/$name.check" 2>&1; then ok "$name: the checkpoint's zeros"
  else bad "$name: the checkpoint's zeros"; cat "$d/$name.check"; fi
  "$DUET" run $M $T --eval-only --checkpoint "$d/$name.st" --quantize int8 --metrics "$d/$name.eval.jsonl" \
    > "$d/$name.eval.out" 2>&1 || { bad "$name: --eval-only --quantize int8"; tail -3 "$d/$name.eval.out"; return; }
  want=$(evaluation "$name" "$d/$name.jsonl") got=$(evaluation "$name" "$d/$name.eval.jsonl")
  if [ -n "$want" ] && [ "$want" = "$got" ] && echo "$got" | grep -q '"test_loss":[0-9]'; then
    ok "$name: --eval-only --quantize int8 = the QAT run's evaluation ($got)"
  else bad "$name: --eval-only --quantize int8"; echo "  QAT run: $want"; echo "  int8:    $got"; fi
}
mode unstructured "--prune 0.5" "--sparsity 0.5" \
  "duet: sparsity at the end (unstructured): 0.5000 of 1861632 weights"
mode 2_4 "--prune-mode 2:4" "--sparsity 0.5 --nm 2:4" \
  "duet: sparsity at the end (2:4): 0.5000 of 1861632 weights"
mode channels "--prune 0.5 --prune-mode channels" "--sparsity 0.5 --channels" \
  "duet: sparsity at the end (channels): 0.5000 of 1861632 weights"
# a dump after qat (fake_quantize ops in the parsed IR) pruned by the flags: the .model run's checkpoint, byte for byte
"$DUET" ir "$d/qat.model" --after qat > "$d/qat.ir" 2>&1
"$DUET" run "$d/qat.ir" $T --train-subset 2560 --steps 20 --prune 0.5 --prune-start 8 --save "$d/dump.st" \
  > "$d/dump.out" 2>&1 && cmp -s "$d/dump.st" "$d/unstructured.st" && ok "a dump after qat pruned: the same checkpoint" ||
  { bad "a dump after qat pruned"; tail -3 "$d/dump.out"; }
# the IR: the masks apply to the f32 weights that fake_quantize reads
"$DUET" ir "$d/qat.model" --prune 0.5 --after prune > "$d/ir" 2>&1
grep -q '^%8 = fake_quantize %2, %7 : f32\[784,1024\]$' "$d/ir" &&
  grep -q '^prune_mask\[out=1\] %2, %[0-9]*, %[0-9]*, %[0-9]* : void  @optimizer$' "$d/ir" &&
  [ "$(grep -c '^prune_mask' "$d/ir")" = 3 ] && ok "ir: prune_mask on the weights behind fake_quantize" ||
  { bad "ir"; grep 'fake_quantize\|prune_mask\|error' "$d/ir"; }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
