#!/bin/sh
# Using a trained checkpoint: duet run --eval-only --checkpoint CK.
#   1. A classifier (fmnist_mlp) trained 20 steps with --save: --eval-only
#      on the checkpoint writes the training run's last evaluation line
#      (test accuracy and loss), bit for bit (the JSON numbers compared as
#      text), in duet run and in a compiled executable;
#   2. a text model (gpt_tiny) likewise: the validation loss;
#   3. bad uses are exact one-line errors, before any kernel is compiled:
#      --eval-only without --checkpoint, --checkpoint without --eval-only,
#      --save with --eval-only, a missing checkpoint, a checkpoint of another
#      model, one whose tensor has another shape (the tensor named);
#      --steps, --epochs and --offload given with --eval-only (they were
#      ignored), in duet run and in a compiled executable; an executable
#      compiled with --offload optimizer (its default, not given) evaluates;
#   4. --metrics-timing adds eval_seconds, samples_per_s (batches_per_s for
#      text) and allocated_bytes and changes no number;
#   5. --eval-only's evaluation program: allocated_bytes is the params and
#      the forward arena (computed from the checkpoint's header and the
#      model's shapes), less than the params plus the AdamW moments; a
#      training run, and a compiled training executable's --eval-only,
#      still allocate the moments; duet compile --checkpoint, duet plan
#      --eval-only and a duet ir --eval-only dump make the same program
#      (the dump refuses to train); a pipeline evaluates alike, fp16 and
#      --data-parallel 2 as their training programs at --lr 0; a model
#      whose train section clips gradients evaluates.
# usage: run_eval.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_eval.sh path/to/duet}
d=${TMPDIR:-/tmp}/duet-eval.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
F="--train-subset 2560 --test-subset 1000 --threads 1 --quiet"
# last_eval FILE KEY: the last metrics line holding KEY, without "epoch" and "eval_only"
last_eval() { grep "\"$2\"" "$1" | tail -1 | sed 's/,"epoch":[0-9]*//; s/,"eval_only":true//'; }
# before_compile NAME "the whole error line" command...: exit 1 with that
# line, no kernels compiled (an empty fresh kernel cache)
before_compile() {
  name=$1 want=$2; shift 2
  out=$(DUET_CACHE_DIR="$d/cache-$name" "$@" 2>&1); rc=$?
  if [ "$rc" -eq 1 ] && [ "$out" = "$want" ] && [ -z "$(ls -A "$d/cache-$name" 2>/dev/null)" ]; then ok "$name"
  else bad "$name: exit $rc, output:"; printf '%s\n' "$out" | head -5; echo "  want (before compiling): $want"; fi
}

# 1. classifier
"$DUET" run $M $F --steps 20 --save "$d/ck.st" --metrics "$d/train.jsonl" > /dev/null || bad train
"$DUET" run $M $F --eval-only --checkpoint "$d/ck.st" --metrics "$d/eval.jsonl" > "$d/eval.out" || bad eval_only_runs
want=$(last_eval "$d/train.jsonl" test_accuracy) want_mlp=$want
got=$(last_eval "$d/eval.jsonl" test_accuracy)
[ -n "$want" ] && [ "$want" = "$got" ] && ok classifier_same_evaluation ||
  { bad classifier_same_evaluation; echo "  train: $want"; echo "  eval:  $got"; }
grep -q "^duet: $d/ck.st (step 20): test accuracy [0-9.]*% ([0-9]*/1000) | test loss [0-9.]*$" "$d/eval.out" &&
  ok classifier_prints_result || { bad classifier_prints_result; cat "$d/eval.out"; }
"$DUET" compile $M -o "$d/exe" > /dev/null || bad compile
"$d/exe" $F --eval-only --checkpoint "$d/ck.st" --metrics "$d/exe.jsonl" > /dev/null || bad exe_runs
[ "$(last_eval "$d/exe.jsonl" test_accuracy)" = "$want" ] && ok executable_same_evaluation ||
  { bad executable_same_evaluation; cat "$d/exe.jsonl"; }

# 2. text model
G=tests/models/gpt_tiny.model
"$DUET" run $G --steps 4 --threads 1 --quiet --save "$d/g.st" --metrics "$d/gtrain.jsonl" > /dev/null || bad text_train
"$DUET" run $G --threads 1 --quiet --eval-only --checkpoint "$d/g.st" --metrics "$d/geval.jsonl" > /dev/null ||
  bad text_eval_only_runs
want=$(last_eval "$d/gtrain.jsonl" val_loss)
[ -n "$want" ] && [ "$want" = "$(last_eval "$d/geval.jsonl" val_loss)" ] && ok text_same_validation_loss ||
  { bad text_same_validation_loss; echo "  train: $want"; cat "$d/geval.jsonl"; }

# 3. errors
before_compile no_checkpoint "duet: error: --eval-only needs --checkpoint CK (a checkpoint written by --save)" \
  "$DUET" run $M --eval-only
before_compile checkpoint_alone "duet: error: --checkpoint CK is read by --eval-only; to continue training from a \
checkpoint give --resume CK, to start a new run from its params --init-from CK" "$DUET" run $M --checkpoint "$d/ck.st"
before_compile eval_only_save "duet: error: --eval-only trains nothing: it takes no --save (the checkpoint to \
evaluate is --checkpoint CK)" "$DUET" run $M --eval-only --checkpoint "$d/ck.st" --save "$d/x.st"
before_compile eval_only_keep "duet: error: --eval-only trains nothing: it takes no --keep (the checkpoint to \
evaluate is --checkpoint CK)" "$DUET" run $M --eval-only --checkpoint "$d/ck.st" --keep 2
before_compile missing "duet: error: cannot load the checkpoint: cannot open $d/none.st: No such file or directory" \
  "$DUET" run $M --eval-only --checkpoint "$d/none.st"
before_compile other_model "duet: error: cannot load $d/g.st: it is a checkpoint of model \`gpt_tiny\`, not \
\`fmnist_mlp\`" "$DUET" run $M --eval-only --checkpoint "$d/g.st"
sed 's/linear(h, 10)/linear(h, 11)/' $M > "$d/eleven.model"
before_compile other_shape "duet: error: cannot load $d/ck.st: tensor \`linear3.w\` is f32[1024,10] in the \
checkpoint, f32[1024,11] in the model" "$DUET" run "$d/eleven.model" --eval-only --checkpoint "$d/ck.st"
for f in steps epochs; do
  before_compile eval_only_$f "duet: error: --eval-only trains nothing: --$f sets the length of training (to \
evaluate fewer samples: --test-subset N; a language model: --eval-batches N)" \
    "$DUET" run $M --eval-only --checkpoint "$d/ck.st" --$f 3
done
off="duet: error: --eval-only trains nothing: --offload moves the optimizer state and its update to the host, and \
an evaluation has neither; leave it out"
before_compile eval_only_offload "$off" "$DUET" run $M --eval-only --checkpoint "$d/ck.st" --offload optimizer
before_compile eval_only_offload_none "$off" "$DUET" run $M --offload=none --eval-only --checkpoint "$d/ck.st"
out=$("$d/exe" --eval-only --checkpoint "$d/ck.st" --steps 3 2>&1)
[ "$out" = "duet: error: --eval-only trains nothing: --steps sets the length of training (to evaluate fewer samples: \
--test-subset N; a language model: --eval-batches N)" ] && ok executable_eval_only_steps ||
  { bad executable_eval_only_steps; echo "$out"; }
out=$("$d/exe" --eval-only --checkpoint "$d/ck.st" --offload optimizer 2>&1)
[ "$out" = "$off" ] && ok executable_eval_only_offload || { bad executable_eval_only_offload; echo "$out"; }
"$DUET" compile $M --offload optimizer -o "$d/exe_off" > /dev/null || bad compile_offload
"$d/exe_off" $F --eval-only --checkpoint "$d/ck.st" --metrics "$d/exe_off.jsonl" > /dev/null &&
  [ "$(last_eval "$d/exe_off.jsonl" test_accuracy)" = "$(last_eval "$d/exe.jsonl" test_accuracy)" ] &&
  ok executable_offload_default_evaluates || { bad executable_offload_default_evaluates; cat "$d/exe_off.jsonl"; }
# an executable with its weights inside evaluates by default: --steps is refused in its words
"$DUET" compile $M --checkpoint "$d/ck.st" -o "$d/exe_w" > /dev/null || bad compile_weights
out=$("$d/exe_w" --steps 3 2>&1)
[ "$out" = "duet: error: this executable evaluates its embedded weights (compiled with --checkpoint) and trains \
nothing: it takes no --steps; to train, compile without --checkpoint" ] && ok executable_weights_steps ||
  { bad executable_weights_steps; echo "$out"; }
out=$("$d/exe" --eval-only 2>&1)
[ "$out" = "duet: error: --eval-only needs --checkpoint CK (a checkpoint written by --save)" ] &&
  ok executable_no_checkpoint || { bad executable_no_checkpoint; echo "$out"; }
# 4. --metrics-timing: the evaluation's time, rate and device bytes join the
# metrics line without changing its numbers; a text model gives batches per
# second
"$DUET" run $M $F --eval-only --checkpoint "$d/ck.st" --metrics-timing --metrics "$d/et.jsonl" > /dev/null &&
"$DUET" run $M $F --eval-only --checkpoint "$d/ck.st" --quantize int8 --metrics-timing --metrics "$d/et8.jsonl" > /dev/null &&
"$DUET" run $G --threads 1 --quiet --eval-only --checkpoint "$d/g.st" --metrics-timing --metrics "$d/gt.jsonl" > /dev/null ||
  bad metrics_timing_runs
num() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1"; }
[ "$(last_eval "$d/et.jsonl" test_accuracy | sed 's/,"eval_seconds".*/}/')" = "$(last_eval "$d/eval.jsonl" test_accuracy)" ] &&
  ok timing_same_numbers || { bad timing_same_numbers; cat "$d/et.jsonl" "$d/eval.jsonl"; }
awk -v s="$(num "$d/et.jsonl" eval_seconds)" -v r="$(num "$d/et.jsonl" samples_per_s)" 'BEGIN {
  d = s * r - 1000; exit !(s > 0 && d < 1e-6 * 1000 && d > -1e-6 * 1000) }' &&
  ok timing_rate_is_samples_over_seconds || { bad timing_rate_is_samples_over_seconds; cat "$d/et.jsonl"; }
grep -q '"batches_per_s":[0-9]' "$d/gt.jsonl" && ok timing_text_batches || { bad timing_text_batches; cat "$d/gt.jsonl"; }

# 5. duet run --eval-only compiles an evaluation program (passes/evalonly.c):
# the params and the forward pass's activations, no gradients, no optimizer
# state.  The expected bytes are computed here, not by duet: from the
# checkpoint's header, P (its tensors but the AdamW moments; 4 x 1,863,690
# for fmnist_mlp), S (the moments .exp_avg and .exp_avg_sq) and P64 (P with
# each tensor rounded up to 64 bytes, the memory plan's alignment); the
# forward arena at its peak, from the model's shapes at batch 256: the
# inputs x f32[256,784] and y i32[256] and two f32[256,1024] hidden layers
# (a matmul's output and the bias+relu reading it; the logits reuse freed
# space).  Compared: allocated_bytes == P64 + that arena, and < P + S (less
# than the params and the optimizer state alone); the training run of the
# same model allocates >= P + S + P (params, moments, gradients) and so does
# a compiled executable (it keeps its training program) with --eval-only;
# an executable with its weights inside (duet compile --checkpoint) is an
# evaluation program too.  The evaluation numbers stay the training run's.
sizes=$(python3 - "$d/ck.st" <<'PY'
import json, struct, sys
with open(sys.argv[1], 'rb') as f:
    h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
p = s = p64 = 0
for k, v in h.items():
    if k == '__metadata__':
        continue
    b = v['data_offsets'][1] - v['data_offsets'][0]
    if k.endswith('.exp_avg') or k.endswith('.exp_avg_sq'):
        s += b
    else:
        p += b
        p64 += (b + 63) // 64 * 64
print('P=%d S=%d P64=%d' % (p, s, p64))
PY
) && eval "$sizes" || bad checkpoint_sizes
[ "$P" = $((4 * 1863690)) ] && [ "$S" = $((2 * P)) ] && ok checkpoint_params_and_moments ||
  bad "checkpoint_params_and_moments: P $P S $S"
arena=$((4 * 256 * 784 + 4 * 256 + 2 * 4 * 256 * 1024))
a32=$(num "$d/et.jsonl" allocated_bytes) a8=$(num "$d/et8.jsonl" allocated_bytes)
[ -n "$a32" ] && [ "$a32" = $((P64 + arena)) ] && ok eval_allocates_params_and_forward_arena ||
  bad "eval_allocates_params_and_forward_arena: $a32 bytes, want $P64 (params) + $arena (forward arena)"
[ -n "$a32" ] && [ "$a32" -lt $((P + S)) ] && ok eval_allocates_no_optimizer_state ||
  bad "eval_allocates_no_optimizer_state: $a32 bytes, params + AdamW moments $((P + S))"
alloc=$("$DUET" run $M --train-subset 2560 --test-subset 1000 --threads 1 --steps 1 --no-eval 2>/dev/null |
  sed -n 's/^duet: allocated: \([0-9]*\) bytes.*/\1/p')
[ -n "$alloc" ] && [ "$alloc" -ge $((2 * P + S)) ] && ok training_allocates_state ||
  bad "training_allocates_state: $alloc bytes, params + gradients + moments $((2 * P + S))"
"$d/exe" $F --eval-only --checkpoint "$d/ck.st" --metrics-timing --metrics "$d/exet.jsonl" > /dev/null || bad exe_timing
[ "$(num "$d/exet.jsonl" allocated_bytes)" = "$alloc" ] && ok executable_keeps_training_program ||
  bad "executable_keeps_training_program: $(num "$d/exet.jsonl" allocated_bytes) bytes, training $alloc"
"$d/exe_w" $F --metrics-timing --metrics "$d/exewt.jsonl" > /dev/null || bad exe_weights_timing
[ "$(num "$d/exewt.jsonl" allocated_bytes)" = "$a32" ] &&
  [ "$(last_eval "$d/exewt.jsonl" test_accuracy | sed 's/,"eval_seconds".*/}/')" = "$want_mlp" ] &&
  ok executable_weights_evaluation_program || { bad executable_weights_evaluation_program; cat "$d/exewt.jsonl"; }
[ -n "$a8" ] && [ "$a8" -gt 0 ] && [ "$a8" -lt "$a32" ] && ok timing_int8_allocates_less ||
  bad "timing_int8_allocates_less: int8 $a8, f32 $a32"
# duet plan --eval-only: the same bytes; duet ir --eval-only: no backward
# value, no optimizer state after `evalonly` (without it, the pass keeps
# them); a dump of it evaluates alike and cannot train
"$DUET" plan $M --eval-only --format json > "$d/plan.json" &&
  [ "$(tr -d ' \t\n' < "$d/plan.json" | sed -n 's/.*"total":\([0-9]*\).*/\1/p')" = "$a32" ] && ok plan_eval_only_bytes || { bad plan_eval_only_bytes; cat "$d/plan.json"; }
"$DUET" ir $M --eval-only --after evalonly > "$d/e.ir" && "$DUET" ir $M --after evalonly > "$d/t.ir" &&
  ! grep -q '@backward\|@optimizer\|^grad ' "$d/e.ir" && grep -q '@backward' "$d/t.ir" &&
  grep -q 'exp_avg.*@optimizer' "$d/t.ir" && grep -q 'eval_metrics' "$d/e.ir" &&
  ok ir_after_evalonly || bad ir_after_evalonly
"$DUET" run "$d/e.ir" $F --eval-only --checkpoint "$d/ck.st" --metrics "$d/eir.jsonl" > /dev/null &&
  [ "$(last_eval "$d/eir.jsonl" test_accuracy)" = "$want_mlp" ] && ok ir_dump_evaluates || { bad ir_dump_evaluates; cat "$d/eir.jsonl"; }
before_compile eval_program_trains "duet: error: this program was compiled for evaluation (duet run --eval-only: no \
gradients, no optimizer state) and cannot train; give --eval-only --checkpoint CK" "$DUET" run "$d/e.ir" $F --steps 1
before_compile plan_fit_eval_only "duet: error: duet plan --fit ranks training layouts; --eval-only plans the \
evaluation program of one: give one of them" "$DUET" plan $M --fit --eval-only
before_compile plan_eval_only_offload "duet: error: --eval-only trains nothing: --offload moves the optimizer state \
and its update to the host, and an evaluation has neither; leave it out" "$DUET" plan $M --eval-only --offload optimizer
before_compile ir_eval_only_value "duet: error: unexpected argument '--eval-only=1' (see duet ir --help)" \
  "$DUET" ir $M --eval-only=1
# a two-stage pipeline evaluates alike; fp16 and two data-parallel
# replicas evaluate as their training programs do (one step at --lr 0 from
# CK's params: the weights stay CK's)
"$DUET" run $M $F --eval-only --checkpoint "$d/ck.st" --devices cpu:0,cpu:1 --metrics "$d/pp.jsonl" > /dev/null &&
  [ "$(last_eval "$d/pp.jsonl" test_accuracy)" = "$want_mlp" ] && ok pipeline_evaluates || { bad pipeline_evaluates; cat "$d/pp.jsonl"; }
# a train section's clip_grad_norm does not stop an evaluation (the
# evaluation program has no gradients to clip, and no clipping kernels)
sed 's/^  seed = 1$/  seed = 1\n  clip_grad_norm = 1/' $M > "$d/clip.model"
grep -q 'clip_grad_norm = 1' "$d/clip.model" &&
  "$DUET" run "$d/clip.model" $F --eval-only --checkpoint "$d/ck.st" --metrics "$d/clip.jsonl" > /dev/null &&
  [ "$(last_eval "$d/clip.jsonl" test_accuracy)" = "$want_mlp" ] && ok clipping_model_evaluates ||
  { bad clipping_model_evaluates; cat "$d/clip.jsonl"; }
for v in "fp16:--precision fp16" "dp2:--data-parallel 2"; do
  n=${v%%:*} flags=${v#*:}
  "$DUET" run $M $F $flags --eval-only --checkpoint "$d/ck.st" --metrics "$d/$n.e.jsonl" > /dev/null &&
  "$DUET" run $M $F $flags --init-from "$d/ck.st" --lr 0 --steps 1 --metrics "$d/$n.t.jsonl" > /dev/null &&
    [ "$(last_eval "$d/$n.e.jsonl" test_accuracy | sed 's/"step":[0-9]*,//')" = \
      "$(last_eval "$d/$n.t.jsonl" test_accuracy | sed 's/"step":[0-9]*,//')" ] && ok "${n}_evaluates_as_training" ||
    { bad "${n}_evaluates_as_training"; cat "$d/$n.e.jsonl" "$d/$n.t.jsonl"; }
done
# duet plan --eval-only's text names no backward pass, gradients or optimizer state
"$DUET" plan $M --eval-only > "$d/plan.txt" 2>&1
grep -q '^  estimated time: forward [0-9.]* ms per micro-batch (an evaluation program: no backward pass or optimizer); ' "$d/plan.txt" &&
  grep -q '^  memory: weights 7.11 MiB, activations 2.77 MiB (1 micro-batch in flight x 2.77 MiB): 9.88 MiB' "$d/plan.txt" &&
  ! grep -q 'grads\|optimizer state\|with their gradients' "$d/plan.txt" && ok plan_eval_only_text || { bad plan_eval_only_text; cat "$d/plan.txt"; }
# an fp16 checkpoint evaluated in fp32 says so (and which --precision repeats the training run's numbers);
# with --precision fp16 nothing is said
"$DUET" run $M $F --steps 2 --precision fp16 --quiet --save "$d/h.st" > /dev/null 2>&1 || bad "fp16 training"
NQ="--train-subset 2560 --test-subset 1000 --threads 1" # not --quiet, which silences the note
"$DUET" run $M $NQ --eval-only --checkpoint "$d/h.st" > "$d/h.out" 2>&1
"$DUET" run $M $NQ --eval-only --checkpoint "$d/h.st" --precision fp16 > "$d/h16.out" 2>&1
grep -qxF "duet: $d/h.st was trained with --precision fp16 and this evaluation runs fp32: its numbers differ from the training run's last evaluation (--precision fp16 repeats them)" "$d/h.out" &&
  ! grep -q "trained with --precision" "$d/h16.out" && ok precision_note || { bad precision_note; cat "$d/h.out"; }

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
