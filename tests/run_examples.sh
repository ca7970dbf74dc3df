#!/bin/sh
# models/examples (issue 19, item 3), on the data tools/gen_npy_fixtures.py
# writes (random, seed 0; numpy at run time, 77 without it), 10 steps each:
#   model_parallel.model on --devices cpu:0,cpu:1: `duet plan` puts
#     linear1 (the first layer) on stage 0 / cpu:0 and linear2 on stage 1 /
#     cpu:1 (the @device hints); the run prints the losses of a one-device run
#     and writes its checkpoint byte for byte (the 2-stage pipeline computes
#     the same ops; --threads 2 over 2 devices is 1 thread each, as
#     --threads 1); the loss falls;
#   data_parallel.model on --devices cpu:0,cpu:1 --data-parallel 2: the
#     losses and checkpoint of one device with --micro-batches 2 (what the
#     replicas compute: 2 x 50 samples; tests/run_data_parallel.sh), the
#     replicas bit-identical after every step (DUET_DP_CHECK=1); the loss
#     falls.
# usage: run_examples.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_examples.sh path/to/duet}
PY=/usr/bin/python3
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: needs numpy for $PY"; exit 77; }
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-examples.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
"$PY" tools/gen_npy_fixtures.py random "$d/data" || { echo "FAIL: gen_npy_fixtures.py"; exit 1; }
for m in model_parallel data_parallel; do
  sed "s|models/examples/data/|$d/data/|g" "models/examples/$m.model" > "$d/$m.model"
done
lines() { sed -n 's/ | [0-9]* samples\/s//; /^epoch/p' "$1"; }
falls() { # the last loss below 0.9 x the first
  awk '/^epoch/ { l = $7; if (!f) f = l } END { exit !(f > 0 && l < 0.9 * f) }' "$1"
}

M=$d/model_parallel.model
"$DUET" plan "$M" --devices cpu:0,cpu:1 > "$d/plan" 2>&1 || bad "duet plan model_parallel"
grep -q '^stage 0 on cpu:0: .*params linear1.w .. linear1.b$' "$d/plan" &&
  grep -q '^stage 1 on cpu:1: .*params linear2.w .. linear2.b$' "$d/plan" && ok ||
  { bad "model_parallel: the layers are not on cpu:0 and cpu:1"; cat "$d/plan"; }
"$DUET" run "$M" --devices cpu:0,cpu:1 --threads 2 --save "$d/mp2.st" > "$d/mp2.out" || bad "model_parallel on 2 devices"
"$DUET" run "$M" --threads 1 --save "$d/mp1.st" > "$d/mp1.out" || bad "model_parallel on 1 device"
grep -q 'pipeline: 2 stages on cpu:0,cpu:1' "$d/mp2.out" && ok || bad "model_parallel: no 2-stage pipeline"
lines "$d/mp2.out" > "$d/a"
lines "$d/mp1.out" > "$d/b"
[ "$(grep -c step "$d/a")" -eq 10 ] && cmp -s "$d/a" "$d/b" && cmp -s "$d/mp2.st" "$d/mp1.st" && ok ||
  bad "model_parallel on 2 devices differs from 1 device"
falls "$d/mp2.out" && ok || bad "model_parallel: the loss does not fall"

M=$d/data_parallel.model
DUET_DP_CHECK=1 "$DUET" run "$M" --devices cpu:0,cpu:1 --data-parallel 2 --threads 2 --save "$d/dp2.st" > "$d/dp2.out" ||
  bad "data_parallel --data-parallel 2"
"$DUET" run "$M" --micro-batches 2 --threads 1 --save "$d/dp1.st" > "$d/dp1.out" || bad "data_parallel --micro-batches 2"
lines "$d/dp2.out" > "$d/a"
lines "$d/dp1.out" > "$d/b"
[ "$(grep -c step "$d/a")" -eq 10 ] && cmp -s "$d/a" "$d/b" && cmp -s "$d/dp2.st" "$d/dp1.st" && ok ||
  { bad "data_parallel on 2 replicas differs from 1 device with 2 micro-batches"; diff "$d/a" "$d/b" | head; }
falls "$d/dp2.out" && ok || bad "data_parallel: the loss does not fall"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
