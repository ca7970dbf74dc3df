#!/bin/sh
# Header compatibility of the CUDA backend, run by hand (not in CI: the
# cuBLAS wheels are 370-580 MB each): compiles runtime/cuda/plugin.c, nccl.c,
# nccl_lib.c, nvrtc.c and nvrtc_lib.c (object files, -std=c11 -Wall -Wextra -Werror)
# against the headers of each CUDA version, taken from NVIDIA's PyPI wheels
# (pinned by sha256):
#   cuda.h (driver API) and the runtime headers cublas_api.h includes:
#     nvidia-cuda-runtime-cuXX
#   nvrtc.h: nvidia-cuda-nvrtc-cuXX
#   cublas_v2.h: nvidia-cublas-cuXX
# and checks that every cublas* / nvrtc* symbol the objects call is
# exported by that version's libcublas / libnvrtc (nm -D), and every cu*
# driver symbol by the installed toolkit's libcuda stub (CUDA 13.0's, the
# R580 driver's API: R580 is the last driver branch for Pascal), when there
# is one.  The installed toolkit's own headers (/usr/local/cuda, or
# $CUDA_HOME) are checked too, as a control.
#
# usage: tools/check-cuda-headers.sh [DIR] [VERSION...]
#   DIR: where the headers and symbol lists go (default .cuda-headers,
#   git-ignored; about 25 MB per version; the wheels themselves are deleted
#   after unpacking).  VERSIONs: 11.8 and 12.9 by default; 12.0 is known too.
# Exits 1 when a compile or a symbol check fails.
set -eu

die() {
  echo "tools/check-cuda-headers.sh: $*" >&2
  exit 1
}

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
dir=${1:-.cuda-headers}
[ $# -ge 1 ] && shift
[ $# -ge 1 ] || set -- 11.8 12.9
CC=${CC:-cc}
command -v nm > /dev/null 2>&1 || die "nm not found (binutils)"

# version -> three "package version sha256 wheel" lines
pinned() {
  case $1 in
  11.8)
    cat << 'EOF'
nvidia-cuda-runtime-cu11 11.8.89 92d04069a987e1fbc9213f8376d265df0f7bb42617d44f5eda1f496acea7f2d1 nvidia_cuda_runtime_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl
nvidia-cuda-nvrtc-cu11 11.8.89 a8d02f3cba345be56b1ffc3e74d8f61f02bb758dd31b0f20e12277a5a244f756 nvidia_cuda_nvrtc_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl
nvidia-cublas-cu11 11.11.3.6 60252822adea5d0b10cd990a7dc7bedf7435f30ae40083c7a624a85a43225abc nvidia_cublas_cu11-11.11.3.6-py3-none-manylinux2014_x86_64.whl
EOF
    ;;
  12.0)
    cat << 'EOF'
nvidia-cuda-runtime-cu12 12.0.107 9ab985dd92728e1c577bb75ae83dcc42357ce7c00016c782e8b196f6fea05b91 nvidia_cuda_runtime_cu12-12.0.107-py3-none-manylinux1_x86_64.whl
nvidia-cuda-nvrtc-cu12 12.0.76 8dd4458a7d8bf8fd2b01a34a9069856d53a9b4c0af2037b77c12b270daf9c828 nvidia_cuda_nvrtc_cu12-12.0.76-py3-none-manylinux1_x86_64.whl
nvidia-cublas-cu12 12.0.1.189 f366475992ddfd5ef3e922457df1238b52ddcf63abecd48522130bd5eedfae77 nvidia_cublas_cu12-12.0.1.189-py3-none-manylinux1_x86_64.whl
EOF
    ;;
  12.9)
    cat << 'EOF'
nvidia-cuda-runtime-cu12 12.9.79 25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3 nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
nvidia-cuda-nvrtc-cu12 12.9.86 210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4 nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
nvidia-cublas-cu12 12.9.1.4 453611eb21a7c1f2c2156ed9f3a45b691deda0440ec550860290dc901af5b4c2 nvidia_cublas_cu12-12.9.1.4-py3-none-manylinux_2_27_x86_64.whl
EOF
    ;;
  *) die "no pinned wheels for CUDA $1 (known: 11.8 12.0 12.9)" ;;
  esac
}

mkdir -p "$dir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-cuda-headers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# DIR/VERSION/include (every header of the three wheels), symbols.txt
# (what libcublas and libnvrtc export), WHEELS (what they came from)
fetch() {
  v=$1 out=$dir/$1
  pinned "$v" > "$tmp/pins"
  if [ -f "$out/WHEELS" ] && cmp -s "$tmp/pins" "$out/WHEELS"; then
    echo "CUDA $v: headers already in $out"
    return 0
  fi
  rm -rf "$out" "$out.tmp"
  mkdir -p "$out.tmp/include"
  : > "$out.tmp/symbols.txt"
  while read -r pkg ver sha whl; do
    echo "CUDA $v: $pkg $ver"
    sh "$here/fetch-wheel.sh" "$pkg" "$ver" "$sha" "$whl" "$tmp/dl" || die "cannot fetch $pkg $ver"
    python3 - "$tmp/dl/$whl" "$out.tmp/include" "$tmp/lib" << 'EOF' || die "cannot unpack $whl"
import os, sys, zipfile
whl, inc, lib = sys.argv[1:4]
os.makedirs(lib, exist_ok=True)
with zipfile.ZipFile(whl) as z:
    for m in z.infolist():
        parts = m.filename.split("/")
        if len(parts) < 4 or parts[0] != "nvidia" or m.filename.endswith("/"):
            continue
        name = parts[-1]
        if parts[2] == "include" and name != "__init__.py":
            dst = os.path.join(inc, *parts[3:])
        elif parts[2] == "lib" and (name.startswith("libcublas.so.") or name.startswith("libnvrtc.so.")):
            dst = os.path.join(lib, name)
        else:
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with z.open(m) as s, open(dst, "wb") as f:
            while True:
                b = s.read(1 << 20)
                if not b:
                    break
                f.write(b)
EOF
    for l in "$tmp"/lib/*; do
      [ -f "$l" ] || continue
      nm -D --defined-only "$l" | awk '{sub(/@.*/, "", $NF); print $NF}' >> "$out.tmp/symbols.txt" || die "nm -D $l failed"
    done
    rm -rf "$tmp/dl" "$tmp/lib"
  done < "$tmp/pins"
  for h in cuda.h nvrtc.h cublas_v2.h; do
    [ -f "$out.tmp/include/$h" ] || die "CUDA $v: no $h in the wheels"
  done
  cp "$tmp/pins" "$out.tmp/WHEELS"
  mv "$out.tmp" "$out"
}

# compiles the backend against include dir $2 (label $1); symbols from $3
# (may be empty: not checked); the driver's from $4 (may be empty)
fails=0
check() {
  label=$1 inc=$2 syms=$3 drv=$4
  cv=$(printf '#include <cuda.h>\nCUDA_VERSION\n' | $CC -E -P -I"$inc" - 2> /dev/null | tail -n 1)
  ok=1
  : > "$tmp/undef"
  for f in runtime/cuda/plugin.c runtime/cuda/nccl.c runtime/cuda/nccl_lib.c runtime/cuda/nvrtc.c runtime/cuda/nvrtc_lib.c; do
    if ! $CC -std=c11 -Wall -Wextra -Werror -c -o "$tmp/obj.o" -I"$inc" "$src/$f" 2> "$tmp/cc.log"; then
      echo "FAIL $label: $f does not compile against $inc:" >&2
      cat "$tmp/cc.log" >&2
      ok=0
      continue
    fi
    nm -u "$tmp/obj.o" | awk '{print $NF}' >> "$tmp/undef"
  done
  what="plugin.c, nccl.c, nccl_lib.c, nvrtc.c, nvrtc_lib.c compile (-Werror)"
  if [ -n "$syms" ]; then
    n=0
    for s in $(grep -E '^(cublas|nvrtc)' "$tmp/undef" | sort -u); do
      n=$((n + 1))
      grep -qx "$s" "$syms" || { echo "FAIL $label: $s is not exported by this version's libcublas/libnvrtc" >&2; ok=0; }
    done
    what="$what; $n cublas/nvrtc symbols exported"
  fi
  if [ -n "$drv" ]; then
    n=0
    for s in $(grep -E '^cu[A-Z]' "$tmp/undef" | sort -u); do
      n=$((n + 1))
      grep -qx "$s" "$drv" || { echo "FAIL $label: $s is not exported by the driver stub" >&2; ok=0; }
    done
    what="$what; $n driver symbols in the libcuda stub"
  fi
  if [ $ok = 1 ]; then
    echo "ok   $label (CUDA_VERSION $cv): $what"
  else
    echo "FAIL $label (CUDA_VERSION $cv)"
    fails=$((fails + 1))
  fi
}

for v in "$@"; do fetch "$v"; done

cuda=${CUDA_HOME:-/usr/local/cuda}
drv=""
if [ -f "$cuda/lib64/stubs/libcuda.so" ]; then
  nm -D --defined-only "$cuda/lib64/stubs/libcuda.so" | awk '{sub(/@.*/, "", $NF); print $NF}' > "$tmp/driver.txt"
  drv=$tmp/driver.txt
  echo "driver symbols: $cuda/lib64/stubs/libcuda.so"
else
  echo "driver symbols: not checked (no $cuda/lib64/stubs/libcuda.so)"
fi
for v in "$@"; do check "CUDA $v (wheels)" "$dir/$v/include" "$dir/$v/symbols.txt" "$drv"; done
if [ -f "$cuda/include/cuda.h" ]; then
  check "installed toolkit $cuda" "$cuda/include" "" "$drv"
else
  echo "installed toolkit: none at $cuda (set CUDA_HOME)"
fi
[ $fails = 0 ] || die "$fails header set(s) failed"
echo "tools/check-cuda-headers.sh: ok"
