#!/bin/sh
# tests/run_kcache.sh: the C kernel cache where it can go wrong, without
# privileges (tests/run_mounts.sh has the cases that need a mount: a full
# disk, a read-only file system as root).
#   1. a run killed while compiling takes its compiler with it: the whole
#      process group the compiler runs in (driver, cc1, as, ld; here a
#      wrapper script and its `sleep`), within seconds;
#   2. the temporaries such a run leaves are removed by a later run when no
#      live writer holds their lock and they are older than 60 s; a locked
#      one, its compiler output, a young one and files not of the cache stay;
#   3. a cached object is loaded from the descriptor its bytes were hashed
#      through (the loader's debug output shows /proc/self/fd/N, not the
#      path); a symlink in place of the object is a miss, recompiled;
#   4. without HOME the cache is ${TMPDIR:-/tmp}/duet-cache-UID/duet and a
#      second run loads from it; when a directory above it is writable by
#      others (and not sticky), a warning and a private temporary directory;
#   5. (not as root) a read-only cache directory: a warning and a temporary
#      directory, not an error (as root: tests/run_mounts.sh).
# usage: run_kcache.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_kcache.sh path/to/duet}
d=$(mktemp -d "${TMPDIR:-/tmp}/duet-kcache.XXXXXX") || exit 2
# processes this script started, ended by their ids if a check left them
pids=""
cleanup() {
  for p in $pids; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$d"
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
M=models/fmnist_mlp.model
RUN="--steps 1 --no-eval --train-subset 512"
uid=$(id -u)
# alive PID: the process exists and is not a zombie
alive() {
  [ -r "/proc/$1/stat" ] || return 1
  [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]
}

# --- 1. killed while compiling
cat > "$d/slowcc" <<EOF
#!/bin/sh
case "\$1" in --version) exec cc --version ;; esac
echo \$\$ > "$d/cc.pid"
sleep 60 &
echo \$! > "$d/sleep.pid"
wait
exec cc "\$@"
EOF
chmod +x "$d/slowcc"
DUET_CC="$d/slowcc" DUET_CACHE_DIR="$d/c1" "$DUET" run $M $RUN > "$d/k.out" 2>&1 &
dpid=$!
pids="$dpid"
i=0
while [ ! -s "$d/sleep.pid" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
if [ -s "$d/sleep.pid" ] && [ -s "$d/cc.pid" ]; then
  ccpid=$(cat "$d/cc.pid") slpid=$(cat "$d/sleep.pid")
  pids="$pids $ccpid $slpid"
  kill -9 "$dpid"
  wait "$dpid" 2>/dev/null
  i=0
  while { alive "$ccpid" || alive "$slpid"; } && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  if alive "$ccpid" || alive "$slpid"; then bad "killed_run_kills_compiler: the compiler outlived duet by 5 s"
  else ok killed_run_kills_compiler; fi
  ls "$d/c1/"*.c > /dev/null 2>&1 && ok killed_run_leaves_source ||
    bad "killed_run_leaves_source: expected the killed run's source in the cache: $(ls -A "$d/c1")"
else
  bad "killed_run_kills_compiler: the compiler wrapper never started"; cat "$d/k.out"
fi

# --- 2. stale temporaries
old() { touch -d '10 minutes ago' "$@"; }
c="$d/c1"
mkdir -p "$c"
left=$(ls "$c/"*.c 2>/dev/null | head -1)
[ -n "$left" ] && old "$left"
: > "$c/0123456789abcdef.999999.so.tmp"          # an older duet's orphan
: > "$c/0123456789abcdef.cubin.999999.tmp"       # an older duet's orphan (CUDA cache entry)
: > "$c/fedcba9876543210.1.AAAAAA.c"             # a live writer's source, locked below
: > "$c/fedcba9876543210.1.AAAAAA.so.tmp"        # ... and its compiler output
: > "$c/aaaaaaaaaaaaaaaa.2.BBBBBB.c"             # young: its writer may be about to lock it
: > "$c/notes.tmp"                               # not a cache file
old "$c/0123456789abcdef.999999.so.tmp" "$c/0123456789abcdef.cubin.999999.tmp" "$c/fedcba9876543210.1.AAAAAA.c" \
  "$c/fedcba9876543210.1.AAAAAA.so.tmp" "$c/notes.tmp"
sh -c 'exec 9<"$1"; flock 9; exec sleep 30' sh "$c/fedcba9876543210.1.AAAAAA.c" &
lpid=$!
pids="$pids $lpid"
i=0
while flock -n "$c/fedcba9876543210.1.AAAAAA.c" true 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
if DUET_CACHE_DIR="$c" "$DUET" run $M $RUN > "$d/s.out" 2>&1; then
  gone=1
  for f in ${left:+"$left"} "$c/0123456789abcdef.999999.so.tmp" "$c/0123456789abcdef.cubin.999999.tmp"; do
    [ -e "$f" ] && { bad "stale_removed: $f is still there"; gone=0; }
  done
  [ $gone = 1 ] && ok stale_removed
  kept=1
  for f in "$c/fedcba9876543210.1.AAAAAA.c" "$c/fedcba9876543210.1.AAAAAA.so.tmp" "$c/aaaaaaaaaaaaaaaa.2.BBBBBB.c" \
    "$c/notes.tmp"; do
    [ -e "$f" ] || { bad "live_and_young_kept: $f was removed"; kept=0; }
  done
  [ $kept = 1 ] && ok live_and_young_kept
  # once its writer is gone, the locked one goes too, with its compiler output
  kill "$lpid"; wait "$lpid" 2>/dev/null
  DUET_CACHE_DIR="$c" "$DUET" run $M $RUN > "$d/s2.out" 2>&1
  [ ! -e "$c/fedcba9876543210.1.AAAAAA.c" ] && [ ! -e "$c/fedcba9876543210.1.AAAAAA.so.tmp" ] &&
    ok unlocked_removed_with_output || bad "unlocked_removed_with_output: $(ls -A "$c")"
else
  bad "stale: duet run failed"; cat "$d/s.out"
fi

# --- 3. load what was hashed
c="$d/c3"
DUET_CACHE_DIR="$c" "$DUET" run $M $RUN > /dev/null 2>&1
LD_DEBUG=files LD_DEBUG_OUTPUT="$d/ld" DUET_CACHE_DIR="$c" "$DUET" run $M $RUN > "$d/h.out" 2>&1
if grep -q '^duet: kernels: .*, loaded from cache$' "$d/h.out" &&
   grep -hq 'file=/proc/self/fd/[0-9]* \[0\];  dynamically loaded by' "$d/ld".* 2>/dev/null &&
   ! grep -hq "file=$c/[0-9a-f]*\.so" "$d/ld".* 2>/dev/null; then ok hit_loads_hashed_descriptor
else bad "hit_loads_hashed_descriptor"; grep -h 'dynamically loaded' "$d/ld".* 2>/dev/null | head -3; head -2 "$d/h.out"; fi
so=$(ls "$c/"*.so | head -1)
cp "$so" "$d/copy.so" && rm "$so" && ln -s "$d/copy.so" "$so"
if DUET_CACHE_DIR="$c" "$DUET" run $M $RUN > "$d/l.out" 2>&1 && grep -q '^duet: kernels: .*, compiled in ' "$d/l.out" &&
   [ ! -L "$so" ] && [ -f "$so" ]; then ok symlinked_object_recompiled
else bad "symlinked_object_recompiled"; head -2 "$d/l.out"; ls -l "$c"; fi

# --- 4. the temporary-directory default (no HOME)
mkdir -m 700 "$d/t"
t1=$(env -u HOME -u XDG_CACHE_HOME -u DUET_CACHE_DIR TMPDIR="$d/t" "$DUET" run $M $RUN 2>&1)
t2=$(env -u HOME -u XDG_CACHE_HOME -u DUET_CACHE_DIR TMPDIR="$d/t" "$DUET" run $M $RUN 2>&1)
if printf '%s\n' "$t1" | grep -q '^duet: kernels: .*, compiled in ' && printf '%s\n' "$t2" | grep -q '^duet: kernels: .*, loaded from cache$' &&
   ls "$d/t/duet-cache-$uid/duet/"*.so > /dev/null 2>&1 && ! printf '%s\n' "$t1$t2" | grep -q warning; then ok tmp_default_cache
else bad "tmp_default_cache"; printf '%s\n' "$t1" "$t2" | grep -v '^epoch' | head -4; fi
mkdir "$d/u" && chmod 777 "$d/u"
t3=$(env -u HOME -u XDG_CACHE_HOME -u DUET_CACHE_DIR TMPDIR="$d/u" "$DUET" run $M $RUN 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$t3" | grep -q "^duet: warning: kernel cache directory $d/u/duet-cache-$uid/duet is not private: $d/u above it is writable by others (mode 0777, not sticky); compiling the kernels in /tmp/duet-kernels-.* without caching them$"; then
  ok tmp_default_unsafe_parent
else bad "tmp_default_unsafe_parent: exit $rc"; printf '%s\n' "$t3" | head -2; fi

# --- 5. a read-only cache directory (permissions bind only a user that is not root)
if [ "$uid" != 0 ]; then
  mkdir -m 500 "$d/ro"
  out=$(DUET_CACHE_DIR="$d/ro" "$DUET" run $M $RUN 2>&1); rc=$?
  if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q "^duet: warning: cannot create a file in $d/ro: Permission denied; compiling the kernels in .* without caching them$"; then
    ok readonly_cache_falls_back
  else bad "readonly_cache_falls_back: exit $rc"; printf '%s\n' "$out" | head -2; fi
  chmod 700 "$d/ro"
fi

echo "kcache: $pass passed, $fail failed"
[ $fail -eq 0 ]
