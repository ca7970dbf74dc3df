#!/bin/sh
# duet compile writes an executable that, for the same seed and flags,
# prints exactly the losses `duet run` prints.
# usage: run_compiled.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_compiled.sh path/to/duet}
d=${TMPDIR:-/tmp}/duet-aot.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
flags="--steps 40 --log-every 5 --threads 2 --seed 7 --lr 0.002 --no-eval"
"$DUET" compile models/fmnist_mlp.model -o "$d/fmnist_train" || { echo "FAIL: duet compile"; exit 1; }
"$d/fmnist_train" $flags --metrics "$d/aot.jsonl" > "$d/aot.txt" || { echo "FAIL: executable"; cat "$d/aot.txt"; exit 1; }
"$DUET" run models/fmnist_mlp.model $flags --metrics "$d/jit.jsonl" > "$d/jit.txt" || { echo "FAIL: duet run"; exit 1; }
n=$(grep -c '"loss"' "$d/jit.jsonl")
[ "$n" -eq 8 ] || { echo "FAIL: expected 8 logged losses, got $n"; exit 1; }
if ! diff "$d/jit.jsonl" "$d/aot.jsonl"; then echo "FAIL: losses differ"; exit 1; fi
# the same losses on the progress lines, too (samples/s differ)
sed 's/ | [0-9]* samples\/s//' "$d/jit.txt" | grep '^epoch' > "$d/a"
sed 's/ | [0-9]* samples\/s//' "$d/aot.txt" | grep '^epoch' > "$d/b"
diff "$d/a" "$d/b" || { echo "FAIL: progress lines differ"; exit 1; }
# the executable rejects a batch it was not compiled for
"$d/fmnist_train" --batch 128 --steps 1 2> "$d/err" && { echo "FAIL: --batch 128 accepted"; exit 1; }
grep -q "compiled for batch 256" "$d/err" || { echo "FAIL: bad --batch message:"; cat "$d/err"; exit 1; }
cat "$d/jit.jsonl"
echo "1 passed, 0 failed"
