#!/bin/sh
# Downloads (does not install) the Debian packages that tests/gpu/run.sh
# unpacks with `dpkg -x` on a GPU machine that has CUDA, CMake, a C compiler
# and PyTorch but no package registry: flex, bison (+ m4), OpenBLAS (OpenMP
# build, + libgfortran5), cJSON, zlib headers, and the Fashion-MNIST data.
# Run it here (where apt works), then carry .debs/ and data/kjv.txt (make
# data) to the GPU machine with the checkout: about 51 MB in all.
# usage: tools/fetch-debs.sh [DIR]   (default .debs, gitignored)
set -eu
dir=${1:-.debs}
mkdir -p "$dir"
cd "$dir"
# apt-get download writes into the current directory as the calling user
apt-get download flex libfl2 libfl-dev bison m4 \
  libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev libgfortran5 \
  libcjson1 libcjson-dev zlib1g-dev dataset-fashion-mnist
ls -l *.deb
echo "tools/fetch-debs.sh: $(ls *.deb | wc -l) packages in $dir ($(du -sh . | cut -f1))"
