#!/bin/sh
# tests/run_fit.sh: the memory budget (--device-memory), the runtime's
# allocation against duet plan, duet plan --format json and duet plan --fit
# (issue 14, items 3 and 5).  Usage: run_fit.sh DUET PART
#   alloc  every model in models/ but gpt2_124m (data: Fashion-MNIST and
#          data/kjv.txt; else exit 77), --batch 2, on one CPU device and
#          as a two-stage pipeline (cpu:0,cpu:1, 2 micro-batches): the bytes
#          `duet run` reports allocated ("duet: allocated: N bytes (a + b on
#          the 2 devices)") equal, device by device, the totals of
#          `duet plan --format json` for the same flags; on one device the
#          growth of resident memory (VmRSS around the allocation: the CPU
#          device zeroes what it allocates, so every page is resident) is
#          within 5% of the plan; with --data-parallel 2 (and --zero 1, and 2
#          replicas of 2 stages) each replica's stage allocates at most the
#          plan's figure and the fullest exactly it (the plan shows the
#          fullest ZeRO shard).
#   alloc_long  the same for models/gpt2_124m.model (--batch 1: 3.9 GB on one
#          device; label long).
#   fit    `duet plan --format json` parses (python3's json) and its
#          per-device totals, weights, grads, optimizer state and
#          activations equal the text table's MiB; `fits` false and exit 1
#          under a budget; --fit on gpt_kjv over cpu:0,cpu:1 with
#          --device-memory 30MiB (plain fp32 on one device needs 201 MiB,
#          on two 110 MiB each) chooses a configuration that fits, with
#          16-bit storage or recomputation, whose command line, run for 2
#          steps, trains and allocates no more than the budget per device;
#          --fit --format json names the same command; nothing fits under
#          4MiB: exit 1, by how much, and the setting that helps most;
#          duet run refuses a budget that does not fit before compiling,
#          with the table (one device: the plan's; two: the fastest split's)
#          and the exact error; exact diagnostics for bad values.
DUET=$1
PART=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
PY=python3
command -v $PY > /dev/null 2>&1 || { echo "skip: no python3"; exit 77; }

# sum of the per-device "total" of a duet plan --format json file, and the list "a + b"
json_totals() {
  $PY -c 'import json,sys
t=[d["total"] for d in json.load(open(sys.argv[1]))["devices"]]
print(sum(t)); print(" + ".join(str(x) for x in t))' "$1"
}

alloc_check() { # model, then flags
  m=$1; shift
  name="$(basename "$m" .model)${1:+ $*}"
  if ! "$DUET" plan "$m" --batch "$BATCH" "$@" --format json > "$d/plan.json" 2> "$d/plan.err"; then
    bad "$name: plan"; head -3 "$d/plan.err"; return
  fi
  json_totals "$d/plan.json" > "$d/totals"
  sum=$(sed -n 1p "$d/totals") list=$(sed -n 2p "$d/totals")
  "$DUET" run "$m" --batch "$BATCH" --steps 1 --no-eval --eval-batches 1 --threads 1 "$@" > "$d/run.out" 2>&1 ||
    { bad "$name: run"; tail -3 "$d/run.out"; return; }
  line=$(grep '^duet: allocated: ' "$d/run.out")
  got=$(printf '%s\n' "$line" | sed 's/^duet: allocated: \([0-9]*\) bytes.*/\1/')
  parts=$(printf '%s\n' "$line" | sed -n 's/^duet: allocated: [0-9]* bytes (\(.*\) on the [0-9]* devices).*/\1/p')
  if [ -n "$parts" ] && [ "$parts" != "$list" ] && [ -n "$REPLICAS" ]; then
    # replicas: every replica's stage s allocates at most the plan's (ZeRO: the fullest shard), one exactly
    if $PY -c 'import sys
got=[int(x) for x in sys.argv[1].split(" + ")]; plan=[int(x) for x in sys.argv[2].split(" + ")]; S=len(plan)
assert len(got) % S == 0 and len(got) > S
for s in range(S):
  mine=got[s::S]; assert max(mine) == plan[s] and all(x <= plan[s] for x in mine), (s, mine, plan[s])' "$parts" "$list"; then
      ok "$name: every replica within the plan, the fullest equal ($parts; plan $list)"
    else bad "$name: replicas allocated $parts, plan $list"; fi
    return
  fi
  if [ "$got" = "$sum" ] && { [ -z "$parts" ] || [ "$parts" = "$list" ]; }; then
    ok "$name: allocated $got bytes = planned${parts:+ ($parts)}"
  else
    bad "$name: allocated '$got' (${parts:-one device}), planned $sum ($list)"; echo "  $line"
  fi
  if [ -z "$parts" ]; then # one device: resident memory
    rss=$(printf '%s\n' "$line" | sed -n 's/.*resident memory grew by \([0-9]*\) bytes.*/\1/p')
    if [ -n "$rss" ] && awk -v r="$rss" -v p="$sum" 'BEGIN { x = (r - p) / p; exit !(x < 0.05 && x > -0.05) }'; then
      ok "$name: resident memory grew by $rss bytes, within 5% of $sum"
    else bad "$name: resident memory grew by '$rss' bytes, plan $sum"; fi
  fi
}

case "$PART" in
alloc | alloc_long)
  [ -f data/kjv.txt ] && [ -d /usr/share/datasets/fashion-mnist ] || { echo "skip: no data"; exit 77; }
  BATCH=2
  if [ "$PART" = alloc_long ]; then
    BATCH=1
    alloc_check models/gpt2_124m.model
  else
    for m in models/*.model; do
      case "$m" in *gpt2_124m*) continue ;; esac
      alloc_check "$m"
      alloc_check "$m" --devices cpu:0,cpu:1 --micro-batches 2
    done
    # data parallelism: 2 replicas, and ZeRO stage 1 (each replica its own shard of the state)
    REPLICAS=1
    alloc_check models/fmnist_mlp.model --data-parallel 2
    alloc_check models/fmnist_mlp.model --data-parallel 2 --zero 1
    BATCH=4
    alloc_check models/gpt_kjv.model --devices cpu:0,cpu:1,cpu:2,cpu:3 --data-parallel 2 --micro-batches 2 --zero 1
    REPLICAS= BATCH=2
  fi
  ;;
fit)
  [ -f data/kjv.txt ] || { echo "skip: no data/kjv.txt"; exit 77; }
  G=models/gpt_kjv.model
  # --format json: the text table's figures, in bytes
  "$DUET" plan $G --devices cpu:0,cpu:1 --micro-batches 2 > "$d/t.txt" 2>&1 || bad "plan text"
  "$DUET" plan $G --devices cpu:0,cpu:1 --micro-batches 2 --format json > "$d/t.json" 2>&1 || bad "plan json"
  if $PY -m json.tool "$d/t.json" > /dev/null 2>&1; then ok "json parses"; else bad "json does not parse"; head -3 "$d/t.json"; fi
  $PY -c 'import json,sys
j=json.load(open(sys.argv[1])); m=lambda b: "%.2f" % (b / 1048576.0)
assert j["fits"] is True and j["stages"] == 2 and j["micro_batches"] == 2
for i, d in enumerate(j["devices"]):
  parts = d["weights"] + d["master_weights"] + d["grads"] + d["optimizer_state"] + d["activations"] + d["cache"] + d["workspace"]
  assert parts == d["total"], (parts, d["total"])
  print("  memory: weights %s MiB, grads %s MiB (summed over the micro-batches), optimizer state %s MiB, activations %s MiB (%d micro-batches in flight x %s MiB, with their gradients): %s MiB" % (
    m(d["weights"] + d["master_weights"]), m(d["grads"]), m(d["optimizer_state"]), m(d["activations"]),
    d["micro_batches_in_flight"], m(d["activations_per_micro_batch"]), m(d["total"])))' "$d/t.json" > "$d/want" 2> "$d/py.err" ||
    { bad "json fields"; cat "$d/py.err"; }
  grep '^  memory: ' "$d/t.txt" | sed 's/ of [0-9.]* GiB (.*//' > "$d/got"
  if [ -s "$d/want" ] && cmp -s "$d/want" "$d/got"; then ok "json totals equal the text table"
  else bad "json against text"; diff "$d/want" "$d/got" | head -6; fi
  "$DUET" plan $G --devices cpu:0,cpu:1 --device-memory 100MiB --format json > "$d/nf.json" 2> "$d/nf.err"; rc=$?
  if [ $rc -eq 1 ] && $PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["fits"] is False and j["devices"][0]["capacity"] == 104857600 and not j["devices"][0]["fits"]' "$d/nf.json" &&
     grep -q '^duet: error: the model does not fit the devices: ' "$d/nf.err"; then
    ok "json: fits false, exit 1 (no split within the budget: the fastest split's table)"
  else bad "json under a budget: exit $rc"; head -3 "$d/nf.err"; fi
  "$DUET" plan $G --device-memory 100MiB --format json > "$d/nf1.json" 2> "$d/nf1.err"; rc=$?
  if [ $rc -eq 1 ] && $PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["fits"] is False and j["devices"][0]["total"] == 211470848' "$d/nf1.json" &&
     grep -Fxq 'duet: error: the model does not fit: a device needs more memory than it has ("fits": false above)' "$d/nf1.err"; then
    ok "json: one device, fits false, exit 1"
  else bad "json one device under a budget: exit $rc"; head -3 "$d/nf1.err"; fi

  # --fit under 30 MiB per device: the command line it prints trains
  "$DUET" plan $G --devices cpu:0,cpu:1 --device-memory 30MiB --threads 2 --fit > "$d/fit.txt" 2>&1; rc=$?
  best=$(sed -n 's/^best: //p' "$d/fit.txt")
  if [ $rc -eq 0 ] && [ -n "$best" ] && printf '%s\n' "$best" | grep -Eq -- '--precision (fp16|bf16)|--recompute (blocks|auto)' &&
     grep -q '^fit: models/gpt_kjv.model, 2 devices per replica, global batch 16: [0-9]* configurations planned, [1-9][0-9]* fit$' "$d/fit.txt"; then
    ok "fit: $best"
  else bad "fit: exit $rc"; cat "$d/fit.txt" | head -20; fi
  # the plain configurations do not fit that budget (the search had to change something)
  "$DUET" plan $G --devices cpu:0,cpu:1 --device-memory 30MiB > /dev/null 2>&1 && bad "fp32 on two devices fits 30MiB"
  "$DUET" plan $G --device-memory 30MiB > /dev/null 2>&1 && bad "fp32 on one device fits 30MiB"
  case "$best" in "duet run $G "*) ;; *) best="duet run $G --bad" ;; esac
  cmd=$(printf '%s\n' "$best" | sed "s|^duet |'$DUET' |")
  eval "$cmd --steps 2 --eval-batches 1 --eval-every 2" > "$d/best.out" 2>&1; rc=$?
  line=$(grep '^duet: allocated: ' "$d/best.out")
  over=$(printf '%s\n' "$line" | sed 's/.*bytes (\(.*\) on the.*/\1/; s/^duet: allocated: \([0-9]*\) bytes.*/\1/' | tr '+' '\n' |
         awk '$1 > 31457280 { n++ } END { print n + 0 }')
  if [ $rc -eq 0 ] && grep -q '^step 2/2 | loss ' "$d/best.out" && [ -n "$line" ] && [ "$over" = 0 ]; then
    ok "fit: its command line trains 2 steps within 30MiB per device"
  else bad "fit command: exit $rc, $over devices over"; tail -4 "$d/best.out"; fi
  "$DUET" plan $G --devices cpu:0,cpu:1 --device-memory 30MiB --threads 2 --fit --format json > "$d/fit.json" 2>&1
  jcmd=$($PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["fits"] and j["chosen"]["fits"]; print(j["chosen"]["command"])' "$d/fit.json" 2>&1)
  if [ "$jcmd" = "$best" ]; then ok "fit json: the same command"; else bad "fit json: '$jcmd'"; fi
  # nothing fits 4 MiB: by how much, and what helps most
  "$DUET" plan $G --devices cpu:0,cpu:1 --device-memory 4MiB --fit > "$d/none.txt" 2>&1; rc=$?
  if [ $rc -eq 1 ] && grep -Eq '^nothing fits: the closest \(.*\) needs [0-9]+ bytes more than cpu:[01] has$' "$d/none.txt" &&
     grep -Eq '^the default configuration \(2 stages, fp32, no recomputation\) needs [0-9]+ bytes more than cpu:[01] has$' "$d/none.txt" &&
     grep -Eq '^the setting that helps most alone: .* \([0-9]+ bytes less over: [0-9]+ bytes over on cpu:[01]\)$' "$d/none.txt"; then
    ok "fit: nothing fits"
  else bad "fit nothing fits: exit $rc"; tail -5 "$d/none.txt"; fi
  "$DUET" plan $G --devices cpu:0,cpu:1 --device-memory 4MiB --fit --format json > "$d/none.json" 2> "$d/none.err"; rc=$?
  if [ $rc -eq 1 ] && $PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["fits"] is False and j["chosen"]["fits"] is False' "$d/none.json"; then
    ok "fit json: nothing fits"
  else bad "fit json nothing fits: exit $rc"; head -3 "$d/none.err"; fi
  # gpt2_124m on two P100-sized devices capped at 1700 MiB: only optimizer offload (with fp16,
  # 8-bit state and recomputation) fits, so the search must take it (measured: the fastest offloaded
  # configuration needs 1699.63 MiB on its fullest device, none without offload fits)
  "$DUET" plan models/gpt2_124m.model --devices 2x16GiB:sm_60 --device-memory 1700MiB --fit > "$d/off.txt" 2>&1; rc=$?
  "$DUET" plan models/gpt2_124m.model --devices 2x16GiB:sm_60 --device-memory 1700MiB --fit --format json > "$d/off.json" 2>&1
  if [ $rc -eq 0 ] && grep -q '^best: duet run models/gpt2_124m.model .* --offload optimizer --device-memory 1700MiB$' "$d/off.txt" &&
     ! grep -E '^ +[0-9]+ +[0-9.]+ ms' "$d/off.txt" | grep -qv 'offload optimizer$' &&
     $PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["fits"] and j["chosen"]["offload"] == "optimizer" and j["host"]["optimizer_state"] > 0' "$d/off.json"; then
    ok "fit: offload chosen where nothing else fits"
  else bad "fit offload: exit $rc"; head -8 "$d/off.txt"; fi

  # duet run refuses before compiling: one device (the plan's table), two (the fastest split's)
  DUET_CACHE_DIR="$d/cache1" "$DUET" run $G --device-memory 30MiB --steps 1 > "$d/r1.out" 2>&1; rc=$?
  if [ $rc -eq 1 ] && grep -q '^  memory: .* of 30.00 MiB (--device-memory 30MiB = 31457280 bytes)  DOES NOT FIT$' "$d/r1.out" &&
     grep -Fxq 'duet: error: the model does not fit the memory of cpu: it needs 201.67 MiB (weights 12.43, grads 0.00, optimizer state 24.86, activations 164.39 MiB), and 30.00 MiB are available (--device-memory 30MiB = 31457280 bytes): 180013568 bytes too many; what would help: --recompute blocks or auto, --precision fp16 (or bf16), --optimizer-state int8, more --devices (stages), --micro-batches N with --schedule 1f1b, a smaller --batch; duet plan --fit searches them' "$d/r1.out" &&
     [ -z "$(ls -A "$d/cache1" 2>/dev/null)" ]; then
    ok "run refuses one device"
  else bad "run one device: exit $rc"; tail -3 "$d/r1.out"; fi
  DUET_CACHE_DIR="$d/cache2" "$DUET" run $G --devices cpu:0,cpu:1 --device-memory 80MiB --steps 1 > "$d/r2.out" 2>&1; rc=$?
  if [ $rc -eq 1 ] && grep -Fxq 'the plan with the fastest split, memory aside:' "$d/r2.out" &&
     grep -Fxq 'cpu:0 needs 117432832 bytes, 33546752 more than its 83886080' "$d/r2.out" &&
     grep -Fxq 'cpu:1 needs 113623104 bytes, 29737024 more than its 83886080' "$d/r2.out" &&
     grep -q '^duet: error: the model does not fit the devices: .* against 160.00 MiB on 2 devices (--device-memory 80MiB = 83886080 bytes); no split into 2 stages keeps every stage within its memory$' "$d/r2.out" &&
     [ -z "$(ls -A "$d/cache2" 2>/dev/null)" ]; then
    ok "run refuses two devices"
  else bad "run two devices: exit $rc"; tail -3 "$d/r2.out"; fi

  # diagnostics
  expect() {
    name=$1 want=$2; shift 2
    out=$("$@" 2>&1); rc=$?
    if [ $rc -eq 1 ] && printf '%s\n' "$out" | grep -Fxq -- "$want"; then ok "$name"
    else bad "$name: exit $rc"; echo "  got:  $(printf '%s\n' "$out" | head -1)"; echo "  want: $want"; fi
  }
  expect weights_alone "duet: error: the model does not fit the memory of cpu: its weights alone take 12.43 MiB (13031424 bytes), more than the 10.00 MiB available (--device-memory 10MiB = 10485760 bytes); only more --devices (stages) or more memory help" \
    "$DUET" run $G --device-memory 10MiB --steps 1
  # the table's advice agrees with the error: no setting but stages helps when the weights alone do not fit
  if "$DUET" run $G --device-memory 10MiB --steps 1 2>&1 |
     grep -Fxq 'what would help: the weights alone exceed cpu: only more --devices (stages) or more memory'; then
    ok weights_alone_table_advice
  else bad weights_alone_table_advice; fi
  expect bad_size "duet: error: --device-memory expects a size such as 16GiB or 16G (2^30 bytes), 16GB (10^9), 500MiB or bytes, got '16QB'" \
    "$DUET" plan $G --device-memory 16QB
  expect bad_size_run "duet: error: --device-memory expects a size such as 16GiB or 16G (2^30 bytes), 16GB (10^9), 500MiB or bytes, got '-1G'" \
    "$DUET" run $G --device-memory -1G
  expect no_size "duet: error: --device-memory needs a value (a size such as 16GiB)" "$DUET" plan $G --device-memory
  expect bad_format "duet: error: --format expects text, json or svg, got 'xml'" "$DUET" plan $G --format xml
  expect fit_svg "duet: error: duet plan --fit prints its ranked list and table as text or json, not svg" "$DUET" plan $G --fit --format svg
  expect fit_fixed "duet: error: duet plan --fit chooses --micro-batches itself (give --devices, --device-memory, --data-parallel, --batch, --arch)" \
    "$DUET" plan $G --fit --micro-batches 2
  expect fit_fixed_prec "duet: error: duet plan --fit chooses --precision itself (give --devices, --device-memory, --data-parallel, --batch, --arch)" \
    "$DUET" plan $G --fit --precision fp16
  expect json_nodes "duet: error: duet plan --format json prints one layout's table; --nodes compares layouts (use text)" \
    "$DUET" plan $G --format json --nodes 2
  # 16GB and 16GiB and 16G: each read as it says
  "$DUET" plan $G --device-memory 16GB > "$d/gb" 2>&1
  "$DUET" plan $G --device-memory 16G > "$d/g" 2>&1
  grep -q '(--device-memory 16GB = 16000000000 bytes)' "$d/gb" && grep -q '(--device-memory 16G = 17179869184 bytes)' "$d/g" &&
    ok "sizes: 16GB is 10^9, 16G is 2^30" || { bad "sizes"; grep memory "$d/gb" "$d/g"; }
  ;;
*)
  echo "usage: run_fit.sh DUET alloc|alloc_long|fit"; exit 2 ;;
esac
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
