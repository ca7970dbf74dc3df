#!/bin/sh
# tests/run_adamw8.sh: 8-bit AdamW state (--optimizer-state int8, adamw(state =
# int8)) through the CLI, on fmnist_mlp (1,863,690 params in 6 tensors):
#   1. duet plan counts 2 bytes of codes per param plus 8 bytes of scales per
#      block of 2,048 (3,734,676 bytes: 3.56 MiB) instead of 8 per param
#      (14.22 MiB), and that is what the memory plan allocates (duet run's
#      memory line); duet check prints the same bytes;
#   2. checkpoints hold the codes (U8, the param's shape) and the scales (F32,
#      one per block) under `<param>.exp_avg.codes`, `.exp_avg.absmax`,
#      `.exp_avg_sq.codes`, `.exp_avg_sq.absmax`, and a run resumed from step
#      12 prints exactly the losses of an uninterrupted 25-step run (crossing
#      epochs) and writes a byte-identical final checkpoint; the flag and the
#      model's `state = int8` give the same program (identical losses);
#   3. an IR dump printed after memplan reads back to the same text and trains
#      with the .model's losses, as does a `duet compile --optimizer-state
#      int8` executable; a dump after `optimizer` refuses another
#      --optimizer-state;
#   3b. ZeRO stage 1 with 8-bit state (--data-parallel 2 --zero 1) equals one
#      device with 2 micro-batches, checkpoint byte for byte;
#   4. exact diagnostics: a bad or missing --optimizer-state, int8 with sgd,
#      resuming an f32-state checkpoint with int8 state and the reverse.
# usage: run_adamw8.sh path/to/duet   (from the repository root; exit 77
# without Fashion-MNIST)
DUET=${1:?usage: run_adamw8.sh path/to/duet}
FM=/usr/share/datasets/fashion-mnist
if [ ! -r "$FM/train-images-idx3-ubyte.gz" ]; then
  echo "skip: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
  exit 77
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-q8.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
Q="--optimizer-state int8"
# expect NAME WANT COMMAND...: exit 1 with exactly WANT as the first line of stderr
expect() {
  name=$1 want=$2
  shift 2
  if "$@" > "$d/out" 2> "$d/err"; then bad "$name: succeeded"; return; fi
  got=$(head -1 "$d/err")
  if [ "$got" = "$want" ]; then ok "$name"; else bad "$name"; echo "  got:  $got"; echo "  want: $want"; fi
}

# 1. the bytes
"$DUET" plan $M $Q > "$d/plan8" && "$DUET" plan $M > "$d/plan32" &&
  grep -q "optimizer state 3.56 MiB" "$d/plan8" && grep -q "optimizer state 14.22 MiB" "$d/plan32" && ok plan_bytes ||
  { bad plan_bytes; grep "optimizer state" "$d/plan8" "$d/plan32"; }
"$DUET" check $M $Q | tail -1 | grep -qx "optimizer state: adamw int8, 3734676 bytes (3.6 MiB): 3727380 bytes of codes (2 per parameter) and 7296 of scales (8 per block of 2048); f32 moments: 14909520 bytes (14.2 MiB)" &&
  ok check_bytes || { bad check_bytes; "$DUET" check $M $Q | tail -1; }
[ "$("$DUET" check $M | grep -c '^optimizer state')" = 0 ] && ok check_f32_no_line || bad check_f32_no_line

# 2. checkpoints and exact resume
E="--train-subset 2560 --test-subset 300 --log-every 1 --threads 2 --quiet"
"$DUET" run $M $Q $E --steps 25 --metrics "$d/a.jsonl" --save "$d/a.st" > "$d/a.out" 2>&1 &&
  "$DUET" run $M $Q $E --steps 12 --save "$d/ck.st" --metrics "$d/b.jsonl" > /dev/null 2>&1 &&
  "$DUET" run $M $Q $E --steps 25 --resume "$d/ck.st" --metrics "$d/b.jsonl" --save "$d/b.st" > /dev/null 2>&1 &&
  grep -v '^{"step":12,"epoch"' "$d/b.jsonl" | cmp -s "$d/a.jsonl" - && cmp -s "$d/a.st" "$d/b.st" && ok resume_exact ||
  { bad resume_exact; diff "$d/a.jsonl" "$d/b.jsonl" | head -5; }
"$DUET" run $M $Q --steps 1 --train-subset 256 --no-eval --threads 1 > "$d/mem.out" 2>&1
grep -q "^duet: memory: params 7.1 MiB, optimizer state 3.6 MiB" "$d/mem.out" && ok run_allocates ||
  { bad run_allocates; grep memory "$d/mem.out"; }
hl=$(od -An -tu8 -N8 "$d/a.st" | tr -d ' \n')
head -c $((8 + hl)) "$d/a.st" | tail -c +9 > "$d/header"
ok_t=1
for t in '"linear1.w.exp_avg.codes":{"dtype":"U8","shape":[784,1024]' '"linear1.w.exp_avg_sq.codes":{"dtype":"U8","shape":[784,1024]' \
         '"linear1.w.exp_avg.absmax":{"dtype":"F32","shape":[392]' '"linear1.w.exp_avg_sq.absmax":{"dtype":"F32","shape":[392]' \
         '"linear3.b.exp_avg.absmax":{"dtype":"F32","shape":[1]' '"linear2.w.exp_avg_sq.codes":{"dtype":"U8","shape":[1024,1024]'; do
  grep -qF "$t" "$d/header" || { ok_t=0; echo "  no $t"; }
done
grep -q '"linear1.w.exp_avg":' "$d/header" && { ok_t=0; echo "  an f32 exp_avg in an int8 checkpoint"; }
[ $ok_t = 1 ] && ok checkpoint_tensors || bad checkpoint_tensors
sed 's/adamw(lr = 1e-3, weight_decay = 0.01)/adamw(lr = 1e-3, weight_decay = 0.01, state = int8)/' $M > "$d/m8.model"
"$DUET" run "$d/m8.model" $E --steps 25 --metrics "$d/c.jsonl" > /dev/null 2>&1 && cmp -s "$d/a.jsonl" "$d/c.jsonl" &&
  ok model_state_equals_flag || bad model_state_equals_flag

# 3. IR dumps
"$DUET" ir "$d/m8.model" --after memplan > "$d/g.ir" && "$DUET" ir "$d/g.ir" > "$d/g2.ir" && cmp -s "$d/g.ir" "$d/g2.ir" &&
  grep -q '^%27 = state "linear1.w.exp_avg.codes" : u8\[784,1024\]' "$d/g.ir" && ok ir_roundtrip || bad ir_roundtrip
F="--train-subset 512 --no-eval --log-every 1 --threads 1"
"$DUET" run "$d/g.ir" $F --steps 3 --metrics "$d/ir.jsonl" > /dev/null 2>&1 &&
  "$DUET" run "$d/m8.model" $F --steps 3 --metrics "$d/mo.jsonl" > /dev/null 2>&1 &&
  [ -s "$d/ir.jsonl" ] && cmp -s "$d/ir.jsonl" "$d/mo.jsonl" && ok ir_trains_alike || bad ir_trains_alike
"$DUET" ir "$d/m8.model" --after optimizer > "$d/opt.ir"
expect ir_fixed_state "$d/opt.ir:2:7: error: the dump was printed after \`optimizer\`, so its optimizer state is fixed (int8); --optimizer-state f32 needs the .model or a dump from before \`optimizer\`" \
  "$DUET" ir "$d/opt.ir" --optimizer-state f32

# a compiled executable keeps the 8-bit state and prints duet run's losses
"$DUET" compile $M $Q -o "$d/exe" > /dev/null 2>&1 && "$d/exe" $F --steps 3 --metrics "$d/exe.jsonl" > /dev/null 2>&1 &&
  "$DUET" run $M $Q $F --steps 3 --metrics "$d/run.jsonl" > /dev/null 2>&1 && [ -s "$d/exe.jsonl" ] &&
  cmp -s "$d/exe.jsonl" "$d/run.jsonl" && cmp -s "$d/run.jsonl" "$d/mo.jsonl" && ok compiled_equals_run || bad compiled_equals_run

# ZeRO stage 1 (--zero 1) shards the state by whole tensors, codes and scales
# alike: two replicas equal one device with 2 micro-batches, checkpoint and all
Z="--steps 10 --log-every 1 --train-subset 2560 --no-eval"
"$DUET" run $M $Q $Z --micro-batches 2 --threads 1 --metrics "$d/z1.jsonl" --save "$d/z1.st" > /dev/null 2>&1 &&
  DUET_DP_CHECK=1 "$DUET" run $M $Q $Z --data-parallel 2 --zero 1 --threads 2 --metrics "$d/z2.jsonl" --save "$d/z2.st" \
    > /dev/null 2>&1 && cmp -s "$d/z1.jsonl" "$d/z2.jsonl" && cmp -s "$d/z1.st" "$d/z2.st" && ok zero_sharded_int8 ||
  bad zero_sharded_int8

# 4. diagnostics
expect bad_value "duet: error: unknown --optimizer-state \`8bit\` (int8, f32)" "$DUET" run $M --optimizer-state 8bit
expect no_value "duet: error: --optimizer-state needs a value (int8, f32)" "$DUET" plan $M --optimizer-state
sed 's/adamw(lr = 1e-3, weight_decay = 0.01)/sgd(lr = 0.1)/' $M > "$d/sgd.model"
expect sgd_int8 "duet: error: --optimizer-state int8 quantizes AdamW's moments; this model trains with sgd (use adamw, or leave the flag out)" \
  "$DUET" check "$d/sgd.model" $Q
R="--train-subset 512 --no-eval --quiet --threads 1"
"$DUET" run $M $R --steps 2 --save "$d/f32.st" > /dev/null 2>&1
expect resume_f32_as_int8 "duet: error: cannot resume from $d/f32.st: it has no tensor \`linear1.w.exp_avg.codes\` (its AdamW state is f32: resume with --optimizer-state f32)" \
  "$DUET" run $M $Q $R --steps 4 --resume "$d/f32.st"
expect resume_int8_as_f32 "duet: error: cannot resume from $d/ck.st: it has no tensor \`linear1.w.exp_avg\` (its AdamW state is 8-bit: resume with --optimizer-state int8)" \
  "$DUET" run $M $R --steps 30 --resume "$d/ck.st"

echo "run_adamw8: $pass passed, $fail failed"
[ $fail -eq 0 ]
