# tests/gpu/common.sh: the preamble the GPU test scripts share
# (tests/gpu/run_*_gpu.sh), sourced by each right after it sets DUET:
#
#   . "$(dirname "$0")/common.sh"
#
# Sets GPU_DEVICE (default cuda; cpu dry-runs a script on the CPU) and
# defines
#   gpu_require   with a GPU_DEVICE other than cpu and no cuda:0 in `duet
#                 devices`: exits 77 (ctest SKIP) with "SKIP: no GPU: WHY"
#                 where there is no GPU (no CUDA driver, no device: CUresult
#                 34, 100), else exits 1 with "FAIL: a CUDA driver is present
#                 but the GPU backend is unusable: WHY" (WHY: the cuda line of
#                 `duet devices`);
#   gpu_fmnist    for the Fashion-MNIST scripts: ARGS (GPU_QUICK=1, the
#                 fake GPU: --train-subset 2560 --test-subset 1000; else
#                 empty), gpu_require, FMNIST_DIR (default the Debian
#                 package's) and, without the data there, "FAIL: no
#                 Fashion-MNIST in DIR (set FMNIST_DIR)" and exit 1;
#   gpu_workdir   tmp, a fresh directory removed on exit; pass=0 fail=0; and
#                 ok NAME / bad NAME, which print "ok NAME" / "FAIL NAME" and
#                 count.
# Each script calls them where its own checks put them (after the
# variables its skip and data checks read).
GPU_DEVICE=${GPU_DEVICE:-cuda}

gpu_require() {
  if [ "$GPU_DEVICE" != cpu ] && ! "$DUET" devices | grep -q '^cuda:0 '; then
    why=$("$DUET" devices | grep '^cuda')
    case "$why" in
      *"no CUDA driver"*|*"reports no GPU"*|*"CUresult 34)"*|*"CUresult 100)"*) echo "SKIP: no GPU: $why"; exit 77 ;;
    esac
    echo "FAIL: a CUDA driver is present but the GPU backend is unusable: $why"
    exit 1
  fi
}

gpu_fmnist() {
  if [ "${GPU_QUICK:-0}" = 1 ]; then ARGS="--train-subset 2560 --test-subset 1000"; else ARGS=; fi
  gpu_require
  FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
  [ -f "$FMNIST_DIR/train-images-idx3-ubyte.gz" ] || { echo "FAIL: no Fashion-MNIST in $FMNIST_DIR (set FMNIST_DIR)"; exit 1; }
}

gpu_workdir() {
  tmp=$(mktemp -d) || exit 1
  trap 'rm -rf "$tmp"' EXIT
  pass=0 fail=0
}
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
