#!/bin/sh
# tests/run_ir_train.sh: a dumped graph trains exactly like its model.
# `duet ir M.model --after P > g.ir; duet run g.ir` must print, for the same
# flags, exactly the losses (and evaluation metrics) of `duet run M.model`,
# for dumps after fuse and after memplan; `duet compile g.ir` too.
# usage: run_ir_train.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_ir_train.sh path/to/duet}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-irtrain.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
# same NAME MODEL PASS flags...: the model and its dump after PASS, same metrics
same() {
  name=$1 m=$2 p=$3; shift 3
  "$DUET" ir "$m" --after "$p" > "$d/g.ir" || { echo "FAIL $name: duet ir"; fail=$((fail + 1)); return; }
  "$DUET" run "$m" "$@" --quiet --metrics "$d/model.jsonl" > "$d/out" 2>&1 || { echo "FAIL $name: duet run $m"; cat "$d/out"; fail=$((fail + 1)); return; }
  "$DUET" run "$d/g.ir" "$@" --quiet --metrics "$d/ir.jsonl" > "$d/out" 2>&1 || { echo "FAIL $name: duet run g.ir"; cat "$d/out"; fail=$((fail + 1)); return; }
  n=$(grep -c loss "$d/model.jsonl")
  if [ "$n" -ge 5 ] && cmp -s "$d/model.jsonl" "$d/ir.jsonl"; then
    echo "ok $name ($n metric lines)"; pass=$((pass + 1))
  else
    echo "FAIL $name: the metrics differ ($n lines)"; diff "$d/model.jsonl" "$d/ir.jsonl"; fail=$((fail + 1))
  fi
}
T=/usr/share/common-licenses/GPL-3   # any text file serves the byte-level models
kjv=data/kjv.txt
[ -f "$kjv" ] || { echo "note: $kjv is missing (make data); gpt_kjv trains on $T"; kjv=$T; }
F="--steps 5 --log-every 1 --threads 2"
same fmnist_mlp.fuse models/fmnist_mlp.model fuse $F --no-eval
same fmnist_mlp.memplan models/fmnist_mlp.model memplan $F --test-subset 500     # with evaluation
same fmnist_cnn.memplan models/fmnist_cnn.model memplan $F --no-eval
same gpt_tiny.memplan tests/models/gpt_tiny.model memplan $F --data $T            # with validation
same gpt_kjv.fuse models/gpt_kjv.model fuse $F --no-eval --data "$kjv"
# a training executable compiled from a dump prints the same losses
"$DUET" ir models/fmnist_mlp.model --after memplan > "$d/m.ir"
if "$DUET" compile "$d/m.ir" -o "$d/exe" > /dev/null && "$d/exe" $F --no-eval --quiet --metrics "$d/exe.jsonl" > /dev/null &&
   "$DUET" run models/fmnist_mlp.model $F --no-eval --quiet --metrics "$d/run.jsonl" > /dev/null &&
   cmp -s "$d/exe.jsonl" "$d/run.jsonl"; then
  echo "ok compile g.ir"; pass=$((pass + 1))
else
  echo "FAIL compile g.ir: losses differ or a step failed"; fail=$((fail + 1))
fi
# the batch of a dump is fixed
if "$DUET" run "$d/m.ir" --batch 128 --steps 1 > "$d/out" 2>&1; then echo "FAIL --batch 128 accepted"; fail=$((fail + 1))
elif grep -Fq "m.ir: error: the graph was built for batch 256; --batch 128 needs the .model (an IR dump's batch is fixed)" "$d/out"; then
  echo "ok batch fixed"; pass=$((pass + 1))
else echo "FAIL bad --batch message:"; cat "$d/out"; fail=$((fail + 1)); fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
