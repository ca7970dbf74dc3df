#!/bin/sh
# Accuracy of pruned models against the dense model of the same run (same
# seed, data order and length): issue 15's criteria, 50% unstructured
# within 0.5 points, 90% with the gradual schedule within 2 points, 2:4
# within 1 point (test accuracy, Fashion-MNIST).
#
#   run_prune_accuracy.sh DUET short   (ctest prune_accuracy, make test)
#     fmnist_mlp, the first 10,000 training images, 3 epochs (117 steps),
#     all 10,000 test images, seed 1: dense; 50% one-shot after epoch 1
#     (step 39); 2:4 after epoch 1; 90% gradual from step 20 to 80, every 2
#     steps, in a run twice as long (6 epochs, against a dense 6-epoch run:
#     a shortened gradual schedule needs its fine-tuning steps).
#     Tolerance: the issue's margin + 3 sigma, sigma = sqrt(2 p (1 - p) / n)
#     the standard deviation of the difference of two accuracies near p
#     measured on n test images (two independent binomials; the models'
#     errors are positively correlated, which only shrinks it): p = the
#     dense accuracy, n = 10,000: about 1.5 points.  The variation of
#     training itself (another seed, another trajectory after pruning) is
#     not in it: measured over seeds 1-3 (README, "Pruning") the gaps stay
#     inside these tolerances.
#   run_prune_accuracy.sh DUET long    (ctest prune_long, label long)
#     the README's table: fmnist_mlp, 5 epochs, seeds 1-3 (the mean of the
#     three gaps is judged, sigma / sqrt(3)); fmnist_cnn, 10 epochs
#     (PRUNE_LONG_CNN_EPOCHS, the schedules scaled with it), seed 1;
#     pruning after epoch 1, the gradual schedule from epoch 1 to the end
#     of epoch 3.5 (mlp: steps 234..819 every 15; cnn: 468..3276 every
#     50); tolerance the margin + 2 sigma; gpt_kjv, 1,000 steps, dense and
#     50% pruned after step 200: the validation losses are printed (the
#     issue asks for the figure, no threshold).  DUET_LONG_GPT_STEPS
#     shortens the GPT runs (default 1000); PRUNE_LONG_PARTS picks parts
#     (default "mlp cnn gpt").
# Prints one line per run and per comparison; exits 77 without the data.
# usage: run_prune_accuracy.sh path/to/duet short|long   (from the repository root)
DUET=${1:?usage: run_prune_accuracy.sh path/to/duet short|long}
MODE=${2:-short}
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-prune-acc.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0 skipped=0
# acc NAME MODEL ARGS...: trains, prints and records the final test accuracy (a fraction)
acc() {
  name=$1 model=$2; shift 2
  "$DUET" run "$model" --threads 2 --quiet --metrics "$d/$name.jsonl" "$@" > "$d/$name.out" 2>&1 ||
    { echo "FAIL $name: the run failed"; cat "$d/$name.out"; fail=$((fail + 1)); echo 0 > "$d/$name.acc"; return; }
  grep test_accuracy "$d/$name.jsonl" | tail -1 | sed 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/' > "$d/$name.acc"
  echo "$name: test accuracy $(cat "$d/$name.acc")  ($*)"
}
# judge WHAT MARGIN K DENSE... -- PRUNED...: the mean of the gaps (dense -
# pruned, in points) within MARGIN + K sigma / sqrt(runs)
judge() {
  what=$1 margin=$2 k=$3; shift 3
  dense="" pruned="" side=d
  for x in "$@"; do
    if [ "$x" = -- ]; then side=p; continue; fi
    if [ $side = d ]; then dense="$dense $(cat "$d/$x.acc")"; else pruned="$pruned $(cat "$d/$x.acc")"; fi
  done
  res=$(echo "$dense|$pruned" | awk -F'|' -v m="$margin" -v k="$k" -v w="$what" '{
    n = split($1, a, " "); split($2, b, " "); gap = 0; p = 0; q = 0
    for (i = 1; i <= n; i++) { gap += a[i] - b[i]; p += a[i]; q += b[i] }
    gap = 100 * gap / n; p /= n; q /= n
    sigma = 100 * sqrt(2 * p * (1 - p) / 10000) / sqrt(n); tol = m + k * sigma
    printf "%s %s: dense %.2f%%, pruned %.2f%% (mean of %d run%s): dense - pruned = %.2f points, tolerance %.2f = %s + %d x %.2f\n",
      (gap <= tol ? "ok" : "FAIL"), w, 100 * p, 100 * q, n, (n > 1 ? "s" : ""), gap, tol, m, k, sigma
    exit !(gap <= tol) }')
  rc=$?
  echo "$res"
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
}

M=models/fmnist_mlp.model
C=models/fmnist_cnn.model
if [ "$MODE" = short ]; then
  S="--train-subset 10000 --seed 1"
  acc dense $M $S --epochs 3
  acc p50 $M $S --epochs 3 --prune 0.5 --prune-start 39
  acc nm $M $S --epochs 3 --prune-mode 2:4 --prune-start 39
  acc dense6 $M $S --epochs 6
  acc g90 $M $S --epochs 6 --prune 0.9 --prune-start 20 --prune-end 80 --prune-every 2
  judge "fmnist_mlp 50% unstructured (shortened)" 0.5 3 dense -- p50
  judge "fmnist_mlp 2:4 (shortened)" 1 3 dense -- nm
  judge "fmnist_mlp 90% gradual (shortened)" 2 3 dense6 -- g90
else
  PARTS=${PRUNE_LONG_PARTS:-mlp cnn gpt}
  case " $PARTS " in *" mlp "*)
    for s in 1 2 3; do
      acc mlp_dense_$s $M --seed $s
      acc mlp_p50_$s $M --seed $s --prune 0.5 --prune-start 234
      acc mlp_nm_$s $M --seed $s --prune-mode 2:4 --prune-start 234
      acc mlp_g90_$s $M --seed $s --prune 0.9 --prune-start 234 --prune-end 819 --prune-every 15
    done
    judge "fmnist_mlp 50% unstructured" 0.5 2 mlp_dense_1 mlp_dense_2 mlp_dense_3 -- mlp_p50_1 mlp_p50_2 mlp_p50_3
    judge "fmnist_mlp 2:4" 1 2 mlp_dense_1 mlp_dense_2 mlp_dense_3 -- mlp_nm_1 mlp_nm_2 mlp_nm_3
    judge "fmnist_mlp 90% gradual" 2 2 mlp_dense_1 mlp_dense_2 mlp_dense_3 -- mlp_g90_1 mlp_g90_2 mlp_g90_3
  ;; esac
  case " $PARTS " in *" cnn "*)
    # E epochs of 468 steps: pruning after epoch 1; the gradual schedule to
    # the end of epoch 1 + 2 (E - 1) / 3 (E = 10: 3276), 56 updates
    E=${PRUNE_LONG_CNN_EPOCHS:-10}
    end=$((468 * (1 + (E - 1) * 2 / 3)))
    every=$(((end - 468) / 56))
    [ "$every" -ge 1 ] || every=1
    acc cnn_dense $C --epochs "$E"
    acc cnn_p50 $C --epochs "$E" --prune 0.5 --prune-start 468
    acc cnn_nm $C --epochs "$E" --prune-mode 2:4 --prune-start 468 --prune-params '!conv1.w'
    acc cnn_g90 $C --epochs "$E" --prune 0.9 --prune-start 468 --prune-end "$end" --prune-every "$every"
    judge "fmnist_cnn 50% unstructured" 0.5 2 cnn_dense -- cnn_p50
    judge "fmnist_cnn 2:4 (conv1 dense)" 1 2 cnn_dense -- cnn_nm
    judge "fmnist_cnn 90% gradual" 2 2 cnn_dense -- cnn_g90
  ;; esac
  case " $PARTS " in *" gpt "*)
    if [ -f data/kjv.txt ]; then
      GS=${DUET_LONG_GPT_STEPS:-1000}
      for v in dense:"" p50:"--prune 0.5 --prune-start 200"; do
        n=${v%%:*}; f=${v#*:}
        "$DUET" run models/gpt_kjv.model --threads 2 --quiet --steps "$GS" --metrics "$d/gpt_$n.jsonl" $f > "$d/gpt_$n.out" 2>&1 ||
          { echo "FAIL gpt_kjv $n"; cat "$d/gpt_$n.out"; fail=$((fail + 1)); }
        echo "gpt_kjv $n ($f): validation loss $(grep val_loss "$d/gpt_$n.jsonl" | sed 's/.*"step":\([0-9]*\).*"val_loss":\([0-9.e-]*\).*/step \1: \2/' | tr '\n' ' ')"
      done
    else
      echo "skip: gpt_kjv (no data/kjv.txt: make data)"
      skipped=1
    fi
  ;; esac
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] || exit 1
[ "$skipped" -eq 0 ] || exit 77
