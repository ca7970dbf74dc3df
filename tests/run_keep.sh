#!/bin/sh
# Checkpoints people can manage, and Fashion-MNIST's validation split:
#   1. fashion_mnist(DIR, val_fraction = 0.1), 16 steps of 4 epochs with
#      --save k.st --save-every 2 --keep 3 --keep-best: the directory holds
#      k.st (step 16), k.st.step-14, k.st.step-12 (older ones removed),
#      k.st.best (the step of the best validation accuracy), k.st.best.json;
#      the per-epoch evaluations are on the 6000 validation samples
#      ("val_accuracy"), the test split is evaluated once, at the end (one
#      "test_accuracy" line, "final"), which --eval-only on k.st reproduces
#      bit for bit; every metrics line has its step;
#      --keep 2 across a resume rotates on from the resumed checkpoint;
#   2. a text model with --keep-best: k.st.best is the step of the lowest
#      validation loss (step 7 of 8 here, not the last);
#   3. exact errors: --keep 0, --keep x, --keep and --keep-best without
#      --save, --keep-best with --no-eval, val_fraction 0, 1.5, a string,
#      one that leaves no validation sample, an unknown argument.
# usage: run_keep.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_keep.sh path/to/duet}
PY=/usr/bin/python3
d=${TMPDIR:-/tmp}/duet-keep.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
FM='fashion_mnist("/usr/share/datasets/fashion-mnist")'
sed "s|$FM|fashion_mnist(\"/usr/share/datasets/fashion-mnist\", val_fraction = 0.1)|" models/fmnist_mlp.model > "$d/v.model"
grep -q 'val_fraction = 0.1' "$d/v.model" || bad model_edit
F="--train-subset 1024 --test-subset 1000 --threads 1"
# ck_step FILE: the step of a checkpoint, as --eval-only reports it
ck_step() { "$DUET" run "$d/v.model" $F --eval-only --checkpoint "$1" 2>&1 | sed -n 's/.*(step \([0-9]*\)).*/\1/p'; }

# 1. --keep, --keep-best, val_fraction
"$DUET" run "$d/v.model" $F --steps 16 --save "$d/k.st" --save-every 2 --keep 3 --keep-best --log-every 4 \
  --metrics "$d/m.jsonl" > "$d/run.out" 2>&1 || { bad train; cat "$d/run.out"; }
files=$(cd "$d" && ls k.st* | tr '\n' ' ')
[ "$files" = "k.st k.st.best k.st.best.json k.st.step-12 k.st.step-14 " ] && ok keep_3_files || { bad keep_3_files; echo "$files"; }
[ "$(ck_step "$d/k.st") $(ck_step "$d/k.st.step-14") $(ck_step "$d/k.st.step-12")" = "16 14 12" ] &&
  ok kept_checkpoints_steps || bad kept_checkpoints_steps
out=$($PY - "$d/m.jsonl" <<'EOF'
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
assert all("step" in o for o in L), "a line without its step"
val = [o for o in L if "val_accuracy" in o]
test = [o for o in L if "test_accuracy" in o]
assert len(val) == 4, "one validation per epoch"
assert len(test) == 1 and test[0].get("final") is True and L[-1] is test[0], "the test split once, at the end"
best = max(val, key=lambda o: (o["val_accuracy"], -o["val_loss"]))
print(best["step"])
EOF
)
set -- $out
[ -n "$1" ] && ok metrics_val_then_final_test || { bad metrics_val_then_final_test; cat "$d/m.jsonl"; }
[ "$(ck_step "$d/k.st.best")" = "$1" ] && ok best_is_best_validation || { bad best_is_best_validation; echo "want $1"; }
grep -q "^epoch 1 | validation accuracy [0-9.]*% ([0-9]*/6000)" "$d/run.out" && ok validation_split_6000 ||
  { bad validation_split_6000; cat "$d/run.out"; }
"$DUET" run "$d/v.model" $F --eval-only --checkpoint "$d/k.st" --metrics "$d/e.jsonl" > /dev/null
numbers() { sed -n 's/.*"test_accuracy":\([^,]*\),"test_loss":\([^,]*\),.*/\1 \2/p' "$1"; }
[ -n "$(numbers "$d/e.jsonl")" ] && [ "$(numbers "$d/e.jsonl")" = "$(numbers "$d/m.jsonl")" ] &&
  ok eval_only_is_final_test || { bad eval_only_is_final_test; cat "$d/e.jsonl"; tail -1 "$d/m.jsonl"; }

# --keep 2 across a resume: the resumed run keeps the checkpoint it resumed
# from as k2.st.step-8 and removes what is older than the last two
"$DUET" run models/fmnist_mlp.model $F --no-eval --steps 8 --save "$d/k2.st" --save-every 2 --keep 2 --quiet \
  > /dev/null || bad keep_resume_first
"$DUET" run models/fmnist_mlp.model $F --no-eval --steps 12 --save "$d/k2.st" --save-every 3 --keep 2 --quiet \
  --resume "$d/k2.st" > /dev/null || bad keep_resume_second
files=$(cd "$d" && ls k2.st* | tr '\n' ' ')
[ "$files" = "k2.st k2.st.step-9 " ] && [ "$(ck_step "$d/k2.st.step-9")" = 9 ] && ok keep_across_resume ||
  { bad keep_across_resume; echo "$files"; }

# 2. a text model: the lowest validation loss
G=tests/models/gpt_tiny.model
# (--lr 0.03: the loss rises again after step 7, so the best is not the last)
"$DUET" run $G --steps 8 --eval-every 1 --lr 0.03 --threads 1 --quiet --save "$d/g.st" --keep-best \
  --metrics "$d/g.jsonl" > /dev/null || bad text_train
want=$($PY -c "
import json, sys
L = [json.loads(l) for l in open(sys.argv[1]) if 'val_loss' in l]
print(min(L, key=lambda o: o['val_loss'])['step'])" "$d/g.jsonl")
got=$($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['step'])" "$d/g.st.best.json")
[ -n "$want" ] && [ "$want" = "$got" ] && ok text_best_lowest_val_loss || { bad text_best_lowest_val_loss; cat "$d/g.jsonl"; }

# 3. errors
check() {
  name=$1 want=$2; shift 2
  out=$("$@" 2>&1); rc=$?
  [ "$rc" -eq 1 ] && [ "$out" = "$want" ] && ok "$name" || { bad "$name: exit $rc"; echo "$out"; echo "  want: $want"; }
}
M=models/fmnist_mlp.model
check keep_0 "duet: error: --keep expects a number of checkpoints >= 1 (PATH and the N-1 before it), got '0'" \
  "$DUET" run $M --keep 0 --save "$d/x.st"
check keep_word "duet: error: --keep expects a number of checkpoints >= 1 (PATH and the N-1 before it), got 'x'" \
  "$DUET" run $M --keep x --save "$d/x.st"
check keep_no_save "duet: error: --keep needs --save PATH (where to write the checkpoints)" "$DUET" run $M --keep 2
check keep_best_no_save "duet: error: --keep-best needs --save PATH (where to write the checkpoints)" \
  "$DUET" run $M --keep-best
check keep_best_no_eval "duet: error: --keep-best keeps the checkpoint of the best evaluation: it cannot go with \
--no-eval" "$DUET" run $M --keep-best --no-eval --save "$d/x.st"
check keep_best_value "duet: error: --keep-best takes no value" "$DUET" run $M --keep-best=1 --save "$d/x.st"
for v in 0 1.5; do
  sed "s|val_fraction = 0.1|val_fraction = $v|" "$d/v.model" > "$d/b.model"
  out=$("$DUET" run "$d/b.model" --steps 1 2>&1 | head -1)
  [ "$out" = "$d/b.model:18:76: error: fashion_mnist: val_fraction must be between 0 and 1 (exclusive), got $v" ] &&
    ok "val_fraction_$v" || { bad "val_fraction_$v"; echo "$out"; }
done
sed 's|val_fraction = 0.1|val_fraction = "x"|' "$d/v.model" > "$d/b.model"
out=$("$DUET" run "$d/b.model" --steps 1 2>&1 | head -1)
[ "$out" = "$d/b.model:18:76: error: val_fraction must be a number, got a string" ] && ok val_fraction_string ||
  { bad val_fraction_string; echo "$out"; }
sed 's|val_fraction = 0.1|val = 0.1|' "$d/v.model" > "$d/b.model"
out=$("$DUET" run "$d/b.model" --steps 1 2>&1 | head -1)
[ "$out" = "$d/b.model:18:61: error: fashion_mnist has no argument named \`val\`" ] && ok val_unknown_argument ||
  { bad val_unknown_argument; echo "$out"; }
sed 's|val_fraction = 0.1|val_fraction = 1e-6|' "$d/v.model" > "$d/b.model"
check val_fraction_no_sample "duet: error: val_fraction 1e-06 of the 60000 training samples leaves no validation \
sample" "$DUET" run "$d/b.model" --steps 1 --quiet
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
