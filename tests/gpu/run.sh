#!/bin/sh
# tests/gpu/run.sh [OUTDIR]: the one command to run on a machine with a GPU.
# Builds duet with the CUDA backend (DUET_CUDA=ON) into build-gpu/, runs the
# CUDA tests that need no GPU (nvrtc_compile*, cuda_target, cuda_cli) and
# the gpu-labelled tests (gpu_ops, gpu_train, gpu_precision, gpu_pipeline, gpu_prune),
# measures the kernel cache (first run compiles with NVRTC, second loads),
# reports the pipeline's transfer paths and tokens/s on one GPU acting as
# two devices (cuda:0,cuda:0) and, with two GPUs, on cuda:0,cuda:1, runs
# the data-parallel checks (tests/gpu/run_data_parallel_gpu.sh: one GPU as
# two replicas; with two GPUs NCCL against one GPU with micro-batches, the
# collective forced each way, NCCL missing; with three, NCCL's order) and
# the data-parallel benchmark (bench/gpu_data_parallel.sh: with two or more
# GPUs NCCL's all-reduce bus bandwidth, 2(N-1)/N x bytes / time, and
# gpt_kjv on cuda:0,cuda:1 with the overlap of its all-reduces achieved;
# one GPU as two replicas), runs the GPU benchmark
# (bench/gpu_gpt2.sh: duet vs PyTorch on GPT-2 small; bench/gpu_prune_quant.sh:
# evaluation time and device bytes with pruning, --shrink and int8) and writes
# OUTDIR/report.md (default build/gpu-report/) with every log next to it.
# What needs two (or three) GPUs is skipped on a machine with fewer.
#
# Build dependencies on a machine without a package registry: when flex,
# bison, OpenBLAS or cJSON are missing, the Debian packages that
# tools/fetch-debs.sh downloaded into .debs/ (or $DUET_DEBS) are unpacked
# with `dpkg -x` (or ar + tar where dpkg is absent) into build-gpu/prefix
# and used from there; Fashion-MNIST comes from the same packages.  The KJV
# text must be carried as data/kjv.txt (`make data` writes it).
# Environment: FORCE_PREFIX=1 uses the carried packages even when the
# system has the tools; BENCH=0 skips the benchmark; RUN_PARTS (default
# "tests cache pipe dp bench") runs only the parts named, after the build.
# usage: sh tests/gpu/run.sh [OUTDIR]   (from the repository root)
set -u
OUT=${1:-build/gpu-report}
BUILD=${BUILD_GPU:-build-gpu}
[ -f models/gpt2_124m.model ] || { echo "tests/gpu/run.sh: run me from the repository root" >&2; exit 2; }
mkdir -p "$OUT" "$BUILD" || exit 2
OUT=$(cd "$OUT" && pwd)
say() { echo "run.sh: $*"; echo "$*" >> "$OUT/report.md.tmp"; }
: > "$OUT/report.md.tmp"
echo "# duet GPU report ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))" > "$OUT/report.md.tmp"
echo >> "$OUT/report.md.tmp"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >> "$OUT/nvidia-smi.txt"
say "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
say "- CUDA toolkit: $( (/usr/local/cuda/bin/nvcc --version || nvcc --version) 2>/dev/null | grep release | sed 's/.*release //')"

# ------------------------------------------------------------ dependencies
need=0
for tool in flex bison; do command -v $tool > /dev/null 2>&1 || need=1; done
[ -f /usr/include/cjson/cJSON.h ] || need=1
ls /usr/lib/x86_64-linux-gnu/libopenblas*.so* /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas*.so* > /dev/null 2>&1 || need=1
[ "${FORCE_PREFIX:-0}" = 1 ] && need=1
CMAKE_EXTRA=""
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ $need = 1 ]; then
  DEBS=${DUET_DEBS:-.debs}
  ls "$DEBS"/*.deb > /dev/null 2>&1 || { echo "run.sh: build dependencies missing and no packages in $DEBS: run tools/fetch-debs.sh where apt works and carry $DEBS" >&2; exit 2; }
  PREFIX=$(pwd)/$BUILD/prefix
  mkdir -p "$PREFIX"
  for f in "$DEBS"/*.deb; do
    if command -v dpkg > /dev/null 2>&1; then dpkg -x "$f" "$PREFIX" || exit 2
    else (tmpd=$(mktemp -d) && cd "$tmpd" && ar x "$OLDPWD/$f" && tar -xf data.tar.* -C "$PREFIX" && rm -rf "$tmpd") || exit 2; fi
  done
  LIB=$PREFIX/usr/lib/x86_64-linux-gnu
  PATH=$PREFIX/usr/bin:$PATH
  M4=$PREFIX/usr/bin/m4
  BISON_PKGDATADIR=$PREFIX/usr/share/bison
  LD_LIBRARY_PATH=$LIB:$LIB/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH M4 BISON_PKGDATADIR LD_LIBRARY_PATH
  CMAKE_EXTRA="-DOPENBLAS_LIB=$LIB/openblas-openmp/libopenblas.so -DCBLAS_INCLUDE=$PREFIX/usr/include/x86_64-linux-gnu/openblas-openmp -DCJSON_LIB=$LIB/libcjson.so -DCJSON_INCLUDE=$PREFIX/usr/include -DFLEX_EXECUTABLE=$PREFIX/usr/bin/flex -DBISON_EXECUTABLE=$PREFIX/usr/bin/bison"
  [ -f /usr/include/zlib.h ] || CMAKE_EXTRA="$CMAKE_EXTRA -DZLIB_INCLUDE_DIR=$PREFIX/usr/include -DZLIB_LIBRARY=$LIB/libz.so"
  [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ] || FMNIST_DIR=$PREFIX/usr/share/datasets/fashion-mnist
  say "- build dependencies: the carried packages in $DEBS, unpacked into $BUILD/prefix"
else
  say "- build dependencies: the system's"
fi
export FMNIST_DIR
KJV_TEXT=${KJV_TEXT:-$(pwd)/data/kjv.txt}
export KJV_TEXT

# -------------------------------------------------------------------- build
# shellcheck disable=SC2086
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDUET_CUDA=ON $CMAKE_EXTRA > "$OUT/build.log" 2>&1 ||
   ! cmake --build "$BUILD" -j"$(nproc)" >> "$OUT/build.log" 2>&1; then
  say "- build: FAILED (see build.log)"; tail -30 "$OUT/build.log"
  mv "$OUT/report.md.tmp" "$OUT/report.md"; exit 1
fi
say "- build: ok ($BUILD)"
"$BUILD/duet" devices > "$OUT/devices.txt" 2>&1
say ""; say '```'; while IFS= read -r l; do say "$l"; done < "$OUT/devices.txt"; say '```'

RUN_PARTS=${RUN_PARTS:-tests cache pipe dp bench}
part() { case " $RUN_PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# -------------------------------------------------------------------- tests
status=0
export DUET_CACHE_DIR="$(pwd)/$BUILD/test-cache" OMP_WAIT_POLICY=PASSIVE
if part tests; then
(cd "$BUILD" && ctest --output-on-failure -R 'nvrtc|cuda_target|cuda_cli' > "$OUT/cuda-tests.log" 2>&1) || status=1
(cd "$BUILD" && ctest --output-on-failure -L gpu > "$OUT/gpu-tests.log" 2>&1) || status=1
say ""; say "## Tests"; say ""
for f in cuda-tests gpu-tests; do
  say "- $f: $(grep -E 'tests passed|tests failed' "$OUT/$f.log" | tail -1)"
  grep -E '^ *[0-9]+/[0-9]+ Test' "$OUT/$f.log" | sed 's/^ */  - /' | while IFS= read -r l; do say "$l"; done
done
grep -E 'fmnist_mlp 1 epoch|^speed |^ok |^FAIL' "$OUT/gpu-tests.log" | head -60 > "$OUT/gpu-tests-summary.txt"
fi

# ------------------------------------------------------------- kernel cache
if part cache; then
cache=$(mktemp -d)
for run in 1 2; do
  DUET_CACHE_DIR=$cache "$BUILD/duet" run models/gpt_kjv.model --devices cuda --steps 1 --no-eval --data "$KJV_TEXT" \
    > "$OUT/cache-run$run.log" 2>&1 || status=1
done
rm -rf "$cache"
say ""; say "## Kernel cache (gpt_kjv, fresh cache directory)"; say ""
for run in 1 2; do
  line=$(grep 'duet: cuda:' "$OUT/cache-run$run.log" | sed 's/^duet: //')
  say "- run $run: ${line:-$(tail -1 "$OUT/cache-run$run.log")}"
done
fi

# ------------------------------------------------------ pipeline transfers
# gpt_kjv, 4 micro-batches: one device, one GPU as two devices (direct and
# pinned-host staging), and two GPUs where present
if part pipe; then
say ""; say "## Pipeline transfers (gpt_kjv, 10 steps, 4 micro-batches)"; say ""
pipe_devs="cuda:0 cuda:0,cuda:0 host:cuda:0,cuda:0"
"$BUILD/duet" devices | grep -q '^cuda:1 ' && pipe_devs="$pipe_devs cuda:0,cuda:1 host:cuda:0,cuda:1"
for dv in $pipe_devs; do
  staging=auto
  case $dv in host:*) staging=host dv=${dv#host:} ;; esac
  log="$OUT/pipe-$(echo "$dv" | tr ':,' '__')-$staging.log"
  DUET_PIPE_STAGING=$staging "$BUILD/duet" run models/gpt_kjv.model --devices "$dv" --micro-batches 4 --steps 10 \
    --no-eval --data "$KJV_TEXT" > "$log" 2>&1 || status=1
  rate=$(sed -n 's/.*trained .* (\([0-9.]*\) tokens\/s).*/\1/p' "$log" | tail -1)
  paths=$(sed -n 's/^duet: pipeline transfers: //p' "$log")
  if [ -n "$rate" ]; then say "- $dv (DUET_PIPE_STAGING=$staging): $rate tokens/s; ${paths:-one device, no transfers}"
  else say "- $dv (DUET_PIPE_STAGING=$staging): FAILED: $(tail -1 "$log")"; fi
done
fi

# ------------------------------------------------------ data parallelism
# the checks (also in ctest -L gpu; here with their output), then the
# benchmark: NCCL bus bandwidth and overlap with two or more GPUs
if part dp; then
sh tests/gpu/run_data_parallel_gpu.sh "$BUILD/duet" > "$OUT/dp-checks.log" 2>&1
rc=$?
[ $rc = 0 ] || [ $rc = 77 ] || status=1
say ""; say "## Data-parallel checks (tests/gpu/run_data_parallel_gpu.sh: exit $rc, 77 = a part needed more GPUs)"; say ""
grep -E '^(ok|FAIL|skip|cuda:0,|3 GPUs|trio)' "$OUT/dp-checks.log" | sed 's/^/- /' | while IFS= read -r l; do say "$l"; done
say ""
sh bench/gpu_data_parallel.sh "$BUILD" "$OUT/dp-bench" > "$OUT/dp-bench.md" 2> "$OUT/dp-bench.err" || status=1
while IFS= read -r l; do say "$l"; done < "$OUT/dp-bench.md"
fi

# --------------------------------------------------------------- benchmark
if [ "${BENCH:-1}" != 0 ] && part bench; then
  sh bench/gpu_gpt2.sh "$BUILD" "$OUT" > "$OUT/bench.log" 2>&1 || status=1
  say ""; say "## Benchmark (bench/gpu_gpt2.sh)"; say ""; say '```'
  sed -n '/^gpt2_124m training/,$p' "$OUT/bench.log" | while IFS= read -r l; do say "$l"; done
  say '```'
  FMNIST_DIR=$FMNIST_DIR sh bench/gpu_prune_quant.sh "$BUILD" "$OUT" > "$OUT/bench_pq.log" 2>&1 || status=1
  say ""; say "## Pruning and int8 at evaluation (bench/gpu_prune_quant.sh)"; say ""; say '```'
  while IFS= read -r l; do say "$l"; done < "$OUT/bench_pq.log"
  say '```'
fi
say ""; say "status: $([ $status = 0 ] && echo ok || echo FAILED; true)"
mv "$OUT/report.md.tmp" "$OUT/report.md"
echo "run.sh: wrote $OUT/report.md"
exit $status
