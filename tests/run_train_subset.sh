#!/bin/sh
# Trains fmnist_mlp on the first 2,000 training images for 10 epochs (70
# steps) and requires at least 75% accuracy on the 10,000 test images.
# usage: run_train_subset.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_train_subset.sh path/to/duet}
m=${TMPDIR:-/tmp}/duet-subset.$$.jsonl
"$DUET" run models/fmnist_mlp.model --train-subset 2000 --epochs 10 --threads 2 --log-every 10 --metrics "$m" || exit 1
acc=$(grep test_accuracy "$m" | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/')
steps=$(grep -c '"loss"' "$m")  # loss lines (evaluation lines carry a step too)
rm -f "$m"
echo "final test accuracy: $acc (logged steps: $steps)"
[ -n "$acc" ] || { echo "FAIL: no test_accuracy in the metrics file"; exit 1; }
awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || { echo "FAIL: accuracy $acc < 0.75"; exit 1; }
[ "$steps" -eq 7 ] || { echo "FAIL: expected 7 logged steps (70 steps, every 10), got $steps"; exit 1; }
echo "1 passed, 0 failed"
