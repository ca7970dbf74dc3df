#!/bin/sh
# The pictures of the README (docs/img/), from a built tree (make build) with
# data/kjv.txt (make data) and gnuplot (gnuplot-nox):
#   curves.png      duet plot of two short runs of tests/models/gpt_tiny.model
#                   (constant rate against cosine with warm-up);
#   plan_gpipe.svg, plan_1f1b.svg
#                   duet plan --format svg of models/gpt_kjv.model on four
#                   16 GiB sm_60 devices with 8 micro-batches.
# usage: sh tools/docs_images.sh   (from the repository root; BUILD=build)
set -e
B=${BUILD:-build}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-docs.XXXXXX")
trap 'rm -rf "$d"' EXIT HUP INT TERM
run() {
  "$B/duet" run tests/models/gpt_tiny.model --data data/kjv.txt --steps 400 --lr 3e-3 --log-every 10 \
    --eval-every 25 --eval-batches 8 --threads 1 --metrics-timing --quiet "$@"
}
run --metrics "$d/constant.jsonl"
run --lr-schedule cosine --warmup 40 --min-lr 3e-4 --metrics "$d/cosine.jsonl"
"$B/duet" plot "$d/constant.jsonl" "$d/cosine.jsonl" --label "constant 3e-3" --label "cosine to 3e-4, warm-up 40" \
  --size 900x600 -o docs/img/curves.png
for s in gpipe 1f1b; do
  "$B/duet" plan models/gpt_kjv.model --devices 4x16GiB:sm_60 --micro-batches 8 --schedule $s --format svg \
    > docs/img/plan_$s.svg
done
ls -l docs/img
