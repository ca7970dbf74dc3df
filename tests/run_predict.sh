#!/bin/sh
# duet predict and duet export, on a checkpoint of 20 training steps:
#   1. predict (fmnist_mlp, 1000 test samples): one line per sample in order,
#      and as many whose class is the label as --eval-only counts correct;
#   2. predict (gpt_tiny): eval_batches x batch windows of block losses whose
#      mean is --eval-only's validation loss (within 1e-6 relative: summed
#      in another order); its summary line names the unit --eval-only's
#      line names (nats/byte: gpt_tiny reads bytes);
#   3. export: the six params of fmnist_mlp alone, f32, under their names;
#      a numpy forward pass of them (tools/duet_to_torch.py --numpy, reading
#      the safetensors file itself) gives duet predict's logits within 1e-4
#      and its probabilities;
#   4. exact one-line errors of both commands.
# usage: run_predict.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_predict.sh path/to/duet}
PY=/usr/bin/python3
d=${TMPDIR:-/tmp}/duet-predict.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
F="--test-subset 1000 --threads 1"
"$DUET" run $M $F --train-subset 2560 --steps 20 --quiet --save "$d/ck.st" > /dev/null || bad train
"$DUET" run $M $F --quiet --eval-only --checkpoint "$d/ck.st" --metrics "$d/eval.jsonl" > /dev/null || bad eval_only

# 1. classifier
"$DUET" predict $M --checkpoint "$d/ck.st" $F -o "$d/p.jsonl" 2> "$d/p.err" || { bad predict_runs; cat "$d/p.err"; }
out=$($PY - "$d/p.jsonl" "$d/eval.jsonl" <<'EOF'
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])]
acc = json.loads(open(sys.argv[2]).readline())["test_accuracy"]
assert [x["index"] for x in p] == list(range(1000)), "indices"
assert all(set(x) == {"index", "class", "prob", "label"} for x in p), "keys"
assert all(0.1 <= x["prob"] <= 1 and 0 <= x["class"] < 10 for x in p), "ranges"
correct = sum(x["class"] == x["label"] for x in p)
print(correct, round(acc * 1000))
EOF
)
set -- $out
[ -n "$1" ] && [ "$1" = "$2" ] && ok classes_agree_with_eval_accuracy || { bad classes_agree_with_eval_accuracy; echo "$out"; }
grep -q "^duet: predicted 1000 samples with $d/ck.st (step 20): $1 correct" "$d/p.err" && ok predict_summary ||
  { bad predict_summary; cat "$d/p.err"; }

# 2. language model
G=tests/models/gpt_tiny.model
"$DUET" run $G --steps 4 --threads 1 --quiet --save "$d/g.st" > /dev/null || bad text_train
"$DUET" run $G --threads 1 --quiet --eval-only --checkpoint "$d/g.st" --metrics "$d/geval.jsonl" > /dev/null ||
  bad text_eval_only
"$DUET" run $G --threads 1 --eval-only --checkpoint "$d/g.st" > "$d/geval.out" 2>&1 || bad text_eval_only
"$DUET" predict $G --checkpoint "$d/g.st" --threads 1 -o "$d/g.jsonl" 2> "$d/g.err" || bad text_predict_runs
"$DUET" predict $G --checkpoint "$d/g.st" --threads 1 --test-subset 5 -o "$d/g5.jsonl" 2> "$d/g5.err" &&
  grep -Fxq "duet: warning: --test-subset applies to image data sets; a language model's predictions cover its \
--eval-batches N fixed validation batches" "$d/g5.err" && cmp -s "$d/g.jsonl" "$d/g5.jsonl" &&
  ok text_predict_test_subset_warns || { bad text_predict_test_subset_warns; cat "$d/g5.err"; }
eu=$(sed -n 's/^duet: .*: val loss [0-9.]* nats\/\([a-z]*\) .*/\1/p' "$d/geval.out")
grep -q "^duet: predicted 16 windows of 16 bytes of $d/g.st (step 4); mean loss [0-9.]* nats/byte$" "$d/g.err" &&
  [ "$eu" = byte ] && ok "predict_unit_as_eval_only (nats/$eu)" || { bad predict_unit_as_eval_only; cat "$d/g.err" "$d/geval.out"; }
out=$($PY - "$d/g.jsonl" "$d/geval.jsonl" <<'EOF'
import json, sys
p = [json.loads(l) for l in open(sys.argv[1])]
val = json.loads(open(sys.argv[2]).readline())["val_loss"]
assert len(p) == 16 and [x["window"] for x in p] == list(range(16)), "4 batches of 4 windows"
assert all(len(x["loss"]) == 16 for x in p), "16 tokens each"
mean = sum(sum(x["loss"]) for x in p) / 256
print("ok" if abs(mean - val) <= 1e-6 * val else f"mean {mean} val_loss {val}")
EOF
)
[ "$out" = ok ] && ok token_losses_mean_is_val_loss || { bad token_losses_mean_is_val_loss; echo "$out"; }

# 3. export
"$DUET" export $M --checkpoint "$d/ck.st" -o "$d/w.safetensors" > /dev/null || bad export_runs
out=$($PY - "$d/w.safetensors" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
meta = h.pop("__metadata__")
print(meta["format"], meta["model"], meta["step"], " ".join(f"{k}:{v['dtype']}{v['shape']}" for k, v in h.items()))
EOF
)
want="duet-weights-1 fmnist_mlp 20 linear1.w:F32[784, 1024] linear1.b:F32[1024] linear2.w:F32[1024, 1024] \
linear2.b:F32[1024] linear3.w:F32[1024, 10] linear3.b:F32[10]"
[ "$out" = "$want" ] && ok export_params_only || { bad export_params_only; echo "$out"; }
"$DUET" predict $M --checkpoint "$d/ck.st" --test-subset 300 --threads 1 --logits -o "$d/pl.jsonl" 2> /dev/null ||
  bad predict_logits
$PY tools/duet_to_torch.py "$d/w.safetensors" "$d/pl.jsonl" --numpy > "$d/np.out" && ok numpy_forward_same_logits ||
  { bad numpy_forward_same_logits; cat "$d/np.out"; }
out=$($PY tools/duet_to_torch.py "$d/w.safetensors" "$d/p.jsonl" --numpy 2>&1)
[ "$out" = "duet_to_torch.py: $d/p.jsonl has no logits: run duet predict with --logits" ] && ok to_torch_names_file ||
  { bad to_torch_names_file; echo "$out"; }

# 4. errors
check() {
  name=$1 want=$2; shift 2
  out=$("$@" 2>&1); rc=$?
  [ "$rc" -eq 1 ] && [ "$out" = "$want" ] && ok "$name" || { bad "$name: exit $rc"; echo "$out"; echo "  want: $want"; }
}
check predict_no_checkpoint "duet: error: duet predict needs --checkpoint CK (a checkpoint written by duet run --save)" \
  "$DUET" predict $M
check predict_bad_subset "duet: error: --test-subset expects an integer >= 1, got '0'" \
  "$DUET" predict $M --checkpoint "$d/ck.st" --test-subset 0
check predict_unknown_flag "duet: error: unknown flag '--steps' (see duet predict --help)" \
  "$DUET" predict $M --checkpoint "$d/ck.st" --steps 3
check predict_other_model "duet: error: cannot load $d/g.st: it is a checkpoint of model \`gpt_tiny\`, not \
\`fmnist_mlp\`" "$DUET" predict $M --checkpoint "$d/g.st"
check predict_export_file "duet: error: cannot load $d/w.safetensors: it is a weights file written by duet export \
(format duet-weights-1, for other tools), not a checkpoint: give the checkpoint duet run --save wrote" \
  "$DUET" predict $M --checkpoint "$d/w.safetensors"
check export_no_output "duet: error: duet export needs -o W.safetensors (the file to write) (usage: duet export \
M.model --checkpoint CK -o W.safetensors)" "$DUET" export $M --checkpoint "$d/ck.st"
check export_onto_checkpoint "duet: error: -o $d/ck.st is the checkpoint itself; give another file" \
  "$DUET" export $M --checkpoint "$d/ck.st" -o "$d/ck.st"
check export_other_model "duet: error: cannot load $d/g.st: it is a checkpoint of model \`gpt_tiny\`, not \
\`fmnist_mlp\`" "$DUET" export $M --checkpoint "$d/g.st" -o "$d/x.safetensors"
[ ! -e "$d/x.safetensors" ] && ok export_error_writes_nothing || bad export_error_writes_nothing
# -o never destroys an input: the checkpoint (also through a symlink), the model source, a data file
cp $M "$d/m.model" && cp "$d/ck.st" "$d/ck.copy" && ln -s "$d/ck.st" "$d/ck.link" || bad copies
check predict_onto_checkpoint "duet: error: -o $d/ck.st is the same file as --checkpoint $d/ck.st: writing it \
would destroy that input" "$DUET" predict "$d/m.model" --checkpoint "$d/ck.st" --test-subset 10 -o "$d/ck.st"
check predict_onto_link "duet: error: -o $d/ck.link is the same file as --checkpoint $d/ck.st: writing it \
would destroy that input" "$DUET" predict "$d/m.model" --checkpoint "$d/ck.st" --test-subset 10 -o "$d/ck.link"
check predict_onto_model "duet: error: -o $d/m.model is the same file as the model source $d/m.model: writing it \
would destroy that input" "$DUET" predict "$d/m.model" --checkpoint "$d/ck.st" --test-subset 10 -o "$d/m.model"
mkdir -p "$d/fm" && for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do ln -s "/usr/share/datasets/fashion-mnist/$f" "$d/fm/$f"; done
check predict_onto_data "duet: error: -o $d/fm/t10k-labels-idx1-ubyte.gz is the same file as the data file \
$d/fm/t10k-labels-idx1-ubyte.gz: writing it would destroy that input" \
  "$DUET" predict "$d/m.model" --checkpoint "$d/ck.st" --data "$d/fm" --test-subset 10 -o "$d/fm/t10k-labels-idx1-ubyte.gz"
check export_onto_model "duet: error: -o $d/m.model is the same file as the model source $d/m.model: writing it \
would destroy that input" "$DUET" export "$d/m.model" --checkpoint "$d/ck.st" -o "$d/m.model"
cmp -s "$d/ck.st" "$d/ck.copy" && cmp -s $M "$d/m.model" && ok inputs_intact || bad inputs_intact
check predict_logits_text "duet: error: --logits is for classifiers: a language model's lines carry its per-token \
losses (see duet predict --help)" "$DUET" predict $G --checkpoint "$d/g.st" --logits --eval-batches 1
# a model whose train section clips gradients predicts (its evaluation program has no clipping kernels)
sed 's/^  batch = 256$/  batch = 256\n  clip_grad_norm = 1.0/' $M > "$d/clip.model"
grep -q '^  clip_grad_norm = 1.0$' "$d/clip.model" || bad "clip.model"
if "$DUET" run "$d/clip.model" $F --train-subset 2560 --steps 5 --quiet --save "$d/clip.st" > "$d/clip.out" 2>&1 &&
  "$DUET" predict "$d/clip.model" --checkpoint "$d/clip.st" $F --test-subset 100 -o "$d/clip.jsonl" > "$d/clipp.out" 2>&1 &&
  [ "$(wc -l < "$d/clip.jsonl")" -eq 100 ]; then ok "predict: a model that clips gradients"
else bad "predict: a model that clips gradients"; cat "$d/clip.out" "$d/clipp.out"; fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
