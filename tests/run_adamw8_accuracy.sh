#!/bin/sh
# Accuracy of training with 8-bit AdamW state (--optimizer-state int8)
# against f32 AdamW state in the same run (same seed, data order, length):
# issue 15's criteria, within 0.5 points of test accuracy on Fashion-MNIST
# and within 0.05 nats of validation loss on gpt_kjv at the same step.
#
#   run_adamw8_accuracy.sh DUET short   (ctest adamw8_accuracy, make test)
#     fmnist_mlp, the first 10,000 training images, 3 epochs (117 steps),
#     all 10,000 test images, seed 1, f32 state and int8 state.
#     Tolerance: 0.5 points + 3 sigma, sigma = sqrt(2 p (1 - p) / n) the
#     standard deviation of the difference of two test accuracies near p on
#     n test images (two independent binomials; the runs' errors are
#     positively correlated, which only shrinks it): p = the f32 accuracy,
#     n = 10,000: about 1.5 points (as tests/run_prune_accuracy.sh).  The
#     gap must also be measured, not assumed: the int8 run must differ from
#     the f32 run (else the flag did nothing).
#   run_adamw8_accuracy.sh DUET long    (ctest adamw8_long, label long)
#     the README's figures: fmnist_mlp, 5 epochs (1,170 steps), seeds 1-3
#     (the mean of the three gaps judged with sigma / sqrt(3)), tolerance
#     0.5 + 2 sigma; gpt_kjv, DUET_LONG_GPT_STEPS steps (default 1,000),
#     f32 and int8 state: every validation loss of the int8 run within
#     0.05 nats of the f32 run's at the same step (the issue's criterion;
#     the validation batches are fixed, so both runs measure the same
#     tokens).  ADAMW8_LONG_PARTS picks parts (default "mlp gpt").
# Prints one line per run and per comparison; exits 77 without the data.
# usage: run_adamw8_accuracy.sh path/to/duet short|long   (from the repository root)
DUET=${1:?usage: run_adamw8_accuracy.sh path/to/duet short|long}
MODE=${2:-short}
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-q8-acc.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
# acc NAME MODEL ARGS...: trains, prints and records the final test accuracy (a fraction)
acc() {
  name=$1 model=$2; shift 2
  "$DUET" run "$model" --threads 2 --quiet --metrics "$d/$name.jsonl" "$@" > "$d/$name.out" 2>&1 ||
    { echo "FAIL $name: the run failed"; cat "$d/$name.out"; fail=$((fail + 1)); echo 0 > "$d/$name.acc"; return; }
  grep test_accuracy "$d/$name.jsonl" | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/' > "$d/$name.acc"
  echo "$name: test accuracy $(cat "$d/$name.acc")  ($*)"
}
# judge WHAT MARGIN K F32... -- INT8...: the mean of the gaps (f32 - int8, in
# points) within MARGIN + K sigma / sqrt(runs)
judge() {
  what=$1 margin=$2 k=$3; shift 3
  a="" b="" side=a
  for x in "$@"; do
    if [ "$x" = -- ]; then side=b; continue; fi
    if [ $side = a ]; then a="$a $(cat "$d/$x.acc")"; else b="$b $(cat "$d/$x.acc")"; fi
  done
  res=$(echo "$a|$b" | awk -F'|' -v m="$margin" -v k="$k" -v w="$what" '{
    n = split($1, a, " "); split($2, b, " "); gap = 0; p = 0; q = 0
    for (i = 1; i <= n; i++) { gap += a[i] - b[i]; p += a[i]; q += b[i] }
    gap = 100 * gap / n; p /= n; q /= n
    sigma = 100 * sqrt(2 * p * (1 - p) / 10000) / sqrt(n); tol = m + k * sigma
    printf "%s %s: f32 state %.2f%%, int8 state %.2f%% (mean of %d run%s): f32 - int8 = %.2f points, tolerance %.2f = %s + %d x %.2f\n",
      (gap <= tol ? "ok" : "FAIL"), w, 100 * p, 100 * q, n, (n > 1 ? "s" : ""), gap, tol, m, k, sigma
    exit !(gap <= tol) }')
  rc=$?
  echo "$res"
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
}
# differ A B: the two runs' metrics differ (the int8 state did something)
differ() {
  if cmp -s "$d/$1.jsonl" "$d/$2.jsonl"; then echo "FAIL $1 and $2 trained identically"; fail=$((fail + 1))
  else pass=$((pass + 1)); fi
}

M=models/fmnist_mlp.model
Q="--optimizer-state int8"
if [ "$MODE" = short ]; then
  S="--train-subset 10000 --seed 1 --epochs 3"
  acc f32 $M $S
  acc int8 $M $S $Q
  differ f32 int8
  judge "fmnist_mlp 8-bit AdamW state (shortened)" 0.5 3 f32 -- int8
else
  PARTS=${ADAMW8_LONG_PARTS:-mlp gpt}
  case " $PARTS " in *" mlp "*)
    for s in 1 2 3; do
      acc mlp_f32_$s $M --seed $s
      acc mlp_int8_$s $M --seed $s $Q
    done
    judge "fmnist_mlp 8-bit AdamW state" 0.5 2 mlp_f32_1 mlp_f32_2 mlp_f32_3 -- mlp_int8_1 mlp_int8_2 mlp_int8_3
  ;; esac
  case " $PARTS " in *" gpt "*)
    if [ -f data/kjv.txt ]; then
      GS=${DUET_LONG_GPT_STEPS:-1000}
      for v in f32:"" int8:"$Q"; do
        n=${v%%:*}; f=${v#*:}
        "$DUET" run models/gpt_kjv.model --threads 2 --quiet --steps "$GS" --metrics "$d/gpt_$n.jsonl" $f > "$d/gpt_$n.out" 2>&1 ||
          { echo "FAIL gpt_kjv $n"; cat "$d/gpt_$n.out"; fail=$((fail + 1)); }
        grep val_loss "$d/gpt_$n.jsonl" | sed 's/.*"step":\([0-9]*\).*"val_loss":\([0-9.e-]*\).*/\1 \2/' > "$d/gpt_$n.val"
        echo "gpt_kjv $n state: validation loss $(tr '\n' ' ' < "$d/gpt_$n.val")"
      done
      res=$(awk 'NR == FNR { f32[$1] = $2; next }
        ($1 in f32) { n++; g = $2 - f32[$1]; last = g; if (g < 0) g = -g; if (g > worst) { worst = g; at = $1 } }
        END { printf "%s gpt_kjv: %d validation points, largest |int8 - f32| %.4f nats (step %d), at the end %+.4f; tolerance 0.05\n",
                (n > 0 && worst <= 0.05 ? "ok" : "FAIL"), n, worst, at, last; exit !(n > 0 && worst <= 0.05) }' \
        "$d/gpt_f32.val" "$d/gpt_int8.val")
      rc=$?
      echo "$res"
      if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    else
      echo "skip gpt_kjv: no data/kjv.txt (make data)"
    fi
  ;; esac
fi
echo "run_adamw8_accuracy $MODE: $pass passed, $fail failed"
[ $fail -eq 0 ]
