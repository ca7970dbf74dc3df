#!/bin/sh
# tests/run_data_parallel.sh: data parallelism in one process (--data-parallel
# N: replicas on virtual CPU devices, gradients all-reduced over shared
# memory).  The reference of every equality is the one-device run with the
# replicas' micro-batches (R x M), because that is what the replicas compute:
# the same global batch, split the same way, summed in the same order.
# Threads are pinned so that OpenBLAS sums alike: `--threads 2` over the 2
# workers of 2 replicas is 1 thread each, as `--threads 1` on one device
# (4 over 4 workers for 2 replicas of a 2-stage pipeline, 2 over 2 for the
# one pipeline it is compared with).  DUET_DP_CHECK=1 makes every
# data-parallel run compare each replica's params and optimizer state with
# replica 0's after every step (it fails the run at the first difference).
# Parts (ctest runs each as its own test):
#   mlp  fmnist_mlp, 20 steps (Fashion-MNIST; without it the part is
#        skipped, exit 77):
#     1. --devices cpu:0,cpu:1 --data-parallel 2 prints the same losses and
#        test accuracy (metrics file, as text) and writes a byte-identical
#        checkpoint as one device with --micro-batches 2; the replicas are
#        bit-identical after every step; two identical runs print identical
#        losses; without --devices (2 virtual CPU devices) and with small
#        buckets (--bucket-mb 1: 4 buckets) the same bits again; three
#        replicas (batch 255) equal one device with 3 micro-batches (the
#        replicas' sums are added in replica order, as its accumulator);
#        the same with 8-bit AdamW state (--optimizer-state int8);
#     2. DUET_DP_DROP=0 (bucket 0 never all-reduced) is caught by
#        DUET_DP_CHECK after step 1: the check can fail;
#     3. 2 replicas x 2-stage pipelines on cpu:0..cpu:3 (GPipe, 1F1B) equal
#        the one 2-stage pipeline with 2 micro-batches, bit for bit;
#     4. 2 micro-batches per replica against one device with 4: only the
#        association of the gradient sums differs ((g0+g1)+(g2+g3) against
#        ((g0+g1)+g2)+g3), and AdamW lets the rounding difference grow
#        (measured 2026-12-01: at most 1.6e-7 relative over steps 1-10,
#        8e-6 by step 15, 1.3e-4 at step 20); the losses must be within 1e-6
#        relative over steps 1-10 and 1e-3 over all 20 (dropping one
#        replica's bucket, DUET_DP_DROP=0, misses by 8e-2 at step 2), and the
#        checkpoints must differ (else this is no test of a reassociation);
#        replicas still bit-identical;
#     5. fp16 with a loss scale of 2^30 (overflows, skipped steps, halving):
#        the same losses, skipped steps and checkpoint as one device with 2
#        micro-batches, and at least one step where one replica overflowed
#        and the other did not (the OR over the replicas made both skip it:
#        their params stay bit-identical);
#     6. exact resume from a data-parallel checkpoint (10 + 10 steps = 20),
#        with the same replicas and with one device and --micro-batches 2
#        (state is not sharded: the same bytes); a resume without
#        micro-batches trains on (not exactly: one batch of 256 sums
#        otherwise);
#     7. a `duet compile --data-parallel 2` executable prints the losses of
#        duet run; it refuses another --data-parallel or --bucket-mb.
#   gpt  gpt_kjv, 20 steps, --devices cpu:0,cpu:1 --data-parallel 2 against
#        one device with --micro-batches 2: the same losses and checkpoint,
#        replicas bit-identical (needs data/kjv.txt: `make data`; without it
#        the part is skipped, exit 77).
#   cli  exact diagnostics: --data-parallel that does not divide the
#        devices, replicas x micro-batches that do not divide the batch (in
#        the train section and from --batch), N < 1 and not a number,
#        --bucket-mb not positive, groups of different device kinds, an IR
#        dump given another replica count, a dump after data_parallel given
#        another --bucket-mb (run, compile; its executable; the default
#        25); the dump records `bucket_mb`; `duet ir --after data_parallel`
#        (golden in tests/golden, buckets on both stages of a pipeline),
#        --format dot and json show the buckets; `duet plan` prints the
#        all-reduce (ring 2(N-1)/N, the link, hidden and exposed time) for
#        virtual CPU devices and for 2x16GiB:sm_60.
# usage: run_data_parallel.sh path/to/duet mlp|gpt|cli   (from the repository root)
DUET=${1:?usage: run_data_parallel.sh path/to/duet mlp|gpt|cli}
PART=${2:?usage: run_data_parallel.sh path/to/duet mlp|gpt|cli}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-dp.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok $1"; }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
skipped=0
skip() { echo "skip: $*"; skipped=$((skipped + 1)); }
FM=/usr/share/datasets/fashion-mnist
KJV=data/kjv.txt

# run NAME THREADS ARGS...: trains with DUET_DP_CHECK=1, keeps output, metrics and checkpoint
run() {
  n=$1 th=$2
  shift 2
  if ! DUET_DP_CHECK=1 "$DUET" run "$@" --threads "$th" --metrics "$d/$n.jsonl" --save "$d/$n.st" > "$d/$n.out" 2>&1; then
    bad "$n: duet run $*"
    tail -5 "$d/$n.out"
  fi
}
# same REF NAME: identical losses (and evaluations) and checkpoint
same() {
  if [ -s "$d/$1.st" ] && cmp -s "$d/$1.st" "$d/$2.st" && cmp -s "$d/$1.jsonl" "$d/$2.jsonl"; then ok "$2 equals $1"
  else bad "$2 differs from $1"; diff "$d/$1.jsonl" "$d/$2.jsonl" | head -6; fi
}
# checked NAME STEPS: the replicas were compared after every step and never differed
checked() {
  if grep -q "^duet: data-parallel check: the params and optimizer state of the 2 replicas were bit-identical after each of $2 training steps" "$d/$1.out"
  then ok "$1 replicas bit-identical"; else bad "$1: no data-parallel check line for $2 steps"; tail -3 "$d/$1.out"; fi
}
# expect NAME WANT COMMAND...: fails with exactly the message WANT (first line of stderr)
expect() {
  name=$1 want=$2
  shift 2
  if "$@" > "$d/out" 2> "$d/err"; then bad "$name: succeeded"; return; fi
  got=$(head -1 "$d/err")
  if [ "$got" = "$want" ]; then ok "$name"; else bad "$name"; echo "  got:  $got"; echo "  want: $want"; fi
}

case $PART in
mlp)
  if [ ! -r "$FM/train-images-idx3-ubyte.gz" ]; then
    skip "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): the mlp part"
  else
    # 5,120 images: one epoch is the 20 steps, then an evaluation on 1,000
    MLP="models/fmnist_mlp.model --steps 20 --log-every 1 --train-subset 5120 --test-subset 1000"
    # 1.
    run ref 1 $MLP --micro-batches 2
    run dp 2 $MLP --devices cpu:0,cpu:1 --data-parallel 2
    run dp_again 2 $MLP --devices cpu:0,cpu:1 --data-parallel 2
    run dp_buckets 2 $MLP --data-parallel 2 --bucket-mb 1
    same ref dp
    same dp dp_again
    same ref dp_buckets
    checked dp 20
    checked dp_buckets 20
    # pruning with data parallelism: the replicas choose the same masks (from
    # bit-identical params) and apply them after the same steps, so the run is
    # the one-device run with 2 micro-batches, masks and all
    run ref_prune 1 $MLP --micro-batches 2 --prune 0.5 --prune-start 4 --prune-end 12 --prune-every 4
    run dp_prune 2 $MLP --devices cpu:0,cpu:1 --data-parallel 2 --prune 0.5 --prune-start 4 --prune-end 12 --prune-every 4
    same ref_prune dp_prune
    checked dp_prune 20
    # gradient clipping: after the all-reduce every replica's gradients, so
    # its norm, are the same (duet_pipe_grad_sumsq refuses a difference);
    # the run is the one-device run with 2 micro-batches, norms included
    C="--clip-grad-norm 2 --lr-schedule linear --warmup 3 --min-lr 1e-5"
    run ref_clip 1 $MLP --micro-batches 2 $C
    run dp_clip 2 $MLP --devices cpu:0,cpu:1 --data-parallel 2 $C
    same ref_clip dp_clip
    checked dp_clip 20
    grep -q '"grad_norm":' "$d/dp_clip.jsonl" && ok "dp_clip logs the norm" || bad "dp_clip: no grad_norm in the metrics"
    # 8-bit AdamW state: each replica keeps its own codes and scales, quantized
    # from bit-identical gradients, so they stay bit-identical (the check
    # compares them) and equal the one-device run's
    run ref_q8 1 $MLP --micro-batches 2 --optimizer-state int8 --no-eval
    run dp_q8 2 $MLP --devices cpu:0,cpu:1 --data-parallel 2 --optimizer-state int8 --no-eval
    same ref_q8 dp_q8
    checked dp_q8 20
    grep -q '"test_accuracy"' "$d/dp.jsonl" && ok "dp evaluates" || bad "dp: no evaluation in the metrics"
    # three replicas: the sum runs in replica order, (g0 + g1) + g2, as one device's accumulator
    run ref3 1 $MLP --micro-batches 3 --batch 255 --no-eval
    run dp3 3 $MLP --data-parallel 3 --batch 255 --no-eval
    same ref3 dp3
    grep -q '^duet: data parallel: 2 replicas of 1 stage, each 1 micro-batch of the global batch of 256; 4 all-reduce buckets' \
      "$d/dp_buckets.out" && ok "4 buckets reported" || { bad "dp_buckets: the data parallel line"; grep 'data parallel' "$d/dp_buckets.out"; }
    # 2. the check sees replicas that drift apart
    if DUET_DP_CHECK=1 DUET_DP_DROP=0 "$DUET" run $MLP --data-parallel 2 --threads 2 --no-eval > "$d/drop.out" 2>&1; then
      bad "DUET_DP_DROP=0 passed the data-parallel check"
    elif grep -q "^duet: error: data-parallel check after step 1: replica 1's params differ from replica 0's: tensor " "$d/drop.out"
    then ok "dropped bucket caught"
    else bad "DUET_DP_DROP=0: unexpected failure"; tail -3 "$d/drop.out"; fi
    # 3. replicas of pipelines
    run pipe_ref 2 $MLP --devices cpu:0,cpu:1 --micro-batches 2
    run pipe_dp 4 $MLP --devices cpu:0,cpu:1,cpu:2,cpu:3 --data-parallel 2
    run pipe_dp_1f1b 4 $MLP --devices cpu:0,cpu:1,cpu:2,cpu:3 --data-parallel 2 --schedule 1f1b
    same pipe_ref pipe_dp
    same pipe_ref pipe_dp_1f1b
    checked pipe_dp 20
    grep -q '^duet: pipeline: 2 stages on each of cpu:0,cpu:1 | cpu:2,cpu:3, 1 micro-batch of 128 per replica' \
      "$d/pipe_dp.out" && ok "groups reported" || { bad "pipe_dp: the pipeline line"; grep 'pipeline:' "$d/pipe_dp.out"; }
    # 4. two micro-batches per replica: the association of the sums differs
    run m4 1 $MLP --micro-batches 4 --no-eval
    run dp_m2 2 $MLP --data-parallel 2 --micro-batches 2 --no-eval
    checked dp_m2 20
    if cmp -s "$d/m4.st" "$d/dp_m2.st"; then bad "dp_m2: the checkpoint equals the one-device run's (expected a reassociation)"
    else ok "dp_m2 checkpoint differs (reassociated sums)"; fi
    if paste -d' ' "$d/m4.jsonl" "$d/dp_m2.jsonl" | awk '
      { if (split($0, f, /"loss":/) != 3) next
        x = f[2] + 0; y = f[3] + 0; r = x - y; if (r < 0) r = -r; r /= (x < 0 ? -x : x); n++
        if (r > m) m = r; if (n <= 10 && r > m10) m10 = r }
      END { printf "max relative loss difference: %.3g over steps 1-10, %.3g over %d steps\n", m10, m, n
            exit !(n == 20 && m10 <= 1e-6 && m <= 1e-3) }'
    then ok "dp_m2 losses within 1e-6 (steps 1-10) and 1e-3 (11-20)"
    else bad "dp_m2 losses differ by more than 1e-6 (steps 1-10) or 1e-3 (11-20) relative"; fi
    # 5. fp16 overflows: the replicas skip the same steps
    HALF="models/fmnist_mlp.model --steps 20 --log-every 1 --train-subset 5120 --no-eval --precision fp16 --loss-scale 1073741824"
    run half_ref 1 $HALF --micro-batches 2
    run half_dp 2 $HALF --data-parallel 2
    same half_ref half_dp
    checked half_dp 20
    grep -q 'loss scale .* ([1-9][0-9]* skipped)' "$d/half_dp.out" && ok "half_dp skipped steps" || bad "half_dp: no skipped step"
    if grep -Eq '; [1-9][0-9]* replica-stages? found no overflow of its own in a step another replica overflowed' "$d/half_dp.out"
    then ok "an overflow of one replica only"; else bad "half_dp: no step overflowed on one replica only"; tail -1 "$d/half_dp.out"; fi
    # 6. resume
    RES="models/fmnist_mlp.model --log-every 1 --train-subset 5120 --no-eval"
    run full 2 $RES --steps 20 --data-parallel 2
    run first 2 $RES --steps 10 --data-parallel 2
    cp "$d/first.st" "$d/first_b.st"
    cp "$d/first.st" "$d/first_c.st"
    if "$DUET" run $RES --steps 20 --data-parallel 2 --threads 2 --resume "$d/first.st" --save "$d/resumed.st" > "$d/out" 2>&1 &&
      cmp -s "$d/full.st" "$d/resumed.st"; then ok "dp resume exact"; else bad "dp resume differs"; tail -3 "$d/out"; fi
    if "$DUET" run $RES --steps 20 --micro-batches 2 --threads 1 --resume "$d/first_b.st" --save "$d/resumed1.st" > "$d/out" 2>&1 &&
      cmp -s "$d/full.st" "$d/resumed1.st"; then ok "one device resumes a dp checkpoint exactly"
    else bad "one device with 2 micro-batches resumed from a dp checkpoint differs"; tail -3 "$d/out"; fi
    if "$DUET" run $RES --steps 20 --threads 1 --resume "$d/first_c.st" --save "$d/resumed2.st" > "$d/out" 2>&1 &&
      ! grep -q warning "$d/out" && [ -s "$d/resumed2.st" ]; then ok "one device without micro-batches resumes (not exactly)"
    else bad "resume without micro-batches"; tail -3 "$d/out"; fi
    # 7. a compiled executable
    if "$DUET" compile models/fmnist_mlp.model -o "$d/exe" --data-parallel 2 --bucket-mb 1 > "$d/out" 2>&1 &&
      DUET_DP_CHECK=1 "$d/exe" --steps 20 --log-every 1 --train-subset 5120 --test-subset 1000 --threads 2 \
        --metrics "$d/exe.jsonl" --save "$d/exe.st" > "$d/exe.out" 2>&1; then same ref exe; checked exe 20
    else bad "compiled data-parallel executable"; tail -5 "$d/out" "$d/exe.out"; fi
    expect exe_dp "duet: error: --data-parallel is fixed at compile time: 2 (this program was compiled with it; to change it, compile again: duet compile M.model --data-parallel 3; duet run takes it directly)" \
      "$d/exe" --steps 1 --data-parallel 3
    expect exe_bucket "duet: error: --bucket-mb is fixed at compile time: 1 (this program was compiled with it; to change it, compile again: duet compile M.model --bucket-mb 25; duet run takes it directly)" \
      "$d/exe" --steps 1 --bucket-mb 25
    expect exe_micro "duet: error: --micro-batches is fixed at compile time: 1 (this program was compiled with it; to change it, compile again: duet compile M.model --micro-batches 2; duet run takes it directly)" \
      "$d/exe" --steps 1 --micro-batches 2
  fi
  ;;
gpt)
  if [ ! -r "$KJV" ]; then
    skip "$KJV is missing (make data): the gpt part"
  else
    GPT="models/gpt_kjv.model --steps 20 --log-every 1 --no-eval --data $KJV"
    run gpt_ref 1 $GPT --micro-batches 2
    run gpt_dp 2 $GPT --devices cpu:0,cpu:1 --data-parallel 2
    same gpt_ref gpt_dp
    checked gpt_dp 20
  fi
  ;;
cli)
  M=models/fmnist_mlp.model
  expect not_dividing "duet: error: --data-parallel 2 does not divide the 3 devices of --devices cpu:0,cpu:1,cpu:2 into equal groups (one group of devices per replica)" \
    "$DUET" run $M --devices cpu:0,cpu:1,cpu:2 --data-parallel 2
  expect batch_section "$M:20:11: error: batch 256 is not a multiple of --data-parallel 3 (the replicas split each global batch)" \
    "$DUET" run $M --data-parallel 3
  expect batch_flag "duet: error: --batch 100 is not a multiple of --data-parallel 2 x --micro-batches 3 = 6 (the replicas' micro-batches split each global batch)" \
    "$DUET" run $M --data-parallel 2 --micro-batches 3 --batch 100
  expect zero "duet: error: --data-parallel expects an integer from 1 to 64 (replicas), got '0'" "$DUET" run $M --data-parallel 0
  expect not_number "duet: error: --data-parallel expects an integer from 1 to 64 (replicas), got 'two'" \
    "$DUET" plan $M --data-parallel two
  expect bucket_zero "duet: error: --bucket-mb expects a number of MiB > 0 (and at most 1e9), got '0'" \
    "$DUET" run $M --data-parallel 2 --bucket-mb 0
  expect bucket_negative "duet: error: --bucket-mb expects a number of MiB > 0 (and at most 1e9), got '-1'" \
    "$DUET" ir $M --data-parallel 2 --bucket-mb -1
  expect kinds "duet: error: --data-parallel 2: replica 1's stage 0 is on cuda:0, replica 0's on cpu:0; every replica needs devices of the same kinds, stage by stage" \
    "$DUET" run $M --devices cpu:0,cuda:0 --data-parallel 2
  expect kinds_plan "duet: error: --data-parallel 2: replica 1's stage 0 is on 8GiB:sm_60, replica 0's on 16GiB:sm_60; every replica needs devices of the same kinds, stage by stage" \
    "$DUET" plan $M --devices 16GiB:sm_60,8GiB:sm_60 --data-parallel 2
  # the collective: DUET_DP_COLLECTIVE checked before compiling
  DUET_DP_COLLECTIVE=ring expect collective_value "duet: error: DUET_DP_COLLECTIVE must be auto, shm or nccl, got 'ring'" \
    "$DUET" run $M --data-parallel 2
  # ... and always, also without replicas (and in a compiled executable)
  DUET_DP_COLLECTIVE=bogus expect collective_value_one "duet: error: DUET_DP_COLLECTIVE must be auto, shm or nccl, got 'bogus'" \
    "$DUET" run $M --steps 1
  # --threads counts the threads of all workers (replicas x stages), at least one each: fewer is said
  if "$DUET" run $M --data-parallel 2 --threads 1 --steps 1 --train-subset 512 --no-eval > "$d/th.out" 2>&1 &&
    grep -qx 'duet: precision fp32, devices cpu:0..cpu:1 (1 thread per CPU device: 2 in all, as every worker runs on a thread of its own; --threads 1 is fewer than the 2 workers), lr schedule constant, pipeline schedule gpipe' "$d/th.out" &&
    "$DUET" run $M --data-parallel 2 --threads 2 --steps 1 --train-subset 512 --no-eval > "$d/th2.out" 2>&1 &&
    grep -qx 'duet: precision fp32, devices cpu:0..cpu:1 (1 thread per CPU device), lr schedule constant, pipeline schedule gpipe' "$d/th2.out"
  then ok threads_below_workers_said; else bad threads_below_workers_said; grep '^duet: precision\|error' "$d/th.out" "$d/th2.out"; fi
  DUET_DP_COLLECTIVE=nccl expect collective_nccl_cpu "duet: error: DUET_DP_COLLECTIVE=nccl: replica 0's stage 0 is on cpu:0, and NCCL connects GPUs" \
    "$DUET" run $M --devices cpu:0,cpu:1 --data-parallel 2
  DUET_DP_COLLECTIVE=nccl expect collective_nccl_default "duet: error: DUET_DP_COLLECTIVE=nccl: replica 0's stage 0 is on cpu:0, and NCCL connects GPUs" \
    "$DUET" run $M --data-parallel 2
  "$DUET" ir $M --data-parallel 2 --after shape > "$d/dp.ir"
  expect dump_replicas "$d/dp.ir: error: the dump was built for 2 data-parallel replicas; --data-parallel 3 needs the .model (an IR dump's batch is split among its replicas)" \
    "$DUET" ir "$d/dp.ir" --data-parallel 3
  # a dump after data_parallel fixes its buckets: it records --bucket-mb, reports it, refuses another
  "$DUET" ir $M --data-parallel 2 --bucket-mb 1 --after data_parallel > "$d/dpb.ir"
  grep -qx 'bucket_mb 1' "$d/dpb.ir" && ok "dump records bucket_mb" || bad "dump records bucket_mb"
  expect dump_bucket_run "$d/dpb.ir:2:7: error: the dump was printed after \`data_parallel\`, so its all-reduce buckets are fixed (made for --bucket-mb 1); --bucket-mb 5 needs the .model or a dump from before \`data_parallel\`" \
    "$DUET" run "$d/dpb.ir" --bucket-mb 5 --steps 1
  expect dump_bucket_compile "$d/dpb.ir:2:7: error: the dump was printed after \`data_parallel\`, so its all-reduce buckets are fixed (made for --bucket-mb 1); --bucket-mb 5 needs the .model or a dump from before \`data_parallel\`" \
    "$DUET" compile "$d/dpb.ir" --bucket-mb 5 -o "$d/dpb_exe"
  if "$DUET" compile "$d/dpb.ir" -o "$d/dpb_exe" > /dev/null 2>&1; then
    expect dump_bucket_exe "duet: error: --bucket-mb is fixed at compile time: 1 (this program was compiled with it; to change it, compile again: duet compile M.model --bucket-mb 5; duet run takes it directly)" \
      "$d/dpb_exe" --bucket-mb 5 --steps 1
  else bad "duet compile of a data-parallel dump"; fi
  "$DUET" ir $M --data-parallel 2 --after data_parallel > "$d/dpd.ir"
  expect dump_bucket_default "$d/dpd.ir:2:7: error: the dump was printed after \`data_parallel\`, so its all-reduce buckets are fixed (made for --bucket-mb 25); --bucket-mb 1 needs the .model or a dump from before \`data_parallel\`" \
    "$DUET" run "$d/dpd.ir" --bucket-mb 1 --steps 1
  # the pass: buckets as ordinary ops, on both stages of a pipeline
  "$DUET" ir $M --after data_parallel --data-parallel 2 --bucket-mb 1 --devices cpu:0,cpu:1,cpu:2,cpu:3 > "$d/pipe.ir"
  grep -Eq '^allreduce\[bucket=0,bytes=[0-9]+\] .* : void  @backward  @device\(1\)$' "$d/pipe.ir" &&
    grep -Eq '^allreduce\[bucket=[0-9]+,bytes=[0-9]+\] .* : void  @backward  @device\(0\)$' "$d/pipe.ir" &&
    grep -q '^replicas 2$' "$d/pipe.ir" && grep -q '^stages 2$' "$d/pipe.ir" && ok "buckets on both stages" ||
    { bad "2 replicas of 2 stages: buckets"; grep -E '^(allreduce|replicas|stages)' "$d/pipe.ir"; }
  # with one replica the pass does nothing
  "$DUET" ir $M --after partition > "$d/one_p.ir"
  "$DUET" ir $M --after data_parallel | sed 's/^after data_parallel$/after partition/' | cmp -s - "$d/one_p.ir" &&
    ok "one replica: no change" || bad "data_parallel changed a graph of one replica"
  if command -v dot > /dev/null 2>&1; then
    "$DUET" ir $M --after memplan --data-parallel 2 --bucket-mb 1 --format dot > "$d/g.dot" &&
      grep -q 'allreduce\\nbucket 3, 3211264 bytes' "$d/g.dot" && dot -Tsvg "$d/g.dot" > "$d/g.svg" && ok "dot" ||
      bad "dot of the buckets"
  else skip "graphviz is not installed: the dot check"; fi
  "$DUET" ir $M --after memplan --data-parallel 2 --bucket-mb 1 --format json > "$d/g.json"
  if command -v python3 > /dev/null 2>&1; then
    python3 - "$d/g.json" <<'PY' && ok "json" || bad "json of the buckets"
import json, sys
g = json.load(open(sys.argv[1]))
b = [v for v in g["values"] if v["op"] == "allreduce"]
assert g["replicas"] == 2 and len(b) == 4, (g["replicas"], len(b))
assert [v["attrs"]["bucket"] for v in b] == [0, 1, 2, 3] and b[3]["attrs"]["bytes"] == 3211264
assert all(v["role"] == "backward" and v["dtype"] == "void" for v in b)
PY
  else skip "python3 is not installed: the json check"; fi
  # duet plan
  "$DUET" plan $M --data-parallel 2 --threads 2 > "$d/plan_cpu" 2>&1 || { bad "plan cpu"; cat "$d/plan_cpu"; }
  grep -q '^plan: fmnist_mlp, 2 replicas on 1 device each, 1 micro-batch of 128 per replica (global batch 256)' "$d/plan_cpu" &&
    grep -Eq '^  stage 0 on cpu:0: 1 bucket, 7\.11 MiB of gradients; ring all-reduce 2\(N-1\)/N x 7\.11 MiB = 7\.11 MiB per replica at 5\.0 GB/s \(virtual CPU devices' "$d/plan_cpu" &&
    grep -q '^estimated step time with data parallelism: ' "$d/plan_cpu" && ok "plan cpu" ||
    { bad "plan cpu"; cat "$d/plan_cpu"; }
  "$DUET" plan models/gpt_kjv.model --devices 2x16GiB:sm_60 --data-parallel 2 > "$d/plan_gpu" 2>&1 || { bad "plan sm_60"; cat "$d/plan_gpu"; }
  grep -Eq '^  stage 0 on 16GiB:sm_60: [0-9]+ buckets?, [0-9.]+ MiB of gradients; ring all-reduce 2\(N-1\)/N x [0-9.]+ MiB = [0-9.]+ MiB per replica at 14\.0 GB/s \(PCIe 3\.0 x16' "$d/plan_gpu" &&
    grep -Eq '[0-9.]+ ms of it hidden behind the backward pass' "$d/plan_gpu" && ok "plan sm_60" ||
    { bad "plan sm_60"; cat "$d/plan_gpu"; }
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
echo "$pass passed, $fail failed, $skipped parts skipped"
[ "$fail" -eq 0 ] || exit 1
if [ "$skipped" -gt 0 ]; then echo "parts were skipped (above): exit 77"; exit 77; fi
