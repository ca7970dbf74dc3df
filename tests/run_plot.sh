#!/bin/sh
# duet plot (cli/plot.c): training curves from metrics files, drawn by gnuplot.
#   1. two short runs write metrics with --metrics-timing (gpt_tiny on
#      data/kjv.txt: loss, val_loss, lr, tokens_per_s; fmnist_mlp on 1,024
#      images with a cosine schedule: loss, test_accuracy, lr,
#      samples_per_s); without --metrics-timing no throughput field (the
#      metrics of two runs stay comparable byte for byte);
#   2. `duet plot A B -o x.png --script s.gp`: a PNG (magic, nonzero size),
#      and the script gnuplot was sent holds, per file and quantity, exactly
#      the metrics' (step, value) pairs in order, no other data, every
#      series plotted (tests/plot_check.py); the same for -o x.svg, which
#      parses as XML with one plot group per series and the --label names
#      in its legend;
#   3. exact errors: malformed lines (FILE:LINE), a file with nothing to
#      plot, bad flags, and no gnuplot on PATH.
# Without gnuplot only the errors run and the test reports a skip (77);
# without data/kjv.txt or Fashion-MNIST their run is left out (77 too).
# usage: run_plot.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_plot.sh path/to/duet}
PY=/usr/bin/python3
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-plot.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0 skipped=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
expect() {
  name=$1 want_rc=$2 want=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq "$want_rc" ] && printf '%s\n' "$out" | grep -Fxq -- "$want"; then ok "$name"
  else bad "$name: exit $rc (want $want_rc)"; echo "  got:  $(printf '%s\n' "$out" | head -3)"; echo "  want: $want"; fi
}

# --- errors (no gnuplot needed: the files are read first) ---
printf '{"step":1,"loss":2.5,"lr":0.001}\n{"step":2,"loss":2.4,"lr":0.001}\n' > "$d/good.jsonl"
printf '{"step":1,"loss":2.5,"lr":0.001}\n{"step":2,"loss":2.4,"l\n' > "$d/cut.jsonl"
printf '{"step":1,"loss":2.5}\n\n{"loss":2.4}\n' > "$d/nostep.jsonl"
printf '{"step":1,"loss":"2.5"}\n' > "$d/strloss.jsonl"
printf '{"step":1.5,"loss":2.5}\n' > "$d/fracstep.jsonl"
printf '[1,2]\n' > "$d/array.jsonl"
printf '{"step":3,"sparsity":0.5,"target":0.5,"layers":{}}\n' > "$d/empty.jsonl"
expect plot_help 0 "usage: duet plot METRICS.jsonl [MORE.jsonl ...] -o OUT.png|OUT.svg [--label NAME ...]" \
  "$DUET" plot --help
expect plot_cut_line 1 "duet: error: $d/cut.jsonl:2: not a JSON object (a metrics file of duet run --metrics has one per line)" \
  "$DUET" plot "$d/good.jsonl" "$d/cut.jsonl" -o "$d/x.png"
expect plot_no_step 1 "duet: error: $d/nostep.jsonl:3: no \"step\" (a whole number >= 0) on this line" \
  "$DUET" plot "$d/nostep.jsonl" -o "$d/x.png"
expect plot_frac_step 1 "duet: error: $d/fracstep.jsonl:1: no \"step\" (a whole number >= 0) on this line" \
  "$DUET" plot "$d/fracstep.jsonl" -o "$d/x.png"
expect plot_string_loss 1 "duet: error: $d/strloss.jsonl:1: \"loss\" is not a finite number" \
  "$DUET" plot "$d/strloss.jsonl" -o "$d/x.png"
expect plot_array 1 "duet: error: $d/array.jsonl:1: not a JSON object (a metrics file of duet run --metrics has one per line)" \
  "$DUET" plot "$d/array.jsonl" -o "$d/x.png"
expect plot_nothing 1 "duet: error: $d/empty.jsonl has nothing to plot: no line carries \"loss\", \"val_loss\", \"val_accuracy\", \"test_accuracy\", \"lr\", \"samples_per_s\" or \"tokens_per_s\"" \
  "$DUET" plot "$d/empty.jsonl" -o "$d/x.png"
expect plot_missing 1 "duet: error: cannot read metrics file $d/nope.jsonl: No such file or directory" \
  "$DUET" plot "$d/nope.jsonl" -o "$d/x.png"
expect plot_no_files 1 "duet: error: usage: duet plot METRICS.jsonl [MORE.jsonl ...] -o OUT.png|OUT.svg" \
  "$DUET" plot -o "$d/x.png"
expect plot_no_out 1 "duet: error: duet plot needs -o OUT.png or -o OUT.svg (the picture to write)" \
  "$DUET" plot "$d/good.jsonl"
expect plot_bad_ext 1 "duet: error: -o $d/x.pdf: the picture's name must end in .png or .svg" \
  "$DUET" plot "$d/good.jsonl" -o "$d/x.pdf"
expect plot_out_is_input 1 "duet: error: --script $d/good.jsonl is the metrics file $d/good.jsonl: give another file" \
  "$DUET" plot "$d/good.jsonl" -o "$d/x.png" --script "$d/good.jsonl"
expect plot_labels 1 "duet: error: 2 --label for 1 metrics file: at most one per file" \
  "$DUET" plot "$d/good.jsonl" --label a --label b -o "$d/x.png"
expect plot_unknown_flag 1 "duet: error: unknown flag '--dpi' (see duet plot --help)" \
  "$DUET" plot "$d/good.jsonl" --dpi 3 -o "$d/x.png"
expect plot_no_value 1 "duet: error: --label needs a value (see duet plot --help)" \
  "$DUET" plot "$d/good.jsonl" -o "$d/x.png" --label
expect plot_bad_size 1 "duet: error: --size expects WxH in pixels, each from 200 to 8000 (such as 1200x800), got '100x800'" \
  "$DUET" plot "$d/good.jsonl" -o "$d/x.png" --size 100x800
expect plot_bad_size2 1 "duet: error: --size expects WxH in pixels, each from 200 to 8000 (such as 1200x800), got '800'" \
  "$DUET" plot "$d/good.jsonl" -o "$d/x.png" --size 800
expect plot_no_gnuplot 1 "duet: error: duet plot needs gnuplot: apt-get install gnuplot-nox" \
  env PATH="$d/nowhere" "$DUET" plot "$d/good.jsonl" -o "$d/x.png"
expect run_timing_value 1 "duet: error: --metrics-timing takes no value" \
  "$DUET" run tests/models/gpt_tiny.model --metrics-timing=1

if ! command -v gnuplot > /dev/null 2>&1; then
  echo "skip: no gnuplot on PATH (apt-get install gnuplot-nox): the pictures are not drawn"
  echo "$pass passed, $fail failed, 1 skipped"
  [ "$fail" -eq 0 ] && exit 77 || exit 1
fi

expect plot_unwritable 1 "duet: error: cannot write $d/no/x.png: No such file or directory" \
  "$DUET" plot "$d/good.jsonl" -o "$d/no/x.png"

# --- 1. metrics of two short runs ---
files="" labels=""
if [ -f data/kjv.txt ]; then
  if "$DUET" run tests/models/gpt_tiny.model --data data/kjv.txt --steps 12 --eval-every 4 --eval-batches 2 \
       --threads 1 --log-every 1 --metrics "$d/gpt.jsonl" --metrics-timing --quiet > "$d/gpt.out" 2>&1 &&
     "$DUET" run tests/models/gpt_tiny.model --data data/kjv.txt --steps 3 --threads 1 --metrics "$d/plain.jsonl" \
       --quiet > /dev/null 2>&1; then
    files="$d/gpt.jsonl" labels="--label gpt_tiny"
    if grep -q '"tokens_per_s"' "$d/gpt.jsonl" && ! grep -q '_per_s' "$d/plain.jsonl"; then ok metrics_timing
    else bad metrics_timing; head -2 "$d/gpt.jsonl" "$d/plain.jsonl"; fi
  else bad "gpt_tiny run"; cat "$d/gpt.out"; fi
else echo "skip: no data/kjv.txt (make data)"; skipped=$((skipped + 1)); fi
if "$DUET" run models/fmnist_mlp.model --train-subset 1024 --test-subset 1000 --epochs 3 --threads 1 --log-every 1 \
     --lr-schedule cosine --warmup 3 --metrics "$d/mlp.jsonl" --metrics-timing --quiet > "$d/mlp.out" 2>&1; then
  files="$files $d/mlp.jsonl"
  grep -q '"samples_per_s"' "$d/mlp.jsonl" && ok metrics_timing_images || bad metrics_timing_images
elif grep -q 'fashion' "$d/mlp.out"; then echo "skip: no Fashion-MNIST"; skipped=$((skipped + 1))
else bad "fmnist_mlp run"; cat "$d/mlp.out"; fi

# the lines of a fashion_mnist(..., val_fraction = F) run: per-epoch validation accuracy and loss, one final test line
printf '%s\n' '{"step":1,"loss":2.3,"lr":0.001}' '{"step":4,"epoch":1,"val_accuracy":0.71,"val_loss":0.8}' \
  '{"step":8,"epoch":2,"val_accuracy":0.78,"val_loss":0.6}' '{"step":8,"test_accuracy":0.77,"test_loss":0.62,"final":true}' \
  > "$d/val.jsonl"
files="$files $d/val.jsonl"
# --- 2. the pictures and the data gnuplot received ---
if [ -n "$files" ]; then
  # shellcheck disable=SC2086
  if "$DUET" plot $files $labels -o "$d/curves.png" --script "$d/png.gp" 2> "$d/plot.err"; then
    if [ "$(head -c 8 "$d/curves.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] && [ -s "$d/curves.png" ]
    then ok plot_png; else bad "plot_png: not a PNG"; fi
    # shellcheck disable=SC2086
    $PY tests/plot_check.py script "$d/png.gp" $files && ok plot_png_data || bad plot_png_data
  else bad plot_png; cat "$d/plot.err"; fi
  # shellcheck disable=SC2086
  if "$DUET" plot $files $labels -o "$d/curves.svg" --script "$d/svg.gp" 2> "$d/plot.err"; then
    # shellcheck disable=SC2086
    $PY tests/plot_check.py script "$d/svg.gp" $files && ok plot_svg_data || bad plot_svg_data
    # shellcheck disable=SC2086
    $PY tests/plot_check.py svg "$d/curves.svg" "$d/svg.gp" ${labels:+gpt_tiny} && ok plot_svg || bad plot_svg
  else bad plot_svg; cat "$d/plot.err"; fi
fi

echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ] || exit 1
[ "$skipped" -eq 0 ] || exit 77
exit 0
