#!/bin/sh
# tests/run_pipeline.sh: model parallelism (the partition pass, micro-batches,
# the GPipe and 1F1B pipelines on virtual CPU devices).
#   1. equality: every pipelined run writes the same losses (metrics file,
#      compared as text: the printed doubles are equal) and a byte-identical
#      checkpoint (params, optimizer state) as the one-device run with the
#      same micro-batches (the reference); both run one thread per device, so
#      every kernel sums in the same order and bit-identity is expected.
#      Cases: fmnist_mlp (3 layers on 2 devices: uneven), gpt_tiny (residuals
#      and the tied embedding cross the cut) on 2 and 3 devices, M = 1, M < S,
#      both schedules, a skip connection over two cuts (residual.model), a
#      pinned block (pinned.model), a gradient part summed once per step on
#      a later stage than the forward value it reads (tied_part.model), a
#      repeated device (cpu:0,cpu:0: two
#      virtual devices); M = 1 on 3 devices also equals the plain
#      program without micro-batches; transfers take the direct path
#      (staging on the receiving device, copy_peer) by default and host
#      staging under DUET_PIPE_STAGING=host, and both equal the reference;
#   1b. the transfer path chosen per pair of stages is reported after the
#      pipeline line (and nothing when no tensor crosses a stage);
#   2. `duet ir --after partition`: transfers of the skip connection and of
#      its gradient, the pinned block's device; partitioned dumps read back
#      (print(parse(print))) and train to the same checkpoint;
#   3. exact diagnostics: a pin to a missing device, pins against the stage
#      order, a bad --devices item, a CUDA device without the CUDA backend,
#      a batch that micro-batches do not divide, a transfer that never comes
#      (DUET_PIPE_DROP_SEND + DUET_PIPE_TIMEOUT: the timeout names stage,
#      micro-batch and tensor; on both transfer paths), a bad
#      DUET_PIPE_STAGING, a plan that does not fit, a bad DUET_CPU_GFLOPS;
#   (also: a `duet compile` executable and a resumed run equal the others)
#   4. `duet plan`: bubble fraction and the stage lines; without --devices
#      the same estimates as with --devices cpu.
# usage: run_pipeline.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_pipeline.sh path/to/duet}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-pipe.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
# a part left out for missing data: the run ends with exit 77 (ctest: skipped)
skipped=0
skip() { echo "skip: $*"; skipped=$((skipped + 1)); }
FM=/usr/share/datasets/fashion-mnist
MLP="models/fmnist_mlp.model --train-subset 512 --test-subset 300 --steps 3 --batch 64"
GPT="tests/models/gpt_tiny.model --steps 3 --batch 8 --eval-batches 2"

# run NAME THREADS ARGS...: trains, keeps metrics and the checkpoint
run() {
  n=$1 th=$2
  shift 2
  if ! "$DUET" run "$@" --threads "$th" --quiet --metrics "$d/$n.jsonl" --save "$d/$n.st" > "$d/$n.out" 2>&1; then
    bad "$n: duet run $*"
    cat "$d/$n.out"
  fi
}
# same REF NAME: identical losses and checkpoint
same() {
  if [ -s "$d/$1.st" ] && cmp -s "$d/$1.st" "$d/$2.st" && cmp -s "$d/$1.jsonl" "$d/$2.jsonl"; then ok
  else bad "$2 differs from $1"; diff "$d/$1.jsonl" "$d/$2.jsonl" | head -6; fi
}

if [ -r "$FM/train-images-idx3-ubyte.gz" ]; then
  run mlp_ref 1 $MLP --micro-batches 4
  run mlp_gpipe 2 $MLP --micro-batches 4 --devices cpu:0,cpu:1
  run mlp_1f1b 2 $MLP --micro-batches 4 --devices cpu:0,cpu:1 --schedule 1f1b
  same mlp_ref mlp_gpipe
  same mlp_ref mlp_1f1b
  # gradient clipping (the norm over both stages' gradients, combined before
  # either updates; steps 2 and 3 clip at 5, 1 does not) and a schedule: the
  # two-stage run is the one-device run, norms and rates included
  C="--log-every 1 --clip-grad-norm 5 --lr-schedule cosine --warmup 1"
  run clip_ref 1 $MLP --micro-batches 4 $C
  run clip_2 2 $MLP --micro-batches 4 --devices cpu:0,cpu:1 $C
  same clip_ref clip_2
  grep -q '^{"step":2,"loss":[0-9.e-]*,"lr":0.001,"grad_norm":[1-9][0-9]*\.' "$d/clip_2.jsonl" && ok ||
    { bad "clip_2: no lr and grad_norm above the limit in the metrics of step 2"; cat "$d/clip_2.jsonl"; }
  grep -q test_accuracy "$d/mlp_gpipe.jsonl" && ok || bad "mlp_gpipe: no evaluation in the metrics"
  run res_ref 1 tests/pipeline/residual.model --micro-batches 2 --no-eval
  run res_3 3 tests/pipeline/residual.model --micro-batches 2 --no-eval --devices cpu:0,cpu:1,cpu:2
  run res_3_1f1b 3 tests/pipeline/residual.model --micro-batches 2 --no-eval --devices cpu:0,cpu:1,cpu:2 --schedule 1f1b
  same res_ref res_3
  same res_ref res_3_1f1b
  # a gradient part that reads only stage 0's forward value, summed once per step on stage 1 (tie_grads)
  run tie_ref 1 tests/pipeline/tied_part.model --micro-batches 2 --no-eval
  run tie_2 2 tests/pipeline/tied_part.model --micro-batches 2 --no-eval --devices cpu:0,cpu:1
  run tie_2_1f1b 2 tests/pipeline/tied_part.model --micro-batches 2 --no-eval --devices cpu:0,cpu:1 --schedule 1f1b
  same tie_ref tie_2
  same tie_ref tie_2_1f1b
  run pin_ref 1 tests/pipeline/pinned.model --micro-batches 2 --no-eval
  run pin_2 2 tests/pipeline/pinned.model --micro-batches 2 --no-eval --devices cpu:0,cpu:1
  same pin_ref pin_2
  # a repeated item is another virtual CPU device (the N of cpu:N is a name)
  run pin_dup 2 tests/pipeline/pinned.model --micro-batches 2 --no-eval --devices cpu:0,cpu:0
  run pin_dup2 2 tests/pipeline/pinned.model --micro-batches 2 --no-eval --devices cpu,cpu
  same pin_ref pin_dup
  same pin_ref pin_dup2
  # the fallback: every transfer staged through host memory
  DUET_PIPE_STAGING=host
  export DUET_PIPE_STAGING
  run mlp_gpipe_host 2 $MLP --micro-batches 4 --devices cpu:0,cpu:1
  run res_3_1f1b_host 3 tests/pipeline/residual.model --micro-batches 2 --no-eval --devices cpu:0,cpu:1,cpu:2 --schedule 1f1b
  unset DUET_PIPE_STAGING
  same mlp_ref mlp_gpipe_host
  # gradients summed on the host instead of by the device's accumulate op: the same bits
  DUET_PIPE_SUMS=host
  export DUET_PIPE_SUMS
  run mlp_gpipe_hostsums 2 $MLP --micro-batches 4 --devices cpu:0,cpu:1
  unset DUET_PIPE_SUMS
  same mlp_ref mlp_gpipe_hostsums
  same res_ref res_3_1f1b_host
  # 1b. the path of every pair of stages, after the pipeline line
  # path NAME "expected transfers line ('' : none)" ARGS...: one step, not quiet
  path() {
    n=$1 want=$2
    shift 2
    if "$DUET" run tests/pipeline/pinned.model --steps 1 --no-eval --threads 2 "$@" > "$d/$n.out" 2>&1; then
      got=$(grep '^duet: pipeline transfers: ' "$d/$n.out")
      if [ "$got" = "$want" ] && grep -q '^duet: pipeline: ' "$d/$n.out"; then ok
      else bad "$n: transfers line"; echo "  got:  $got"; echo "  want: $want"; fi
    else bad "$n: duet run $*"; cat "$d/$n.out"; fi
  }
  path path_cpu "duet: pipeline transfers: stage 0 -> 1 copied between arenas (CPU), stage 1 -> 0 copied between arenas (CPU)" \
    --micro-batches 2 --devices cpu:0,cpu:1
  DUET_PIPE_STAGING=auto
  export DUET_PIPE_STAGING
  path path_3 "duet: pipeline transfers: stage 0 -> 1 copied between arenas (CPU), stage 1 -> 0 copied between arenas (CPU), stage 1 -> 2 copied between arenas (CPU), stage 2 -> 1 copied between arenas (CPU)" \
    --micro-batches 2 --devices cpu:0,cpu:1,cpu:2
  DUET_PIPE_STAGING=host
  path path_host "duet: pipeline transfers: stage 0 -> 1 staged through host memory, stage 1 -> 0 staged through host memory (forced by DUET_PIPE_STAGING=host)" \
    --micro-batches 2 --devices cpu:0,cpu:1
  unset DUET_PIPE_STAGING
  path path_one "" --micro-batches 2
else
  skip "fashion-mnist not installed ($FM): its equality and transfer-path checks"
fi

if [ -r data/kjv.txt ]; then
  run gpt_ref2 1 $GPT --micro-batches 2
  run gpt_2 2 $GPT --micro-batches 2 --devices cpu:0,cpu:1
  run gpt_3_1f1b 3 $GPT --micro-batches 2 --devices cpu:0,cpu:1,cpu:2 --schedule 1f1b
  same gpt_ref2 gpt_2
  same gpt_ref2 gpt_3_1f1b
  # host staging for the tied embedding, skip transfers over two cuts, evaluation
  DUET_PIPE_STAGING=host
  export DUET_PIPE_STAGING
  run gpt_3_host 3 $GPT --micro-batches 2 --devices cpu:0,cpu:1,cpu:2
  unset DUET_PIPE_STAGING
  same gpt_ref2 gpt_3_host
  run gpt_plain 1 $GPT
  run gpt_3_m1 3 $GPT --micro-batches 1 --devices cpu:0,cpu:1,cpu:2
  same gpt_plain gpt_3_m1
  # a compiled executable runs the pipeline (default devices cpu:0,cpu:1) as
  # the executable of one device does (executables are compared with each
  # other: sanitizer builds compile JIT and executable kernels differently)
  if "$DUET" compile tests/models/gpt_tiny.model -o "$d/exe" --batch 8 --devices cpu:0,cpu:1 --micro-batches 2 \
      > "$d/out" 2>&1 &&
    "$DUET" compile tests/models/gpt_tiny.model -o "$d/exe1" --batch 8 --micro-batches 2 > "$d/out" 2>&1 &&
    "$d/exe" --steps 3 --eval-batches 2 --threads 2 --schedule 1f1b --quiet --metrics "$d/gpt_exe.jsonl" \
      --save "$d/gpt_exe.st" > "$d/out" 2>&1 &&
    "$d/exe1" --steps 3 --eval-batches 2 --threads 1 --quiet --metrics "$d/gpt_exe1.jsonl" \
      --save "$d/gpt_exe1.st" > "$d/out" 2>&1; then same gpt_exe1 gpt_exe
  else bad "compiled pipelined executable"; cat "$d/out"; fi
  # resume a pipelined run from its checkpoint: the same final checkpoint
  P2="tests/models/gpt_tiny.model --batch 8 --eval-batches 2 --micro-batches 2 --devices cpu:0,cpu:1 --schedule 1f1b"
  run gpt_4 2 $P2 --steps 4
  run gpt_first2 2 $P2 --steps 2
  if "$DUET" run $P2 --steps 4 --threads 2 --quiet --resume "$d/gpt_first2.st" --save "$d/gpt_resumed.st" > "$d/out" 2>&1 &&
    cmp -s "$d/gpt_4.st" "$d/gpt_resumed.st"; then ok; else bad "pipelined resume differs"; cat "$d/out"; fi
  # a dump after partition (and after memplan) reads back and trains the same
  for p in partition memplan; do
    "$DUET" ir tests/models/gpt_tiny.model --batch 8 --micro-batches 2 --devices cpu:0,cpu:1 --after $p > "$d/g.$p.ir" &&
      "$DUET" ir "$d/g.$p.ir" --micro-batches 2 --devices cpu:0,cpu:1 > "$d/again.ir" 2> "$d/err" &&
      cmp -s "$d/g.$p.ir" "$d/again.ir" && ok || { bad "gpt_tiny after $p: print(parse(print(g))) differs"; cat "$d/err"; }
  done
  run gpt_dump 2 "$d/g.partition.ir" --steps 3 --eval-batches 2 --micro-batches 2 --devices cpu:0,cpu:1
  same gpt_ref2 gpt_dump
  grep -q '^regions device 1 ' "$d/g.memplan.ir" && grep -q '^stages 2$' "$d/g.memplan.ir" && ok ||
    bad "memplan dump: no per-device regions"
else
  skip "data/kjv.txt missing (make data): the gpt_tiny equality and dump checks"
fi

# --- the partition as printed
"$DUET" ir tests/pipeline/residual.model --after partition --devices cpu:0,cpu:1,cpu:2 > "$d/res.ir"
grep -Eq '^%[0-9]+ = transfer %5 : f32\[32,64\]  @device\(2\)$' "$d/res.ir" && ok || bad "residual: no forward transfer 0 -> 2"
grep -Eq '^%[0-9]+ = transfer %[0-9]+ : f32\[32,64\]  @backward  @device\(0\)$' "$d/res.ir" && ok ||
  bad "residual: no gradient transfer back to device 0"
# gpt_tiny on 2 devices: the tied embedding goes forward as a param and its
# partial gradient comes back; the cut falls inside a layer, so the residual
# stream and the branch both cross it (two activations forward, their
# gradients back)
"$DUET" ir tests/models/gpt_tiny.model --after partition --devices cpu:0,cpu:1 > "$d/gpt.ir"
grep -Eq '^%[0-9]+ = transfer %2 : f32\[256,32\]  @device\(1\)$' "$d/gpt.ir" && grep -q '^%2 = param "wte"' "$d/gpt.ir" &&
  grep -Eq '^%[0-9]+ = transfer %[0-9]+ : f32\[256,32\]  @backward  @device\(0\)$' "$d/gpt.ir" && ok ||
  bad "gpt_tiny: tied embedding transfers"
[ "$(grep -Ec '^%[0-9]+ = transfer %[0-9]+ : f32\[4,16,32\]  @device\(1\)$' "$d/gpt.ir")" -ge 2 ] && ok ||
  bad "gpt_tiny: residual stream and branch should both cross the cut"
"$DUET" ir tests/pipeline/pinned.model --after partition --devices cpu:0,cpu:1 > "$d/pin.ir"
grep -Eq '^%[0-9]+ = matmul %[0-9]+, %[0-9]+ : f32\[32,16\]  (@block\([0-9]+\)  )?@device\(1\)$' "$d/pin.ir" && ok || bad "pinned block not on device 1"
grep -Eq '^%[0-9]+ = matmul %0, %2 : f32\[32,128\]  (@block\([0-9]+\)  )?@device\(0\)$' "$d/pin.ir" && ok || bad "first block not on device 0"

# --- exact diagnostics: expect NAME CODE "first line of stderr" CMD...
expect() {
  name=$1 code=$2 want=$3
  shift 3
  "$@" > "$d/out" 2> "$d/err"
  rc=$?
  got=$(grep -v '^ ' "$d/err" | head -1)
  if [ "$rc" = "$code" ] && [ "$got" = "$want" ]; then ok
  else bad "$name: exit $rc (want $code)"; echo "  got:  $got"; echo "  want: $want"; fi
}
expect bad_pin 1 "tests/pipeline/bad_pin.model:14:5: error: block \`linear2\` is pinned to device 2 (@device(2)), but --devices gives only 2 devices" \
  "$DUET" ir tests/pipeline/bad_pin.model --after partition --devices cpu:0,cpu:1
expect bad_order 1 "tests/pipeline/bad_order.model:14:5: error: block \`linear2\` is pinned to device 0 but comes after block \`linear1\` on device 1: stages run in order, so pinned blocks must follow the device order" \
  "$DUET" ir tests/pipeline/bad_order.model --after partition --devices cpu:0,cpu:1
expect pin_empties_stage 1 "tests/pipeline/pinned.model:15:5: error: block \`linear2\` is pinned to device 1, but the 5 ops after it cannot fill devices 2..7 (every stage needs at least one op)" \
  "$DUET" ir tests/pipeline/pinned.model --after partition --devices cpu:0,cpu:1,cpu:2,cpu:3,cpu:4,cpu:5,cpu:6,cpu:7
expect unknown_sm 1 "duet: error: device 16GiB:sm_52: no rates known for sm_52 (known: sm_60, 61, 70, 75, 80, 86, 89, 90)" \
  "$DUET" plan models/fmnist_mlp.model --devices 2x16GiB:sm_52
# DUET_CPU_GFLOPS (the partition's CPU rate): a bad value is an error, not the default
for v in abc -1 0 1e999 ""; do
  DUET_CPU_GFLOPS=$v expect "cpu_gflops_'$v'" 1 "duet: error: DUET_CPU_GFLOPS must be a number of GFLOP/s per core > 0, got '$v'" \
    "$DUET" plan models/fmnist_mlp.model --devices cpu:0,cpu:1
done
DUET_PIPE_SUMS=gpu expect bad_pipe_sums 1 "duet: error: DUET_PIPE_SUMS must be auto or host, got 'gpu'" \
  "$DUET" run tests/pipeline/pinned.model --devices cpu:0,cpu:1 --micro-batches 2 --quiet --no-eval
expect plan_threads 1 "duet: error: --threads expects an integer from 1 to 1024, got 'abc'" \
  "$DUET" plan models/fmnist_mlp.model --devices cpu:0,cpu:1 --threads abc
# DUET_PIPE_TIMEOUT: a number of seconds > 0 and at most 1e6, checked before the kernels are compiled
# (inf made an invalid deadline that hung the pipeline, 1e19 one that had passed already)
for v in "" inf nan 1e19 1000001 -1 0 abc; do
  DUET_PIPE_TIMEOUT=$v expect "pipe_timeout_'$v'" 1 "duet: error: DUET_PIPE_TIMEOUT must be a number of seconds > 0 and at most 1000000 (11.6 days), got '$v'" \
    timeout 60 "$DUET" run tests/pipeline/pinned.model --devices cpu:0,cpu:1 --micro-batches 2 --no-eval
  grep -q '^duet: kernels' "$d/out" && bad "pipe_timeout_'$v': checked only after compiling"
done
if [ -r "$FM/train-images-idx3-ubyte.gz" ]; then
  # the largest timeout works: a run that waits on transfers does not time out at once
  DUET_PIPE_TIMEOUT=1000000 expect pipe_timeout_max 0 "" timeout 120 "$DUET" run tests/pipeline/pinned.model \
    --devices cpu:0,cpu:1 --micro-batches 2 --steps 2 --train-subset 64 --quiet --no-eval
  # with a dropped transfer, the other waits get 100x the timeout: still a valid deadline
  DUET_PIPE_DROP_SEND=0:1 DUET_PIPE_TIMEOUT=0.5 expect pipe_timeout_drop_short 1 \
    "duet: error: stage 1 timed out after 0.5 s waiting for micro-batch 1 of tensor %4 (transfer 0 from stage 0); raise DUET_PIPE_TIMEOUT if a stage is legitimately this slow" \
    timeout 60 "$DUET" run tests/pipeline/pinned.model --micro-batches 2 --devices cpu:0,cpu:1 --quiet --no-eval
fi
if DUET_HOST_MEMORY=8GiB DUET_CPU_GFLOPS=50 "$DUET" plan models/fmnist_mlp.model --devices cpu:0,cpu:1 --threads 2 > "$d/plan50" 2>&1 &&
  DUET_HOST_MEMORY=8GiB "$DUET" plan models/fmnist_mlp.model --devices cpu:0,cpu:1 --threads 2 > "$d/plan100" 2>&1 &&
  ! cmp -s "$d/plan50" "$d/plan100"; then ok; else bad "DUET_CPU_GFLOPS=50 should change the plan"; cat "$d/plan50"; fi
expect bad_size 1 "duet: error: --devices: bad item '2x16XB:sm_60' (expected cpu, cpu:N, cuda, cuda:N, or a capacity such as 16GiB:sm_60 or 2x16GiB:sm_60)" \
  "$DUET" plan models/fmnist_mlp.model --devices 2x16XB:sm_60
if "$DUET" plan models/fmnist_mlp.model --devices 16GiB:sm_60,1.5GB:sm_61 > "$d/plan" 2>&1 &&
  grep -q '^stage 0 on 16GiB:sm_60: ' "$d/plan" && grep -q '^stage 1 on 1.5GB:sm_61: ' "$d/plan" &&
  grep -q ' of 1.40 GiB$' "$d/plan"; then ok; else bad "plan: two different capacities"; cat "$d/plan"; fi
expect bad_device 1 "duet: error: --devices: bad item 'gpu:1' (expected cpu, cpu:N, cuda, cuda:N, or a capacity such as 16GiB:sm_60 or 2x16GiB:sm_60)" \
  "$DUET" run tests/pipeline/pinned.model --devices cpu:0,gpu:1
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  expect no_cuda 1 "duet: error: no CUDA driver on this machine (libcuda.so.1: cannot open shared object file: No such file or directory)" \
    "$DUET" run tests/pipeline/pinned.model --devices cpu:0,cuda:1 --quiet
fi
expect compile_capacity 1 "duet: error: device 16GiB:sm_60 is a capacity for \`duet plan\`, not a device to run on (use cpu:N or cuda:N)" \
  "$DUET" compile models/fmnist_mlp.model -o "$d/cap" --devices 2x16GiB:sm_60
expect compile_schedule 1 "duet: error: --schedule expects gpipe or 1f1b, got 'bogus'" \
  "$DUET" compile models/fmnist_mlp.model -o "$d/sch" --devices cpu:0,cpu:1 --schedule bogus
# a partitioned dump without --devices keeps its own partition (check, emit, run)
"$DUET" ir tests/pipeline/pinned.model --after partition --devices cpu:0,cpu:1 > "$d/pin.ir" &&
  "$DUET" check "$d/pin.ir" | tail -1 | grep -qx "$d/pin.ir: ok, 106010 parameters, 424040 bytes (414.1 KiB) of f32 weights" &&
  "$DUET" emit "$d/pin.ir" --target c > /dev/null && ok || bad "check/emit of a partitioned dump"
# an indivisible batch: the message points at where the batch was set
expect indivisible 1 "tests/pipeline/pinned.model:22:11: error: batch 32 is not a multiple of --micro-batches 3" \
  "$DUET" ir tests/pipeline/pinned.model --micro-batches 3
expect indivisible_flag 1 "duet: error: --batch 30 is not a multiple of --micro-batches 4" \
  "$DUET" ir tests/pipeline/pinned.model --micro-batches 4 --batch 30
printf 'model nobatch\ninput x: f32[batch, 8]\nparam w: [8, 8]\nloss = mean(x @ w)\n' > "$d/nobatch.model"
expect indivisible_default 1 "$d/nobatch.model: error: the default batch 32 is not a multiple of --micro-batches 5 (no \`batch = N\` in the train section: set one, or use --batch)" \
  "$DUET" ir "$d/nobatch.model" --micro-batches 5
expect too_few_ops 1 "duet: error: the model has 9 forward ops, fewer than the 10 devices: no stage may be empty" \
  "$DUET" ir tests/pipeline/pinned.model --after partition --devices cpu:0,cpu:1,cpu:2,cpu:3,cpu:4,cpu:5,cpu:6,cpu:7,cpu:8,cpu:9
if [ -r "$FM/train-images-idx3-ubyte.gz" ]; then
  DUET_PIPE_DROP_SEND=0:1 DUET_PIPE_TIMEOUT=0.3 expect timeout 1 \
    "duet: error: stage 1 timed out after 0.3 s waiting for micro-batch 1 of tensor %4 (transfer 0 from stage 0); raise DUET_PIPE_TIMEOUT if a stage is legitimately this slow" \
    "$DUET" run tests/pipeline/pinned.model --micro-batches 2 --devices cpu:0,cpu:1 --quiet --no-eval
  DUET_PIPE_STAGING=host DUET_PIPE_DROP_SEND=0:1 DUET_PIPE_TIMEOUT=0.3 expect timeout_host 1 \
    "duet: error: stage 1 timed out after 0.3 s waiting for micro-batch 1 of tensor %4 (transfer 0 from stage 0); raise DUET_PIPE_TIMEOUT if a stage is legitimately this slow" \
    "$DUET" run tests/pipeline/pinned.model --micro-batches 2 --devices cpu:0,cpu:1 --quiet --no-eval
  DUET_PIPE_STAGING=peer expect bad_staging 1 "duet: error: DUET_PIPE_STAGING must be auto or host, got 'peer'" \
    "$DUET" run tests/pipeline/pinned.model --micro-batches 2 --devices cpu:0,cpu:1 --quiet --no-eval
else
  skip "fashion-mnist not installed ($FM): the transfer timeout and DUET_PIPE_STAGING checks"
fi
# virtual CPU devices share the host memory available (DUET_HOST_MEMORY here; else MemAvailable or a cgroup limit)
DUET_HOST_MEMORY=20MiB expect no_fit_cpu 1 "duet: error: the model does not fit the devices: its params with gradients and optimizer state take 28.44 MiB and its activations 4.02 MiB per micro-batch in flight (gpipe: M), against 20.00 MiB on 2 devices (DUET_HOST_MEMORY, shared by 2 CPU devices); no split into 2 stages keeps every stage within its memory" \
  "$DUET" run models/fmnist_mlp.model --devices cpu:0,cpu:1 --steps 1
grep -q '^duet: kernels' "$d/out" && bad "no_fit_cpu: checked only after compiling"
if DUET_HOST_MEMORY=1GiB "$DUET" plan models/fmnist_mlp.model --devices cpu:0,cpu:1 > "$d/plan" 2>&1 &&
  [ "$(grep -c ' of 512.00 MiB (DUET_HOST_MEMORY, shared by 2 CPU devices)$' "$d/plan")" = 2 ]; then ok
else bad "plan: two CPU devices should share DUET_HOST_MEMORY"; cat "$d/plan"; fi
expect no_fit 1 "duet: error: the model does not fit the devices: its params with gradients and optimizer state take 28.44 MiB and its activations 4.02 MiB per micro-batch in flight (gpipe: M), against 8.00 MiB on 2 devices; no split into 2 stages keeps every stage within its memory" \
  "$DUET" plan models/fmnist_mlp.model --devices 2x4MiB:sm_60
# gpipe keeps 16 micro-batches of activations per stage, 1f1b at most 2
expect no_fit_gpipe 1 "duet: error: the model does not fit the devices: its params with gradients and optimizer state take 0.52 MiB and its activations 2.06 MiB per micro-batch in flight (gpipe: M), against 6.00 MiB on 2 devices; no split into 2 stages keeps every stage within its memory" \
  "$DUET" plan tests/models/gpt_tiny.model --devices 2x3MiB:sm_60 --micro-batches 4 --batch 64
# the cost model's estimate passes, the planned memory does not
expect no_fit_planned 1 "duet: error: the model does not fit: a device needs more memory than it has (DOES NOT FIT above)" \
  "$DUET" plan models/gpt_kjv.model --devices 2x150MiB:sm_60 --micro-batches 16
if "$DUET" plan tests/models/gpt_tiny.model --devices 2x3MiB:sm_60 --micro-batches 4 --batch 64 --schedule 1f1b \
    > "$d/plan" 2> "$d/err" && ! grep -q 'DOES NOT FIT' "$d/plan"; then ok
else bad "plan: 1f1b should fit where gpipe does not"; cat "$d/plan" "$d/err"; fi

# --- duet plan
if "$DUET" plan tests/models/gpt_tiny.model --devices 3x16GiB:sm_60 --micro-batches 1 > "$d/plan" 2> "$d/err"; then
  grep -qx 'bubble fraction (S-1)/(M+S-1) = 2/3 = 0.667 (fewer micro-batches than stages: a large bubble)' "$d/plan" && ok ||
    { bad "plan: bubble line"; cat "$d/plan"; }
  [ "$(grep -c '^stage [0-2] on 16GiB:sm_60: ' "$d/plan")" = 3 ] && ok || bad "plan: three stage lines"
  grep -q '^  memory: weights .* MiB, grads .* MiB (summed over the micro-batches), optimizer state .* MiB, activations .* of 16.00 GiB$' "$d/plan" && ok ||
    bad "plan: memory line"
else
  bad "duet plan gpt_tiny"; cat "$d/err"
fi
if "$DUET" plan models/fmnist_mlp.model --devices cpu:0,cpu:1 --micro-batches 8 --schedule 1f1b > "$d/plan" 2> "$d/err"; then
  grep -qx 'bubble fraction (S-1)/(M+S-1) = 1/9 = 0.111' "$d/plan" && ok || bad "plan: fmnist bubble"
  grep -q '(1 micro-batch in flight x ' "$d/plan" && ok || bad "plan: 1f1b keeps one micro-batch on the last stage"
else
  bad "duet plan fmnist"; cat "$d/err"
fi

# cuda:0,cuda:0 (one GPU acting as two devices): the stages share its memory
if "$DUET" plan models/fmnist_mlp.model --devices cuda:0,cuda:0,cuda:1 > "$d/plan" 2>&1 &&
  [ "$(grep -c ' of 8.00 GiB$' "$d/plan")" = 2 ] && [ "$(grep -c ' of 16.00 GiB$' "$d/plan")" = 1 ]; then ok
else bad "plan: cuda:0,cuda:0 should share the GPU's 16 GiB"; cat "$d/plan"; fi

# without --devices, duet plan estimates for duet run's default device
# (--devices cpu: all cores, or --threads), not for one core
for th in "" "--threads 1"; do
  if DUET_HOST_MEMORY=8GiB "$DUET" plan models/fmnist_mlp.model $th > "$d/plan_default" 2>&1 &&
    DUET_HOST_MEMORY=8GiB "$DUET" plan models/fmnist_mlp.model --devices cpu $th > "$d/plan_cpu" 2>&1 &&
    cmp -s "$d/plan_default" "$d/plan_cpu"; then ok
  else bad "plan without --devices ($th) differs from --devices cpu"; diff "$d/plan_default" "$d/plan_cpu"; fi
done

echo "pipeline: $pass passed, $fail failed, $skipped parts skipped"
[ "$fail" = 0 ] || exit 1
if [ "$skipped" -gt 0 ]; then
  echo "pipeline: $skipped parts were skipped for missing data (above): reported as skipped (exit 77), not passed"
  exit 77
fi
