#!/bin/sh
# duet compile writes an executable that, for the same seed and flags,
# prints exactly the losses `duet run` prints; it answers the flags fixed
# at compile time with their compiled value; schedules and (compiled with
# its kernels) clipping are run-time flags of it.
# usage: run_compiled.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_compiled.sh path/to/duet}
d=${TMPDIR:-/tmp}/duet-aot.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
flags="--steps 40 --log-every 5 --threads 2 --seed 7 --lr 0.002 --no-eval"
"$DUET" compile models/fmnist_mlp.model -o "$d/fmnist_train" || { echo "FAIL: duet compile"; exit 1; }
"$d/fmnist_train" $flags --metrics "$d/aot.jsonl" > "$d/aot.txt" || { echo "FAIL: executable"; cat "$d/aot.txt"; exit 1; }
"$DUET" run models/fmnist_mlp.model $flags --metrics "$d/jit.jsonl" > "$d/jit.txt" || { echo "FAIL: duet run"; exit 1; }
n=$(grep -c '"loss"' "$d/jit.jsonl")
[ "$n" -eq 8 ] || { echo "FAIL: expected 8 logged losses, got $n"; exit 1; }
if ! diff "$d/jit.jsonl" "$d/aot.jsonl"; then echo "FAIL: losses differ"; exit 1; fi
# --version: the line of the duet that compiled it
[ "$("$d/fmnist_train" --version)" = "$("$DUET" --version)" ] || { echo "FAIL: --version: $("$d/fmnist_train" --version)"; exit 1; }
# the same losses on the progress lines, too (samples/s differ)
sed 's/ | [0-9]* samples\/s//' "$d/jit.txt" | grep '^epoch' > "$d/a"
sed 's/ | [0-9]* samples\/s//' "$d/aot.txt" | grep '^epoch' > "$d/b"
diff "$d/a" "$d/b" || { echo "FAIL: progress lines differ"; exit 1; }
# compile-time flags: the executable answers another value with the
# compiled one (exit 1), and takes the compiled value silently
fixed() {
  want="duet: error: $1 is fixed at compile time: $2 (this program was compiled with it; to change it, compile again: duet compile M.model $1 $3; duet run takes it directly)"
  "$d/fmnist_train" "$1" "$3" --steps 1 > "$d/out" 2> "$d/err" && { echo "FAIL: $1 $3 accepted"; exit 1; }
  [ "$(cat "$d/err")" = "$want" ] || { echo "FAIL: $1 $3:"; cat "$d/err"; echo "want: $want"; exit 1; }
}
fixed --batch 256 128
fixed --precision fp32 fp16
fixed --gemm-accumulate fp32 fp16
fixed --micro-batches 1 2
fixed --data-parallel 1 2
fixed --prune "0 (no pruning)" 0.5
fixed --prune-mode "none (no pruning)" global
fixed --optimizer-state f32 int8
fixed --recompute "as compiled (the program does not record the mode)" blocks
fixed --quantize none int8
"$d/fmnist_train" --shrink --steps 1 > "$d/out" 2> "$d/err" && { echo "FAIL: --shrink accepted"; exit 1; }
[ "$(cat "$d/err")" = "duet: error: --shrink is fixed at compile time: this program's layers are not shrunk (to evaluate a channels-pruned checkpoint with smaller layers, compile again: duet compile M.model --prune-mode channels --prune S --shrink; duet run takes it directly)" ] ||
  { echo "FAIL: --shrink:"; cat "$d/err"; exit 1; }
# values the compiler would refuse are named as such, not suggested for a new compile
for v in "--batch:-256:a whole number >= 1:256" "--precision:FP32:auto, fp32, fp16 or bf16:fp32" \
  "--prune:nan:a sparsity in [0, 1):0 (no pruning)" "--prune-mode:abc:unstructured, global, channels or N:M (such as 2:4):none (no pruning)" \
  "--quantize:bogus:int8, int8-tensor or none:none" "--calibrate:0:a number of batches from 1 to 1000000:none (no int8 activations)"; do
  f=${v%%:*} r=${v#*:} x=${r%%:*} r=${r#*:} what=${r%%:*} cv=${r#*:}
  if [ "$f" = --prune-mode ]; then what="unstructured, global, channels or N:M (such as 2:4)" cv="none (no pruning)"; fi
  "$d/fmnist_train" "$f" "$x" --steps 1 > "$d/out" 2> "$d/err" && { echo "FAIL: $f $x accepted"; exit 1; }
  want="duet: error: $f expects $what, got '$x' (fixed at compile time in this program: $cv)"
  [ "$(cat "$d/err")" = "$want" ] || { echo "FAIL: $f $x:"; cat "$d/err"; echo "want: $want"; exit 1; }
done
"$d/fmnist_train" --shrink=1 --steps 1 > "$d/out" 2> "$d/err" && { echo "FAIL: --shrink=1 accepted"; exit 1; }
[ "$(cat "$d/err")" = "duet: error: --shrink takes no value" ] || { echo "FAIL: --shrink=1:"; cat "$d/err"; exit 1; }
"$d/fmnist_train" --prune abc --steps 1 > "$d/out" 2> "$d/err" && { echo "FAIL: --prune abc accepted"; exit 1; }
[ "$(cat "$d/err")" = "duet: error: --prune expects a sparsity in [0, 1), got 'abc' (fixed at compile time in this program: 0 (no pruning))" ] ||
  { echo "FAIL: --prune abc:"; cat "$d/err"; exit 1; }
"$d/fmnist_train" --batch 256 --precision fp32 --micro-batches 1 --data-parallel 1 --prune 0 --optimizer-state f32 --quantize none --steps 1 --no-eval \
  --train-subset 512 --quiet > "$d/out" 2>&1 || { echo "FAIL: the compiled values are refused:"; cat "$d/out"; exit 1; }
"$d/fmnist_train" --help > "$d/help" && grep -q '^  --precision        fp32$' "$d/help" &&
  grep -q '^  --batch            256$' "$d/help" || { echo "FAIL: --help does not list the fixed values"; exit 1; }
# schedules are run-time flags; clipping needs its kernels: without them,
# --clip-grad-norm is fixed (off); compiled with them, its limit is a
# run-time flag, and the executable's losses, rates and norms are duet run's
"$d/fmnist_train" --clip-grad-norm 1 --steps 1 2> "$d/err" && { echo "FAIL: --clip-grad-norm accepted"; exit 1; }
[ "$(cat "$d/err")" = "duet: error: --clip-grad-norm is fixed at compile time: off (this program has no gradient clipping kernels; compile it with \`duet compile M.model --clip-grad-norm X\`, or set clip_grad_norm in the train section)" ] ||
  { echo "FAIL: --clip-grad-norm without kernels:"; cat "$d/err"; exit 1; }
"$DUET" compile models/fmnist_mlp.model -o "$d/clip_train" --clip-grad-norm 3 > /dev/null || { echo "FAIL: compile --clip-grad-norm"; exit 1; }
C="--steps 6 --log-every 1 --threads 2 --no-eval --train-subset 2560 --lr-schedule linear --warmup 2 --min-lr 1e-4"
"$d/clip_train" $C --clip-grad-norm 2.5 --metrics "$d/aot_c.jsonl" > /dev/null &&
  "$DUET" run models/fmnist_mlp.model $C --clip-grad-norm 2.5 --metrics "$d/jit_c.jsonl" > /dev/null &&
  cmp -s "$d/aot_c.jsonl" "$d/jit_c.jsonl" && grep -q '^{"step":6,"loss":[0-9.]*,"lr":0.0001,"grad_norm":[1-9]\.[0-9]*}$' "$d/aot_c.jsonl" ||
  { echo "FAIL: the clipping executable differs from duet run"; diff "$d/aot_c.jsonl" "$d/jit_c.jsonl"; exit 1; }
cat "$d/jit.jsonl"
echo "2 passed, 0 failed"
