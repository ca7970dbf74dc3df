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
#     fake GPUs without and with peer access) and run_prune_gpu.sh.
# Parts (ctest runs each as its own test): cli (1-4), ops, train,
# precision, pipeline, prune (5).  The emulator's seed (DUET_EMU_SEED, README
# "The emulator") is printed first, one for the whole part.  Skips (77) when the plugin or the fake was not
# built (no CUDA toolkit) or there is no C++ compiler.
# usage: run_fakegpu.sh BUILD_DIR PART   (from the repository root)
B=${1:?usage: run_fakegpu.sh BUILD_DIR cli|ops|train|precision|pipeline|prune}
PART=${2:?usage: run_fakegpu.sh BUILD_DIR cli|ops|train|precision|pipeline|prune}
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
# the names the plugin asks the loader for, and the driver duet probes
for n in libcuda.so.1 $(objdump -p "$PLUGIN" | sed -n 's/^ *NEEDED *\(lib\(cuda\|cublas\|nvrtc\)[^ ]*\)$/\1/p'); do
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
  # 2, 3. target selection and the kernel cache
  "$DUET" run $TINY --devices cuda:0 > "$tmp/sass" 2>&1
  has "$tmp/sass" "sm_60 SASS compiled by NVRTC 12.9" sass_sm60
  "$DUET" run $TINY --devices cuda:0 > "$tmp/cached" 2>&1
  has "$tmp/cached" "sm_60 SASS from the kernel cache" kernel_cache
  DUET_FAKE_CC=12.0 DUET_FAKE_NVRTC=12.0 "$DUET" run $TINY --devices cuda:0 > "$tmp/ptx" 2>&1
  has "$tmp/ptx" "compute_90 PTX compiled by NVRTC 12.0" ptx_below_card
  if DUET_FAKE_NVRTC=13.0 "$DUET" run $TINY --devices cuda:0 > "$tmp/nv13" 2>&1; then bad "NVRTC 13 on sm_60 ran"; fi
  has "$tmp/nv13" "fakegpu sm_60 (host emulation) (compute capability 6.0, sm_60) is not supported by NVRTC 13.0, whose oldest target is sm_75; CUDA 12.x supports it" nvrtc13_sm60
  # 4. out of GPU memory
  if DUET_FAKE_MEM=64KiB "$DUET" run $TINY --devices cuda:0 > "$tmp/oom" 2>&1; then bad "64 KiB GPU ran"; fi
  has "$tmp/oom" "of GPU memory: out of memory" out_of_memory
  ;;
# 5. the gpu-labelled tests
ops)
  t gpu_ops "$B/tests/test_gpu_ops"
  DUET_FAKE_CC=8.0 GPU_OPS_ONLY=bf16 t gpu_ops_bf16_sm80 "$B/tests/test_gpu_ops"
  ;;
train) t gpu_train sh tests/gpu/run_train_gpu.sh "$DUET" ;;
precision) t gpu_precision sh tests/gpu/run_precision_gpu.sh "$DUET" ;;
prune) t gpu_prune sh tests/gpu/run_prune_gpu.sh "$DUET" ;;
pipeline)
  DUET_FAKE_GPUS=2 t gpu_pipeline_staged sh tests/gpu/run_pipeline_gpu.sh "$DUET"
  has "$tmp/gpu_pipeline_staged.log" "ok pair path (duet: pipeline transfers: stage 0 -> 1 staged through pinned host memory" pair_staged
  DUET_FAKE_GPUS=2 DUET_FAKE_P2P=1 t gpu_pipeline_p2p sh tests/gpu/run_pipeline_gpu.sh "$DUET"
  has "$tmp/gpu_pipeline_p2p.log" "ok pair path (duet: pipeline transfers: stage 0 -> 1 peer-to-peer" pair_p2p
  ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
