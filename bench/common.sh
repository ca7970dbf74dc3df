# bench/common.sh: the plumbing bench/run.sh and bench/run_gpt.sh share;
# sourced (`. bench/common.sh`) from the repository root after the caller has
# set BUILD_DIR.  Defines median, rate_of UNIT, interference_start,
# interference_end (sets others, steal), and the variables HZ, tmp (a
# temporary directory removed on exit), OPENBLAS_INC, OPENBLAS_LIB.

if [ ! -x "$BUILD_DIR/duet" ]; then
  echo "bench: $BUILD_DIR/duet missing; building it"
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD_DIR" -j2 >/dev/null
fi

# median of the numbers on stdin (one a line)
median() {
  sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# "... (12345 UNIT/s)" -> 12345, for UNIT samples or tokens
rate_of() {
  sed -n "s/.*trained .* (\([0-9.]*\) $1\/s).*/\1/p" | tail -n 1
}

# The figures are only meaningful on an otherwise idle machine.  Account for
# the CPU time other processes take: all busy CPU time (/proc/stat) less the
# CPU time of this script and its children (/proc/$$/stat), in clock ticks.
cpu_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $9 }' /proc/stat 2>/dev/null || echo "0 0"; }
own_cpu() { sed 's/.*) //' /proc/$$/stat 2>/dev/null | awk '{ print $12 + $13 + $14 + $15 }' || echo 0; }
HZ=$(getconf CLK_TCK 2>/dev/null || echo 100)

# Samples the machine's load for a second (warning when it is busy), then
# starts counting (sets idle_busy, busy_start, own_start).
interference_start() {
  b0=$(cpu_busy)
  sleep 1
  b1=$(cpu_busy)
  idle_busy=$(echo "$b0 $b1" | awk -v hz="$HZ" '{ printf "%.0f", 100 * ($3 - $1) / hz }')
  if [ "$idle_busy" -gt 10 ]; then
    echo "bench: warning: the CPUs were ${idle_busy}% busy (of one core) before starting; other processes will skew these figures"
  fi
  busy_start=$b1
  own_start=$(own_cpu)
}

# CPU seconds other processes used since interference_start (others) and the
# VM's steal time (steal).
interference_end() {
  busy_end=$(cpu_busy)
  own_end=$(own_cpu)
  others=$(echo "$busy_start $busy_end $own_start $own_end" | awk -v hz="$HZ" '{ o = (($3 - $1) - ($6 - $5)) / hz; printf "%.1f", o < 0 ? 0 : o }')
  steal=$(echo "$busy_start $busy_end" | awk -v hz="$HZ" '{ printf "%.1f", ($4 - $2) / hz }')
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

OPENBLAS_INC=/usr/include/x86_64-linux-gnu/openblas-openmp
OPENBLAS_LIB=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so
