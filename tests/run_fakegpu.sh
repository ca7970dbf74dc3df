#!/bin/sh
# (ctest fakegpu) The real CUDA plugin, libduet_cuda.so, end to end on the
# fake GPU of tests/fakegpu/fakegpu.c (CUDA driver, cuBLAS and NVRTC in one
# library that emulates kernels on the host; see its header for what it
# models), put on LD_LIBRARY_PATH under the plugin's own library names.
#  1. duet devices lists the fake card; two fake GPUs are listed as two.
#  2. Target selection through the plugin: SASS sm_60 from NVRTC 12.9; PTX
#     for the highest virtual architecture below a card newer than NVRTC
#     knows (sm_120 with NVRTC 12.0: compute_90); NVRTC 13.0 on sm_60 is the
#     one clear error naming the card, the NVRTC version and CUDA 12.x.
#  3. Kernel cache: a second run loads the module from the cache.
#  4. Out of GPU memory is an error that names the size.
#  5. The gpu-labelled tests, as a GPU machine runs them, on small work
#     (GPU_QUICK=1): test_gpu_ops (every op case on sm_60 and, with bf16,
#     on sm_80), run_train_gpu.sh, run_precision_gpu.sh,
#     run_pipeline_gpu.sh (one fake GPU as two devices, cpu + GPU, and two
#     fake GPUs without and with peer access), run_prune_gpu.sh and
#     run_adamw8_gpu.sh and run_quantize_gpu.sh (part prune), run_data_parallel_gpu.sh
#     (one fake GPU as two replicas, summed device-to-device; two fake GPUs
#     with the fake's NCCL, forced to shared memory, without NCCL; three
#     fake GPUs, whose ring order must differ from the replica order in
#     the last bits; two replicas of two-stage pipelines on two and on
#     four fake GPUs).
#  6. Data parallelism on what only the fake can stage: a hung collective
#     (DUET_FAKE_NCCL_HANG) ends the run within DUET_PIPE_TIMEOUT with the
#     error naming the stage and bucket; an NCCL built with CUDA 13
#     (DUET_FAKE_NCCL=2.28.9) on sm_60 cards: auto falls back to shared
#     memory saying why, DUET_DP_COLLECTIVE=nccl is that error, and on sm_75
#     cards it is used; two fake GPUs with peer access and
#     DUET_DP_COLLECTIVE=shm sum peer-to-peer, to the same bits.
#  7. Data parallelism across MPI ranks with the fake NCCL across processes
#     (its shared-memory file; needs mpirun and libduet_mpi.so, else 77):
#     run_data_parallel_gpu.sh's MPI part (DP_PART=mpi: 2 ranks, each on
#     its own fake cuda:0, summed by NCCL, exactly cuda:0 with 2
#     micro-batches for gpt_tiny and fmnist_mlp; DUET_DP_COLLECTIVE=shm
#     and NCCL missing fall back to MPI with the same bits; nccl forced
#     without NCCL is the error); 2 ranks x 2-stage pipelines (a
#     communicator per stage) equal the one pipeline with 2 micro-batches;
#     --zero 1 across 2 ranks over NCCL equals cuda:0 with 2 micro-batches;
#     a hung collective (DUET_FAKE_NCCL_HANG) ends the run within
#     DUET_PIPE_TIMEOUT; DUET_DP_COLLECTIVE=nccl on CPU ranks is refused.
# 8. Optimizer offload (part offload): tests/gpu/run_offload_gpu.sh on two fake GPUs; a card
#    too small for the run without offload (DUET_FAKE_MEM) trains with it.
# Parts (ctest runs each as its own test): cli (1-4), ops, train,
# precision, pipeline, prune, dataparallel (5, 6), mpi (7).  The emulator's seed (DUET_EMU_SEED, README
# "The emulator") is printed first, one for the whole part.  Skips (77) when the plugin or the fake was not
# built (no CUDA toolkit) or there is no C++ compiler.
# usage: run_fakegpu.sh BUILD_DIR PART   (from the repository root)
B=${1:?usage: run_fakegpu.sh BUILD_DIR cli|ops|train|precision|pipeline|prune|dataparallel|mpi|offload}
PART=${2:?usage: run_fakegpu.sh BUILD_DIR cli|ops|train|precision|pipeline|prune|dataparallel|mpi|offload}
DUET=$B/duet
PLUGIN=$B/libduet_cuda.so
FAKE=$B/fakegpu/libduet_fakegpu.so
if [ ! -f "$PLUGIN" ] || [ ! -f "$FAKE" ]; then
  echo "SKIP: no CUDA plugin or fake GPU in $B (built only with a CUDA toolkit)"
  exit 77
fi
# the fake NVRTC compiles kernels with $CXX or c++ (as test_cuda_emu)
if ! command -v "${CXX:-c++}" > /dev/null 2>&1; then
  echo "SKIP: no C++ compiler (${CXX:-c++}) for the fake NVRTC"
  exit 77
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/lib" "$tmp/tmp"
# the names the plugin asks the loader for, the driver duet probes and the
# NCCL the plugin loads for data parallelism (this machine may have a real
# libnccl.so.2 in the loader's cache: LD_LIBRARY_PATH comes first)
for n in libcuda.so.1 libnccl.so.2 $(objdump -p "$PLUGIN" | sed -n 's/^ *NEEDED *\(lib\(cuda\|cublas\|nvrtc\)[^ ]*\)$/\1/p'); do
  ln -sf "$(cd "$(dirname "$FAKE")" && pwd)/$(basename "$FAKE")" "$tmp/lib/$n"
done
# the emulator's schedule (tests/cuda_emu: block and thread orders): one
# seed for every process of this part, printed first, so that a failure
# is replayed with DUET_EMU_SEED=N
if [ -z "${DUET_EMU_SEED:-}" ]; then DUET_EMU_SEED=$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); fi
export DUET_EMU_SEED
echo "emulator seed: DUET_EMU_SEED=$DUET_EMU_SEED replays this run's block and thread orders"
LD_LIBRARY_PATH=$tmp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
DUET_CACHE_DIR=$tmp/cache
TMPDIR=$tmp/tmp
GPU_QUICK=1
export LD_LIBRARY_PATH DUET_CACHE_DIR TMPDIR GPU_QUICK
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
# has FILE TEXT NAME: FILE contains the fixed string TEXT
has() {
  if grep -qF -- "$2" "$1"; then ok "$3"; else bad "$3: expected '$2' in:"; tail -5 "$1"; fi
}
# t NAME COMMAND...: the command succeeds (its output kept in the log)
t() {
  name=$1
  shift
  if "$@" > "$tmp/$name.log" 2>&1; then ok "$name"; else bad "$name (exit $?):"; tail -30 "$tmp/$name.log"; fi
  grep -E '^(ok|FAIL|fmnist|step|gpt_kjv|fp16|speed)' "$tmp/$name.log" | grep -v '^ok .* (f..)$' | head -40
}
KJV=${KJV_TEXT:-data/kjv.txt}
TINY="tests/models/gpt_tiny.model --steps 2 --eval-batches 1 --data $KJV"

case $PART in
cli)
  # 1. devices
  "$DUET" devices > "$tmp/dev" 2>&1
  has "$tmp/dev" "cuda:0  fakegpu sm_60 (host emulation), compute capability 6.0, 16.0 GiB, driver 12.8, NVRTC 12.9" devices
  DUET_FAKE_GPUS=2 "$DUET" devices > "$tmp/dev2" 2>&1
  has "$tmp/dev2" "cuda:1  fakegpu sm_60" two_devices
  # a cuda:N device's memory: the card's free memory (cuMemGetInfo; DUET_FAKE_MEM), shared by stages on one GPU
  DUET_FAKE_MEM=100MiB "$DUET" plan tests/models/gpt_tiny.model --devices cuda:0 > "$tmp/mem1" 2>&1
  has "$tmp/mem1" ": 0.86 MiB of 100.00 MiB (cuMemGetInfo: free memory of cuda:0)" device_memory_free
  DUET_FAKE_MEM=100MiB "$DUET" plan tests/models/gpt_tiny.model --devices cuda:0,cuda:0 > "$tmp/mem2" 2>&1
  has "$tmp/mem2" " of 50.00 MiB (cuMemGetInfo: free memory of cuda:0, shared by its stages)" device_memory_shared
  DUET_FAKE_MEM=100MiB "$DUET" run models/gpt_kjv.model --devices cuda:0 --steps 1 > "$tmp/mem3" 2>&1
  has "$tmp/mem3" "duet: error: the model does not fit the memory of cuda:0: it needs 201.67 MiB (weights 12.43, grads 0.00, optimizer state 24.86, activations 164.39 MiB), and 100.00 MiB are available (cuMemGetInfo: free memory of cuda:0): 106613248 bytes too many; what would help: --recompute blocks or auto, --precision fp16 (or bf16), --optimizer-state int8, more --devices (stages), --micro-batches N with --schedule 1f1b, a smaller --batch; duet plan --fit searches them" device_memory_refused
  DUET_FAKE_MEM=100MiB "$DUET" plan tests/models/gpt_tiny.model --devices cuda:0 --device-memory 1GiB > "$tmp/mem4" 2>&1
  has "$tmp/mem4" " of 1.00 GiB (--device-memory 1GiB = 1073741824 bytes)" device_memory_flag
  # 2, 3. target selection and the kernel cache
  DUET_PROGRESS_SECONDS=0.0001 "$DUET" run $TINY --devices cuda:0 > "$tmp/sass" 2>&1
  has "$tmp/sass" "sm_60 SASS compiled by NVRTC 12.9" sass_sm60
  # the NVRTC compile shows that it is alive (progress lines on a pipe; it wakes up every 0.1 s)
  has "$tmp/sass" "duet: progress: compiling 129 kernels with NVRTC 12.9 for sm_60 | " nvrtc_progress
  "$DUET" run $TINY --devices cuda:0 > "$tmp/cached" 2>&1
  has "$tmp/cached" "sm_60 SASS from the kernel cache" kernel_cache
  DUET_FAKE_CC=12.0 DUET_FAKE_NVRTC=12.0 "$DUET" run $TINY --devices cuda:0 > "$tmp/ptx" 2>&1
  has "$tmp/ptx" "compute_90 PTX compiled by NVRTC 12.0" ptx_below_card
  if DUET_FAKE_NVRTC=13.0 "$DUET" run $TINY --devices cuda:0 > "$tmp/nv13" 2>&1; then bad "NVRTC 13 on sm_60 ran"; fi
  has "$tmp/nv13" "fakegpu sm_60 (host emulation) (compute capability 6.0, sm_60) is not supported by NVRTC 13.0, whose oldest target is sm_75; CUDA 12.x supports it" nvrtc13_sm60
  # 4. out of GPU memory: refused by the plan (the card's free memory), and, past the plan with a
  # --device-memory larger than the card, by the allocation
  if DUET_FAKE_MEM=64KiB "$DUET" run $TINY --devices cuda:0 > "$tmp/oomp" 2>&1; then bad "64 KiB GPU ran"; fi
  has "$tmp/oomp" "duet: error: the model does not fit the memory of cuda:0: its weights alone take 0.13 MiB (136704 bytes), more than the 0.06 MiB available (cuMemGetInfo: free memory of cuda:0); only more --devices (stages) or more memory help" out_of_memory_planned
  if DUET_FAKE_MEM=64KiB "$DUET" run $TINY --devices cuda:0 --device-memory 1GiB > "$tmp/oom" 2>&1; then bad "64 KiB GPU ran"; fi
  has "$tmp/oom" "of GPU memory: out of memory" out_of_memory
  ;;
# 5. the gpu-labelled tests
ops)
  t gpu_ops "$B/tests/test_gpu_ops"
  DUET_FAKE_CC=8.0 GPU_OPS_ONLY=bf16 t gpu_ops_bf16_sm80 "$B/tests/test_gpu_ops"
  ;;
train) t gpu_train sh tests/gpu/run_train_gpu.sh "$DUET" ;;
precision) t gpu_precision sh tests/gpu/run_precision_gpu.sh "$DUET" ;;
prune)
  t gpu_prune sh tests/gpu/run_prune_gpu.sh "$DUET"
  t gpu_adamw8 sh tests/gpu/run_adamw8_gpu.sh "$DUET"
  t gpu_quantize sh tests/gpu/run_quantize_gpu.sh "$DUET"
  t gpu_shrink sh tests/gpu/run_shrink_gpu.sh "$DUET"
  ;;
pipeline)
  DUET_FAKE_GPUS=2 t gpu_pipeline_staged sh tests/gpu/run_pipeline_gpu.sh "$DUET"
  has "$tmp/gpu_pipeline_staged.log" "ok pair path (duet: pipeline transfers: stage 0 -> 1 staged through pinned host memory" pair_staged
  DUET_FAKE_GPUS=2 DUET_FAKE_P2P=1 t gpu_pipeline_p2p sh tests/gpu/run_pipeline_gpu.sh "$DUET"
  has "$tmp/gpu_pipeline_p2p.log" "ok pair path (duet: pipeline transfers: stage 0 -> 1 peer-to-peer" pair_p2p
  ;;
offload)
  DUET_FAKE_GPUS=2 t gpu_offload sh tests/gpu/run_offload_gpu.sh "$DUET"
  has "$tmp/gpu_offload.log" "ok two equals off" offload_two_stages
  # the device holds no optimizer state: gpt_tiny needs 136,704 bytes of
  # params + 273,408 of AdamW state + 494,144 of activations (883 KiB) on
  # cuda:0 without offload, 616 KiB with it (one micro-batch: no gradient
  # accumulators); a 700 KiB card runs only the latter (the former is
  # refused at plan time against the card's free memory)
  DUET_FAKE_MEM=700KiB "$DUET" run $TINY --devices cuda:0 > "$tmp/mem_none" 2>&1 && bad "700 KiB: ran without offload"
  has "$tmp/mem_none" "cuda:0 needs 904256 bytes, 187456 more than its 716800" offload_mem_none
  if DUET_FAKE_MEM=700KiB "$DUET" run $TINY --devices cuda:0 --offload optimizer > "$tmp/mem_off" 2>&1; then
    ok "700 KiB: trains with offload"
  else bad "700 KiB: offload did not run:"; tail -3 "$tmp/mem_off"; fi
  ;;
dataparallel)
  DP_PART=local DUET_FAKE_GPUS=4 t gpu_data_parallel sh tests/gpu/run_data_parallel_gpu.sh "$DUET"
  has "$tmp/gpu_data_parallel.log" "ok dp equals ref" same_gpu_replicas
  has "$tmp/gpu_data_parallel.log" "ok dp summed in replica order over shared memory, device-to-device on the GPU" same_gpu_direct
  has "$tmp/gpu_data_parallel.log" "cuda:0,cuda:1: summed by NCCL 2.26.5 (libnccl.so.2 = " nccl_used
  has "$tmp/gpu_data_parallel.log" "ok pair equals ref" two_gpu_replicas_nccl
  has "$tmp/gpu_data_parallel.log" "ok half_pair equals half_ref" two_gpu_replicas_nccl_fp16
  has "$tmp/gpu_data_parallel.log" "ok mlp_pair equals mlp_ref" two_gpu_mlp_nccl
  has "$tmp/gpu_data_parallel.log" "ok mlp_half_pair equals mlp_half_ref" two_gpu_mlp_nccl_fp16
  has "$tmp/gpu_data_parallel.log" "ok pair_shm equals ref" two_gpu_shm
  has "$tmp/gpu_data_parallel.log" "ok pair_nonccl equals ref" two_gpu_no_nccl
  has "$tmp/gpu_data_parallel.log" "ok trio losses within 1e-6 relative of ref3" three_gpu_losses
  # the fake's ring order must show in the last bits with three ranks
  has "$tmp/gpu_data_parallel.log" "trio checkpoint: differs from ref3" three_gpu_ring_order
  has "$tmp/gpu_data_parallel.log" "ok pipe_dp equals pipe_ref" pipeline_replicas_shm
  has "$tmp/gpu_data_parallel.log" "cuda:0,cuda:1,cuda:2,cuda:3: summed by NCCL" pipeline_replicas_nccl_used
  has "$tmp/gpu_data_parallel.log" "ok quad equals pipe_ref" pipeline_replicas_nccl
  # 6. what only the fake can stage
  TWO_GPUS="--devices cuda:0,cuda:1 --data-parallel 2"
  start=$(date +%s)
  DUET_FAKE_GPUS=2 DUET_FAKE_NCCL_HANG=1:2 DUET_PIPE_TIMEOUT=3 timeout 300 "$DUET" run $TINY $TWO_GPUS \
    > "$tmp/hang" 2>&1
  rc=$? secs=$(($(date +%s) - start))
  if [ $rc = 1 ] && [ $secs -le 60 ]; then ok "hung collective: exit 1 after $secs s"
  else bad "hung collective: exit $rc after $secs s (want 1, within 60 s)"; fi
  if grep -qE "^duet: error: replica [01], stage 0: all-reduce of bucket 0: NCCL did not complete it within 3 s; ncclCommAbort ended the communicators of every stage \(raise DUET_PIPE_TIMEOUT if a replica is legitimately this slow\)$" "$tmp/hang"
  then ok "hung collective: $(grep '^duet: error' "$tmp/hang")"; else bad "hung collective: no timeout message:"; tail -3 "$tmp/hang"; fi
  DUET_FAKE_GPUS=2 DUET_FAKE_NCCL=2.28.9 "$DUET" run $TINY $TWO_GPUS > "$tmp/nccl13" 2>&1 || bad "CUDA 13 NCCL, auto: failed"
  has "$tmp/nccl13" "summed in replica order over shared memory (GPU buffers staged through host memory); NCCL not used: NCCL 2.28.9 at " nccl13_fallback
  if DUET_FAKE_GPUS=2 DUET_FAKE_NCCL=2.28.9 DUET_DP_COLLECTIVE=nccl "$DUET" run $TINY $TWO_GPUS > "$tmp/nccl13f" 2>&1
  then bad "CUDA 13 NCCL forced on sm_60 ran"; fi
  has "$tmp/nccl13f" "was built with CUDA 13.0, whose NCCL supports sm_75 and newer: it cannot drive cuda:0 fakegpu sm_60 (host emulation) (sm_60); install an NCCL built with CUDA 12 (pip's nvidia-nccl-cu12, or libnccl2 for CUDA 12.x) and point DUET_NCCL_LIBRARY at its libnccl.so.2" nccl13_forced_error
  DUET_FAKE_GPUS=2 DUET_FAKE_CC=7.5 DUET_FAKE_NCCL=2.28.9 DUET_DP_COLLECTIVE=nccl "$DUET" run $TINY $TWO_GPUS \
    > "$tmp/nccl13_75" 2>&1 || bad "CUDA 13 NCCL on sm_75: failed"
  has "$tmp/nccl13_75" "summed by NCCL 2.28.9 (" nccl13_sm75
  DUET_FAKE_GPUS=2 "$DUET" run $TINY --devices cuda:0 --micro-batches 2 --save "$tmp/p2p_ref.st" > "$tmp/p2p_ref" 2>&1
  DUET_FAKE_GPUS=2 DUET_FAKE_P2P=1 DUET_DP_COLLECTIVE=shm "$DUET" run $TINY $TWO_GPUS --save "$tmp/p2p.st" \
    > "$tmp/p2p" 2>&1 || bad "peer-to-peer shared memory: failed"
  has "$tmp/p2p" "summed in replica order over shared memory, device to device (peer-to-peer between the GPUs)" p2p_shm
  cmp -s "$tmp/p2p_ref.st" "$tmp/p2p.st" && ok "p2p shm checkpoint equals cuda:0 with 2 micro-batches" ||
    bad "p2p shm checkpoint differs from cuda:0 with 2 micro-batches"
  ;;
mpi)
  if ! command -v mpirun > /dev/null 2>&1 || [ ! -f "$B/libduet_mpi.so" ]; then
    echo "SKIP: no mpirun or no MPI plugin ($B/libduet_mpi.so)"
    exit 77
  fi
  MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl tcp,self"
  # Under AddressSanitizer, as tests/run_mpi.sh: Open MPI 4.1 leaks from
  # components it has unloaded (frames nothing can name), so the reports go
  # to files, leaks do not set the exit status, and the part fails on any
  # memory error and on any leak with a frame in duet's own sources.
  mkdir "$tmp/asan"
  ASAN_OPTIONS="log_path=$tmp/asan/report${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  LSAN_OPTIONS="exitcode=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
  export ASAN_OPTIONS LSAN_OPTIONS
  # 7. the GPU script's MPI part: each rank's fake cuda:0 (a process's own fake GPUs)
  DP_PART=mpi DUET_FAKE_GPUS=2 t gpu_data_parallel_mpi sh tests/gpu/run_data_parallel_gpu.sh "$DUET"
  L=$tmp/gpu_data_parallel_mpi.log
  has "$L" "2 MPI ranks on cuda:0 and cuda:1: summed by NCCL 2.26.5 (libnccl.so.2 = " mpi_nccl_used
  has "$L" ", across the ranks (ncclCommInitRank, the unique ids broadcast over MPI (2 ranks, " mpi_nccl_ranks
  has "$L" "ok mpi_pair rank 1 bit-identical to rank 0" mpi_ranks_identical
  has "$L" "ok mpi_pair equals ref" mpi_nccl_gpt
  has "$L" "ok mpi_mlp equals mlp_ref" mpi_nccl_mlp
  has "$L" "ok mpi_shm equals ref" mpi_shm
  has "$L" "ok mpi_nonccl equals ref" mpi_no_nccl
  has "$L" "ok MPI, NCCL missing, nccl forced: duet: rank " mpi_no_nccl_forced
  # 2 ranks x 2-stage pipelines (a communicator per stage) against the one pipeline with 2 micro-batches
  DUET_FAKE_GPUS=2 "$DUET" run $TINY --devices cuda:0,cuda:1 --micro-batches 2 --bucket-mb 0.05 --save "$tmp/pipe_ref.st" \
    --metrics "$tmp/pipe_ref.jsonl" > "$tmp/pipe_ref" 2>&1 || bad "pipeline reference: failed"
  DUET_FAKE_GPUS=2 DUET_DP_CHECK=1 $MPIRUN "$DUET" run $TINY --devices cuda:0,cuda:1 --bucket-mb 0.05 \
    --save "$tmp/pipe_mpi.st" --metrics "$tmp/pipe_mpi.jsonl" > "$tmp/pipe_mpi" 2>&1 || bad "2 ranks x 2 stages: failed"
  # 0.16 MiB: the params' 0.13, and the tied wte's gradient as its two parts (passes/partition.c, tie_grads)
  has "$tmp/pipe_mpi" "2 replicas of 2 stages, each 1 micro-batch of the global batch of 4; 4 all-reduce buckets (0.16 MiB of gradients, --bucket-mb 0.05) summed by NCCL 2.26.5" mpi_pipeline_nccl
  has "$tmp/pipe_mpi" "duet: rank 1: data-parallel check: the params and optimizer state of the 2 replicas (ranks; hashes compared) were bit-identical after each of 2 training steps" mpi_pipeline_identical
  if [ -s "$tmp/pipe_ref.st" ] && cmp -s "$tmp/pipe_ref.st" "$tmp/pipe_mpi.st" && cmp -s "$tmp/pipe_ref.jsonl" "$tmp/pipe_mpi.jsonl"
  then ok "2 ranks x 2 stages equal the pipeline with 2 micro-batches"; else bad "2 ranks x 2 stages differ from the pipeline"; fi
  # --zero 1 across the ranks over NCCL (its all-reduce as the reduce-scatter, ncclBroadcast per tensor as
  # the all-gather; rank 0 gathers the state for the checkpoint over MPI): one GPU with 2 micro-batches' bits
  DUET_FAKE_GPUS=1 "$DUET" run $TINY --devices cuda:0 --micro-batches 2 --save "$tmp/one_ref.st" \
    --metrics "$tmp/one_ref.jsonl" > "$tmp/one_ref" 2>&1 || bad "one GPU reference: failed"
  DUET_FAKE_GPUS=1 DUET_DP_CHECK=1 $MPIRUN "$DUET" run $TINY --devices cuda:0 --zero 1 --save "$tmp/zero_mpi.st" \
    --metrics "$tmp/zero_mpi.jsonl" > "$tmp/zero_mpi" 2>&1 || bad "--zero 1 across ranks: failed"
  has "$tmp/zero_mpi" ", across the ranks (ncclCommInitRank, the unique ids broadcast over MPI (2 ranks, " mpi_zero_nccl
  has "$tmp/zero_mpi" "; --zero 1: the reduce-scatter as NCCL's all-reduce, the all-gather as an ncclBroadcast per tensor from its replica" mpi_zero_says
  has "$tmp/zero_mpi" "duet: rank 1: data-parallel check: the params (the optimizer state is sharded: each holds its own) of the 2 replicas (ranks; hashes compared) were bit-identical after each of 2 training steps" mpi_zero_identical
  if [ -s "$tmp/one_ref.st" ] && cmp -s "$tmp/one_ref.st" "$tmp/zero_mpi.st" && cmp -s "$tmp/one_ref.jsonl" "$tmp/zero_mpi.jsonl"
  then ok "--zero 1 across 2 ranks over NCCL equals one GPU with 2 micro-batches"; else bad "--zero 1 across ranks differs from one GPU"; fi
  # a rank whose collective never starts: ncclCommAbort and MPI_Abort within DUET_PIPE_TIMEOUT
  start=$(date +%s)
  DUET_FAKE_GPUS=1 DUET_FAKE_NCCL_HANG=1:2 DUET_PIPE_TIMEOUT=3 timeout 300 $MPIRUN "$DUET" run $TINY --devices cuda:0 \
    > "$tmp/mpi_hang" 2>&1
  rc=$? secs=$(($(date +%s) - start))
  if [ $rc != 0 ] && [ $rc != 124 ] && [ $secs -le 60 ]; then ok "hung collective across ranks: exit $rc after $secs s"
  else bad "hung collective across ranks: exit $rc after $secs s (want non-zero, within 60 s)"; fi
  if grep -qE "^duet: rank [01]: error: replica [01], stage 0: all-reduce of bucket 0: NCCL did not complete it within 3 s; ncclCommAbort ended the communicators of every stage \(raise DUET_PIPE_TIMEOUT if a replica is legitimately this slow\)$" "$tmp/mpi_hang"
  then ok "hung collective across ranks: $(grep '^duet: rank .: error' "$tmp/mpi_hang" | head -1)"; else bad "hung collective across ranks: no timeout message:"; tail -5 "$tmp/mpi_hang"; fi
  # NCCL forced on CPU devices: before compiling, on every rank
  DUET_DP_COLLECTIVE=nccl $MPIRUN "$DUET" run $TINY > "$tmp/mpi_cpu" 2>&1 && bad "NCCL forced on CPU ranks ran"
  # (the first rank to fail ends the others with MPI_Abort, maybe before they print)
  if grep -qE "^duet: rank ([01]): error: DUET_DP_COLLECTIVE=nccl: rank \1's stage 0 is on cpu:0, and NCCL connects GPUs$" "$tmp/mpi_cpu"
  then ok "NCCL forced on CPU ranks: $(grep '^duet: rank .: error' "$tmp/mpi_cpu" | head -1)"; else bad "NCCL forced on CPU ranks: no error:"; tail -3 "$tmp/mpi_cpu"; fi
  ROOT=$(pwd)
  for f in "$tmp"/asan/report.*; do
    [ -e "$f" ] || continue
    if grep -q 'ERROR: AddressSanitizer\|runtime error:' "$f"; then bad "a sanitizer report ($f)"; head -30 "$f"; continue; fi
    if awk -v root="$ROOT/" '/^(Direct|Indirect) leak/ { keep = 0; block = $0; next }
      /^ *#[0-9]+ / { block = block "\n" $0; i = index($0, " " root)   # a source line of duet: " ROOT/dir/file.c:LINE"
                      if (i && substr($0, i + 1 + length(root)) ~ /^[^ ()]*\.[ch]:[0-9]/) keep = 1; next }
      /^$/ { if (keep) { print block; found = 1 } keep = 0 }
      END { exit !found }' "$f"; then bad "a leak in duet's code ($f, above)"; fi
  done
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
