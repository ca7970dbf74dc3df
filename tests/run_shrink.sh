#!/bin/sh
# Channels pruning made physically smaller (issue 15, item 1: "channel
# pruning physically shrinks the layer and the next layer's input"): the
# shrink pass (passes/shrink.c, --shrink) and the runtime's gather
# (runtime/shrink.c).
#
#   run_shrink.sh DUET   (ctest shrink_run, make test)
#     fmnist_mlp trained 20 steps on 2,048 images with --prune-mode channels
#     --prune 0.5 --prune-start 10 and saved; its checkpoint evaluated on all
#     10,000 test images with and without --shrink (--threads 1):
#       - the same accuracy (the same images right) and the test loss within
#         1e-5 relative: the shrunk GEMMs sum fewer terms, and the removed
#         terms were exact zeros, so only the order of the f32 sums (and the
#         folded constants of the removed channels, relu(bias) x rows of the
#         next weight, added to the next bias in double) differs: a few ulps
#         of f32 (measured: equal to the printed 6 digits);
#       - the evaluation's line: 669,706 parameters instead of 1,863,690 (784
#         x 512 + 512 + 512 x 512 + 512 + 512 x 10 + 10 against the full
#         784-1024-1024-10 MLP; linear3's 10 outputs, the logits, stay);
#       - duet export --shrink writes 4 x 669,706 bytes of tensor data
#         (without: 4 x 1,863,690), and tools/duet_to_torch.py --numpy
#         computes from the small export the logits that duet predict of the
#         unshrunk program printed, within its 1e-4;
#       - duet predict --shrink: the same correct count;
#       - duet ir --after shrink: linear1.w f32[784,512], linear2.w
#         f32[512,512], and the note for linear3.w; a residual add keeps its
#         weight (a note, no shrink line); the dump evaluates the same, and
#         given --shrink again is an error;
#       - duet compile --shrink: an evaluation executable whose line equals
#         duet run's and which refuses to train; given the training run's
#         pruning flags it evaluates the same, its --help and the errors for
#         another --prune or --prune-mode name the compiled values (0.5,
#         channels, shrunk) and the duet compile line to use instead;
#       - exact one-line errors: --shrink without channels pruning (duet
#         run, and duet ir printing before the shrink pass), --shrink=1
#         (it takes no value), with a
#         training run, with --quantize, with duet compile --checkpoint
#         (embedded weights), a removed channel whose relu(bias) is not 0
#         where the next layer has no bias to fold it into (a small model
#         trained 6 steps: evaluate it without --shrink), and checkpoints
#         that keep another number of channels than the program was shrunk
#         to, each named from the checkpoint's metadata with what to do:
#         trained with another --prune S (0.5, evaluated with 0.25), with
#         unstructured pruning, saved before its pruning began or before its
#         last update, trained with --prune-params '!linear1.w' (and with
#         them it evaluates), trained without pruning; the unstructured one
#         in the compiled executable too.
#     fmnist_cnn trained 10 steps on 1,024 images the same way, evaluated on
#     the first 2,000 test images with and without --shrink: the same
#     accuracy, the loss within 1e-5 relative, 110,634 parameters instead of
#     421,642 (conv1 stays at 32 channels, see its note: the padding of
#     conv2; conv2 [32,32,3,3], linear1 [1568,64]: each kept channel of conv2
#     keeps its 7 x 7 group of rows, linear2 [64,10]).
# Exits 77 without the data.
# usage: run_shrink.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_shrink.sh path/to/duet}
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
PY=/usr/bin/python3
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-shrink.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
P="--prune-mode channels --prune 0.5"
T="--threads 1 --seed 1"

# ev NAME MODEL CK ARGS...: evaluates CK, writes NAME.acc and NAME.loss
ev() {
  name=$1 model=$2 ck=$3; shift 3
  "$DUET" run "$model" $T --eval-only --checkpoint "$ck" --metrics "$d/$name.jsonl" "$@" > "$d/$name.out" 2>&1 ||
    { bad "$name: the evaluation failed"; cat "$d/$name.out"; echo 0 > "$d/$name.acc"; echo 0 > "$d/$name.loss"; return; }
  sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/' "$d/$name.jsonl" > "$d/$name.acc"
  sed 's/.*"test_loss":\([0-9.e-]*\).*/\1/' "$d/$name.jsonl" > "$d/$name.loss"
  echo "$name: test accuracy $(cat "$d/$name.acc") loss $(cat "$d/$name.loss")  (duet run $model $T --eval-only --checkpoint CK $*)"
}
# same NAME A B: A and B evaluated alike: accuracy equal, loss within 1e-5 relative
same() {
  if [ "$(cat "$d/$2.acc")" = "$(cat "$d/$3.acc")" ] &&
     awk -v a="$(cat "$d/$2.loss")" -v b="$(cat "$d/$3.loss")" \
       'BEGIN { r = (a - b) / b; if (r < 0) r = -r; exit !(a > 0 && r <= 1e-5) }'; then
    ok "$1: the same accuracy, the loss within 1e-5 relative"
  else
    bad "$1: accuracy $(cat "$d/$2.acc") / $(cat "$d/$3.acc"), loss $(cat "$d/$2.loss") / $(cat "$d/$3.loss")"
  fi
}
# err NAME WANT CMD...: CMD fails with exactly the line WANT on stderr
err() {
  name=$1 want=$2; shift 2
  if "$@" > "$d/err.out" 2> "$d/err.txt"; then bad "$name: succeeded"; return; fi
  if grep -qxF "$want" "$d/err.txt"; then ok "$name"; else bad "$name: got"; cat "$d/err.txt"; fi
}
# data_bytes FILE: the bytes of a safetensors file's tensor data (after its header)
data_bytes() { $PY -c 'import struct,sys,os; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; print(os.path.getsize(sys.argv[1])-8-n)' "$1"; }

M=models/fmnist_mlp.model
"$DUET" run $M $T --quiet --steps 20 --train-subset 2048 $P --prune-start 10 --no-eval --save "$d/mlp.st" \
  > "$d/train.out" 2>&1 || { bad "training fmnist_mlp"; cat "$d/train.out"; exit 1; }
echo "trained: duet run $M $T --steps 20 --train-subset 2048 $P --prune-start 10 --no-eval --save CK"
ev mlp_masked $M "$d/mlp.st" $P
ev mlp_shrunk $M "$d/mlp.st" $P --shrink
same "fmnist_mlp --shrink" mlp_masked mlp_shrunk
want="duet: shrunk (--shrink): 669706 parameters in 2678824 bytes (1863690 in 7454760 before)"
if grep -qxF "$want" "$d/mlp_shrunk.out"; then ok "fmnist_mlp: 669,706 parameters instead of 1,863,690"; else bad "fmnist_mlp params line"; cat "$d/mlp_shrunk.out"; fi
grep -q "note: --shrink leaves \`linear3.w\` at its 10 output channels (the pruned ones stay zeros): its channels reach the model's output (the logits, the loss)" "$d/mlp_shrunk.out" &&
  ok "note: linear3.w stays (the logits)" || bad "no note for linear3.w"

# export: the smaller tensors, and the same logits from them
"$DUET" export $M --checkpoint "$d/mlp.st" -o "$d/full.st" > /dev/null 2>&1 &&
"$DUET" export $M --checkpoint "$d/mlp.st" $P --shrink -o "$d/small.st" > /dev/null 2>&1 || bad "export failed"
full=$(data_bytes "$d/full.st") small=$(data_bytes "$d/small.st")
echo "export: $full bytes of tensors without --shrink, $small with (files: $(wc -c < "$d/full.st") and $(wc -c < "$d/small.st") bytes)"
[ "$full" = 7454760 ] && [ "$small" = 2678824 ] && ok "export --shrink: 4 x 669,706 bytes of tensors" || bad "export sizes $full $small"
"$DUET" predict $M --checkpoint "$d/mlp.st" --logits -o "$d/pred.jsonl" > /dev/null 2>&1 || bad "predict"
if $PY tools/duet_to_torch.py "$d/small.st" "$d/pred.jsonl" --numpy > "$d/torch.out" 2>&1; then
  ok "the shrunk export computes the unshrunk program's logits ($(head -1 "$d/torch.out"))"
else bad "duet_to_torch.py on the shrunk export"; cat "$d/torch.out"; fi
n0=$("$DUET" predict $M --checkpoint "$d/mlp.st" -o "$d/p0.jsonl" 2>&1 | sed -n 's/.*: \([0-9]*\) correct.*/\1/p')
n1=$("$DUET" predict $M --checkpoint "$d/mlp.st" $P --shrink -o "$d/p1.jsonl" 2>&1 | sed -n 's/.*: \([0-9]*\) correct.*/\1/p')
[ -n "$n0" ] && [ "$n0" = "$n1" ] && ok "predict --shrink: $n1 correct, as without" || bad "predict: $n0 / $n1 correct"

# the IR
"$DUET" ir $M $P --shrink --after shrink > "$d/ir.txt" 2> /dev/null
grep -q '^%[0-9]* = param "linear1.w" kaiming_uniform : f32\[784,512\]$' "$d/ir.txt" &&
grep -q '^%[0-9]* = param "linear2.w" kaiming_uniform : f32\[512,512\]$' "$d/ir.txt" &&
grep -q '^shrink param="linear2.w" axis=0 full=1024 group=1 source="linear1.w" kind=next out=1 acts="relu" fold=1 bias="linear2.b"$' "$d/ir.txt" &&
  ok "duet ir --after shrink: linear1.w f32[784,512], linear2.w f32[512,512]" || { bad "duet ir --after shrink"; cat "$d/ir.txt"; }

# the dump runs on: the same line; --shrink again is an error
"$DUET" run "$d/ir.txt" $T --eval-only --checkpoint "$d/mlp.st" > "$d/dump.out" 2>&1
a=$(grep 'test accuracy' "$d/dump.out" | sed 's/.*(step/(step/') b=$(grep 'test accuracy' "$d/mlp_shrunk.out" | sed 's/.*(step/(step/')
[ -n "$a" ] && [ "$a" = "$b" ] && ok "the dump after shrink evaluates: $a" || { bad "the dump after shrink: '$a' vs '$b'"; cat "$d/dump.out"; }
"$DUET" run "$d/ir.txt" --eval-only --checkpoint "$d/mlp.st" --shrink > /dev/null 2> "$d/dump.err"
grep -qxF "$d/ir.txt:2:7: error: the dump was printed after \`shrink\`, so its shapes are fixed; --shrink needs the .model or a dump from before \`shrink\`" "$d/dump.err" &&
  ok "a dump after shrink given --shrink again: an error" || { bad "a dump after shrink with --shrink"; cat "$d/dump.err"; }

# what the pass cannot follow: a residual add keeps w1 (with a note), the logits keep w2
printf 'model resid\ninput x: f32[4, 8]\ninput y: i32[4]\nparam w1: [8, 8]\nparam b1: [8] = zeros\nparam w2: [8, 4]\nh = relu(x @ w1 + b1)\nloss = cross_entropy((h + x) @ w2, y)\n' > "$d/resid.model"
"$DUET" ir "$d/resid.model" $P --shrink --after shrink > "$d/resid.ir" 2> "$d/resid.err"
grep -q "note: --shrink leaves \`w1\` at its 8 output channels (the pruned ones stay zeros): it meets an add with another activation (a residual connection)" "$d/resid.err" &&
grep -q '^%[0-9]* = param "w1" kaiming_uniform : f32\[8,8\]$' "$d/resid.ir" && ! grep -q '^shrink' "$d/resid.ir" &&
  ok "a residual add: w1 stays [8, 8], with a note" || { bad "residual add"; cat "$d/resid.err" "$d/resid.ir"; }

# a compiled evaluation executable
if "$DUET" compile $M $P --shrink -o "$d/mlp_exe" > "$d/compile.out" 2>&1; then
  "$d/mlp_exe" $T --eval-only --checkpoint "$d/mlp.st" > "$d/exe.out" 2>&1
  a=$(grep 'test accuracy' "$d/exe.out" | sed 's/.*(step/(step/') b=$(grep 'test accuracy' "$d/mlp_shrunk.out" | sed 's/.*(step/(step/')
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "compiled --shrink: $a" || { bad "compiled --shrink: '$a' vs '$b'"; cat "$d/exe.out"; }
  err "compiled --shrink refuses to train" "duet: error: this program's layers are shrunk (compiled with --shrink): it evaluates a channels-pruned checkpoint and cannot train; give --eval-only --checkpoint CK" \
    "$d/mlp_exe" --steps 1
  # the pruning flags it was compiled with are accepted (the training run's schedule too) and say what it is
  "$d/mlp_exe" $T --eval-only --checkpoint "$d/mlp.st" $P --prune-start 10 --shrink > "$d/exe2.out" 2>&1
  a=$(grep 'test accuracy' "$d/exe2.out" | sed 's/.*(step/(step/')
  [ -n "$a" ] && [ "$a" = "$b" ] && ok "compiled --shrink given the training run's $P --prune-start 10 --shrink: $a" ||
    { bad "compiled --shrink with the training flags: '$a' vs '$b'"; cat "$d/exe2.out"; }
  "$d/mlp_exe" --help > "$d/exe_help.out" 2>&1
  grep -qxF "  --prune            0.5 (channels pruning, shrunk: --shrink)" "$d/exe_help.out" &&
  grep -qxF "  --prune-mode       channels (shrunk: --shrink)" "$d/exe_help.out" &&
    ok "compiled --shrink: --help lists --prune 0.5, --prune-mode channels, shrunk" || { bad "compiled --shrink --help"; grep -e '--prune' "$d/exe_help.out"; }
  err "compiled --shrink given another --prune" "duet: error: --prune is fixed at compile time: 0.5 (this program was compiled with --prune-mode channels --prune 0.5 --shrink: it evaluates checkpoints channels-pruned to sparsity 0.5; for one trained with --prune 0.25, compile again: duet compile M.model --prune-mode channels --prune 0.25 --shrink; duet run takes them directly)" \
    "$d/mlp_exe" --eval-only --checkpoint "$d/mlp.st" --prune 0.25
  err "compiled --shrink given --prune abc" "duet: error: --prune expects a sparsity in [0, 1), got 'abc' (fixed at compile time in this program: 0.5 (channels pruning, shrunk: --shrink))" \
    "$d/mlp_exe" --eval-only --checkpoint "$d/mlp.st" --prune abc
  err "compiled --shrink given another --prune-mode" "duet: error: --prune-mode is fixed at compile time: channels (this program was compiled with --prune-mode channels --prune 0.5 --shrink, and --shrink needs channels pruning; for a checkpoint trained with --prune-mode unstructured, compile again without --shrink: duet compile M.model --prune-mode unstructured --prune S; duet run takes them directly)" \
    "$d/mlp_exe" --eval-only --checkpoint "$d/mlp.st" --prune-mode unstructured
else bad "duet compile --shrink"; cat "$d/compile.out"; fi

# errors
err "--shrink without channels pruning" "duet: error: --shrink removes the output channels that channels pruning zeroed: it needs --prune-mode channels and the --prune S of the training run (this program's pruning: none)" \
  "$DUET" run $M --eval-only --checkpoint "$d/mlp.st" --shrink
err "--shrink with unstructured pruning" "duet: error: --shrink removes the output channels that channels pruning zeroed: it needs --prune-mode channels and the --prune S of the training run (this program's pruning: unstructured)" \
  "$DUET" run $M --eval-only --checkpoint "$d/mlp.st" --prune 0.5 --shrink
err "duet ir --shrink (printed before shrink) without channels pruning" "duet: error: --shrink removes the output channels that channels pruning zeroed: it needs --prune-mode channels and the --prune S of the training run (this program's pruning: none)" \
  "$DUET" ir $M --shrink
err "duet ir --after prune --shrink with unstructured pruning" "duet: error: --shrink removes the output channels that channels pruning zeroed: it needs --prune-mode channels and the --prune S of the training run (this program's pruning: unstructured)" \
  "$DUET" ir $M --prune 0.5 --after prune --shrink
"$DUET" ir $M $P --shrink > /dev/null 2>&1 && ok "duet ir $P --shrink (printed after shape) is accepted" || bad "duet ir $P --shrink"
err "--shrink=1" "duet: error: --shrink takes no value" "$DUET" run $M --eval-only --checkpoint "$d/mlp.st" $P --shrink=1
err "duet ir --shrink=1" "duet: error: --shrink takes no value" "$DUET" ir $M $P --shrink=1
err "--shrink with a training run" "duet: error: --shrink removes the channels that channels pruning zeroed from a trained checkpoint and cannot train: train and save first (duet run M.model --prune-mode channels --prune S --save CK), then evaluate with duet run M.model --eval-only --checkpoint CK --prune-mode channels --prune S --shrink" \
  "$DUET" run $M $P --shrink --steps 1
err "--shrink with --quantize" "duet: error: --shrink and --quantize int8 together are not supported yet: evaluate with one of them" \
  "$DUET" run $M --eval-only --checkpoint "$d/mlp.st" $P --shrink --quantize int8
err "duet compile --checkpoint with --shrink" "duet: error: duet compile --checkpoint does not embed shrunk weights yet: compile with --shrink alone and run EXE --eval-only --checkpoint CK" \
  "$DUET" compile $M $P --shrink --checkpoint "$d/mlp.st" -o "$d/emb_exe"
want="duet: error: cannot load $d/mlp.st: it was trained with --prune-mode channels --prune 0.5, and this program was shrunk (--shrink) for --prune-mode channels --prune 0.25; give --prune 0.5 (a compiled executable: compile again: duet compile M.model --prune-mode channels --prune 0.5 --shrink)"
err "a checkpoint trained with another --prune S" "$want" \
  "$DUET" run $M $T --eval-only --checkpoint "$d/mlp.st" --prune-mode channels --prune 0.25 --shrink
err "export of such a checkpoint" "$want" \
  "$DUET" export $M --checkpoint "$d/mlp.st" --prune-mode channels --prune 0.25 --shrink -o "$d/bad.st"
# checkpoints whose mismatch is not S: named from their metadata (trained a few steps on 512 images)
Q="--threads 1 --seed 1 --quiet --train-subset 512 --no-eval"
without="evaluate it without --shrink (a compiled executable: compile again without --shrink)"
"$DUET" run $M $Q --steps 3 --prune 0.5 --prune-start 1 --save "$d/un.st" > /dev/null 2>&1 &&
"$DUET" run $M $Q --steps 2 $P --prune-start 5 --save "$d/early.st" > /dev/null 2>&1 &&
"$DUET" run $M $Q --steps 3 $P --prune-start 1 --prune-end 9 --prune-every 1 --save "$d/mid.st" > /dev/null 2>&1 &&
"$DUET" run $M $Q --steps 3 $P --prune-start 1 --prune-params '!linear1.w' --save "$d/pp.st" > /dev/null 2>&1 &&
"$DUET" run $M $Q --steps 1 --save "$d/dense.st" > /dev/null 2>&1 || bad "training the mismatched checkpoints"
err "an unstructured checkpoint" "duet: error: cannot load $d/un.st: it was trained with --prune-mode unstructured --prune 0.5, and this program was shrunk (--shrink) for --prune-mode channels --prune 0.5: --shrink removes only the channels that channels pruning zeroed; $without" \
  "$DUET" run $M $T --eval-only --checkpoint "$d/un.st" $P --shrink
err "a checkpoint saved before its pruning began" "duet: error: cannot load $d/early.st: it was saved at step 2, before its channels pruning began (--prune-start 5), so fewer channels are pruned than --prune 0.5 removes; evaluate a checkpoint saved after step 5, or this one without --shrink (a compiled executable: compile again without --shrink)" \
  "$DUET" run $M $T --eval-only --checkpoint "$d/early.st" $P --shrink
err "a checkpoint saved before its last pruning update" "duet: error: cannot load $d/mid.st: it was saved at step 3, before its last pruning update (--prune-start 1 --prune-end 9), so fewer channels are pruned than --prune 0.5 removes; evaluate a checkpoint saved after step 9, or this one without --shrink (a compiled executable: compile again without --shrink)" \
  "$DUET" run $M $T --eval-only --checkpoint "$d/mid.st" $P --shrink
err "a checkpoint trained with --prune-params '!linear1.w', evaluated without it" "duet: error: cannot load $d/pp.st: it has no pruning mask of \`linear1.w\` (it was trained with --prune-params that leave it out), and this program was shrunk (--shrink) for --prune-mode channels --prune 0.5, which prunes it; give the --prune-params it was trained with (a compiled executable: compile again with them)" \
  "$DUET" run $M $T --eval-only --checkpoint "$d/pp.st" $P --shrink
"$DUET" run $M $T --eval-only --checkpoint "$d/pp.st" $P --prune-params '!linear1.w' --shrink > /dev/null 2>&1 &&
  ok "... and with its --prune-params it evaluates" || bad "pp.st with its --prune-params"
err "a checkpoint without pruning" "duet: error: cannot load $d/dense.st: it was trained without pruning (no pruning settings, no mask of \`linear1.w\`), and this program was shrunk (--shrink) for --prune-mode channels --prune 0.5; $without" \
  "$DUET" run $M $T --eval-only --checkpoint "$d/dense.st" $P --shrink
[ -x "$d/mlp_exe" ] && err "a compiled --shrink executable given an unstructured checkpoint" "duet: error: cannot load $d/un.st: it was trained with --prune-mode unstructured --prune 0.5, and this program was shrunk (--shrink) for --prune-mode channels --prune 0.5: --shrink removes only the channels that channels pruning zeroed; $without" \
  "$d/mlp_exe" $T --eval-only --checkpoint "$d/un.st"

# a removed channel whose relu(bias) is not 0 and no next bias to fold it into: refused, naming it
printf 'model nobias\ninput x: f32[batch, 784]\ninput y: i32[batch]\nparam w1: [784, 32]\nparam b1: [32] = zeros\nparam w2: [32, 10]\nloss = cross_entropy(relu(x @ w1 + b1) @ w2, y)\ntrain {\n  data = fashion_mnist("%s")\n  optimizer = adamw(lr = 1e-2)\n  batch = 64\n}\n' "$FM" > "$d/nobias.model"
"$DUET" run "$d/nobias.model" $T --steps 6 --train-subset 512 $P --prune-start 3 --no-eval --quiet --save "$d/nb.st" > /dev/null 2>&1 || bad "training nobias"
"$DUET" run "$d/nobias.model" $T --eval-only --checkpoint "$d/nb.st" $P --shrink > /dev/null 2> "$d/nb.err"
if grep -q "^duet: error: cannot load $d/nb.st: pruned channel [0-9]* of \`w1\` still outputs relu(bias) = [0-9.e-]* (channels pruning keeps the biases), and the next layer has no bias to fold it into, so the channel cannot be removed exactly; evaluate it without --shrink (a compiled executable: compile again without --shrink)$" "$d/nb.err"
then ok "no next bias to fold a removed channel's relu(bias) into: an error naming it"; else bad "no next bias"; cat "$d/nb.err"; fi

# fmnist_cnn: convolutions (the output axis first), im2col, flatten's groups of 7 x 7
C=models/fmnist_cnn.model
"$DUET" run $C $T --quiet --steps 10 --train-subset 1024 $P --prune-start 5 --no-eval --save "$d/cnn.st" \
  > "$d/train_cnn.out" 2>&1 || { bad "training fmnist_cnn"; cat "$d/train_cnn.out"; exit 1; }
echo "trained: duet run $C $T --steps 10 --train-subset 1024 $P --prune-start 5 --no-eval --save CK"
ev cnn_masked $C "$d/cnn.st" $P --test-subset 2000
ev cnn_shrunk $C "$d/cnn.st" $P --test-subset 2000 --shrink
same "fmnist_cnn --shrink" cnn_masked cnn_shrunk
want="duet: shrunk (--shrink): 110634 parameters in 442536 bytes (421642 in 1686568 before)"
if grep -qxF "$want" "$d/cnn_shrunk.out"; then ok "fmnist_cnn: 110,634 parameters instead of 421,642"; else bad "fmnist_cnn params line"; cat "$d/cnn_shrunk.out"; fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
