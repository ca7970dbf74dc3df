#!/bin/sh
# (ctest label gpu) Data parallelism on GPUs, in one process:
#  1. one GPU acting as two replicas (--devices cuda:0,cuda:0
#     --data-parallel 2: a context, and a stream and arenas per replica; the
#     shared-memory collective sums each bucket in replica order on the GPU,
#     copy_peer and the device's accumulate kernel, no host copies):
#     gpt_tiny, 3 steps, writes exactly the losses and the checkpoint of
#     `--devices cuda:0 --micro-batches 2` (the same kernels, cuBLAS GEMMs
#     of the same shapes, the same sums, each add rounded once), the start-up
#     line says "device-to-device on the GPU", and the replicas' params and
#     optimizer state are bit-identical after every step (DUET_DP_CHECK=1,
#     which reads them back from each replica's GPU memory); the same bits
#     with DUET_PIPE_STAGING=host (the buckets staged through host memory);
#  2. fp16 with a forced overflow (loss scale 2^30): the same skipped steps,
#     losses and checkpoint as cuda:0 with 2 micro-batches;
#  3. the collective's errors (exact text): DUET_DP_COLLECTIVE=nccl with
#     both replicas on cuda:0 (NCCL allows one rank per GPU), a bad value;
#  4. with two GPUs, cuda:0,cuda:1 --data-parallel 2: NCCL where it loads
#     (the start-up line says which collective, and "NCCL not used: WHY"
#     otherwise): replicas bit-identical, and, when both GPUs are the same
#     model, exactly the losses and checkpoint of cuda:0 with 2
#     micro-batches (two ranks: each element is one add, a + b = b + a, so
#     NCCL's order gives the replica-order bits) for gpt_tiny in fp32 and
#     fp16 and for fmnist_mlp in fp32 and fp16; DUET_DP_COLLECTIVE=shm (the
#     shared-memory collective: peer-to-peer where the GPUs allow it, else
#     staged through host memory) and DUET_DP_COLLECTIVE=nccl: the same
#     bits; NCCL missing (DUET_NCCL_LIBRARY=/nonexistent/libnccl.so.2):
#     auto falls back to shared memory saying why, nccl is an error naming
#     the library and the package;
#     Two replicas of a two-stage pipeline, cuda:0,cuda:1,cuda:0,cuda:1
#     --data-parallel 2 (each stage's replicas on one GPU: shared memory,
#     device-to-device): exactly the losses and checkpoint of the one
#     pipeline cuda:0,cuda:1 with 2 micro-batches;
#  5. with three GPUs, cuda:0,cuda:1,cuda:2 --data-parallel 3 (batch 12):
#     replicas bit-identical; losses within 1e-6 relative of cuda:0 with 3
#     micro-batches (NCCL's order is not the replica order: three terms
#     associate differently); says whether the checkpoint is bit-identical;
#  6. with four GPUs, two replicas of a two-stage pipeline,
#     cuda:0,cuda:1,cuda:2,cuda:3 --data-parallel 2 (a communicator per
#     stage): the bits of the pipeline cuda:0,cuda:1 with 2 micro-batches.
#  7. across MPI ranks (two GPUs, mpirun and libduet_mpi.so beside duet):
#     mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl tcp,self,
#     each rank one GPU (CUDA_VISIBLE_DEVICES set to its local rank, so
#     each says --devices cuda:0): NCCL between the ranks where it loads
#     (rank 0's unique id broadcast over MPI, ncclCommInitRank; the
#     start-up line says so, or "NCCL not used: WHY"), the ranks
#     bit-identical after every step (both say so), and, when both GPUs
#     are the same model, exactly the losses and checkpoint of cuda:0 with
#     2 micro-batches, for gpt_tiny and fmnist_mlp; DUET_DP_COLLECTIVE=shm
#     (MPI between the ranks, GPU buffers staged through host memory): the
#     same bits; NCCL missing: auto falls back to MPI saying why, the same
#     bits; nccl forced is the error naming the library and the package,
#     on every rank.
#  8. ZeRO stage 1 (--zero 1): one GPU as two replicas, fp32 and (but with
#     GPU_QUICK=1) fp16 with overflows, each replica holding its shard of the state in GPU memory
#     (the reduce-scatter and all-gather staged through host memory):
#     exactly the bits of 1. and 2.; with two GPUs (NCCL: its all-reduce as
#     the reduce-scatter, ncclBroadcast per tensor as the all-gather, the
#     start-up line says so) the bits of cuda:0 with 2 micro-batches when
#     both GPUs are one model; a --zero 1 checkpoint of one GPU as two
#     replicas resumed without --zero by cuda:0 with 2 micro-batches gives
#     the checkpoint of the uninterrupted run.
# Parts 4-7 are skipped (and the script exits 77 after the rest) with
# fewer GPUs; NCCL's parts of 4 and 7 with NCCL absent, part 7 without
# mpirun or the MPI plugin.  DP_PART=local runs parts 1-6 and 8 only, DP_PART=mpi
# part 7 only (tests/run_fakegpu.sh runs them as two tests).  Exits 77 (ctest SKIP)
# with a message when there is no GPU; a missing text is a failure
# (tests/gpu/run.sh provides it; fmnist_mlp's part needs FMNIST_DIR).
# Environment: KJV_TEXT (default data/kjv.txt), FMNIST_DIR (default
# /usr/share/datasets/fashion-mnist), GPU_QUICK=1 (fmnist_mlp on 2,560
# images, the fake GPU's setting), GPU_DEVICE (default cuda; `GPU_DEVICE=cpu`
# dry-runs parts 1-2 on virtual CPU devices: cpu:0,cpu:1 against cpu:0).
# usage: run_data_parallel_gpu.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_data_parallel_gpu.sh path/to/duet}
. "$(dirname "$0")/common.sh" # GPU_DEVICE, gpu_require, gpu_workdir, ok, bad
DP_PART=${DP_PART:-all}
case $DP_PART in all|local|mpi) ;; *) echo "DP_PART must be all, local or mpi, got '$DP_PART'"; exit 2 ;; esac
gpu_require
KJV_TEXT=${KJV_TEXT:-data/kjv.txt}
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$KJV_TEXT" ]; then
  echo "FAIL: no text at $KJV_TEXT (make data, or set KJV_TEXT)"
  exit 1
fi
if [ "$GPU_DEVICE" = cpu ]; then ONE=cpu:0 TWO=cpu:0,cpu:1 TH_ONE=1; else ONE=cuda:0 TWO=cuda:0,cuda:0 TH_ONE=2; fi
if [ "${GPU_QUICK:-0}" = 1 ]; then MLP_ARGS="--train-subset 2560 --test-subset 1000"; else MLP_ARGS=; fi
gpu_workdir
skipped=0
GPT="tests/models/gpt_tiny.model --steps 3 --batch 8 --eval-batches 2 --data $KJV_TEXT"
MLP="models/fmnist_mlp.model --steps 3 --eval-batches 1 $MLP_ARGS --data $FMNIST_DIR"

# run NAME DEVICES THREADS ARGS...: trains $MODEL (default gpt_tiny; replicas
# compared every step); keeps output, metrics, checkpoint
run() {
  n=$1 dev=$2 th=$3
  shift 3
  # shellcheck disable=SC2086
  if ! DUET_DP_CHECK=1 "$DUET" run ${MODEL:-$GPT} --devices "$dev" --threads "$th" --metrics "$tmp/$n.jsonl" \
      --save "$tmp/$n.st" "$@" > "$tmp/$n.out" 2>&1; then
    bad "$n: duet run --devices $dev $*"; tail -5 "$tmp/$n.out"
  fi
}
# same REF NAME: identical losses and checkpoint
same() {
  if [ -s "$tmp/$1.st" ] && cmp -s "$tmp/$1.st" "$tmp/$2.st" && cmp -s "$tmp/$1.jsonl" "$tmp/$2.jsonl"; then ok "$2 equals $1"
  else bad "$2 differs from $1"; diff "$tmp/$1.jsonl" "$tmp/$2.jsonl" | head -6; fi
}
# zchecked NAME: --zero 1: the 2 replicas' params were bit-identical after every one of the 3 steps
zchecked() {
  if grep -q "^duet: data-parallel check: the params (the optimizer state is sharded: each holds its own) of the 2 replicas were bit-identical after each of 3 training steps" "$tmp/$1.out"
  then ok "$1 replicas' params bit-identical"; else bad "$1: no data-parallel check line"; tail -3 "$tmp/$1.out"; fi
}
# checked NAME [R]: the R (2) replicas were bit-identical after every one of the 3 steps
checked() {
  if grep -q "^duet: data-parallel check: the params and optimizer state of the ${2:-2} replicas were bit-identical after each of 3 training steps" "$tmp/$1.out"
  then ok "$1 replicas bit-identical"; else bad "$1: no data-parallel check line"; tail -3 "$tmp/$1.out"; fi
}
# summed NAME TEXT: the start-up line says how the buckets are summed
summed() {
  line=$(sed -n 's/^duet: data parallel: .* summed //p' "$tmp/$1.out")
  case "$line" in
    *"$2"*) ok "$1 summed $2" ;;
    *) bad "$1: expected 'summed ...$2' in '$line'" ;;
  esac
}
# fails NAME MESSAGE ARGS...: duet run (gpt_tiny) exits 1 with exactly MESSAGE as its error line
fails() {
  n=$1 msg=$2
  shift 2
  # shellcheck disable=SC2086
  "$DUET" run $GPT "$@" > "$tmp/$n.out" 2>&1
  rc=$?
  got=$(grep '^duet: error: ' "$tmp/$n.out" | head -1)
  if [ $rc = 1 ] && [ "$got" = "duet: error: $msg" ]; then ok "$n: $msg"
  else bad "$n: exit $rc, got '$got', want 'duet: error: $msg'"; fi
}

# mchecked NAME: both MPI ranks compared their params and optimizer state after each of the 3 steps
mchecked() {
  for k in 0 1; do
    if grep -q "^duet: rank $k: data-parallel check: the params and optimizer state of the 2 replicas (ranks; hashes compared) were bit-identical after each of 3 training steps" "$tmp/$1.out"
    then ok "$1 rank $k bit-identical to rank 0"; else bad "$1: no data-parallel check line of rank $k"; tail -3 "$tmp/$1.out"; fi
  done
}

# 7. across MPI ranks, each rank one GPU (called at the end)
mpi_part() {
  if ! "$DUET" devices | grep -q '^cuda:1 '; then echo "skip: one GPU: the MPI checks"; skipped=1; return; fi
  if ! command -v mpirun > /dev/null 2>&1; then echo "skip: no mpirun: the MPI checks"; skipped=1; return; fi
  if [ -z "${DUET_MPI_PLUGIN:-}" ] && [ ! -f "$(dirname "$DUET")/libduet_mpi.so" ]; then
    echo "skip: no libduet_mpi.so beside $DUET: the MPI checks"; skipped=1; return
  fi
  n0=$("$DUET" devices | sed -n 's/^cuda:0  \([^,]*\),.*/\1/p')
  n1=$("$DUET" devices | sed -n 's/^cuda:1  \([^,]*\),.*/\1/p')
  # mrun NAME ARGS...: ${MODEL:-$GPT} on 2 ranks, rank k on GPU k (CUDA_VISIBLE_DEVICES), ranks compared every step
  mrun() {
    n=$1
    shift
    # shellcheck disable=SC2016,SC2086
    if ! DUET_DP_CHECK=1 mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl tcp,self \
        sh -c 'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"' sh "$DUET" run ${MODEL:-$GPT} \
        --devices cuda:0 --threads 1 --metrics "$tmp/$n.jsonl" --save "$tmp/$n.st" "$@" > "$tmp/$n.out" 2>&1; then
      bad "$n: mpirun -np 2 duet run --devices cuda:0 $*"; grep 'error' "$tmp/$n.out" | head -3
    fi
  }
  [ -s "$tmp/ref.st" ] || run ref "$ONE" "$TH_ONE" --micro-batches 2
  mrun mpi_pair
  mchecked mpi_pair
  line=$(sed -n 's/^duet: data parallel: .* summed //p' "$tmp/mpi_pair.out")
  echo "2 MPI ranks on cuda:0 and cuda:1: summed $line"
  case "$line" in
    "by NCCL "*", across the ranks (ncclCommInitRank, the unique ids broadcast over MPI (2 ranks, "*) mnccl=1 ;;
    *"NCCL not used: "*) mnccl=0; echo "skip: NCCL between the ranks: ${line#*NCCL not used: }"; skipped=1 ;;
    *) mnccl=0; bad "mpi_pair: neither NCCL across the ranks nor the reason it was not used: '$line'" ;;
  esac
  DUET_DP_COLLECTIVE=shm mrun mpi_shm
  summed mpi_shm "in replica order over MPI (2 ranks, "
  DUET_NCCL_LIBRARY=/nonexistent/libnccl.so.2 mrun mpi_nonccl
  summed mpi_nonccl "(GPU buffers staged through host memory); NCCL not used: rank 0: NCCL (/nonexistent/libnccl.so.2) could not be loaded: "
  DUET_NCCL_LIBRARY=/nonexistent/libnccl.so.2 DUET_DP_COLLECTIVE=nccl mpirun --allow-run-as-root --oversubscribe \
    -np 2 --mca btl tcp,self "$DUET" run $GPT --devices cuda:0 > "$tmp/mpi_nonccl_forced.out" 2>&1
  rc=$?
  # every rank fails so; the first to fail ends the others with MPI_Abort, maybe before they print
  got=$(grep "^duet: rank [01]: error: " "$tmp/mpi_nonccl_forced.out" | head -1)
  case "$got" in
    "duet: rank "[01]": error: DUET_DP_COLLECTIVE=nccl: rank 0: NCCL (/nonexistent/libnccl.so.2) could not be loaded: "*"; install NCCL (NVIDIA's libnccl2 package, or pip's nvidia-nccl-cu12 for CUDA 12) or point DUET_NCCL_LIBRARY at libnccl.so.2")
      [ $rc != 0 ] && ok "MPI, NCCL missing, nccl forced: $got" || bad "MPI, NCCL missing, nccl forced: mpirun exit 0" ;;
    *) bad "MPI, NCCL missing, nccl forced: exit $rc, '$got'" ;;
  esac
  if [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
    [ -s "$tmp/mlp_ref.st" ] || MODEL=$MLP run mlp_ref cuda:0 2 --micro-batches 2
    MODEL=$MLP mrun mpi_mlp
    mchecked mpi_mlp
  else
    bad "fmnist_mlp: no Fashion-MNIST in $FMNIST_DIR (set FMNIST_DIR)"
  fi
  if [ "$n0" = "$n1" ]; then
    same ref mpi_pair
    same ref mpi_shm
    same ref mpi_nonccl
    [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ] && same mlp_ref mpi_mlp
  else
    echo "cuda:0 ($n0) and cuda:1 ($n1) differ: the MPI runs' losses are not compared"
  fi
}

if [ "$DP_PART" != mpi ]; then # parts 1-6 and 8 (not indented: they came first)
# 1. one GPU as two replicas
run ref "$ONE" "$TH_ONE" --micro-batches 2
run dp "$TWO" 2 --data-parallel 2
same ref dp
checked dp
if [ "$GPU_DEVICE" = cpu ]; then summed dp "in replica order over shared memory"
else summed dp "in replica order over shared memory, device-to-device on the GPU"; fi
if [ "$GPU_DEVICE" != cpu ]; then
  DUET_PIPE_STAGING=host run dp_host "$TWO" 2 --data-parallel 2
  same ref dp_host
  summed dp_host "in replica order over shared memory (GPU buffers staged through host memory, forced by DUET_PIPE_STAGING=host)"
fi
# 2. fp16 overflows
run half_ref "$ONE" "$TH_ONE" --micro-batches 2 --precision fp16 --loss-scale 1073741824
run half_dp "$TWO" 2 --data-parallel 2 --precision fp16 --loss-scale 1073741824
same half_ref half_dp
checked half_dp
grep -q 'loss scale .* ([1-9][0-9]* skipped)' "$tmp/half_dp.out" && ok "half_dp skipped steps" || bad "half_dp: no skipped step"
# 8. ZeRO stage 1 on one GPU as two replicas (two GPUs: below)
run z "$TWO" 2 --data-parallel 2 --zero 1
same ref z
zchecked z
if [ "${GPU_QUICK:-0}" != 1 ]; then
  run half_z "$TWO" 2 --data-parallel 2 --zero 1 --precision fp16 --loss-scale 1073741824
  same half_ref half_z
  zchecked half_z
fi
GPT2="tests/models/gpt_tiny.model --batch 8 --eval-batches 2 --data $KJV_TEXT"
if "$DUET" run $GPT2 --steps 2 --devices "$TWO" --threads 2 --data-parallel 2 --zero 1 --save "$tmp/z2.st" > "$tmp/z2.out" 2>&1 &&
  "$DUET" run $GPT2 --steps 3 --devices "$ONE" --threads "$TH_ONE" --micro-batches 2 --resume "$tmp/z2.st" \
    --save "$tmp/z_res.st" > "$tmp/z_res.out" 2>&1 && cmp -s "$tmp/ref.st" "$tmp/z_res.st"
then ok "a --zero 1 checkpoint resumed on one device: the uninterrupted run's checkpoint"
else bad "--zero 1 checkpoint resumed on one device"; tail -3 "$tmp/z2.out" "$tmp/z_res.out"; fi

if [ "$GPU_DEVICE" != cpu ]; then
  # 3. the collective's errors
  DUET_DP_COLLECTIVE=nccl fails nccl_same_gpu "DUET_DP_COLLECTIVE=nccl: replicas 0 and 1 of stage 0 are both on cuda:0, and NCCL allows one rank per GPU (DUET_DP_COLLECTIVE=auto or shm sums one GPU's replicas device-to-device)" --devices cuda:0,cuda:0 --data-parallel 2
  DUET_DP_COLLECTIVE=ring fails bad_collective "DUET_DP_COLLECTIVE must be auto, shm or nccl, got 'ring'" --devices cuda:0,cuda:0 --data-parallel 2
  # 4. two GPUs
  if "$DUET" devices | grep -q '^cuda:1 '; then
    n0=$("$DUET" devices | sed -n 's/^cuda:0  \([^,]*\),.*/\1/p')
    n1=$("$DUET" devices | sed -n 's/^cuda:1  \([^,]*\),.*/\1/p')
    run pair cuda:0,cuda:1 2 --data-parallel 2
    checked pair
    line=$(sed -n 's/^duet: data parallel: .* summed //p' "$tmp/pair.out")
    echo "cuda:0,cuda:1: summed $line"
    case "$line" in
      "by NCCL "*) nccl=1 ;;
      *"NCCL not used: "*) nccl=0; echo "skip: NCCL's parts: ${line#*NCCL not used: }"; skipped=1 ;;
      *) nccl=0; bad "pair: neither NCCL nor the reason it was not used: '$line'" ;;
    esac
    run half_pair cuda:0,cuda:1 2 --data-parallel 2 --precision fp16 --loss-scale 1073741824
    checked half_pair
    DUET_DP_COLLECTIVE=shm run pair_shm cuda:0,cuda:1 2 --data-parallel 2
    summed pair_shm "in replica order over shared memory"
    if [ "$nccl" = 1 ]; then
      DUET_DP_COLLECTIVE=nccl run pair_nccl cuda:0,cuda:1 2 --data-parallel 2
      summed pair_nccl "by NCCL "
    fi
    # NCCL missing
    DUET_NCCL_LIBRARY=/nonexistent/libnccl.so.2 run pair_nonccl cuda:0,cuda:1 2 --data-parallel 2
    summed pair_nonccl "; NCCL not used: NCCL (/nonexistent/libnccl.so.2) could not be loaded: "
    DUET_NCCL_LIBRARY=/nonexistent/libnccl.so.2 DUET_DP_COLLECTIVE=nccl "$DUET" run $GPT --devices cuda:0,cuda:1 \
      --data-parallel 2 > "$tmp/nonccl.out" 2>&1
    rc=$?
    got=$(grep '^duet: error: ' "$tmp/nonccl.out" | head -1)
    case "$got" in
      "duet: error: DUET_DP_COLLECTIVE=nccl: NCCL (/nonexistent/libnccl.so.2) could not be loaded: "*"; install NCCL (NVIDIA's libnccl2 package, or pip's nvidia-nccl-cu12 for CUDA 12) or point DUET_NCCL_LIBRARY at libnccl.so.2")
        [ $rc = 1 ] && ok "NCCL missing, nccl forced: $got" || bad "NCCL missing, nccl forced: exit $rc" ;;
      *) bad "NCCL missing, nccl forced: exit $rc, '$got'" ;;
    esac
    # fmnist_mlp
    if [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
      MODEL=$MLP run mlp_ref cuda:0 2 --micro-batches 2
      MODEL=$MLP run mlp_pair cuda:0,cuda:1 2 --data-parallel 2
      checked mlp_pair
      MODEL=$MLP run mlp_half_ref cuda:0 2 --micro-batches 2 --precision fp16
      MODEL=$MLP run mlp_half_pair cuda:0,cuda:1 2 --data-parallel 2 --precision fp16
      checked mlp_half_pair
    else
      bad "fmnist_mlp: no Fashion-MNIST in $FMNIST_DIR (set FMNIST_DIR)"
    fi
    # 8. ZeRO stage 1 on two GPUs
    run pair_z cuda:0,cuda:1 2 --data-parallel 2 --zero 1
    zchecked pair_z
    [ "$nccl" = 1 ] && summed pair_z "; --zero 1: the reduce-scatter as NCCL's all-reduce, the all-gather as an ncclBroadcast per tensor from its replica"
    # two replicas of a two-stage pipeline, each stage's replicas on one GPU
    run pipe_ref cuda:0,cuda:1 2 --micro-batches 2 --bucket-mb 0.05
    run pipe_dp cuda:0,cuda:1,cuda:0,cuda:1 2 --data-parallel 2 --bucket-mb 0.05
    checked pipe_dp
    summed pipe_dp "in replica order over shared memory, device-to-device on each stage's GPU"
    same pipe_ref pipe_dp
    if [ "$n0" = "$n1" ]; then
      same ref pair
      same half_ref half_pair
      same ref pair_shm
      [ "$nccl" = 1 ] && same ref pair_nccl
      same ref pair_nonccl
      same ref pair_z
      if [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ]; then
        same mlp_ref mlp_pair
        same mlp_half_ref mlp_half_pair
      fi
    else
      echo "cuda:0 ($n0) and cuda:1 ($n1) differ: their losses are not compared"
    fi
    # 5. three GPUs
    if "$DUET" devices | grep -q '^cuda:2 '; then
      GPT12="tests/models/gpt_tiny.model --steps 3 --batch 12 --eval-batches 2 --data $KJV_TEXT"
      MODEL=$GPT12 run ref3 cuda:0 2 --micro-batches 3
      MODEL=$GPT12 run trio cuda:0,cuda:1,cuda:2 3 --data-parallel 3
      checked trio 3
      echo "cuda:0,cuda:1,cuda:2: summed $(sed -n 's/^duet: data parallel: .* summed //p' "$tmp/trio.out")"
      if paste -d' ' "$tmp/ref3.jsonl" "$tmp/trio.jsonl" | awk -F'"loss":' '
          NF == 3 { a = $2 + 0; b = $3 + 0; d = a - b; if (d < 0) d = -d; r = d / (a < 0 ? -a : a); if (r > m) m = r; n++ }
          END { printf "3 GPUs against 3 micro-batches: max relative loss difference %.3g over %d logged losses\n", m, n
                exit !(n >= 3 && m <= 1e-6) }'; then ok "trio losses within 1e-6 relative of ref3"
      else bad "trio losses differ from ref3 by more than 1e-6 relative"; fi
      if cmp -s "$tmp/ref3.st" "$tmp/trio.st"; then echo "trio checkpoint: bit-identical to ref3"
      else echo "trio checkpoint: differs from ref3 (the collective's order is not the replica order)"; fi
    else
      echo "skip: fewer than three GPUs: the cuda:0,cuda:1,cuda:2 checks"
      skipped=1
    fi
    # 6. four GPUs: two replicas of a two-stage pipeline over NCCL
    if "$DUET" devices | grep -q '^cuda:3 '; then
      run quad cuda:0,cuda:1,cuda:2,cuda:3 2 --data-parallel 2 --bucket-mb 0.05
      checked quad
      echo "cuda:0,cuda:1,cuda:2,cuda:3: summed $(sed -n 's/^duet: data parallel: .* summed //p' "$tmp/quad.out")"
      n2=$("$DUET" devices | sed -n 's/^cuda:2  \([^,]*\),.*/\1/p')
      n3=$("$DUET" devices | sed -n 's/^cuda:3  \([^,]*\),.*/\1/p')
      if [ "$n0" = "$n2" ] && [ "$n1" = "$n3" ]; then same pipe_ref quad
      else echo "cuda:2,cuda:3 are other models than cuda:0,cuda:1: their losses are not compared"; fi
    else
      echo "skip: fewer than four GPUs: the cuda:0,cuda:1,cuda:2,cuda:3 checks"
      skipped=1
    fi
  else
    echo "skip: one GPU: the cuda:0,cuda:1 checks"
    skipped=1
  fi
fi
fi # parts 1-6 and 8
if [ "$DP_PART" != local ]; then
  if [ "$GPU_DEVICE" = cpu ]; then echo "skip: GPU_DEVICE=cpu: the MPI checks (tests/run_mpi.sh has the CPU's)"
  else mpi_part; fi
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ] || exit 1
[ "$skipped" = 0 ] || { echo "a part was skipped: exit 77"; exit 77; }
