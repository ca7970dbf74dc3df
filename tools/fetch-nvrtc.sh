#!/bin/sh
# Fetches older NVRTC libraries (CUDA 12.x, 11.8) from NVIDIA's PyPI wheels,
# for the test that compiles every generated kernel for the P100 (sm_60)
# with the NVRTC a P100 user runs (tests/test_nvrtc_sm60.c, ctest
# nvrtc_sm60_*).  CUDA 13's NVRTC no longer targets sm_60.
#
# usage: tools/fetch-nvrtc.sh DIR [VERSION...]
#   default VERSIONs: 12.9.86 (CUDA 12.9, the last toolkit for Pascal) and
#   11.8.89 (CUDA 11.8, Debian 12's non-free toolkit); 12.4.127 and 12.0.76
#   (the oldest 12.x) are known too.
# Each version ends up in DIR/VERSION/ as lib/libnvrtc.so.* (with its
# libnvrtc-builtins), include/nvrtc.h and WHEEL (the wheel's name and
# sha256).  Only the pinned wheels below are accepted: pip checks each
# download against its sha256 (--require-hashes) and this script checks it
# again (tools/fetch-wheel.sh).  A version already present with the same
# sha256 is not downloaded again.  Needs python3 with pip (Debian:
# python3-pip) and the network (PyPI); exits 1 with a message when either is
# missing.  x86_64 only.
# Download sizes: 12.9.86 about 90 MB, 12.4.127, 12.0.76 and 11.8.89 about
# 23-25 MB each; unpacked about 114 MB and 60-66 MB.
set -eu

die() {
  echo "tools/fetch-nvrtc.sh: $*" >&2
  exit 1
}

[ $# -ge 1 ] || die "usage: tools/fetch-nvrtc.sh DIR [VERSION...] (default versions: 12.9.86 11.8.89)"
dir=$1
shift
[ $# -ge 1 ] || set -- 12.9.86 11.8.89

# version -> package, wheel file, sha256 (of the wheel on PyPI)
pinned() {
  case $1 in
  12.9.86)
    pkg=nvidia-cuda-nvrtc-cu12
    whl=nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
    sha=210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4
    ;;
  12.4.127)
    pkg=nvidia-cuda-nvrtc-cu12
    whl=nvidia_cuda_nvrtc_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl
    sha=a178759ebb095827bd30ef56598ec182b85547f1508941a3d560eb7ea1fbf338
    ;;
  12.0.76)
    pkg=nvidia-cuda-nvrtc-cu12
    whl=nvidia_cuda_nvrtc_cu12-12.0.76-py3-none-manylinux1_x86_64.whl
    sha=8dd4458a7d8bf8fd2b01a34a9069856d53a9b4c0af2037b77c12b270daf9c828
    ;;
  11.8.89)
    pkg=nvidia-cuda-nvrtc-cu11
    whl=nvidia_cuda_nvrtc_cu11-11.8.89-py3-none-manylinux2014_x86_64.whl
    sha=a8d02f3cba345be56b1ffc3e74d8f61f02bb758dd31b0f20e12277a5a244f756
    ;;
  *) die "no pinned wheel for NVRTC $1 (known: 12.9.86 12.4.127 12.0.76 11.8.89); add its sha256 to this script" ;;
  esac
}

here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fetch-nvrtc.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

for v in "$@"; do
  pinned "$v"
  out=$dir/$v
  if [ -f "$out/WHEEL" ] && grep -q "$sha" "$out/WHEEL" && ls "$out"/lib/libnvrtc.so.* > /dev/null 2>&1; then
    echo "tools/fetch-nvrtc.sh: NVRTC $v already in $out"
    continue
  fi
  sh "$here/fetch-wheel.sh" "$pkg" "$v" "$sha" "$whl" "$tmp/dl" ||
    die "NVRTC $v not fetched: the sm_60 NVRTC test will be skipped"
  # only the library, its builtins and nvrtc.h (12.9's alternative .alt. libraries are not used)
  rm -rf "$out" "$out.tmp"
  python3 - "$tmp/dl/$whl" "$out.tmp" << 'EOF' || die "cannot unpack $whl"
import os, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(whl) as z:
    for m in z.infolist():
        p = m.filename
        if not p.startswith("nvidia/cuda_nvrtc/") or p.endswith("/") or ".alt." in p:
            continue
        rel = p[len("nvidia/cuda_nvrtc/"):]
        if not (rel.startswith("lib/") or rel.startswith("include/")) or rel.endswith("__init__.py"):
            continue
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with z.open(m) as src, open(dst, "wb") as f:
            f.write(src.read())
        os.chmod(dst, 0o755 if rel.startswith("lib/") else 0o644)
        n += 1
if n == 0:
    sys.exit("no nvidia/cuda_nvrtc/ files in " + whl)
EOF
  ls "$out.tmp"/lib/libnvrtc.so.* > /dev/null 2>&1 || die "$whl holds no lib/libnvrtc.so.*"
  [ -f "$out.tmp/include/nvrtc.h" ] || die "$whl holds no include/nvrtc.h"
  echo "$whl $sha" > "$out.tmp/WHEEL"
  mv "$out.tmp" "$out"
  rm -rf "$tmp/dl"
  echo "tools/fetch-nvrtc.sh: NVRTC $v in $out ($(du -sh "$out" | cut -f1))"
done
