#!/bin/sh
# duet run --init-from CK: a new training run that starts from the params of
# checkpoint CK (fine-tuning; QAT from a trained f32 model).  fmnist_mlp on
# 2,560 training images, 10 steps saved to A, evaluated on the first 1,000
# test images; --threads 1 pins the sums.  Checks:
#   - `--init-from A --steps 1 --lr 0` (AdamW with lr 0 moves nothing)
#     evaluates to exactly `--eval-only --checkpoint A`'s test accuracy and
#     loss (the metrics lines' digits): on one CPU device, a two-stage
#     pipeline (--devices cpu:0,cpu:1) and with --offload optimizer (host
#     master weights), so every place params live is written;
#   - its checkpoint (tests/init_from_check.py): step 1, A's params byte for
#     byte, AdamW moments of one step from zero (v = (1-b2)/(1-b1)^2 m^2),
#     which A's own moments are not;
#   - the QAT variant of the model (`quantize { weights = int8, mode = qat }`)
#     started from A with lr 0 evaluates to exactly `--eval-only --checkpoint
#     A --quantize int8` (post-training int8 of the same weights);
#   - a text model (gpt_tiny): the validation loss of `--init-from G --steps
#     1 --lr 0` equals `--eval-only --checkpoint G`'s;
#   - errors, exact text: another model's checkpoint, a missing file, with
#     --resume, with --eval-only, --save over the --init-from file, the
#     --init-from file as PATH.best of --keep-best or PATH.step-S of --keep,
#     a FIFO as --init-from, --resume or --checkpoint (refused at once).
# Without the load every equality fails (the run evaluates its seed's
# random init: about 10% accuracy after one step at lr 0).
# Exits 77 without Fashion-MNIST.
# usage: run_init_from.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_init_from.sh path/to/duet}
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-initfrom.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
G=tests/models/gpt_tiny.model
{ cat $M; printf '\nquantize { weights = int8, mode = qat }\n'; } > "$d/qat.model"
T="--threads 1 --seed 1 --test-subset 1000 --train-subset 2560 --quiet"
# last NAME: the last evaluation of metrics file $d/NAME.jsonl, without its step
last() { grep 'test_accuracy\|val_loss' "$d/$1.jsonl" | tail -1 | sed 's/^{"step":[0-9]*,\("epoch":[0-9]*,\)\{0,1\}//; s/,"eval_only":true}$/}/'; }
# same WHAT NAME REF: the evaluations of runs NAME and REF are equal (and a number)
same() {
  got=$(last "$2") want=$(last "$3")
  if [ -n "$want" ] && [ "$got" = "$want" ] && echo "$got" | grep -q '_loss":[0-9]'; then ok "$1 ($got)"
  else bad "$1"; echo "  got:  $got"; echo "  want: $want"; fi
}

"$DUET" run $M $T --steps 10 --save "$d/a.st" > "$d/a.out" 2>&1 || { cat "$d/a.out"; exit 1; }
"$DUET" run $M $T --eval-only --checkpoint "$d/a.st" --metrics "$d/eval.jsonl" > "$d/eval.out" 2>&1 ||
  bad "--eval-only A"
for v in "one:" "pipe:--devices cpu:0,cpu:1" "offload:--offload optimizer"; do
  n=${v%%:*} flags=${v#*:}
  "$DUET" run $M $T --init-from "$d/a.st" --steps 1 --lr 0 $flags --save "$d/$n.st" --metrics "$d/$n.jsonl" \
    > "$d/$n.out" 2>&1 || { bad "$n: --init-from A $flags"; tail -3 "$d/$n.out"; continue; }
  same "$n: --init-from A --steps 1 --lr 0 $flags evaluates as --eval-only --checkpoint A" $n eval
done
grep -q '^{"step":1,"loss":' "$d/one.jsonl" && ok "the run's first step is step 1" ||
  { bad "first step"; head -1 "$d/one.jsonl"; }
if out=$(/usr/bin/python3 tests/init_from_check.py "$d/a.st" "$d/one.st" 0.9 0.999 2>&1); then ok "checkpoint: $out"
else bad "checkpoint"; echo "  $out"; fi
"$DUET" run $M --threads 1 --seed 1 --test-subset 1000 --train-subset 2560 --init-from "$d/a.st" --steps 1 --lr 0 \
  > "$d/msg.out" 2>&1
grep -qxF "duet: params from $d/a.st (its step 10); step, optimizer state and data order start afresh" "$d/msg.out" &&
  ok "says where the params come from" || { bad "the params line"; cat "$d/msg.out"; }

# QAT from the f32 checkpoint at lr 0 = post-training int8 of the same weights
"$DUET" run $M $T --eval-only --checkpoint "$d/a.st" --quantize int8 --metrics "$d/ptq.jsonl" > "$d/ptq.out" 2>&1 ||
  bad "--eval-only --quantize int8"
"$DUET" run "$d/qat.model" $T --init-from "$d/a.st" --steps 1 --lr 0 --metrics "$d/qat.jsonl" > "$d/qat.out" 2>&1 ||
  { bad "QAT --init-from"; tail -3 "$d/qat.out"; }
same "QAT model --init-from the f32 A at lr 0 evaluates as --eval-only --checkpoint A --quantize int8" qat ptq

# a text model
"$DUET" run $G --threads 1 --steps 4 --quiet --save "$d/g.st" > "$d/g.out" 2>&1 || { bad "gpt_tiny"; cat "$d/g.out"; }
"$DUET" run $G --threads 1 --quiet --eval-only --checkpoint "$d/g.st" --metrics "$d/geval.jsonl" > /dev/null 2>&1
"$DUET" run $G --threads 1 --quiet --init-from "$d/g.st" --steps 1 --lr 0 --metrics "$d/ginit.jsonl" > "$d/gi.out" 2>&1 ||
  { bad "gpt_tiny --init-from"; cat "$d/gi.out"; }
same "text: --init-from G --steps 1 --lr 0 has --eval-only's validation loss" ginit geval

# errors
err() {
  want=$1; shift
  timeout 60 "$DUET" run $M --threads 1 "$@" > "$d/err.out" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ] && grep -qxF "$want" "$d/err.out"; then ok "refused: $*"
  else bad "refused: $* (rc $rc)"; cat "$d/err.out"; echo "  want: $want"; fi
}
err "duet: error: cannot load $d/g.st: it is a checkpoint of model \`gpt_tiny\`, not \`fmnist_mlp\`" \
  --init-from "$d/g.st" --steps 1
err "duet: error: cannot load the checkpoint: cannot open $d/none.st: No such file or directory" \
  --init-from "$d/none.st" --steps 1
err "duet: error: --init-from starts a new run from a checkpoint's params (step 0, fresh optimizer state) and --resume continues a run where it stopped: give one of them" \
  --init-from "$d/a.st" --resume "$d/a.st"
err "duet: error: --init-from CK starts a training run from CK's params; --eval-only trains nothing: to evaluate CK give --eval-only --checkpoint CK" \
  --init-from "$d/a.st" --eval-only --checkpoint "$d/a.st"
err "duet: error: --save $d/a.st is the same file as --init-from $d/a.st: writing it would destroy that input" \
  --init-from "$d/a.st" --save "$d/a.st" --steps 1
# a FIFO given as a checkpoint is refused at once (it used to block forever waiting for a writer)
mkfifo "$d/fifo" || bad mkfifo
for f in --init-from --resume; do
  err "duet: error: $([ $f = --resume ] && echo "cannot resume" || echo "cannot load the checkpoint"): cannot read $d/fifo: not a regular file" \
    $f "$d/fifo" --steps 1
done
err "duet: error: cannot load the checkpoint: cannot read $d/fifo: not a regular file" --eval-only --checkpoint "$d/fifo"
# an empty path, and a flag where a path belongs
err "duet: error: --init-from needs a path, got an empty one" --init-from= --steps 1
err "duet: error: --resume needs a path, got an empty one" --resume= --steps 1
err "duet: error: --init-from needs a path, got the flag '--save' (for a file of that name give ./--save)" \
  --init-from --save "$d/x.st" --steps 1
# --keep-best and --keep write and remove PATH.best and PATH.step-S: never the --init-from file
cp "$d/a.st" "$d/k.st.best" && cp "$d/a.st" "$d/k.st.step-1"
err "duet: error: --init-from $d/k.st.best is $d/k.st.best, which --keep-best replaces with this run's best checkpoint: copy it elsewhere first, or --save to another PATH" \
  --init-from "$d/k.st.best" --save "$d/k.st" --keep-best --steps 1
err "duet: error: --init-from $d/k.st.step-1 is $d/k.st.step-1, one of the checkpoints --keep 2 renames and removes: copy it elsewhere first, or --save to another PATH" \
  --init-from "$d/k.st.step-1" --save "$d/k.st" --keep 2 --steps 1
cmp -s "$d/a.st" "$d/k.st.best" && cmp -s "$d/a.st" "$d/k.st.step-1" && [ ! -e "$d/k.st" ] && ok "both inputs untouched" ||
  bad "an input was changed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
