#!/bin/sh
# tests/run_zero.sh: ZeRO stage 1 (--zero 1: the optimizer state sharded over
# the data-parallel replicas by whole tensors; passes/data_parallel.c,
# runtime/pipeline.c, the reduce-scatter and all-gather of
# runtime/collective.c and runtime/collective_mpi.c).  The reference of
# every equality is the unsharded data-parallel run (--data-parallel 2
# without --zero), which run_data_parallel.sh and run_mpi.sh show equal to
# one device with the replicas' micro-batches: a reduce-scatter adds each
# element in replica order as the all-reduce does, each update is the same
# kernel on the same bytes, so losses, params and the gathered checkpoint
# must be the same bits.  Threads as there: --threads 2 over 2 in-process
# replicas, --threads 1 per MPI rank.  DUET_DP_CHECK=1 compares the
# replicas' params after every step (the state is sharded: each replica
# holds only its own).
# Parts (ctest runs each as its own test):
#   mlp  fmnist_mlp, 20 steps (Fashion-MNIST; else exit 77): --zero 1
#        prints the same losses and test accuracy and writes the same
#        checkpoint as without; the replicas' params bit-identical; it says
#        what each replica holds; a `duet compile --data-parallel 2 --zero 1`
#        executable the same bits, refusing --zero 0; resume: a 10-step --zero 1 checkpoint
#        continued to 20 with --zero 1, without it, and on one device with
#        --micro-batches 2 gives the 20-step checkpoint exactly, and so does
#        an unsharded 10-step checkpoint continued with --zero 1.
#   gpt  gpt_tiny (data/kjv.txt; else exit 77), 20 steps: fp32, and fp16
#        with a loss scale of 2^24 (overflows, skipped steps, halving):
#        the same losses, skipped steps and checkpoint as without --zero;
#        2 replicas of a 2-stage pipeline (cpu:0..cpu:3, buckets on both
#        stages, shards per stage) the same bits as without;
#        DUET_DP_DROP=0 (bucket 0 neither reduce-scattered nor all-gathered)
#        is caught by the replicas' check after step 1.
#   mpi  gpt_tiny under mpirun -np 2 --mca btl tcp,self (else exit 77):
#        --zero 1 gives the in-process --zero 1 run's losses and checkpoint
#        (rank 0 gathers the state by broadcasts from the ranks that hold
#        it); with 3 ranks (batch 6), the in-process unsharded run of 3
#        replicas (the MPI reduce-scatter adds in rank order as the
#        shared-memory all-reduce); 2 ranks x 2-stage pipelines the bits
#        of the in-process 2 x 2-stage --zero 1 run; a 5-step MPI --zero 1 checkpoint resumed
#        by mpirun to 10 steps equals the uninterrupted run.
#   cli  exact diagnostics (--zero 2, --zero without --data-parallel, with
#        pruning, a dump printed after data_parallel without it);
#        `duet ir --after data_parallel --zero 1` shows reduce_scatter and
#        all_gather ops and [shard=r] updates and parses back; `duet run`
#        of that dump trains the same bits; duet plan prints the optimizer
#        state per device with and without --zero 1 (fmnist_mlp: 14.22 MiB
#        without, 8.00 with: the moments of its [1024,1024] weight, 8 MiB,
#        are whole tensors of one replica; gpt_kjv: 24.86 and 12.50).
# usage: run_zero.sh path/to/duet mlp|gpt|mpi|cli   (from the repository root)
DUET=${1:?usage: run_zero.sh path/to/duet mlp|gpt|mpi|cli}
PART=${2:?usage: run_zero.sh path/to/duet mlp|gpt|mpi|cli}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-zero.XXXXXX") || exit 2
trap 'rm -rf "$d"' EXIT HUP INT TERM
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok $1"; }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
skipped=0
skip() { echo "skip: $*"; skipped=$((skipped + 1)); }
FM=/usr/share/datasets/fashion-mnist
KJV=data/kjv.txt
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self"
export OMPI_MCA_rmaps_base_oversubscribe=1
ROOT=$(pwd)
# The mpi part under AddressSanitizer (harmless otherwise), as tests/run_mpi.sh:
# Open MPI 4.1 leaks from components it has unloaded (unnameable frames), so
# the sanitizer's reports go to files, leaks do not set the exit status, and
# the part fails on any memory error and on any leak with a frame in duet's
# own sources.
if [ "$PART" = mpi ]; then
  mkdir -p "$d/asan"
  export ASAN_OPTIONS="log_path=$d/asan/report${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export LSAN_OPTIONS="exitcode=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fi
sanitizer_reports() {
  for f in "$d"/asan/report.*; do
    [ -e "$f" ] || continue
    if grep -q 'ERROR: AddressSanitizer\|runtime error:' "$f"; then bad "a sanitizer report ($f)"; head -30 "$f"; continue; fi
    if awk -v root="$ROOT/" '/^(Direct|Indirect) leak/ { keep = 0; block = $0; next }
      /^ *#[0-9]+ / { block = block "\n" $0; i = index($0, " " root)
                      if (i && substr($0, i + 1 + length(root)) ~ /^[^ ()]*\.[ch]:[0-9]/) keep = 1; next }
      /^$/ { if (keep) { print block; found = 1 } keep = 0 }
      END { exit !found }' "$f"; then bad "a leak in duet's code ($f, above)"; fi
  done
}

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
# same_st REF NAME: identical checkpoints
same_st() {
  if [ -s "$d/$1.st" ] && cmp -s "$d/$1.st" "$d/$2.st"; then ok "$2 checkpoint equals $1's"
  else bad "$2's checkpoint differs from $1's"; tail -3 "$d/$2.out"; fi
}
# checked NAME STEPS: the replicas' params were compared after every step and never differed
checked() {
  if grep -q "data-parallel check: the params (the optimizer state is sharded: each holds its own) of the 2 replicas.* were bit-identical after each of $2 training steps" "$d/$1.out"
  then ok "$1 replicas' params bit-identical"; else bad "$1: no data-parallel check line for $2 steps"; tail -3 "$d/$1.out"; fi
}
# expect NAME WANT COMMAND...: fails with exactly the message WANT (first line of stderr)
expect() {
  name=$1 want=$2
  shift 2
  if "$@" > "$d/out" 2> "$d/err"; then bad "$name: succeeded"; return; fi
  got=$(head -1 "$d/err")
  if [ "$got" = "$want" ]; then ok "$name"; else bad "$name"; echo "  got:  $got"; echo "  want: $want"; fi
}
# resume NAME FROM THREADS ARGS...: continues checkpoint FROM (a copy) to NAME.st
resume() {
  n=$1 from=$2 th=$3
  shift 3
  cp "$d/$from.st" "$d/$n.from.st"
  if ! "$DUET" run "$@" --threads "$th" --resume "$d/$n.from.st" --save "$d/$n.st" > "$d/$n.out" 2>&1; then
    bad "$n: duet run $* --resume"
    tail -3 "$d/$n.out"
  fi
}

case $PART in
mlp)
  if [ ! -r "$FM/train-images-idx3-ubyte.gz" ]; then
    skip "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): the mlp part"
  else
    MLP="models/fmnist_mlp.model --steps 20 --log-every 1 --train-subset 5120 --test-subset 1000"
    run dp 2 $MLP --data-parallel 2
    run z 2 $MLP --data-parallel 2 --zero 1
    same dp z
    checked z 20
    grep -q '^duet: ZeRO stage 1: optimizer state sharded over the 2 replicas by whole tensors: at most 8\.00 MiB per replica of 14\.22 MiB (56\.3%); gradients reduce-scattered, params all-gathered after the update$' \
      "$d/z.out" && ok "z says what each replica holds" || { bad "z: the ZeRO line"; grep ZeRO "$d/z.out"; }
    # a compiled executable: the same bits; --zero is fixed in it
    if "$DUET" compile models/fmnist_mlp.model -o "$d/exe" --data-parallel 2 --zero 1 > "$d/out" 2>&1 &&
      DUET_DP_CHECK=1 "$d/exe" --steps 20 --log-every 1 --train-subset 5120 --test-subset 1000 --threads 2 \
        --metrics "$d/exe.jsonl" --save "$d/exe.st" > "$d/exe.out" 2>&1; then same dp exe; checked exe 20
    else bad "compiled --zero 1 executable"; tail -5 "$d/out" "$d/exe.out"; fi
    expect exe_zero "duet: error: --zero is fixed at compile time: 1 (this program was compiled with it; to change it, compile again: duet compile M.model --zero 0; duet run takes it directly)" \
      "$d/exe" --steps 1 --zero 0
    # resume: the checkpoint holds the whole state, gathered from the replicas
    HALF10="models/fmnist_mlp.model --log-every 1 --train-subset 5120 --test-subset 1000"
    run z10 2 $HALF10 --steps 10 --data-parallel 2 --zero 1
    run dp10 2 $HALF10 --steps 10 --data-parallel 2
    resume z_z z10 2 $HALF10 --steps 20 --data-parallel 2 --zero 1
    resume z_dp z10 2 $HALF10 --steps 20 --data-parallel 2
    resume z_one z10 1 $HALF10 --steps 20 --micro-batches 2
    resume dp_z dp10 2 $HALF10 --steps 20 --data-parallel 2 --zero 1
    same_st dp z_z
    same_st dp z_dp
    same_st dp z_one
    same_st dp dp_z
  fi
  ;;
gpt)
  if [ ! -r "$KJV" ]; then
    skip "$KJV is missing (make data): the gpt part"
  else
    GPT="tests/models/gpt_tiny.model --steps 20 --log-every 1 --data $KJV"
    run gdp 2 $GPT --data-parallel 2
    run gz 2 $GPT --data-parallel 2 --zero 1
    same gdp gz
    checked gz 20
    HALF="$GPT --precision fp16 --loss-scale 16777216"
    run hdp 2 $HALF --data-parallel 2
    run hz 2 $HALF --data-parallel 2 --zero 1
    same hdp hz
    checked hz 20
    grep -q 'loss scale .* ([1-9][0-9]* skipped)' "$d/hz.out" && ok "hz skipped steps" || bad "hz: no skipped step"
    # 2 replicas of a 2-stage pipeline: shards per stage, buckets on both stages
    PIPE="$GPT --bucket-mb 0.05 --devices cpu:0,cpu:1,cpu:2,cpu:3 --data-parallel 2"
    run pdp 4 $PIPE
    run pz 4 $PIPE --zero 1
    same pdp pz
    checked pz 20
    # the check sees replicas whose params drift apart (bucket 0 neither reduce-scattered nor all-gathered)
    if DUET_DP_CHECK=1 DUET_DP_DROP=0 "$DUET" run $GPT --data-parallel 2 --zero 1 --threads 2 --steps 2 > "$d/drop.out" 2>&1; then
      bad "DUET_DP_DROP=0 passed the data-parallel check"
    elif grep -q "^duet: error: data-parallel check after step 1: replica 1's params differ from replica 0's: tensor " "$d/drop.out"
    then ok "dropped bucket caught"
    else bad "DUET_DP_DROP=0: unexpected failure"; tail -3 "$d/drop.out"; fi
  fi
  ;;
mpi)
  if ! command -v mpirun > /dev/null 2>&1; then
    echo "skip: mpirun is not installed (Debian: apt-get install openmpi-bin libopenmpi-dev): the mpi part"
    exit 77
  fi
  if [ ! -e "$(dirname "$DUET")/libduet_mpi.so" ]; then
    echo "skip: duet was built without MPI (no $(dirname "$DUET")/libduet_mpi.so): the mpi part"
    exit 77
  fi
  if [ ! -r "$KJV" ]; then
    skip "$KJV is missing (make data): the mpi part"
  else
    GPT="tests/models/gpt_tiny.model --log-every 1 --data $KJV"
    run gz 2 $GPT --steps 10 --data-parallel 2 --zero 1
    if DUET_DP_CHECK=1 timeout 300 $MPIRUN -np 2 "$DUET" run $GPT --steps 10 --zero 1 --threads 1 \
      --metrics "$d/mz.jsonl" --save "$d/mz.st" > "$d/mz.out" 2>&1; then same gz mz
    else bad "mpirun --zero 1"; grep -v '^ \|^--\|^$' "$d/mz.out" | tail -6; fi
    [ "$(grep -c 'data-parallel check: the params (the optimizer state is sharded' "$d/mz.out")" = 2 ] &&
      ok "both ranks' params bit-identical" || bad "mz: the ranks' check lines"
    # three ranks: the order of the sums shows (a + b = b + a, but not so for three)
    run g3 3 $GPT --steps 10 --batch 6 --data-parallel 3
    run g3z 3 $GPT --steps 10 --batch 6 --data-parallel 3 --zero 1
    same g3 g3z
    if DUET_DP_CHECK=1 timeout 300 $MPIRUN -np 3 "$DUET" run $GPT --steps 10 --batch 6 --zero 1 --threads 1 \
      --metrics "$d/m3z.jsonl" --save "$d/m3z.st" > "$d/m3z.out" 2>&1; then same g3 m3z
    else bad "mpirun -np 3 --zero 1"; grep -v '^ \|^--\|^$' "$d/m3z.out" | tail -6; fi
    # 2 ranks x 2-stage pipelines
    run pz 4 $GPT --steps 10 --bucket-mb 0.05 --devices cpu:0,cpu:1,cpu:2,cpu:3 --data-parallel 2 --zero 1
    if DUET_DP_CHECK=1 timeout 300 $MPIRUN -np 2 "$DUET" run $GPT --steps 10 --bucket-mb 0.05 --devices cpu:0,cpu:1 \
      --zero 1 --threads 2 --metrics "$d/mpz.jsonl" --save "$d/mpz.st" > "$d/mpz.out" 2>&1; then same pz mpz
    else bad "mpirun 2 x 2-stage --zero 1"; grep -v '^ \|^--\|^$' "$d/mpz.out" | tail -6; fi
    if timeout 300 $MPIRUN -np 2 "$DUET" run $GPT --steps 5 --zero 1 --threads 1 --save "$d/mz5.st" > "$d/mz5.out" 2>&1 &&
      timeout 300 $MPIRUN -np 2 "$DUET" run $GPT --steps 10 --zero 1 --threads 1 --resume "$d/mz5.st" \
        --save "$d/mzr.st" > "$d/mzr.out" 2>&1; then same_st gz mzr
    else bad "mpirun --zero 1 resume"; grep -v '^ \|^--\|^$' "$d/mz5.out" "$d/mzr.out" | tail -6; fi
    sanitizer_reports
  fi
  ;;
cli)
  M=models/fmnist_mlp.model
  expect zero_value "duet: error: --zero expects 0 or 1 (ZeRO stage 1: optimizer state sharded over the replicas), got '2'" \
    "$DUET" run $M --data-parallel 2 --zero 2
  expect zero_plan_value "duet: error: --zero expects 0 or 1 (ZeRO stage 1: optimizer state sharded over the replicas), got 'yes'" \
    "$DUET" plan $M --data-parallel 2 --zero yes
  expect zero_alone "duet: error: --zero 1 needs --data-parallel N with N >= 2 (it shards the optimizer state over the replicas)" \
    "$DUET" run $M --zero 1
  expect zero_one "duet: error: --zero 1 needs --data-parallel N with N >= 2 (it shards the optimizer state over the replicas)" \
    "$DUET" ir $M --data-parallel 1 --zero 1
  expect zero_check "duet: error: --zero 1 needs --data-parallel N with N >= 2 (it shards the optimizer state over the replicas)" \
    "$DUET" check $M --zero 1
  expect zero_prune "duet: error: --zero 1 does not combine with pruning yet (the masks zero optimizer state that only one replica holds): drop --zero 1 or the pruning" \
    "$DUET" run $M --data-parallel 2 --zero 1 --prune 0.5
  "$DUET" ir $M --after data_parallel --data-parallel 2 > "$d/nz.ir"
  expect zero_dump "duet: error: the dump was printed after \`data_parallel\` without --zero 1: its buckets are all-reduces; --zero 1 needs the .model or a dump from before \`data_parallel\`" \
    "$DUET" ir "$d/nz.ir" --zero 1
  "$DUET" check $M --data-parallel 2 --zero 1 > "$d/out" 2>&1 && ok "check --zero 1" || { bad "check --zero 1"; cat "$d/out"; }
  # the kernels are the unsharded run's (each update is its whole tensor's kernel)
  "$DUET" emit $M --target c --data-parallel 2 > "$d/nz.c" 2>&1 && "$DUET" emit $M --target c --data-parallel 2 --zero 1 > "$d/z.c" 2>&1 &&
    cmp -s "$d/nz.c" "$d/z.c" && ok "emit --zero 1: the same kernels" || { bad "emit --zero 1"; head -3 "$d/z.c"; }
  # the pass: reduce-scatter and all-gather buckets, updates with shards
  G=tests/models/gpt_tiny.model
  "$DUET" ir $G --after data_parallel --data-parallel 2 --zero 1 --bucket-mb 0.05 > "$d/z.ir"
  grep -q '^zero 1$' "$d/z.ir" && grep -Eq '^reduce_scatter\[bucket=0,bytes=[0-9]+\] ' "$d/z.ir" &&
    grep -Eq '^all_gather\[bucket=0\] ' "$d/z.ir" && grep -Eq '^adamw_update\[shard=1\] ' "$d/z.ir" &&
    grep -Eq '^adamw_update\[no_decay,shard=0\] ' "$d/z.ir" && ! grep -q '^allreduce' "$d/z.ir" &&
    [ "$(grep -c '^reduce_scatter' "$d/z.ir")" = "$(grep -c '^all_gather' "$d/z.ir")" ] &&
    [ "$(grep -c '^reduce_scatter' "$d/z.ir")" -gt 1 ] && ok "ir: reduce_scatter, all_gather, shards" ||
    { bad "ir --zero 1"; grep -E '^(zero|reduce_scatter|all_gather|adamw)' "$d/z.ir" | head; }
  "$DUET" ir "$d/z.ir" > "$d/z2.ir" 2>&1 && cmp -s "$d/z.ir" "$d/z2.ir" && ok "ir --zero 1 parses back" ||
    { bad "ir --zero 1 round trip"; diff "$d/z.ir" "$d/z2.ir" | head -5; }
  if [ -r "$KJV" ]; then
    run dump 2 "$d/z.ir" --steps 10 --log-every 1 --data "$KJV"
    run model 2 $G --data-parallel 2 --zero 1 --bucket-mb 0.05 --steps 10 --log-every 1 --data "$KJV"
    same model dump
  else skip "$KJV is missing (make data): duet run of the dump"; fi
  # a bucket's gradients are grouped by shard; a dump with them out of order is refused
  # (the first operand, of shard 0, swapped with the last, of shard 1)
  awk '/^reduce_scatter\[bucket=0,/ && !done { n = split($0, a, " "); f = a[2]; sub(/,$/, "", f)
         a[2] = a[n - 3] ","; a[n - 3] = f
         s = a[1]; for (i = 2; i <= n; i++) s = s " " a[i]; print s; done = 1; next } { print }' "$d/z.ir" > "$d/bad.ir"
  if "$DUET" ir "$d/bad.ir" > "$d/out" 2>&1; then bad "a reduce_scatter not grouped by shard was accepted"
  elif grep -q 'a reduce_scatter.s operands are grouped by shard in order' "$d/out"; then ok "ungrouped reduce_scatter refused"
  else bad "ungrouped reduce_scatter: unexpected error"; head -3 "$d/out"; fi
  # duet plan: the optimizer state per device with and without --zero 1
  "$DUET" plan $M --data-parallel 2 --threads 2 > "$d/plan" 2>&1 || { bad "plan"; cat "$d/plan"; }
  "$DUET" plan $M --data-parallel 2 --zero 1 --threads 2 > "$d/planz" 2>&1 || { bad "plan --zero 1"; cat "$d/planz"; }
  grep -q '^  memory: weights 7\.11 MiB, grads 0\.00 MiB (summed over the micro-batches), optimizer state 14\.22 MiB,' "$d/plan" &&
    grep -q '^  optimizer state per device: 14\.22 MiB without --zero 1, 8\.00 MiB with it (ZeRO stage 1: the fullest of the 2 replicas. shards, 8\.00, 6\.22 MiB; whole tensors)$' "$d/plan" &&
    grep -q '^  memory: weights 7\.11 MiB, grads 0\.00 MiB (summed over the micro-batches), optimizer state 8\.00 MiB,' "$d/planz" &&
    grep -q '^  optimizer state per device: 8\.00 MiB with --zero 1 (ZeRO stage 1: the fullest of the 2 replicas. shards, 8\.00, 6\.22 MiB; whole tensors), 14\.22 MiB without$' "$d/planz" &&
    grep -q 'ZeRO stage 1: ring reduce-scatter (N-1)/N x 7\.11 MiB = 3\.55 MiB and all-gather of the params (N-1)/N x 7\.11 MiB = 3\.55 MiB per replica' "$d/planz" &&
    ok "plan: fmnist_mlp state per device" || { bad "plan: fmnist_mlp state"; grep -E 'memory|state|ZeRO' "$d/plan" "$d/planz"; }
  "$DUET" plan models/gpt_kjv.model --devices 2x16GiB:sm_60 --data-parallel 2 --zero 1 > "$d/planz_gpt" 2>&1 ||
    { bad "plan gpt_kjv"; cat "$d/planz_gpt"; }
  grep -q '^  optimizer state per device: 12\.50 MiB with --zero 1 (ZeRO stage 1: the fullest of the 2 replicas. shards, 12\.50, 12\.36 MiB; whole tensors), 24\.86 MiB without$' "$d/planz_gpt" &&
    ok "plan: gpt_kjv state per device halves" || { bad "plan: gpt_kjv state"; grep -E 'state' "$d/planz_gpt"; }
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
echo "$pass passed, $fail failed, $skipped parts skipped"
[ "$fail" -eq 0 ] || exit 1
if [ "$skipped" -gt 0 ]; then echo "parts were skipped (above): exit 77"; exit 77; fi
