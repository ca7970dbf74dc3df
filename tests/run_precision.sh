#!/bin/sh
# Mixed precision end to end (duet run on the CPU):
#   1. forced overflow: fp16 with an initial loss scale of 2^30 overflows
#      for real (the scaled gradients exceed f16's 65504), so steps are
#      skipped, the scale halving on each, until the gradients fit; training
#      then goes on (over 60% test accuracy after 40 steps);
#   2. the floor: with --min-loss-scale 2^29 the second halving stops the run
#      with an error naming the first param whose gradient overflowed;
#   3. resume: 12 fp16 steps straight vs 5 + --resume (the checkpoint is
#      taken during the backoff, so the scaler state must travel) give the
#      same losses; bf16 too; --loss-scale with --resume warns that the
#      checkpoint's scale wins;
#   4. duet compile --precision fp16: the executable prints duet run's losses;
#   5. --arch / --precision: auto follows the device table, bf16 below sm_80
#      is refused naming the card, duet run refuses a GPU --arch;
#   6. fp16 with micro-batches and on two virtual devices (below).
# usage: run_precision.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_precision.sh path/to/duet}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-prec.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
F="--train-subset 2560 --test-subset 1000 --threads 2 --precision fp16"

# 1. forced overflow
"$DUET" run $M $F --steps 40 --log-every 40 --loss-scale 1073741824 > "$d/o.txt" 2>&1 || { bad overflow_run; cat "$d/o.txt"; }
grep '^step' "$d/o.txt" > "$d/skips"
k=$(wc -l < "$d/skips")
# every skipped step halves the scale (printed with %g); the first names linear1.w
halving=$(awk -v s=1073741824 '{ s /= 2; v = $NF; if (v / s < 0.99999 || v / s > 1.00001) bad = 1 }
  END { print bad ? "no" : "yes" }' "$d/skips")
last=$(tail -1 "$d/skips" | awk '{print $NF}')
if [ "$k" -ge 5 ] && [ "$halving" = yes ] &&
   head -1 "$d/skips" | grep -qx 'step 1: gradient overflow (first: linear1.w); step skipped, loss scale now 5.36871e+08' &&
   grep -q "step 40/40 | loss 0\.[0-9]* | lr 0\.001 | [0-9]* samples/s | loss scale $last ($k skipped)" "$d/o.txt" &&
   grep -q "test accuracy [6-9][0-9]\." "$d/o.txt"; then ok "forced_overflow ($k steps skipped, scale 2^30 -> $last)"
else bad forced_overflow; cat "$d/o.txt"; fi

# 1b. gradient clipping with loss scaling: a skipped step is not clipped
# (no norm: null in the metrics); the later steps clip the unscaled
# gradients (a norm of the size fp32 measures: below 100, not 2^20 times it)
"$DUET" run $M --train-subset 512 --batch 64 --threads 2 --precision fp16 --steps 8 --log-every 1 --no-eval \
  --loss-scale 4194304 --clip-grad-norm 1 --metrics "$d/clip.jsonl" > "$d/clip.txt" 2>&1 || { bad clip_overflow_run; cat "$d/clip.txt"; }
if head -1 "$d/clip.jsonl" | grep -q '^{"step":1,"loss":[0-9.e-]*,"lr":0.001,"grad_norm":null}$' &&
   tail -1 "$d/clip.jsonl" | grep -q '^{"step":8,"loss":[0-9.e-]*,"lr":0.001,"grad_norm":[0-9]\{1,2\}\.[0-9]*}$'; then
  ok "clip_with_loss_scaling (skipped steps unclipped, the rest on the unscaled gradients)"
else bad clip_with_loss_scaling; cat "$d/clip.jsonl"; fi

# 2. the floor
"$DUET" run $M $F --steps 5 --loss-scale 1073741824 --min-loss-scale 536870912 > "$d/f.txt" 2> "$d/f.err" &&
  bad "floor: the run succeeded"
want="duet: error: the loss scale fell below 5.36871e+08 (--min-loss-scale): the gradient of linear1.w keeps overflowing (inf or NaN) at step 2; fp16 cannot represent it (try --precision bf16 or fp32, or a lower --lr)"
if [ "$(cat "$d/f.err")" = "$want" ]; then ok floor; else bad floor; echo "got:  $(cat "$d/f.err")"; echo "want: $want"; fi

# 3. exact resume with the scaler state (and bf16)
for p in fp16 bf16; do
  R="--train-subset 2560 --threads 2 --precision $p --loss-scale 1073741824 --log-every 1 --no-eval --quiet"
  "$DUET" run $M $R --steps 12 --metrics "$d/a.jsonl" > /dev/null &&
  "$DUET" run $M $R --steps 5 --save "$d/ck.st" > /dev/null &&
  "$DUET" run $M $R --steps 12 --resume "$d/ck.st" --metrics "$d/b.jsonl" > /dev/null &&
  tail -7 "$d/a.jsonl" | diff - "$d/b.jsonl" && ok "resume_$p" || bad "resume_$p"
  [ $p = fp16 ] && cp "$d/ck.st" "$d/ck16.st" && cp "$d/a.jsonl" "$d/a16.jsonl"
done
# --loss-scale with --resume: the checkpoint's scaler wins (resume stays
# exact, as GradScaler.load_state_dict), with a warning saying so
R="--train-subset 2560 --threads 2 --precision fp16 --log-every 1 --no-eval"
want="duet: warning: --loss-scale 1024 is ignored: resuming from $d/ck16.st restores its loss scale 33554432 (and growth counter) so that the run continues exactly"
"$DUET" run $M $R --steps 12 --loss-scale 1024 --resume "$d/ck16.st" --metrics "$d/c.jsonl" > /dev/null 2> "$d/w.err"
if [ "$(cat "$d/w.err")" = "$want" ] && tail -7 "$d/a16.jsonl" | cmp -s - "$d/c.jsonl"; then ok resume_loss_scale_warning
else bad resume_loss_scale_warning; echo "got:  $(cat "$d/w.err")"; echo "want: $want"; fi

# 4. the compiled executable
C="--steps 12 --log-every 3 --threads 2 --seed 3 --no-eval --train-subset 2560"
"$DUET" compile $M --precision fp16 -o "$d/exe" > /dev/null &&
"$d/exe" $C --metrics "$d/aot.jsonl" > /dev/null &&
"$DUET" run $M --precision fp16 $C --metrics "$d/jit.jsonl" > /dev/null &&
diff "$d/jit.jsonl" "$d/aot.jsonl" && ok compiled_fp16 || bad compiled_fp16

# 5. flags and the device table
"$DUET" ir $M --arch sm_61 --after precision | grep -Eq '^%6 = matmul %4, %5 : f16\[256,1024\](  @block\([0-9]+\))?$' && ok arch_sm_61_fp16 || bad arch_sm_61_fp16
"$DUET" ir $M --arch sm_80 --after precision | grep -q ': bf16\[256,1024\]' && ok arch_sm_80_bf16 || bad arch_sm_80_bf16
"$DUET" ir $M --after precision | grep -q 'f16\|bf16' && bad cpu_auto_fp32 || ok cpu_auto_fp32
expect() { # name command... ; the expected stderr in $want
  n=$1; shift
  "$@" > /dev/null 2> "$d/e" && { bad "$n: succeeded"; return; }
  [ "$(cat "$d/e")" = "$want" ] && ok "$n" || { bad "$n"; echo "got:  $(cat "$d/e")"; echo "want: $want"; }
}
want="duet: error: bf16 needs compute capability 8.0 or newer; sm_60 (Tesla P100) has no bf16 arithmetic: use --precision fp16"
expect bf16_on_p100 "$DUET" ir $M --arch sm_60 --precision bf16
want="duet: error: unknown precision \`fp8\` (auto, fp32, fp16, bf16)"
expect bad_precision "$DUET" check $M --precision fp8
want="duet: error: duet run builds for the CPU; --arch sm_60 is for duet ir and duet check"
expect run_gpu_arch "$DUET" run $M --arch sm_60
# fp16 loss scaling with micro-batches: the seed is S * 1/M (the loss
# scaled once, divided by M once)
"$DUET" ir $M --precision fp16 --micro-batches 2 --after precision > "$d/mb.ir" &&
  grep -q '^%[0-9]* = const 0.5 : f32\[\]  @backward$' "$d/mb.ir" &&
  grep -q '^%[0-9]* = mul %[0-9]*, %[0-9]* : f32\[\]  @backward$' "$d/mb.ir" && ok fp16_micro_batch_seed ||
  bad fp16_micro_batch_seed
# the train section's `precision` key, and the command line winning over it
sed 's/^  seed = 1$/  seed = 1\n  precision = "bf16"/' $M > "$d/p.model"
"$DUET" ir "$d/p.model" --after precision | grep -Eq '^%6 = matmul %4, %5 : bf16\[256,1024\](  @block\([0-9]+\))?$' && ok train_key_precision ||
  bad train_key_precision
"$DUET" ir "$d/p.model" --after precision --precision fp32 | grep -q 'bf16\[' && bad cli_wins || ok cli_wins
# 6. fp16 loss scaling with micro-batches and pipelines: a forced overflow
#    from 2^30 with 4 micro-batches on one device and on cpu:0,cpu:1 (GPipe
#    and 1F1B; every stage's overflow flags OR-ed over the micro-batches,
#    one verdict for all stages) skips the same steps, naming the same
#    params, and ends in the same losses and checkpoint bit for bit (one
#    thread per device); a run resumed mid-backoff on two devices equals
#    the straight one
P="$M --train-subset 2560 --test-subset 500 --precision fp16 --loss-scale 1073741824 --micro-batches 4 --steps 12 --log-every 1 --threads 1"
"$DUET" run $P --metrics "$d/m1.jsonl" --save "$d/m1.st" > "$d/m1.out" 2>&1 || { bad mb_one_device; cat "$d/m1.out"; }
for s in gpipe 1f1b; do
  "$DUET" run $P --devices cpu:0,cpu:1 --schedule $s --metrics "$d/m2.jsonl" --save "$d/m2.st" > "$d/m2.out" 2>&1 ||
    { bad "mb_two_devices_$s"; cat "$d/m2.out"; }
  grep '^step' "$d/m1.out" > "$d/s1"
  grep '^step' "$d/m2.out" > "$d/s2"
  if [ "$(wc -l < "$d/s1")" -ge 5 ] && cmp -s "$d/s1" "$d/s2" && cmp -s "$d/m1.jsonl" "$d/m2.jsonl" &&
     cmp -s "$d/m1.st" "$d/m2.st" && grep -q 'first: linear3.w' "$d/s2"; then
    ok "fp16_pipeline_$s ($(wc -l < "$d/s1") skipped steps, identical to one device)"
  else bad "fp16_pipeline_$s"; diff "$d/m1.out" "$d/m2.out" | head; fi
done
"$DUET" run $P --devices cpu:0,cpu:1 --steps 5 --quiet --save "$d/m5.st" > /dev/null 2>&1 &&
"$DUET" run $P --devices cpu:0,cpu:1 --resume "$d/m5.st" --quiet --metrics "$d/mr.jsonl" > /dev/null 2>&1 &&
  [ "$(wc -l < "$d/mr.jsonl")" -eq 9 ] && tail -9 "$d/m1.jsonl" | diff - "$d/mr.jsonl" &&
  ok fp16_pipeline_resume || bad fp16_pipeline_resume
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
