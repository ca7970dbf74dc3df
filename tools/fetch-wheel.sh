#!/bin/sh
# Downloads one pinned wheel from PyPI with pip (no dependencies, no
# install) and checks its sha256; used by tools/fetch-nvrtc.sh and
# tools/check-cuda-headers.sh.
# usage: tools/fetch-wheel.sh PACKAGE VERSION SHA256 WHEEL-FILE DEST-DIR
# Leaves DEST-DIR/WHEEL-FILE; exits 1 with a message (pip's log on stderr)
# when pip is missing, the download fails (offline?) or the hash differs.
set -eu

die() {
  echo "tools/fetch-wheel.sh: $*" >&2
  exit 1
}

[ $# -eq 5 ] || die "usage: tools/fetch-wheel.sh PACKAGE VERSION SHA256 WHEEL-FILE DEST-DIR"
pkg=$1 ver=$2 sha=$3 whl=$4 dest=$5
[ "$(uname -m)" = x86_64 ] || die "the pinned wheels are for x86_64 Linux, this machine is $(uname -m)"
command -v python3 > /dev/null 2>&1 || die "python3 not found (Debian: apt-get install python3-pip)"
python3 -m pip --version > /dev/null 2>&1 || die "python3 has no pip (Debian: apt-get install python3-pip)"
command -v sha256sum > /dev/null 2>&1 || die "sha256sum not found (coreutils)"

mkdir -p "$dest"
req=$(mktemp "${TMPDIR:-/tmp}/fetch-wheel.XXXXXX")
log=$(mktemp "${TMPDIR:-/tmp}/fetch-wheel.XXXXXX")
trap 'rm -f "$req" "$log"' EXIT INT TERM
echo "$pkg==$ver --hash=sha256:$sha" > "$req"
# the wheels' platform tags: manylinux2014 (= manylinux_2_17) or newer
# manylinux_2_27; short timeouts: offline, pip would retry for minutes
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 \
  --platform manylinux2014_x86_64 --python-version 3 --implementation py --require-hashes -r "$req" \
  --timeout 20 --retries 1 --dest "$dest" > "$log" 2>&1; then
  cat "$log" >&2
  die "pip download of $pkg==$ver failed (offline, or PyPI unreachable?)"
fi
[ -f "$dest/$whl" ] || die "pip download of $pkg==$ver gave no $whl (got: $(ls "$dest"))"
got=$(sha256sum "$dest/$whl" | cut -d' ' -f1)
[ "$got" = "$sha" ] || die "$whl: sha256 $got, expected $sha"
