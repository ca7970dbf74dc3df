#!/bin/sh
# tests/run_mounts.sh: what needs a file system of its own, mounted as root
# in a private mount namespace (unshare -m; nothing outside sees the mounts
# and they vanish with the test).  Exit 77 (skipped) without root, unshare
# or tmpfs mounts.
#   1. a full disk under the kernel cache (a tmpfs of 4 KiB: the source does
#      not fit; of 20 KiB: the compiler's output does not) and a read-only
#      one: a warning, the kernels compiled in a private temporary directory,
#      training goes on, and nothing is left in the cache;
#   2. the Fashion-MNIST package hint: printed for the package's own
#      directory (/usr/share/datasets/fashion-mnist, hidden under an empty
#      tmpfs, then holding a damaged file), not for other paths
#      (tests/run_cli.sh).
# usage: run_mounts.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_mounts.sh path/to/duet}
if [ -z "$DUET_IN_NAMESPACE" ]; then
  if [ "$(id -u)" != 0 ]; then echo "skip: needs root to mount file systems"; exit 77; fi
  if ! unshare -m true 2>/dev/null; then echo "skip: unshare -m (a private mount namespace) is not permitted"; exit 77; fi
  DUET_IN_NAMESPACE=1 exec unshare -m sh "$0" "$@"
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-mounts.XXXXXX") || exit 2
trap 'umount "$d/m" 2>/dev/null; rm -rf "$d"' EXIT
trap 'exit 1' HUP INT TERM
mkdir "$d/m"
if ! mount -t tmpfs -o size=4k,mode=0700 tmpfs "$d/m" 2>/dev/null; then
  echo "skip: cannot mount a tmpfs"; exit 77
fi
umount "$d/m"
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
RUN="--steps 1 --no-eval --train-subset 512 --quiet"

# --- 1. a full or read-only kernel cache: NAME MOUNT-OPTIONS "warning (a regular expression)"
cache_case() {
  name=$1 opts=$2 want=$3
  mount -t tmpfs -o "$opts,mode=0700" tmpfs "$d/m" || { bad "$name: mount"; return; }
  out=$(DUET_CACHE_DIR="$d/m" "$DUET" run $M $RUN 2>&1); rc=$?
  if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -Eq "$want" && printf '%s\n' "$out" | grep -q '^duet: trained 1 step ' &&
     [ -z "$(ls -A "$d/m")" ]; then ok "$name"
  else bad "$name: exit $rc"; printf '%s\n' "$out" | head -3; ls -A "$d/m" | head -3; fi
  umount "$d/m"
}
cache_case full_cache_source size=4k \
  "^duet: warning: cannot write $d/m/[0-9a-f]{16}\.[0-9]+\.[A-Za-z0-9]{6}\.c: No space left on device; compiling the kernels in .* without caching them$"
cache_case full_cache_object size=20k \
  "^duet: warning: (the compiler failed in the kernel cache $d/m \(.*\); compiled the kernels in .* without caching them|cannot .*: No space left on device; compiling the kernels in .* without caching them)$"
cache_case readonly_cache ro \
  "^duet: warning: cannot create a file in $d/m: Read-only file system; compiling the kernels in .* without caching them$"

# --- 2. the package hint, for the package's directory only
P=/usr/share/datasets/fashion-mnist
H="(Debian package dataset-fashion-mnist: apt-get install dataset-fashion-mnist)"
# hidden under an empty tmpfs (where the package is not installed, it is missing as it is)
hidden=0
if [ ! -d "$P" ] || { mount -t tmpfs tmpfs "$P" && hidden=1; }; then
  out=$(DUET_CACHE_DIR="$d/c" "$DUET" run $M --steps 1 2>&1); rc=$?
  [ $rc -eq 1 ] && printf '%s\n' "$out" | grep -Fqx "duet: error: cannot open $P/train-images-idx3-ubyte.gz: No such file or directory $H" &&
    ok package_hint_missing || { bad "package_hint_missing: exit $rc"; printf '%s\n' "$out" | head -2; }
fi
if [ $hidden = 1 ]; then
  printf 'not an idx file at all' | gzip > "$P/train-images-idx3-ubyte.gz"
  out=$(DUET_CACHE_DIR="$d/c" "$DUET" run $M --steps 1 2>&1); rc=$?
  [ $rc -eq 1 ] && printf '%s\n' "$out" | grep -Fqx "duet: error: corrupt IDX file $P/train-images-idx3-ubyte.gz: magic 0x6e6f7420, expected 0x00000803 $H" &&
    ok package_hint_corrupt || { bad "package_hint_corrupt: exit $rc"; printf '%s\n' "$out" | head -2; }
  umount "$P"
elif [ -d "$P" ]; then
  bad "package_hint: cannot mount over $P"
fi

echo "mounts: $pass passed, $fail failed"
[ $fail -eq 0 ]
