#!/bin/sh
# duet plan --format svg (cli/plan_svg.c) against the text table of the
# same plan (tests/plan_svg_check.py: one box per stage, micro-batch and
# direction in the schedule's order and dependencies, the table's times;
# memory bars whose heights are proportional to the table's bytes):
# fmnist_mlp on 2 CPU devices with 4 micro-batches, GPipe and 1F1B (1F1B
# keeps fewer activations on stage 0), 3 devices with 2 micro-batches
# (fewer than stages), gpt_tiny on 3 devices; a plan that does not fit
# (the picture still drawn, the capacity line at its height, exit 1);
# --format errors.
# usage: run_plan_svg.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_plan_svg.sh path/to/duet}
PY=/usr/bin/python3
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-plan-svg.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
expect() {
  name=$1 want_rc=$2 want=$3; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq "$want_rc" ] && printf '%s\n' "$out" | grep -Fxq -- "$want"; then ok "$name"
  else bad "$name: exit $rc (want $want_rc)"; echo "  got:  $(printf '%s\n' "$out" | head -3)"; echo "  want: $want"; fi
}
# check NAME MODEL SCHEDULE M RC [CAPACITY] -- PLAN FLAGS: the svg and the
# table of one plan; the stage-0 activation bytes into $d/NAME.act
check() {
  name=$1 model=$2 sched=$3 M=$4 want_rc=$5 cap=$6; shift 7
  "$DUET" plan "$model" --schedule "$sched" --micro-batches "$M" "$@" > "$d/$name.txt" 2> /dev/null
  rc_t=$?
  "$DUET" plan "$model" --schedule "$sched" --micro-batches "$M" "$@" --format svg > "$d/$name.svg" 2> "$d/$name.err"
  rc_s=$?
  if [ $rc_t -ne "$want_rc" ] || [ $rc_s -ne "$want_rc" ]; then
    bad "$name: exit $rc_t (text), $rc_s (svg), want $want_rc"; cat "$d/$name.err"; return
  fi
  # shellcheck disable=SC2086
  if $PY tests/plan_svg_check.py "$d/$name.svg" "$d/$name.txt" "$sched" "$M" $cap > "$d/$name.act"; then ok "$name"
  else bad "$name"; cat "$d/$name.act"; fi
}
MLP=models/fmnist_mlp.model
check mlp_gpipe $MLP gpipe 4 0 "" -- --devices cpu:0,cpu:1
check mlp_1f1b $MLP 1f1b 4 0 "" -- --devices cpu:0,cpu:1
if [ -s "$d/mlp_gpipe.act" ] && [ -s "$d/mlp_1f1b.act" ] &&
   [ "$(cat "$d/mlp_1f1b.act")" -lt "$(cat "$d/mlp_gpipe.act")" ]; then ok mlp_1f1b_fewer_activations
else bad "mlp_1f1b_fewer_activations: $(cat "$d/mlp_1f1b.act") vs $(cat "$d/mlp_gpipe.act")"; fi
check mlp_3_stages_m2 $MLP 1f1b 2 0 "" -- --devices cpu:0,cpu:1,cpu:2
check gpt_tiny_3 tests/models/gpt_tiny.model gpipe 2 0 "" -- --devices cpu:0,cpu:1,cpu:2
# 20 MiB per device: fmnist_mlp's stages need more (the capacity line shows it)
check mlp_no_fit $MLP gpipe 4 1 20971520 -- --devices 20MiB:sm_60,20MiB:sm_60
if grep -q '^duet: error: the model does not fit the memory of 20MiB:sm_60' "$d/mlp_no_fit.err"; then ok no_fit_error
else bad no_fit_error; cat "$d/mlp_no_fit.err"; fi

expect format_bad 1 "duet: error: --format expects text, json or svg, got 'png'" "$DUET" plan $MLP --format png
expect format_nodes 1 "duet: error: --format svg draws one layout; --nodes compares several (use --format text)" \
  "$DUET" plan $MLP --format svg --nodes 2
expect plan_help 0 "                [--device-memory SIZE] [--format text|json|svg] [--fit]" "$DUET" plan --help

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
