#!/bin/sh
# npy data (issue 19, item 4): .npy copies of Fashion-MNIST's first 512
# training and 256 test samples (tools/gen_npy_fixtures.py, numpy) train an
# MLP to the same losses and test accuracy as the IDX files with
# --train-subset 512 --test-subset 256 (same samples, same seeded shuffle:
# the identical loss lines are the check); val_fraction = 0.25 trains on the
# first 384 as --train-subset 384 does; a version-2.0 file reads as 1.0
# does; a compiled executable reads npy data too; bad files and mismatches
# are exact one-line errors from the preflight, before compiling.
# Exits 77 when /usr/bin/python3 has no numpy or the dataset is missing.
# usage: run_npy.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_npy.sh path/to/duet}
PY=/usr/bin/python3
FM=/usr/share/datasets/fashion-mnist
if ! "$PY" -c 'import numpy' 2>/dev/null || [ ! -f "$FM/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: needs numpy for $PY and $FM"; exit 77
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-npy.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
"$PY" tools/gen_npy_fixtures.py fmnist "$d" 512 256 || { echo "FAIL: gen_npy_fixtures.py"; exit 1; }

model() { # model NAME DATA [INPUT_X]
  cat > "$d/$1.model" <<M
model $1
input x: ${3:-f32[batch, 784]}
input y: i32[batch]
param w1: [784, 64] = kaiming_uniform
param b1: [64] = zeros
param w2: [64, 10] = kaiming_uniform
loss = cross_entropy(relu(x @ w1 + b1) @ w2, y)
train {
  data = $2
  batch = 32
  epochs = 2
  seed = 3
  log_every = 4
}
M
}
# the loss and accuracy lines, without the speed
lines() { sed -n 's/ | [0-9]* samples\/s//; s/validation/test/g; /^epoch/p' "$1"; }

model idx "fashion_mnist(\"$FM\")"
model npy "npy(\"$d/x_train.npy\", \"$d/y_train.npy\", val_x = \"$d/x_test.npy\", val_y = \"$d/y_test.npy\")"
model frac "npy(\"$d/x_train.npy\", \"$d/y_train.npy\", val_fraction = 0.25)"
"$DUET" run "$d/idx.model" --threads 1 --train-subset 512 --test-subset 256 > "$d/idx.out" || bad "idx run"
"$DUET" run "$d/npy.model" --threads 1 > "$d/npy.out" || bad "npy run"
lines "$d/idx.out" > "$d/idx.l"
lines "$d/npy.out" > "$d/npy.l"
n=$(grep -c loss "$d/idx.l")
if [ "$n" -ge 10 ] && cmp -s "$d/idx.l" "$d/npy.l"; then ok; else bad "npy losses differ from IDX ($n lines)"; diff "$d/idx.l" "$d/npy.l" | head; fi
grep -q 'validation accuracy' "$d/npy.out" && ok || bad "npy run names its validation split"

"$DUET" run "$d/idx.model" --threads 1 --train-subset 384 --no-eval > "$d/idx384.out" || bad "idx 384 run"
"$DUET" run "$d/frac.model" --threads 1 --metrics "$d/frac.jsonl" > "$d/frac.out" || bad "frac run"
# a validation split's metrics are val_*, not test_* (the test split's)
grep -q '^{"step":[0-9]*,"epoch":2,"val_accuracy":[0-9.e-]*,"val_loss":[0-9.e-]*}$' "$d/frac.jsonl" &&
  ! grep -q '"test_' "$d/frac.jsonl" && ok || { bad "npy validation metrics keys"; grep -v '"loss"' "$d/frac.jsonl"; }
lines "$d/idx384.out" | grep step > "$d/a.l"
lines "$d/frac.out" | grep step > "$d/b.l"
if [ -s "$d/a.l" ] && cmp -s "$d/a.l" "$d/b.l"; then ok; else bad "val_fraction 0.25 losses differ from --train-subset 384"; diff "$d/a.l" "$d/b.l" | head; fi
# its validation: the last 128 samples, as given by separate files
model last "npy(\"$d/x_train.npy\", \"$d/y_train.npy\", val_x = \"$d/x_last.npy\", val_y = \"$d/y_last.npy\")"
"$PY" -c "
import numpy as np
np.save('$d/x_last.npy', np.load('$d/x_train.npy')[384:])
np.save('$d/y_last.npy', np.load('$d/y_train.npy')[384:])
" || bad "writing the last 128 samples"
"$DUET" run "$d/last.model" --threads 1 --train-subset 384 > "$d/last.out" || bad "last run"
lines "$d/last.out" > "$d/a.l"
lines "$d/frac.out" > "$d/b.l"
if grep -q '(.*/128)' "$d/b.l" && cmp -s "$d/a.l" "$d/b.l"; then ok; else
  bad "val_fraction 0.25 does not validate the last 128 samples"; diff "$d/a.l" "$d/b.l" | head; fi

# format version 2.0 and a compiled executable
"$PY" -c "
import numpy as np, sys
a = np.load('$d/x_train.npy')
with open('$d/x_v2.npy', 'wb') as f: np.lib.format.write_array(f, a, version=(2, 0))
np.save('$d/x_f.npy', np.asfortranarray(a))
np.save('$d/x_be.npy', a.astype('>f4'))
np.save('$d/x_f8.npy', a.astype('<f8'))
np.save('$d/x_i4.npy', (a * 255).astype('<i4'))
np.save('$d/y_big.npy', np.full(512, 10, dtype=np.int64))
np.save('$d/y_short.npy', np.zeros(511, dtype=np.int32))
np.save('$d/x_small.npy', a[:20])
np.save('$d/y_small.npy', np.zeros(20, dtype=np.uint8))
" || bad "writing the variant files"
head -c 1000 "$d/x_train.npy" > "$d/x_cut.npy"
model v2 "npy(\"$d/x_v2.npy\", \"$d/y_train.npy\", val_x = \"$d/x_test.npy\", val_y = \"$d/y_test.npy\")"
"$DUET" run "$d/v2.model" --threads 1 > "$d/v2.out" || bad "v2 run"
lines "$d/v2.out" > "$d/v2.l"
cmp -s "$d/npy.l" "$d/v2.l" && ok || bad "format 2.0 differs from 1.0"
if "$DUET" compile "$d/npy.model" -o "$d/npy.exe" > /dev/null 2>&1; then
  "$d/npy.exe" --threads 1 > "$d/exe.out" || bad "compiled run"
  lines "$d/exe.out" > "$d/exe.l"
  cmp -s "$d/npy.l" "$d/exe.l" && ok || bad "compiled executable differs from duet run"
else
  bad "duet compile npy.model"
fi

# errors: each exactly one line, from the preflight
err() { # err WANT DATA [INPUT_X]
  model e "$2" "$3"
  "$DUET" run "$d/e.model" --threads 1 > "$d/e.out" 2> "$d/e.err" && { bad "accepted: $2"; return; }
  want=$(printf '%s' "$1" | sed "s|@|$d/|g")
  if [ "$(cat "$d/e.err")" = "duet: error: $want" ] && [ ! -s "$d/e.out" ]; then ok; else
    bad "$2: want 'duet: error: $want', got '$(cat "$d/e.err")'"; fi
}
Y="\"$d/y_train.npy\""
err "@x_f.npy: the array is in Fortran order; duet reads C order only (save np.ascontiguousarray(a))" "npy(\"$d/x_f.npy\", $Y)"
err "@x_be.npy: unsupported .npy dtype '>f4' (duet reads '<f4', '<i4', '<i8' and '|u1')" "npy(\"$d/x_be.npy\", $Y)"
err "@x_f8.npy: unsupported .npy dtype '<f8' (duet reads '<f4', '<i4', '<i8' and '|u1')" "npy(\"$d/x_f8.npy\", $Y)"
err "@x_cut.npy: shape (512, 784) of '<f4' needs 1605632 bytes of data, the file has 872 (truncated)" "npy(\"$d/x_cut.npy\", $Y)"
printf 'PK\003\004 not an array' > "$d/x_bad.npy"
err '@x_bad.npy: not a NumPy .npy file (it does not start with \x93NUMPY)' "npy(\"$d/x_bad.npy\", $Y)"
err "@x_train_u8.npy holds samples of shape (28, 28); input \`x\` takes samples of shape (784,)" "npy(\"$d/x_train_u8.npy\", $Y)"
err "@x_i4.npy holds '<i4'; input \`x\` is f32 (it takes '<f4' or '|u1')" "npy(\"$d/x_i4.npy\", $Y)"
err "@x_train.npy holds 512 samples but @y_short.npy holds 511" "npy(\"$d/x_train.npy\", \"$d/y_short.npy\")"
err "@x_small.npy: 20 training samples are fewer than one batch of 32" "npy(\"$d/x_small.npy\", \"$d/y_small.npy\")"
err "val_fraction 0.01 of the 20 samples of @x_small.npy leaves no validation sample" "npy(\"$d/x_small.npy\", \"$d/y_small.npy\", val_fraction = 0.01)"
err "cannot open @nope.npy: No such file or directory" "npy(\"$d/nope.npy\", $Y)"
# a label outside the classes: found when the data is loaded (after compiling)
model e "npy(\"$d/x_train.npy\", \"$d/y_big.npy\")"
"$DUET" run "$d/e.model" --threads 1 > /dev/null 2> "$d/e.err" && bad "accepted labels 10"
[ "$(cat "$d/e.err")" = "duet: error: $d/y_big.npy: label 10 of sample 0 is outside the model's 10 classes" ] && ok ||
  bad "label range: got '$(cat "$d/e.err")'"
# i32 inputs that index an embedding: ids against its rows, labels of any rank against the classes
"$PY" -c "
import numpy as np
x = np.arange(64 * 4, dtype=np.int32).reshape(64, 4) % 10
y = (x + 1) % 10
np.save('$d/ids.npy', x)
np.save('$d/next.npy', y)
x[3, 2] = 12
np.save('$d/ids_big.npy', x)
y[2, 1] = 11
np.save('$d/next_big.npy', y.astype(np.int64))
" || bad "writing the id files"
lm() { # lm X Y
  cat > "$d/lm.model" <<M
model lm
input idx: i32[batch, 4]
input targets: i32[batch, 4]
param table: [10, 10] = normal(0.02)
loss = cross_entropy(embedding(table, idx), targets)
train {
  data = npy("$d/$1", "$d/$2")
  batch = 8
  steps = 3
}
M
  "$DUET" run "$d/lm.model" --threads 1 > "$d/lm.out" 2> "$d/lm.err"
}
lm ids.npy next.npy && grep -q 'step 3/3' "$d/lm.out" && ok || bad "npy token ids: $(cat "$d/lm.err")"
lm ids_big.npy next.npy && bad "accepted index 12"
[ "$(cat "$d/lm.err")" = "duet: error: $d/ids_big.npy: index 12 of sample 3 is outside the model's 10 embedding rows" ] && ok ||
  bad "index range: got '$(cat "$d/lm.err")'"
lm ids.npy next_big.npy && bad "accepted label 11"
[ "$(cat "$d/lm.err")" = "duet: error: $d/next_big.npy: label 11 of sample 2 is outside the model's 10 classes" ] && ok ||
  bad "label range (rank 2): got '$(cat "$d/lm.err")'"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
