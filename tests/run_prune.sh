#!/bin/sh
# Pruning end to end (duet run on fmnist_mlp / fmnist_cnn, short runs):
#   1. regrowth: pruned after 5 steps, trained on with AdamW + weight decay,
#      SGD + momentum + weight decay and AdamW in fp16: in the checkpoint
#      every pruned weight and its optimizer state is +0.0 (prune_check);
#   2. the modes: global (one threshold: the exact count over all layers),
#      2:4 (every group of 4 along the inputs keeps 2; the CNN's conv2 and
#      linear layers, conv1 left out with --prune-params), channels (whole
#      output channels, MLP and CNN);
#   3. the gradual schedule: the masks change after steps 5, 10, 15, 20, 25
#      to the targets of Zhu & Gupta's formula (hand-derived: 0, 0.5203125,
#      0.7875, 0.8859375, 0.9), each layer's sparsity exact; the metrics
#      lines, the progress lines and the table at the end;
#   4. resume: 30 steps straight against 13 + resume and 15 + resume (an
#      update is due right after the checkpoint): the same checkpoint, byte
#      for byte, and the same metrics file; a checkpoint of a run without
#      pruning resumed into a pruned run (masks from ones) ends as the pruned
#      run from the start, and is refused (before compiling) when the
#      schedule's last update lies before its step; a pruned checkpoint
#      resumed with another mode, a lower sparsity or one its masks would
#      not reach is refused (before compiling), a higher one with updates to
#      come warns; resumed without the pruning flags (or with fewer pruned
#      params), the error names the masks and the flags;
#   5. a compiled executable prunes as duet run does (same losses, masks);
#   6. the IR: `duet ir --after prune` shows the masks; the dump trains with
#      the .model's losses; a pipeline on two virtual CPU devices prunes as
#      one device with the same micro-batches does (same checkpoint);
#   7. flag errors with their exact text, before any kernel is compiled;
#      sparsities that would prune every weight (or channel) of a tensor,
#      or (global) of all, named.
# Without Fashion-MNIST the parts that need it are skipped (exit 77).
# usage: run_prune.sh path/to/duet path/to/prune_check   (from the repository root)
DUET=${1:?usage: run_prune.sh path/to/duet path/to/prune_check}
CHECK=${2:?usage: run_prune.sh path/to/duet path/to/prune_check}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-prune.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0 skipped=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
C=models/fmnist_cnn.model
F="--train-subset 2560 --no-eval --threads 2 --log-every 1"
# losses FILE: the loss lines of a run's output, without the throughput
losses() { sed -n 's/^\(epoch [0-9]* step [0-9/]* | loss [0-9.]*\) .*/\1/p' "$1"; }
# check NAME CK ARGS...: prune_check passes
check() {
  name=$1 ck=$2; shift 2
  if "$CHECK" "$ck" "$@" > "$d/check.txt" 2>&1; then ok "$name"; else bad "$name"; cat "$d/check.txt"; fi
}
# expect_error NAME "the whole error line" ARGS...: duet run exits 1 with that line, no kernels compiled
expect_error() {
  name=$1 want=$2; shift 2
  out=$(DUET_CACHE_DIR="$d/cache-$name" "$DUET" run "$@" 2>&1); rc=$?
  if [ "$rc" -eq 1 ] && [ "$out" = "$want" ] && [ -z "$(ls -A "$d/cache-$name" 2>/dev/null)" ]; then ok "$name"
  else bad "$name: exit $rc"; printf '%s\n' "$out" | head -5; echo "  want: $want"; fi
}

# 7. flag errors (need no data: they stop before the data is read)
expect_error sparsity_range "duet: error: --prune expects a sparsity in [0, 1), got '1'" $M --prune 1
expect_error sparsity_negative "duet: error: --prune expects a sparsity in [0, 1), got '-0.1'" $M --prune=-0.1
expect_error unknown_mode "duet: error: unknown --prune-mode 'sparse'; modes are unstructured, global, channels and N:M such as 2:4" \
  $M --prune 0.5 --prune-mode sparse
expect_error nm_order "duet: error: --prune-mode 3:2: N must be less than M (N:M keeps N of every M weights, such as 2:4)" \
  $M --prune-mode 3:2
expect_error end_before_start "duet: error: prune end step 10 is before its start step 20" \
  $M --prune 0.5 --prune-start 20 --prune-end 10
expect_error every_zero "duet: error: --prune-every expects an integer >= 1 (a step count), got '0'" $M --prune 0.5 --prune-every 0
expect_error nm_every "duet: error: 2:4 pruning is one-shot, at its start step: the frequency (--prune-every, \`every\`) belongs to the gradual schedule of unstructured, global and channels pruning; leave it out" \
  $M --prune-mode 2:4 --prune-start 5 --prune-every 5
expect_error nm_initial "duet: error: 2:4 pruning is one-shot, at its start step: the initial sparsity (--prune-initial, \`initial_sparsity\`) belongs to the gradual schedule of unstructured, global and channels pruning; leave it out" \
  $M --prune-mode 2:4 --prune-initial 0.1
expect_error no_sparsity "duet: error: unstructured pruning needs its final sparsity: \`sparsity = S\` in the prune section, or --prune S" \
  $M --prune-start 5
expect_error missing_value "duet: error: --prune-mode needs a value (see duet run --help)" $M --prune-mode
expect_error cnn_2_4 "$C:10:9: error: 2:4 pruning of \`conv1.w\` f32[32,1,3,3]: its input dimension (9) is not divisible by 4; leave it out with --prune-params '!conv1.w' (params = \"!conv1.w\")
    param w: [out, dim(x, 1), k, k] = kaiming_uniform
          ^" $C --prune-mode 2:4
# sparsities that round to every weight (round(s x n) = n) of a tensor, or of all (global)
expect_error prunes_all "$M:8:9: error: unstructured pruning to sparsity 0.9999999 removes every weight of \`linear1.w\` f32[784,1024]: round(0.9999999 x 802816) = 802816; give a sparsity below 0.999999, or leave it out with --prune-params '!linear1.w'
    param w: [dim(h, -1), out] = kaiming_uniform
          ^" $M --prune 0.9999999
expect_error prunes_all_channels "$M:8:9: error: channels pruning to sparsity 0.96 removes every output channel of \`linear3.w\` f32[1024,10]: round(0.96 x 10) = 10; give a sparsity below 0.95, or leave it out with --prune-params '!linear3.w'
    param w: [dim(h, -1), out] = kaiming_uniform
          ^" $M --prune 0.96 --prune-mode channels
expect_error prunes_all_global "duet: error: global pruning to sparsity 0.9999999 removes every weight of the pruned tensors: round(0.9999999 x 1861632) = 1861632; give a sparsity below 0.9999997" \
  $M --prune 0.9999999 --prune-mode global
"$DUET" ir $M --after prune --prune 0.5 > "$d/p.ir" 2>&1 || bad "ir --after prune"
expect_error dump_after_prune "$d/p.ir:2:7: error: the dump was printed after \`prune\`, so its pruning is fixed; the --prune flags need the .model or a dump from before \`prune\`
  after prune
        ^" "$d/p.ir" --prune 0.7
# 6 (IR, no data): the masks and the ops that apply them, after the updates
n_mask=$(grep -c '^%[0-9]* = state "linear[123].w.mask" ones : f32\[' "$d/p.ir")
n_op=$(grep -c '^prune_mask\[out=1\] %[0-9]*, %[0-9]*, %[0-9]*, %[0-9]* : void  @optimizer$' "$d/p.ir")
if [ "$n_mask" -eq 3 ] && [ "$n_op" -eq 3 ] && grep -qx 'prune mode="unstructured" sparsity=0.5 initial=0 start=0 end=0 every=100' "$d/p.ir"
then ok ir_after_prune; else bad "ir_after_prune ($n_mask masks, $n_op ops)"; fi

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "skip: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist): the training parts"
  echo "$pass passed, $fail failed (training parts skipped)"
  [ "$fail" -eq 0 ] && exit 77
  exit 1
fi

# 1. regrowth
"$DUET" run $M $F --steps 25 --prune 0.5 --prune-start 5 --weight-decay 0.1 --quiet --save "$d/adamw.st" > /dev/null &&
  check regrowth_adamw "$d/adamw.st" --sparsity 0.5 --masks 3 || bad "regrowth_adamw run"
sed 's/optimizer = adamw(.*)/optimizer = sgd(lr = 0.05, momentum = 0.9, weight_decay = 0.01)/' $M > "$d/sgd.model"
"$DUET" run "$d/sgd.model" $F --steps 25 --prune 0.5 --prune-start 5 --quiet --save "$d/sgd.st" > /dev/null &&
  check regrowth_sgd "$d/sgd.st" --sparsity 0.5 --masks 3 || bad "regrowth_sgd run"
"$DUET" run $M $F --steps 25 --prune 0.5 --prune-start 5 --precision fp16 --quiet --save "$d/fp16.st" > /dev/null &&
  check regrowth_fp16 "$d/fp16.st" --sparsity 0.5 --masks 3 || bad "regrowth_fp16 run"

# 2. the modes
"$DUET" run $M $F --steps 6 --prune 0.7 --prune-mode global --prune-start 3 --quiet --save "$d/g.st" > /dev/null &&
  check global "$d/g.st" --global 0.7 || bad "global run"
"$DUET" run $M $F --steps 6 --prune-mode 2:4 --prune-start 3 --quiet --save "$d/nm.st" > /dev/null &&
  check 2_4 "$d/nm.st" --nm 2:4 --sparsity 0.5 || bad "2:4 run"
"$DUET" run $M $F --steps 6 --prune 0.5 --prune-mode channels --prune-start 3 --quiet --save "$d/ch.st" > /dev/null &&
  check channels "$d/ch.st" --channels --sparsity 0.5 || bad "channels run"
CF="--train-subset 384 --no-eval --threads 2 --quiet --steps 3 --prune-start 1"
"$DUET" run $C $CF --prune-mode 2:4 --prune-params '!conv1.w' --save "$d/cnm.st" > /dev/null &&
  check cnn_2_4 "$d/cnm.st" --nm 2:4 --sparsity 0.5 --masks 3 || bad "cnn 2:4 run"
"$DUET" run $C $CF --prune 0.25 --prune-mode channels --save "$d/cch.st" > /dev/null &&
  check cnn_channels "$d/cch.st" --channels --sparsity 0.25 --masks 4 || bad "cnn channels run"
# (linear2.w [128,10]: round(0.25 x 10) = 2 of its 10 channels; round half to even)

# 3. the gradual schedule (and 4: its straight run)
G="$F --prune 0.9 --prune-start 5 --prune-end 25 --prune-every 5"
"$DUET" run $M $G --steps 30 --save "$d/a.st" --metrics "$d/a.jsonl" > "$d/a.txt" 2>&1 || { bad "gradual run"; cat "$d/a.txt"; }
grep '"sparsity"' "$d/a.jsonl" > "$d/sched.jsonl"
# {"step":6,"sparsity":...,"target":0,"layers":{...}}: the targets, and each layer exactly round(target x n) / n
res=$(awk -F'[:,{}]' 'BEGIN { split("6 11 16 21 26", st, " "); split("0 0.5203125 0.7875 0.8859375 0.9", tg, " ");
    n["linear1.w"] = 802816; n["linear2.w"] = 1048576; n["linear3.w"] = 10240 }
  { k++; for (i = 1; i < NF; i++) { if ($i == "\"step\"") s = $(i + 1); if ($i == "\"target\"") t = $(i + 1)
      if ($i ~ /"linear[123]\.w"/) { name = $i; gsub(/"/, "", name); v[name] = $(i + 1) } }
    if (s != st[k] || t - tg[k] > 1e-15 || tg[k] - t > 1e-15) bad = bad " step " s " target " t
    for (name in n) { z = t * n[name]; r = int(z + 0.5); if (r - z == 0.5 && r % 2) r--
      if (v[name] * n[name] - r > 1e-6 || r - v[name] * n[name] > 1e-6) bad = bad " " name "@" s } }
  END { if (k != 5) bad = bad " " k " lines"; print bad ? bad : "ok" }' "$d/sched.jsonl")
[ "$res" = ok ] && ok "gradual_schedule" || { bad "gradual_schedule:$res"; cat "$d/sched.jsonl"; }
if grep -Fqx 'prune before step 11: unstructured, target sparsity 0.5203: 0.5203 of 1861632 weights (linear1.w 0.5203, linear2.w 0.5203, linear3.w 0.5203)' "$d/a.txt" &&
   grep -Fqx 'duet: sparsity at the end (unstructured): 0.9000 of 1861632 weights' "$d/a.txt" &&
   grep -Fqx '  linear3.w                [1024,10]        0.9000' "$d/a.txt"; then ok progress_lines
else bad progress_lines; grep -i "prune\|sparsity\|linear" "$d/a.txt"; fi
check gradual_masks "$d/a.st" --sparsity 0.9 --masks 3

# 4. resume, exactly
for at in 13 15; do
  "$DUET" run $M $G --steps $at --save "$d/b$at.st" --metrics "$d/b$at.jsonl" > /dev/null 2>&1 &&
  "$DUET" run $M $G --steps 30 --resume "$d/b$at.st" --save "$d/b$at.st" --metrics "$d/b$at.jsonl" > /dev/null 2>&1 &&
  cmp -s "$d/a.st" "$d/b$at.st" && cmp -s "$d/a.jsonl" "$d/b$at.jsonl" && ok "resume_at_$at" ||
    { bad "resume_at_$at"; diff "$d/a.jsonl" "$d/b$at.jsonl" | head -5; }
done

# a checkpoint of a run without pruning continues into a pruned run (train,
# then prune and fine-tune): the masks start at ones, and the run ends as
# one that pruned from the start of the schedule does, byte for byte
"$DUET" run $M $F --steps 3 --quiet --save "$d/dense.st" > /dev/null &&
"$DUET" run $M $F --steps 8 --prune 0.5 --prune-start 5 --resume "$d/dense.st" --save "$d/dense.st" > "$d/dp.txt" 2>&1 &&
"$DUET" run $M $F --steps 8 --prune 0.5 --prune-start 5 --quiet --save "$d/straight.st" > /dev/null &&
  grep -Fqx "duet: $d/dense.st has no pruning masks (a run without pruning): pruning starts from the dense weights, at the schedule's steps after its step 3" "$d/dp.txt" &&
  cmp -s "$d/dense.st" "$d/straight.st" && ok resume_dense_into_pruned || { bad resume_dense_into_pruned; cat "$d/dp.txt"; }
"$DUET" run $M $F --steps 3 --quiet --save "$d/dense.st" > /dev/null
expect_error resume_dense_after_schedule "duet: error: cannot resume from $d/dense.st: it has no pruning masks (a run without pruning) and its step 3 is after the pruning schedule's last update (after step 2), so nothing would be pruned; start pruning at its step or later (--prune-start 3)" \
  $M $F --steps 8 --prune 0.5 --prune-start 2 --resume "$d/dense.st"

# a pruned checkpoint resumed with other pruning settings (its metadata
# records them): another mode, a next update below the sparsity its masks
# reached, or another final sparsity with no update left are refused before
# compiling; a higher sparsity with an update to come goes on, with a warning
"$DUET" run $M $F --steps 6 --prune 0.5 --prune-start 3 --quiet --save "$d/p5.st" > /dev/null || bad "pruned run for resume"
expect_error resume_other_mode "duet: error: cannot resume from $d/p5.st: it was pruned with --prune 0.5 --prune-start 3, this run asks for --prune-mode 2:4 --prune-start 2: its masks were chosen by unstructured pruning and are not 2:4 masks; resume with its mode (--prune-mode unstructured)" \
  $M $F --steps 8 --resume "$d/p5.st" --prune-mode 2:4 --prune-start 2
expect_error resume_lower "duet: error: cannot resume from $d/p5.st: it was pruned with --prune 0.5 --prune-start 3, this run asks for --prune 0.3 --prune-start 10: its masks reached sparsity 0.5, and this schedule's next update (after step 10) asks for 0.3, which would bring pruned weights back; ask for 0.5 or more from step 6 on" \
  $M $F --steps 12 --resume "$d/p5.st" --prune 0.3 --prune-start 10
expect_error resume_no_update "duet: error: cannot resume from $d/p5.st: it was pruned with --prune 0.5 --prune-start 3, this run asks for --prune 0.7 --prune-start 2: its masks have sparsity 0.5 and this schedule makes no update after its step 6 (the last is after step 2), so they would stay at 0.5, not 0.7; resume with its sparsity, or schedule an update after step 6 or later (--prune-start, --prune-end)" \
  $M $F --steps 8 --resume "$d/p5.st" --prune 0.7 --prune-start 2
# ... and without the pruning flags: the masks named, the flags given
expect_error resume_without_pruning "duet: error: cannot resume from $d/p5.st: it was trained with pruning (it holds the pruning masks linear1.w.mask, linear2.w.mask, linear3.w.mask): pass its pruning flags (--prune 0.5 --prune-start 3), or the model's prune section, to continue it" \
  $M $F --steps 8 --resume "$d/p5.st"
expect_error resume_fewer_params "duet: error: cannot resume from $d/p5.st: it holds pruning masks of params this run does not prune (linear3.w.mask): pass its --prune-params (or the prune section's params)" \
  $M $F --steps 8 --resume "$d/p5.st" --prune 0.5 --prune-start 3 --prune-params '!linear3.w'
"$DUET" run $M $F --steps 8 --resume "$d/p5.st" --prune 0.7 --prune-start 6 > "$d/p7.txt" 2>&1 &&
  grep -Fqx "duet: warning: the pruning schedule --prune 0.7 --prune-start 6 differs from the checkpoint's --prune 0.5 --prune-start 3 ($d/p5.st): the masks go on from its sparsity 0.5, and the resumed run does not continue the original one exactly" "$d/p7.txt" &&
  grep -Fqx 'duet: sparsity at the end (unstructured): 0.7000 of 1861632 weights' "$d/p7.txt" && ok resume_higher_sparsity ||
  { bad resume_higher_sparsity; grep duet "$d/p7.txt"; }

# 5. a compiled executable
P="--prune 0.6 --prune-start 3"
if "$DUET" compile $M $P -o "$d/exe" > "$d/compile.txt" 2>&1; then
  "$DUET" run $M $F $P --steps 8 --save "$d/r.st" > "$d/r.out" && losses "$d/r.out" > "$d/r.txt"
  "$d/exe" $F --steps 8 --save "$d/e.st" > "$d/e.out" && losses "$d/e.out" > "$d/e.txt"
  cmp -s "$d/r.txt" "$d/e.txt" && [ -s "$d/r.txt" ] && "$CHECK" "$d/e.st" --sparsity 0.6 > /dev/null && ok compiled_executable ||
    { bad compiled_executable; diff "$d/r.txt" "$d/e.txt" | head; }
else bad "duet compile"; cat "$d/compile.txt"; fi

# 6. the dump trains as the .model; a pipeline as one device with its micro-batches
"$DUET" ir $M --after prune --prune 0.5 --prune-start 2 > "$d/q.ir" &&
"$DUET" run $M $F --steps 6 --prune 0.5 --prune-start 2 > "$d/m.out" && losses "$d/m.out" > "$d/m.txt" &&
"$DUET" run "$d/q.ir" $F --steps 6 > "$d/i.out" && losses "$d/i.out" > "$d/i.txt" &&
  cmp -s "$d/m.txt" "$d/i.txt" && [ -s "$d/m.txt" ] && ok ir_dump_trains || { bad ir_dump_trains; diff "$d/m.txt" "$d/i.txt"; }
PP="--train-subset 2560 --no-eval --threads 1 --quiet --steps 6 --prune 0.5 --prune-start 2 --micro-batches 2"
"$DUET" run $M $PP --save "$d/one.st" > /dev/null &&
"$DUET" run $M $PP --devices cpu:0,cpu:1 --save "$d/two.st" > /dev/null &&
  cmp -s "$d/one.st" "$d/two.st" && "$CHECK" "$d/two.st" --sparsity 0.5 > /dev/null && ok pipeline || bad pipeline

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
